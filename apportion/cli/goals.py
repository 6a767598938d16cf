"""Benchmark goals: what each ``apportion bench`` suite is for, and whether a run met it.

Each suite states its goals with its table (``show``: one line per goal, met or missed, with the
figure that decides it). ``--check`` makes a missed goal exit status 1, with one line on stderr
per missed goal naming it and by how much (``status``); without ``--check`` a benchmark only
reports, so that a run on a loaded machine still prints its tables.

>>> g = at_most("time ratio <= 1", 1.25, 1.0, "{:.2f}x", where="shape a")
>>> g.met, g.figure
(False, '1.25x (shape a), over the goal by 0.25x')
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console


@dataclass(frozen=True)
class Goal:
    """One goal of a suite: what it asks, whether this run met it, and the deciding figure
    (for a missed goal, how far from it)."""

    what: str
    met: bool
    figure: str


def at_most(what: str, value: float, bound: float, fmt: str = "{:.3g}",
            where: str = "") -> Goal:
    """The goal ``value <= bound``; ``where`` names the case the value comes from (the worst)."""
    met = value <= bound
    figure = fmt.format(value) + (f" ({where})" if where else "")
    if not met:
        figure += f", over the goal by {fmt.format(value - bound)}"
    return Goal(what, met, figure)


def at_least(what: str, value: float, bound: float, fmt: str = "{:.3g}",
             where: str = "") -> Goal:
    """The goal ``value >= bound``; ``where`` names the case the value comes from (the worst)."""
    met = value >= bound
    figure = fmt.format(value) + (f" ({where})" if where else "")
    if not met:
        figure += f", short of the goal by {fmt.format(bound - value)}"
    return Goal(what, met, figure)


def count(what: str, bad: Sequence[str], total: int) -> Goal:
    """The goal that no case of ``total`` fails; ``bad`` names the ones that do."""
    if not bad:
        return Goal(what, True, f"all {total}")
    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    return Goal(what, False, f"{len(bad)} of {total} miss it: {shown}")


def line(goal: Goal) -> str:
    return f"goal {'met' if goal.met else 'MISSED'}: {goal.what}: {goal.figure}"


def show(goals: Sequence[Goal], console: Console) -> None:
    """Print each goal's line under the table it belongs to (missed ones in red)."""
    for g in goals:
        console.print(line(g), style=None if g.met else "red", highlight=False, markup=False,
                      soft_wrap=True)  # one line each, however long: for grep and diff


def status(suite: str, goals: Sequence[Goal], check: bool, err: TextIO | None = None) -> int:
    """The exit status: 1 when ``check`` and a goal is missed (one stderr line each), else 0."""
    missed = [g for g in goals if not g.met]
    if not check or not missed:
        return 0
    for g in missed:
        print(f"apportion: bench {suite}: {line(g)}", file=err or sys.stderr)
    return 1
