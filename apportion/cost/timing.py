"""Calls timed in interleaved rounds: ``interleaved`` (a fixed number of rounds) and
``until_stable`` (rounds until what the times decide is settled, ``noise.until_stable``), each
case's times and what its fastest call returned (``Timing``). The bench suites, the calibration
and the host's split-K table time with them.

>>> t = interleaved([lambda: 1], repeat=2)[0]
>>> len(t.seconds), t.result, t.min <= t.median
(2, 1, True)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from apportion.cost import noise
from apportion.cost.noise import Criterion, Measured, Rules, load_average

R = TypeVar("R")


@dataclass(frozen=True)
class Timing(Generic[R]):
    """The seconds of every timed call of one case, and what its fastest call returned."""

    seconds: tuple[float, ...]
    result: R | None = field(default=None, compare=False, repr=False)

    @property
    def min(self) -> float:
        """The fastest call (what a stall cannot lengthen)."""
        return min(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def interleaved(calls: Sequence[Callable[..., R]], repeat: int, warmup: int = 0,
                clock: Callable[[], float] = time.perf_counter, alternate: bool = False,
                before: Callable[[], None] | None = None,
                fresh: Sequence[Callable[[], Any]] | None = None) -> list[Timing[R]]:
    """Time every call ``repeat`` times in rounds (each round calls each once, in order;
    ``alternate``: in reverse order every other round, so that no case always finds the caches
    as the one before it left them), after ``warmup`` untimed calls of each. ``clock`` is the
    timer (``time.process_time`` for CPU time, which other work on the cores does not
    inflate); ``before`` runs before every timed call, untimed (a garbage collection, say);
    ``fresh[i]()``, also untimed, makes the argument of each call of case ``i`` (a fresh copy
    of its input, so that no call finds what an earlier one cached on it). A fixed number of
    rounds: ``until_stable`` times until what the times decide is stable.

    >>> t = interleaved([lambda: 1], repeat=2)[0]
    >>> len(t.seconds), t.result, t.min <= t.median
    (2, 1, True)
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    timings, _ = until_stable(calls, Rules(min_rounds=repeat, max_rounds=repeat, settle=1),
                              warmup=warmup, clock=clock, alternate=alternate, before=before,
                              fresh=fresh)
    return timings


def until_stable(calls: Sequence[Callable[..., R]], rules: Rules,
                 criteria: Callable[[np.ndarray], Sequence[Criterion]] | None = None, *,
                 warmup: int = 0, clock: Callable[[], float] = time.perf_counter,
                 alternate: bool = True, before: Callable[[], None] | None = None,
                 fresh: Sequence[Callable[[], Any]] | None = None, names: Sequence[str] = (),
                 load: Callable[[], float | None] = load_average,
                 ) -> tuple[list[Timing[R]], Measured]:
    """Time the calls in interleaved rounds until the ``criteria`` of their least times are
    stable (``cost.noise.until_stable``: ``rules`` say how long it may take), each call as
    ``interleaved`` times it; the timings (and what each case's fastest call returned) and
    the measurement with its noise. A CPU-time ``clock`` (``time.process_time``) is judged by
    its spread alone, not by the machine's load."""
    if fresh is not None and len(fresh) != len(calls):
        raise ValueError(f"fresh has {len(fresh)} makers for {len(calls)} calls")

    def args(i: int) -> tuple[Any, ...]:
        return () if fresh is None else (fresh[i](),)

    for i, call in enumerate(calls):
        for _ in range(warmup):
            call(*args(i))
    best: list[tuple[float, Any]] = [(float("inf"), None) for _ in calls]

    def case(i: int) -> Callable[[], float]:
        def once() -> float:
            given = args(i)
            if before is not None:
                before()
            start = clock()
            out = calls[i](*given)
            took = clock() - start
            if took < best[i][0]:
                best[i] = (took, out)
            return took
        return once

    measured = noise.until_stable([case(i) for i in range(len(calls))], criteria, rules,
                                  alternate=alternate, names=names, load=load,
                                  wall_clock=clock is not time.process_time)
    timings = [Timing(tuple(s for s in col if not math.isnan(s)), b[1])
               for col, b in zip(measured.seconds, best, strict=True)]
    return timings, measured
