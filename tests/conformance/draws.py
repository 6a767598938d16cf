"""The conformance generators' ``Draw`` over hypothesis, and the settings their property tests
run with."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


class HypothesisDraw:
    """``random_programs.Draw`` over hypothesis's ``draw``: failing cases shrink."""

    def __init__(self, draw: Any) -> None:
        self._draw = draw

    def integers(self, low: int, high: int) -> int:
        return self._draw(st.integers(low, high))

    def sampled_from(self, values: Any) -> Any:
        return self._draw(st.sampled_from(values))

    def booleans(self) -> bool:
        return self._draw(st.booleans())


def conformance(examples: int) -> settings:
    """A modest, derandomized number of examples (no test fails by chance), no deadline."""
    return settings(derandomize=True, deadline=None, database=None, max_examples=examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
