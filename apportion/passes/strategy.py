"""Planning strategies as values: how the splitting passes choose each op's splits.

A strategy is a small frozen object, not a name: each carries what the passes used to decide by
comparing names, so a pass asks the strategy instead.

* ``Balanced()`` (the default) is the exact search over split assignments (pass
  ``work_distribution``): every assignment within the constraints, uneven whole-stick splits
  included, the lowest predicted time kept; loop groups then get splits that agree across the
  group (pass ``group_distribution``).
* ``Greedy(rule="any")`` is the reference design's greedy rule: the span reduction's splits
  kept as minimums, the largest divisor per output dim, then one reduction dim; a forced
  minimum may grow to any legal factor (the reference's newer rule).
* ``Greedy(rule="multiples")`` is its older variant: a forced minimum grows only to multiples
  of itself.

Each has a ``name`` (what the CLI takes and a plan records: ``balanced``, ``greedy``,
``greedy-multiples``); ``parse_strategy`` turns a name (or a strategy) into the object at the
boundary of the public API and the command line.

>>> parse_strategy("greedy-multiples")
Greedy(rule='multiples')
>>> [s.name for s in (Balanced(), Greedy(), Greedy(rule="multiples"))]
['balanced', 'greedy', 'greedy-multiples']
>>> Balanced().uneven, Greedy().uneven
(True, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, TypeAlias

from apportion.errors import PlanningError

#: how a greedy strategy lets a span-forced minimum split grow (see ``Greedy``)
GreedyRule = Literal["any", "multiples"]
GREEDY_RULES: tuple[GreedyRule, ...] = ("any", "multiples")


@dataclass(frozen=True)
class Greedy:
    """The reference design's greedy rule: keep the span reduction's splits as minimums, give
    each output dim (largest first) the largest divisor of its planning units that fits the
    cores left, then split at most one reduction dim (none if span reduction split one).

    ``rule`` is how a dim the span limit forces to split may grow: ``"any"`` legal factor (a
    divisor of its units, at least the forced minimum, within the cores the other dims leave;
    the reference's newer rule) or only ``"multiples"`` of the minimum (the older one). 6 rows
    on 3 cores with a forced split of 2 take 3 cores under ``any`` and 2 under ``multiples``.

    Greedy plans ops alone (no group distribution), splits only evenly, and an op whose span
    reduction finds no even split that fits is refused (or given a loop of last resort by
    pass ``span_tiling``).

    >>> Greedy().name, Greedy(rule="multiples").name
    ('greedy', 'greedy-multiples')
    >>> Greedy(rule="all")
    Traceback (most recent call last):
    ...
    apportion.errors.PlanningError: unknown greedy rule 'all'; valid: 'any', 'multiples'
    """

    rule: GreedyRule = "any"

    #: span reduction and work distribution cut dims into even splits only
    uneven: ClassVar[bool] = False
    #: a span reduction that finds no fitting split is the op's refusal: greedy only grows it
    span_refusal_final: ClassVar[bool] = True
    #: None: loop groups keep their op-by-op splits (the reference plans ops alone; group
    #: distribution does not run)
    group_baseline: ClassVar[Greedy | None] = None

    def __post_init__(self) -> None:
        if self.rule not in GREEDY_RULES:
            raise PlanningError(f"unknown greedy rule {self.rule!r}; valid: "
                                f"{', '.join(map(repr, GREEDY_RULES))}")

    @property
    def name(self) -> str:
        """The name the CLI takes and a plan records."""
        return "greedy" if self.rule == "any" else f"greedy-{self.rule}"

    def start(self, minimum: Mapping[str, int]) -> dict[str, int]:
        """Where work distribution starts an op: the span reduction's splits, kept as minimums.

        >>> Greedy().start({"m": 2, "n": 1})
        {'m': 2, 'n': 1}
        """
        return dict(minimum)


@dataclass(frozen=True)
class Balanced:
    """The exact search: every split assignment within the span limit, whole sticks, at most
    one split reduction dim and the core count, uneven whole-stick splits included; the lowest
    predicted time wins (ties to even splits, fewer cores, then outer dims). The greedy
    assignment is among those searched, so balanced is never predicted slower. Loop groups then
    get splits that agree across the group where that is predicted faster, each op no slower
    than ``group_baseline`` would plan it alone.

    >>> Balanced().name, Balanced().group_baseline
    ('balanced', Greedy(rule='any'))
    >>> Balanced().start({"m": 2, "n": 1})   # the search covers every assignment itself
    {'m': 1, 'n': 1}
    """

    #: span reduction may take an uneven whole-stick split where no even one fits, and the
    #: search lists uneven splits
    uneven: ClassVar[bool] = True
    #: a span reduction that finds no fitting split is not final: the search may still find
    #: one (the walk's error is kept, raised only if the search finds none either)
    span_refusal_final: ClassVar[bool] = False
    #: group distribution aligns the splits of each loop group's ops, measuring each against
    #: this greedy rule: a group-wide seed under which an op would run slower than under this
    #: rule's splits of the op alone is not taken for that op
    group_baseline: ClassVar[Greedy | None] = Greedy("any")

    @property
    def name(self) -> str:
        """The name the CLI takes and a plan records."""
        return "balanced"

    def start(self, minimum: Mapping[str, int]) -> dict[str, int]:
        """Where work distribution starts an op: no split at all, since the search covers
        every assignment (the span reduction's splits are not a floor)."""
        return {d: 1 for d in minimum}


#: a planning strategy
Strategy: TypeAlias = Balanced | Greedy

#: every strategy, the default first
ALL: tuple[Strategy, ...] = (Balanced(), Greedy("any"), Greedy("multiples"))
#: the names ``parse_strategy`` takes (the CLI's ``--strategy`` choices), the default first
STRATEGIES: tuple[str, ...] = tuple(s.name for s in ALL)
_BY_NAME: dict[str, Strategy] = {s.name: s for s in ALL}


def parse_strategy(value: str | Strategy) -> Strategy:
    """The strategy ``value`` names (``balanced``, ``greedy``, ``greedy-multiples``), or
    ``value`` itself when it is one; anything else is a ``PlanningError`` listing the valid
    names.

    >>> parse_strategy("balanced"), parse_strategy(Greedy(rule="multiples"))
    (Balanced(), Greedy(rule='multiples'))
    >>> parse_strategy("fast")
    Traceback (most recent call last):
    ...
    apportion.errors.PlanningError: unknown strategy 'fast'; valid: balanced, greedy, \
greedy-multiples, or a strategy object (Balanced(), Greedy(rule='any' or 'multiples'))
    """
    if isinstance(value, Balanced | Greedy):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    shown = repr(value) if isinstance(value, str) else f"{type(value).__name__} {value!r}"
    raise PlanningError(f"unknown strategy {shown[:200]}; valid: {', '.join(STRATEGIES)}, or a "
                        "strategy object (Balanced(), Greedy(rule='any' or 'multiples'))")
