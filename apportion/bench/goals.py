"""Benchmark goals: what each ``apportion bench`` suite is for, and whether a run met it.

Each suite states its goals with its table (``show``: one line per goal, met, missed or
inconclusive, with the figure that decides it). A goal of timed figures is judged with their
noise (``judged``, from a ``cost.noise.Verdict``): the figure, its interval over the resampled
rounds in brackets, and met or missed only where the whole interval says so; where the interval
holds the bound, or the machine was loaded past its cores, the goal is inconclusive (too noisy)
and names why. ``--check`` makes a missed goal exit status 1, and otherwise an inconclusive one
exit status 3 (``INCONCLUSIVE``: neither a pass nor a failure; rerun on a quieter machine), each
with one line on stderr naming it and by how much or why (``status``); without ``--check`` a
benchmark only reports, so that a run on a loaded machine still prints its tables.

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

from apportion.cost.noise import Verdict

#: ``--check``'s exit status when no goal is missed but one is too noisy to judge
INCONCLUSIVE = 3


@dataclass(frozen=True)
class Goal:
    """One goal of a suite: what it asks, whether this run met it, and the deciding figure
    (for a missed goal, how far from it)."""

    what: str
    met: bool
    figure: str
    inconclusive: bool = False

    @property
    def state(self) -> str:
        return "met" if self.met else "inconclusive" if self.inconclusive else "MISSED"


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


def judged(what: str, v: Verdict, fmt: str = "{:.3g}", where: str = "") -> Goal:
    """The goal ``v`` judged (met or missed only where its whole interval says so), its figure
    the value, the interval in brackets (none where the figure was given, not measured) and
    ``where`` (the worst case).

    >>> import numpy as np
    >>> from apportion.cost.noise import verdict
    >>> judged("ratio <= 2", verdict("r", 1.9, np.array([1.8, 2.2]), 2.0), "{:.2f}x").figure
    '1.90x [1.80x, 2.20x], too noisy: its interval 1.8 to 2.2 holds the bound 2'
    """
    interval = "" if v.exact else f" [{fmt.format(v.low)}, {fmt.format(v.high)}]"
    figure = fmt.format(v.value) + interval + (f" ({where})" if where else "")
    if v.state == "missed":
        gap = v.low - v.bound if v.at_most else v.bound - v.high
        figure += f", {'over' if v.at_most else 'short of'} the goal by {fmt.format(gap)}"
    elif v.state == "inconclusive":
        figure += f", too noisy: {v.why}"
    return Goal(what, v.met, figure, v.state == "inconclusive")


def count(what: str, bad: Sequence[str], total: int) -> Goal:
    """The goal that no case of ``total`` fails; ``bad`` names the ones that do."""
    if not bad:
        return Goal(what, True, f"all {total}")
    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    return Goal(what, False, f"{len(bad)} of {total} miss it: {shown}")


def line(goal: Goal) -> str:
    return f"goal {goal.state}: {goal.what}: {goal.figure}"


def show(goals: Sequence[Goal], console: Console) -> None:
    """Print each goal's line under the table it belongs to (missed ones in red, inconclusive
    ones in yellow)."""
    for g in goals:
        style = None if g.met else "yellow" if g.inconclusive else "red"
        console.print(line(g), style=style, highlight=False, markup=False,
                      soft_wrap=True)  # one line each, however long: for grep and diff


def status(suite: str, goals: Sequence[Goal], check: bool, err: TextIO | None = None) -> int:
    """The exit status under ``check``: 1 when a goal is missed, else ``INCONCLUSIVE`` when one
    is too noisy to judge (one stderr line each), else 0; always 0 without ``check``."""
    missed = [g for g in goals if not g.met and not g.inconclusive]
    unsure = [g for g in goals if g.inconclusive]
    if not check or not (missed or unsure):
        return 0
    for g in missed + unsure:
        print(f"apportion: bench {suite}: {line(g)}", file=err or sys.stderr)
    return 1 if missed else INCONCLUSIVE
