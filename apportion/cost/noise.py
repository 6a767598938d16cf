"""Measurements that know their noise: timing in interleaved rounds until what the times decide
stops changing, the spread of each figure, the load the machine ran under, and the verdict a
figure gets against a bound: met, missed, or inconclusive (too noisy).

Everything apportion times and then caches or judges goes through here: this host's split-K
table (``workflows/host_splitk.py``, cached per host), ``calibrate --measure``
(``cli/calibrate.py``) and the timed bench suites (``splitk``, ``forall``, ``e2e``, the forward
solve of ``sharding``, ``scale``, the programs ``costmodel --target cpu`` runs, the 8B of
``fullsize``).

**Rounds** (``until_stable``): each case is a callable that runs once and returns its seconds;
a round calls every live case once, in reverse order every other round (a drift of the
machine's speed falls on all cases alike), after ``warmup`` untimed calls of each. A case's
estimate is its least time over the rounds: load from other work only ever adds time.

**Criteria**: what the caller decides from the estimates, as figures held against bounds (the
chosen split-K factor within 10% of the fastest; the executor at most 2x eager). After each
round from ``Rules.min_rounds`` on, the rounds are resampled with replacement (a paired
bootstrap of ``REPLICATES`` resamples: a resampled round keeps every case's time of that round,
so load that slowed one round cancels in a ratio) and each figure computed on every resample.
A figure's interval runs from the ``1 - confidence`` to the ``confidence`` quantile of its
resamples; its **verdict** is met where the whole interval meets the bound, missed where the
whole interval misses it, and inconclusive where the interval holds the bound.

**Stable**: every criterion's verdict is met or missed (on ``FEWEST`` rounds at least), every
live case's least time is known within ``Rules.precision`` (where given), and the decision
(each criterion's side of its bound at the estimates, and the caller's own ``key``, such as
the factor chosen) has been the same for the last ``Rules.settle`` rounds. Rounds are added
until the measurement is stable, up to ``Rules.max_rounds`` (or ``Rules.budget_s`` seconds
timed); it is then reported unstable, with why.

**Load**: the 1-minute load average (``os.getloadavg``) before the first round and after the
last. A wall-clock measurement taken while it was over the machine's cores is not trusted
(``Measured.trusted``) and its verdicts are inconclusive: other work then held the cores, and a
steady load slows long calls more than short ones, which no spread shows. One begun under such
a load takes its least rounds and stops: no number of rounds would make it trusted. A CPU-time
measurement (``wall_clock=False``: ``time.process_time``, which other work does not inflate)
records the load but is judged by its spread alone.

>>> import itertools
>>> fast, slow = itertools.cycle([1.0, 1.02]), itertools.cycle([2.0, 2.04])
>>> ratio = Criterion("slow / fast", lambda t: t[..., 1] / t[..., 0], 1.5, at_most=False)
>>> m = until_stable([lambda: next(fast), lambda: next(slow)], lambda t: [ratio],
...                  Rules(min_rounds=3, max_rounds=10), load=lambda: 0.0, cores=2)
>>> m.stable, m.rounds, m.verdicts[0].state, m.least
(True, 3, 'met', (1.0, 2.0))
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the share of resamples a verdict needs on one side of its bound (and the interval's quantiles)
CONFIDENCE = 0.95
#: bootstrap resamples per check
REPLICATES = 400
#: the resampling seed: the same times always give the same verdicts
SEED = 0
#: verdicts
MET, MISSED, INCONCLUSIVE = "met", "missed", "inconclusive"
#: the fewest rounds a criterion is judged on
FEWEST = 3


def load_average() -> float | None:
    """The 1-minute load average, or None where the system has none (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def machine_cores() -> int:
    """The machine's cores: what its load average is measured against."""
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Load:
    """The 1-minute load average before a measurement and after it (None: unknown), and the
    machine's cores."""

    before: float | None
    after: float | None
    cores: int

    @property
    def peak(self) -> float | None:
        known = [v for v in (self.before, self.after) if v is not None]
        return max(known) if known else None

    @property
    def over(self) -> bool:
        """The load average was over the cores: other work held them while this ran.

        >>> Load(0.4, 2.5, 2).over, Load(0.4, 1.9, 2).over, Load(None, None, 2).over
        (True, False, False)
        """
        return self.peak is not None and self.peak > self.cores

    def __str__(self) -> str:
        def text(v: float | None) -> str:
            return "unknown" if v is None else f"{v:.2f}"
        return f"load average {text(self.before)} before, {text(self.after)} after, on " \
               f"{self.cores} cores"

    @staticmethod
    def across(loads: Sequence[Load]) -> Load:
        """One load over several measurements in turn: the first's before, the last's after
        and, where a middle one was higher, its peak as the after."""
        if not loads:
            return Load(None, None, machine_cores())
        peaks = [v for v in (ld.peak for ld in loads[1:-1]) if v is not None]
        after = max([*peaks, *([] if loads[-1].after is None else [loads[-1].after])],
                    default=None)
        return Load(loads[0].before, after, loads[0].cores)

    def to_doc(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after, "cores": self.cores,
                "over": self.over}


@dataclass(frozen=True)
class Rules:
    """How long a measurement goes on: at least ``min_rounds``, then until stable, up to
    ``max_rounds`` or ``budget_s`` timed seconds (None: no budget); the decision the same for
    ``settle`` rounds; verdicts at ``confidence``; each live case's least time within
    ``precision`` (its interval's width over it; None: not asked). After ``drop_after`` rounds
    (None: never), cases over ``drop`` times the fastest stop being timed: they can be neither
    the fastest nor near it."""

    min_rounds: int = 5
    max_rounds: int = 50
    settle: int = 3
    budget_s: float | None = None
    confidence: float = CONFIDENCE
    precision: float | None = None
    drop_after: int | None = None
    drop: float = 2.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"rounds: need 1 <= min_rounds <= max_rounds, got "
                             f"{self.min_rounds}, {self.max_rounds}")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")


@dataclass(frozen=True)
class Criterion:
    """A figure of the cases' estimates held against a bound: ``figure`` maps estimates of
    shape ``(..., cases)`` to figures of shape ``(...)`` (numpy, so that every resample is
    computed at once); the figure should be at most ``bound`` (``at_most``) or at least it."""

    name: str
    figure: Callable[[np.ndarray], np.ndarray]
    bound: float
    at_most: bool = True


@dataclass(frozen=True)
class Verdict:
    """A figure, its interval over the resamples and its verdict against the bound (``MET``,
    ``MISSED`` or ``INCONCLUSIVE``), with why where inconclusive."""

    name: str
    value: float
    low: float
    high: float
    bound: float
    at_most: bool
    state: str
    why: str = ""
    exact: bool = False  # one sample: a figure given, not measured (no interval to show)

    @property
    def spread(self) -> float:
        """The interval's width over the figure (0: exact)."""
        return (self.high - self.low) / abs(self.value) if self.value else 0.0

    @property
    def met(self) -> bool:
        return self.state == MET

    @property
    def conclusive(self) -> bool:
        return self.state != INCONCLUSIVE


def _quantiles(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    """The interval's ends: resampled values themselves (no interpolation, which an infinite
    resample, a case none of its rounds timed, would turn into NaN), the wider way."""
    finite = np.where(np.isnan(samples), np.inf, samples)
    low = np.quantile(finite, 1 - confidence, method="lower")
    high = np.quantile(finite, confidence, method="higher")
    return float(low), float(high)


def verdict(name: str, value: float, samples: np.ndarray, bound: float, at_most: bool = True,
            confidence: float = CONFIDENCE, noisy: str = "") -> Verdict:
    """The verdict of a figure (``value`` at the estimates) against ``bound`` from its
    resampled ``samples``: met or missed where the whole interval is on one side,
    inconclusive where it holds the bound, or where ``noisy`` says why the figures cannot be
    trusted (a load over the cores).

    >>> verdict("r", 1.2, np.array([1.1, 1.2, 1.3]), 2.0).state
    'met'
    >>> v = verdict("r", 1.9, np.array([1.8, 1.9, 2.1]), 2.0)
    >>> v.state, v.why
    ('inconclusive', 'its interval 1.8 to 2.1 holds the bound 2')
    """
    samples = np.asarray(samples, dtype=float)
    low, high = _quantiles(samples, confidence)
    exact = samples.size <= 1
    good = (lambda v: v <= bound) if at_most else (lambda v: v >= bound)
    if noisy:
        return Verdict(name, value, low, high, bound, at_most, INCONCLUSIVE, noisy, exact)
    if good(low) and good(high):
        return Verdict(name, value, low, high, bound, at_most, MET, "", exact)
    if not good(low) and not good(high):
        return Verdict(name, value, low, high, bound, at_most, MISSED, "", exact)
    return Verdict(name, value, low, high, bound, at_most, INCONCLUSIVE,
                   f"its interval {low:.3g} to {high:.3g} holds the bound {bound:.3g}", exact)


def resampled_least(seconds: np.ndarray, n: int = REPLICATES, seed: int = SEED) -> np.ndarray:
    """``n`` bootstrap resamples of each case's least time: ``seconds`` is (rounds, cases),
    NaN where a case was not timed; whole rounds are drawn with replacement (paired), and a
    case that none of a resample's rounds timed is infinitely slow in it.

    >>> resampled_least(np.array([[1.0, 2.0]]), 3).tolist()
    [[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]
    """
    rounds = seconds.shape[0]
    picks = np.random.default_rng(seed).integers(0, rounds, size=(n, rounds))
    timed = np.where(np.isnan(seconds), np.inf, seconds)
    return timed[picks].min(axis=1)


@dataclass(frozen=True)
class Measured:
    """One measurement: every case's seconds per round (NaN where it was not timed), the
    criteria's verdicts, whether it is stable (and why not), the load, and the confidence it
    was judged at. ``wall_clock``: a load over the cores makes it untrusted."""

    seconds: tuple[tuple[float, ...], ...]
    verdicts: tuple[Verdict, ...]
    stable: bool
    why: str
    load: Load
    confidence: float = CONFIDENCE
    wall_clock: bool = True
    names: tuple[str, ...] = field(default=(), compare=False)

    @property
    def array(self) -> np.ndarray:
        """(rounds, cases)."""
        return np.array(self.seconds, dtype=float).T.reshape(self.rounds, len(self.seconds))

    @property
    def rounds(self) -> int:
        return len(self.seconds[0]) if self.seconds else 0

    @property
    def least(self) -> tuple[float, ...]:
        """Each case's least time (inf: never timed)."""
        return tuple(float(v) for v in _least(self.array))

    def resampled(self) -> np.ndarray:
        """(``REPLICATES``, cases): the bootstrap resamples of the least times."""
        return resampled_least(self.array)

    @property
    def spread(self) -> tuple[float, ...]:
        """Each case's least time's interval width over it (0 for a case timed once)."""
        reps = self.resampled()
        out = []
        for i, least in enumerate(self.least):
            low, high = _quantiles(reps[:, i], self.confidence)
            out.append((high - low) / least if math.isfinite(high) and least > 0 else 0.0)
        return tuple(out)

    @property
    def noisy(self) -> str:
        """Why a load makes this measurement's figures untrustworthy ("" where none does)."""
        return _noisy(self.load, self.wall_clock)

    @property
    def trusted(self) -> bool:
        """Stable, every criterion met, and not taken under a load over the cores."""
        return self.stable and not self.noisy and all(v.met for v in self.verdicts)

    @property
    def untrusted_why(self) -> str:
        """Why it is not trusted ("" where it is)."""
        if self.noisy:
            return self.noisy
        if not self.stable:
            return self.why
        missed = [v for v in self.verdicts if not v.met]
        if missed:
            v = missed[0]
            return f"{v.name}: {v.value:.3g} is not {'at most' if v.at_most else 'at least'} " \
                   f"{v.bound:.3g}"
        return ""

    def judge(self, name: str, figure: Callable[[np.ndarray], np.ndarray], bound: float,
              at_most: bool = True) -> Verdict:
        """The verdict of another figure of these times (a goal judged after measuring)."""
        value = float(figure(np.array(self.least))[()])
        return verdict(name, value, figure(self.resampled()), bound, at_most, self.confidence,
                       self.noisy)

    def to_doc(self) -> dict[str, Any]:
        """What a ``--json`` document or a cache records of the noise."""
        return {"rounds": self.rounds, "stable": self.stable, "why": self.why,
                "spread": [round(s, 4) for s in self.spread], "load": self.load.to_doc()}


def _least(seconds: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(seconds), np.inf, seconds).min(axis=0)


def _states(criteria: Sequence[Criterion], estimates: np.ndarray) -> tuple[bool, ...]:
    out = []
    for c in criteria:
        v = float(c.figure(estimates)[()])
        out.append(v <= c.bound if c.at_most else v >= c.bound)
    return tuple(out)


def _check(criteria: Sequence[Criterion], seconds: np.ndarray, live: Sequence[int],
           rules: Rules, names: Sequence[str]) -> tuple[list[Verdict], str]:
    """The criteria's verdicts on these rounds, and why they are not settled ("" where they
    are)."""
    least = _least(seconds)
    reps = resampled_least(seconds)
    verdicts = [verdict(c.name, float(c.figure(least)[()]), c.figure(reps), c.bound, c.at_most,
                        rules.confidence) for c in criteria]
    if criteria and seconds.shape[0] < FEWEST:  # resamples of one or two rounds show no noise
        why = f"only {seconds.shape[0]} rounds, too few to judge"
        return [dataclasses.replace(v, state=INCONCLUSIVE, why=why) for v in verdicts], \
            f"{verdicts[0].name}: {why}"
    unsure = [v for v in verdicts if not v.conclusive]
    if unsure:
        v = unsure[0]
        return verdicts, f"{v.name}: {v.value:.3g}, but {v.why}"
    if rules.precision is not None:
        for i in live:
            low, high = _quantiles(reps[:, i], rules.confidence)
            width = (high - low) / least[i]
            if width > rules.precision:
                name = names[i] if i < len(names) else f"case {i}"
                return verdicts, f"{name}'s least time is known within {width:.1%}, over " \
                                 f"{rules.precision:.0%}"
    return verdicts, ""


def until_stable(calls: Sequence[Callable[[], float]],
                 criteria: Callable[[np.ndarray], Sequence[Criterion]] | None = None,
                 rules: Rules | None = None, *, key: Callable[[np.ndarray], Hashable] | None = None,
                 warmup: int = 0, alternate: bool = True, wall_clock: bool = True,
                 names: Sequence[str] = (), load: Callable[[], float | None] = load_average,
                 cores: int | None = None, step: Callable[[int], None] | None = None
                 ) -> Measured:
    """Time ``calls`` (each runs once and returns its seconds) in interleaved rounds until the
    measurement is stable (see the module docstring). ``criteria(estimates)`` gives the
    criteria at the current estimates (they may depend on them: the regret of the factor
    chosen now); ``key(estimates)`` is the caller's own decision that must settle too;
    ``names`` name the cases in messages; ``load`` reads the load average (injected by
    tests); ``step(round)`` hears each round end."""
    rules = rules or Rules()
    crit = criteria or (lambda _: ())
    cores = cores or machine_cores()
    before = load()
    # a wall-clock measurement begun under a load over the cores is untrusted however many
    # rounds it takes: it takes its least and stops
    doomed = bool(_noisy(Load(before, None, cores), wall_clock))
    for call in calls:
        for _ in range(warmup):
            call()
    rows: list[list[float]] = []
    live = list(range(len(calls)))
    history: list[Hashable] = []
    spent = 0.0
    verdicts: list[Verdict] = []
    why = "no rounds"
    stable = False
    while True:
        row = [math.nan] * len(calls)
        for i in live[::-1] if alternate and len(rows) % 2 else live:
            took = float(calls[i]())
            row[i] = took
            spent += took
        rows.append(row)
        r = len(rows)
        if step is not None:
            step(r)
        seconds = np.array(rows)
        least = _least(seconds)
        if rules.drop_after is not None and r == rules.drop_after:
            fastest = min(least[i] for i in live)
            live = [i for i in live if least[i] <= rules.drop * fastest]
        now = crit(least)
        history.append((_states(now, least), None if key is None else key(least)))
        out_of_budget = rules.budget_s is not None and spent >= rules.budget_s
        last = r >= rules.max_rounds or (out_of_budget and r >= rules.min_rounds)
        if r >= rules.min_rounds and (_due(r) or last):
            verdicts, why = _check(now, seconds, live, rules, names)
            decides = bool(now) or key is not None  # else there is no decision to settle
            if not why and decides and (len(history) < rules.settle or
                                        len(set(history[-rules.settle:])) > 1):
                why = f"the decision changed within the last {rules.settle} rounds"
            if not why:
                stable = True
                break
            if doomed:
                why = f"not settled after {r} rounds, the least asked for: {why}; no more " \
                      "were timed under a load over the cores"
                break
        if last:
            why = f"not stable after {r} rounds: {why}"
            break
    measured_load = Load(before, load(), cores)
    noisy = _noisy(measured_load, wall_clock)
    if noisy:  # the verdicts say so too: a load over the cores decides none of them
        verdicts = [dataclasses.replace(v, state=INCONCLUSIVE, why=noisy) for v in verdicts]
    return Measured(tuple(tuple(float(v) for v in col) for col in np.array(rows).T),
                    tuple(verdicts), stable, "" if stable else why, measured_load,
                    rules.confidence, wall_clock, tuple(names))


def _noisy(load: Load, wall_clock: bool) -> str:
    if wall_clock and load.over:
        return f"the load average {load.peak:.2f} was over the machine's {load.cores} cores"
    return ""


def _due(r: int) -> bool:
    """Whether round ``r`` ends with a check: every round up to 40, then every twentieth of
    the rounds so far (each check resamples every round)."""
    return r <= 40 or r % max(1, r // 20) == 0


def timed(call: Callable[[], Any], clock: Callable[[], float] = time.perf_counter
          ) -> Callable[[], float]:
    """``call`` as a case: run once, its seconds on ``clock``."""
    def once() -> float:
        start = clock()
        call()
        return clock() - start
    return once


def summary(measured: Sequence[Measured], unit: str = "table") -> str:
    """One line on a suite's measurements (one per ``unit``), the same words however they
    went: the least and most rounds, how many are stable, the widest spread of a least time,
    and the load.

    >>> m = Measured(((1.0, 1.0, 1.0),), (), True, "", Load(0.5, 1.5, 2))
    >>> print(summary([m, m], "shape"))  # doctest: +NORMALIZE_WHITESPACE
    noise: interleaved rounds per shape 3 to 3, 2 of 2 stable, least times within 0.0%;
    load average 0.50 before, 1.50 after, on 2 cores
    """
    if not measured:
        return "noise: nothing measured"
    widest = max((s for m in measured for s in m.spread if math.isfinite(s)), default=0.0)
    rounds = [m.rounds for m in measured]
    stable = sum(m.stable for m in measured)
    return (f"noise: interleaved rounds per {unit} {min(rounds)} to {max(rounds)}, {stable} of "
            f"{len(measured)} stable, least times within {widest:.1%}; "
            f"{Load.across([m.load for m in measured])}")
