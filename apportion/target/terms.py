"""Cost terms a target carries beyond the cost model's own: the extension point of a new device.

The cost model (``apportion/cost/model.py``) predicts an op's time from named terms whose
coefficients are ``Target`` fields. A device whose time has a further component (a hop between
chiplets, a launch overhead of its own) adds it as a ``CostTerm`` object in
``Target.cost_terms``: ``op_cost`` adds each term's ``us`` to the op's time, and work
distribution's bounded search adds each term's ``least`` to its lower bound. Nothing else needs
to change, and no code asks for the target's name.

A term is a time in microseconds, finite and at least 0 (``op_cost`` refuses any other value):
the search skips a subtree only when its bound exceeds the best time found, and a term's bound
of 0 (``least``'s default) is then always below what the term adds, so the search stays exact.
A term that bounds itself tighter (``least`` above 0) prunes more; it must never exceed ``us``
of any assignment that extends the one it is given.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Launch(CostTerm):
...     us_per_op: float = 2.0
...     def us(self, op, program, target, sizes, splits, largest):
...         return self.us_per_op
>>> Launch().name, Launch().least(None, None, None, {}, {}, {})
('Launch', 0.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from apportion.ir.op import Op
from apportion.ir.program import Program


class TermTarget(Protocol):
    """What a term reads of its target, at least: a ``Target`` (which imports this module)."""

    @property
    def name(self) -> str: ...

    @property
    def cores(self) -> int: ...

    def elems_per_stick(self, dtype: str) -> int: ...


@dataclass(frozen=True)
class CostTerm:
    """One further term of a target's cost model (see the module docstring). A subclass is a
    small frozen dataclass (a target is hashed and compared by value) whose fields are the
    term's coefficients."""

    @property
    def name(self) -> str:
        """What an error or a report calls the term: its class name."""
        return type(self).__name__

    def us(self, op: Op, program: Program, target: TermTarget, sizes: Mapping[str, int],
           splits: Mapping[str, int], largest: Mapping[str, int]) -> float:
        """The term's microseconds for ``op`` over ``sizes`` cut by ``splits`` (cores per dim),
        each core computing at most ``largest`` elements per dim."""
        raise NotImplementedError(f"cost term {self.name}: define us()")

    def least(self, op: Op, program: Program, target: TermTarget, sizes: Mapping[str, int],
              assigned: Mapping[str, int], small: Mapping[str, int]) -> float:
        """A lower bound on ``us`` over every assignment extending ``assigned`` (the dims the
        search has split so far; the others any split), whose slices are at least ``small``
        elements per dim. 0 is always one."""
        return 0.0
