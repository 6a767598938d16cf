"""One harness for every ``apportion bench`` suite: the options a suite takes, the timing of its
cases, its ``--json`` document and its goals, each done once here.

A suite is a ``Suite``: its name, the bench options it takes, and a function from the parsed
arguments to an ``Outcome`` (the JSON document, the goals it states, and whether a result was
wrong). ``run_suite`` refuses the options the suite does not take (one line naming the suite
and the ones it does), checks the ``--json`` path before any work, writes the document once,
and turns the goals into the exit status (``goals.status``: 1 under ``--check`` when one is
missed, else 3 when one is too noisy to judge; a wrong result is 1 with or without it).

Timing goes through ``interleaved`` (a fixed number of rounds) or ``until_stable`` (rounds until
the suite's goals are settled, ``cost/noise.py``): rounds that call every case once, so a burst
of load elsewhere slows one round of each case rather than every round of one; the fastest and
the median of each case's times are reported (a stall only lengthens a run, so the fastest is
the steadiest figure), and ``until_stable`` also gives the measurement's noise: its intervals,
the verdict of each goal and the load average before and after.

>>> calls = [lambda: sum(range(1000)), lambda: sum(range(10))]
>>> [len(t.seconds) for t in interleaved(calls, repeat=3)]
[3, 3]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
from rich.console import Console

from apportion.bench import goals as bench_goals
from apportion.cost import noise
from apportion.cost.noise import Criterion, Measured, Rules, load_average
from apportion.errors import UsageError
from apportion.report.files import output_path, write_json
from apportion.target.presets import spyre

R = TypeVar("R")
T = TypeVar("T")

#: bench options a suite may take, as the parser stores them, with their flags
OPTIONS: dict[str, str] = {
    "cores": "--cores",
    "models": "--models",
    "threads": "--threads",
    "repeat": "--repeat",
    "measurements": "--measurements",
    "target": "--target",
    "n": "--n",
    "dtensor": "--dtensor",
    "seed": "--seed",
}


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


@dataclass(frozen=True)
class Outcome:
    """What one suite's run gives the harness: its ``--json`` document (JSON-able), the goals
    it states (met or missed), and ``failed`` when a result was wrong (exit status 1 whatever
    the goals say)."""

    doc: Any
    goals: list[bench_goals.Goal]
    failed: bool = False


@dataclass(frozen=True)
class Suite:
    """One ``apportion bench`` suite: its name, the options of ``OPTIONS`` it takes, a line of
    help, and the function that runs it."""

    name: str
    options: frozenset[str]
    about: str
    run: Callable[[argparse.Namespace, Console], Outcome]


def core_counts(args: argparse.Namespace, default: Sequence[int]) -> list[int]:
    """``--cores`` (else ``default``) without repeats, each checked as a spyre core count
    before the first case runs (a bad one is one line, not a failure halfway through).

    >>> core_counts(argparse.Namespace(cores=[8, 8, 32]), [32])
    [8, 32]
    """
    cores = list(dict.fromkeys(args.cores or default))
    for n in cores:
        spyre(cores=n)
    return cores


def check_options(suite: Suite, args: argparse.Namespace) -> None:
    """Refuse, in one line, a given option the suite does not take."""
    for option, flag in OPTIONS.items():
        if getattr(args, option, None) is not None and option not in suite.options:
            takes = ", ".join(OPTIONS[o] for o in OPTIONS if o in suite.options) or "none"
            raise UsageError(f"{flag} is not an option of the {suite.name} suite (its options: "
                             f"{takes}, --limit, --json, --check)")


def run_suite(suite: Suite, args: argparse.Namespace, console: Console) -> int:
    """Run ``suite`` as ``apportion bench`` does: options checked, the ``--json`` path checked
    before any work and written once after, the exit status from the goals."""
    check_options(suite, args)
    out = output_path("--json", args.json) if getattr(args, "json", None) is not None else None
    outcome = suite.run(args, console)
    if out is not None:
        write_json(out, json.dumps(outcome.doc, indent=1))
    if outcome.failed:
        return 1
    return bench_goals.status(suite.name, outcome.goals, bool(getattr(args, "check", False)))


def from_models(path: str | None, build: Callable[[], T]) -> T:
    """``build()``, with a malformed ``--models`` file (JSON, keys, types) refused in one line."""
    if path is None:  # the packaged file: a failure here is a bug, not bad input
        return build()
    try:
        return build()
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        why = f"no key {e.args[0]!r}" if isinstance(e, KeyError) and e.args else str(e)
        raise UsageError(f"--models {path!r} is not a models file like the packaged "
                         f"models.json: {why or type(e).__name__}") from None
