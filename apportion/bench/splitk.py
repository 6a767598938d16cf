"""`apportion bench splitk`: the split-K factor each target's resolver picks, and on this machine
which factor is fastest, beside IREE's own compile of the unsplit matmul.

Two tables over ``split_k_shapes_MNK`` of the models file (each ``[M, N, K]``, one matmul
``y[m,n] = x[m,k] @ w[k,n]``):

* **picks**: the factor of K each resolver picks and the op's predicted time: ``spyre`` (the cost
  model's search, float16), ``gpu`` (IREE's GPU heuristic, float16) and ``cpu`` (the stock
  preset on this machine's cores with this host's split table, float32: ``target/host.py``,
  measured on first use and cached per host).
* **measured**: the skinny-output shapes (``M*N <= SKINNY_OUTPUT``; K halved until ``2*M*N*K <=
  MAX_FLOP``, the table says so), each planned in float32 by the stock ``cpu`` target with K
  split into every factor of ``FACTORS`` (pinned with the program's ``split_k``: the plan the
  target runs when its table names that factor), emitted as parallel IR, compiled by IREE
  (cached), checked once against the unplanned program and timed on this machine, in the same
  rounds as IREE's own compile of the unsplit ``linalg.matmul`` (no plan:
  ``workflows/host_splitk.py`` says how: interleaved rounds, warm-up, the least time of each, slow
  factors dropped early), until the shape's goals are settled (``cost/noise.py``: each goal's
  figure met or missed over its whole interval across the resampled rounds, for the last
  rounds; up to a cap). Per shape: the fastest factor, the stock ``cpu`` target's own pick for
  the measured shape (its plan, not a pin), fastest / pick, IREE's unsplit time over the pick's
  (above 1: the plan runs faster than IREE's own compile); a line under the table gives the
  noise (rounds, spread, load average before and after).

Goals (``goals``, checked by ``--check``): on every measured shape the ``cpu`` pick runs within
``GOAL`` of the fastest factor (fastest / pick at least ``GOAL``) and no slower than no split
(beyond ``TOLERANCE``: times within it are the ties the host table's decision counts as equal),
and IREE's output matches the unplanned program for every factor (a mismatch stops the run with
an error naming the shape and factor, ``--check`` or not: it is a wrong result, not a slow
one). A timed goal is met or missed only where its whole interval says so, else inconclusive:
too noisy (``goals.judged``; ``--check`` exit status 3), as it is where the load average went
over the machine's cores.

``frontend/data/cpu_splitk_measurements.json`` holds the CI machine's measurements behind the
shipped table (``target/presets.CPU_SPLIT_K``; ``APPORTION_CPU_SPLIT_K=shipped``), taken with one
core per slice (format ``SHIPPED_FORMAT``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.bench import goals as bench_goals
from apportion.bench.harness import Outcome, Suite, from_models
from apportion.cost import noise
from apportion.errors import PlanningError
from apportion.planned import PlannedProgram, plan
from apportion.target.host import TOLERANCE, host_key
from apportion.target.presets import cpu, gpu, spyre
from apportion.target.target import Target
from apportion.workflows.host_splitk import (
    FACTORS,
    MAX_FLOP,
    REPEATS,
    SKINNY_OUTPUT,
    WARMUP,
    Timed,
    matmul_program,
    measure_shape,
    measured_k,
)

#: the pick's time should be within this fraction of the fastest: fastest / pick >= GOAL
GOAL = 0.9
FORMAT = "apportion.splitk-bench/2"
#: the shipped measurements behind ``CPU_SPLIT_K``
SHIPPED = "data/cpu_splitk_measurements.json"
SHIPPED_FORMAT = "apportion.splitk-measurements/1"


def resolvers() -> dict[str, tuple[Callable[[], Target], str]]:
    """Resolver name -> (its target, the dtype it plans in); ``cpu`` is the stock preset."""
    return {"spyre": (spyre, "float16"), "gpu": (gpu, "float16"), "cpu": (cpu, "float32")}


@dataclass(frozen=True)
class Pick:
    """One resolver's choice for one shape: the factor of K and the op's predicted time."""

    resolver: str
    m: int
    n: int
    k: int
    factor: int
    by: str | None  # who decided (the plan's split_k.by), None: work distribution's search
    predicted_us: float


def split_of(planned: PlannedProgram) -> tuple[int, str | None, float, int]:
    """The matmul's split of K: slices, who decided, predicted time and cores. A split decided
    before work distribution makes the op a partial op and a combine op (both timed); one left
    to the cost model's search stays inside the op ``mm``."""
    names = [o.name for o in planned.ops]
    if "mm.partial" in names:
        partial, combine = planned.op("mm.partial"), planned.op("mm.combine")
        assert partial.split_k is not None
        return (partial.split_k.factor, partial.split_k.by,
                partial.predicted_time_us + combine.predicted_time_us, partial.cores)
    op = planned.op("mm")
    return (op.split_map["k"], op.split_k.by if op.split_k else None, op.predicted_time_us,
            op.cores)


def pick(resolver: str, m: int, n: int, k: int) -> Pick:
    """Plan the matmul for ``resolver``'s target and read its split of K."""
    make, dtype = resolvers()[resolver]
    factor, by, predicted, _ = split_of(plan(matmul_program(m, n, k, dtype), make()))
    return Pick(resolver, m, n, k, factor, by, predicted)


def cpu_pick(m: int, n: int, k: int) -> int:
    """The factor the stock cpu target picks for a float32 matmul."""
    return pick("cpu", m, n, k).factor


@dataclass(frozen=True)
class Verdict:
    """One measured shape: the fastest factor, the cpu pick, no split and IREE's unsplit
    compile (least seconds each)."""

    m: int
    n: int
    k: int
    k_full: int
    fastest: int
    fastest_s: float
    pick: int
    pick_s: float | None  # None: the pick was not measured
    unsplit_s: float
    iree_s: float | None  # None: IREE's own compile not timed

    @property
    def ratio(self) -> float | None:
        """fastest / pick (1: the pick is the fastest)."""
        return None if self.pick_s is None else self.fastest_s / self.pick_s

    @property
    def iree_ratio(self) -> float | None:
        """IREE's unsplit time / the pick's (above 1: the plan runs faster)."""
        return None if self.pick_s is None or self.iree_s is None else self.iree_s / self.pick_s


@dataclass(frozen=True)
class Shape:
    """One measured shape: K as measured and as listed, every way of it timed, and the
    measurement's noise (None: synthetic times, whose rounds are the timed calls in order)."""

    k_full: int
    timed: tuple[Timed, ...]
    measured: noise.Measured | None = None

    @property
    def rounds(self) -> np.ndarray:
        """(rounds, ways) seconds, NaN where a way was not timed."""
        if self.measured is not None:
            return self.measured.array
        longest = max(len(t.seconds) for t in self.timed)
        return np.array([[*t.seconds, *[np.nan] * (longest - len(t.seconds))]
                         for t in self.timed]).T

    @property
    def noisy(self) -> str:
        return "" if self.measured is None else self.measured.noisy


def figures(ways: Sequence[int], pick: int) -> tuple[Callable[[np.ndarray], np.ndarray],
                                                     Callable[[np.ndarray], np.ndarray]] | None:
    """The two timed figures of a shape whose ways are ``ways`` (factors of K, 0: IREE's own
    compile) and whose pick is ``pick``, over least times ``(..., ways)``: fastest / pick, and
    pick / no split (None: the pick is not among the ways).

    >>> ratio, slower = figures([1, 2, 4, 0], 2)
    >>> least = np.array([10.0, 6.0, 5.0, 1.0])
    >>> round(float(ratio(least)), 3), float(slower(least))
    (0.833, 0.6)
    """
    if pick not in ways:
        return None
    split = [i for i, f in enumerate(ways) if f > 0]
    at, one = list(ways).index(pick), list(ways).index(1)
    return (lambda t: t[..., split].min(axis=-1) / t[..., at],
            lambda t: t[..., at] / t[..., one])


def criteria(pick: int) -> Callable[[list[int]], Callable[[np.ndarray],
                                                          list[noise.Criterion]]]:
    """What one shape is timed until it settles: its two goals (``figures``) against their
    bounds."""
    def of(ways: list[int]) -> Callable[[np.ndarray], list[noise.Criterion]]:
        figs = figures(ways, pick)
        found = [] if figs is None else [
            noise.Criterion("fastest / pick", figs[0], GOAL, at_most=False),
            noise.Criterion("pick / no split", figs[1], 1 + TOLERANCE)]
        return lambda _: found
    return of


def verdict(shape: Shape, pick_of: Callable[[int, int, int], int] = cpu_pick) -> Verdict:
    """The shape's verdict; the pick read from ``pick_of(m, n, measured K)``."""
    t0 = shape.timed[0]
    factors = {t.factor: t.least for t in shape.timed if t.factor > 0}
    fastest = min(factors, key=lambda f: factors[f])
    chosen = pick_of(t0.m, t0.n, t0.k)
    iree = next((t.least for t in shape.timed if t.factor == 0), None)
    return Verdict(t0.m, t0.n, t0.k, shape.k_full, fastest, factors[fastest], chosen,
                   factors.get(chosen), factors[1], iree)


def shapes_of(models: dict[str, Any]) -> list[tuple[int, int, int]]:
    rows = models["split_k_shapes_MNK"]
    if not isinstance(rows, list) or not all(
            isinstance(r, list) and len(r) == 3 and all(isinstance(v, int) and v > 0 for v in r)
            for r in rows):
        raise ValueError("split_k_shapes_MNK must be a list of [M, N, K] positive ints")
    return [(m, n, k) for m, n, k in rows]


def run(shapes: Sequence[tuple[int, int, int]], console: Console | None = None,
        factors: Sequence[int] = FACTORS, max_flop: float = MAX_FLOP, warmup: int = WARMUP,
        repeats: int = REPEATS, pick_of: Callable[[int, int, int], int] = cpu_pick
        ) -> tuple[list[Pick], list[Verdict], list[Shape]]:
    """Print the picks table, measure the skinny shapes, print their verdicts."""
    console = console or Console()
    picks, refused = [], []
    for m, n, k in shapes:
        for r in resolvers():
            try:
                picks.append(pick(r, m, n, k))
            except PlanningError as e:  # shown under the table: one resolver's fault
                refused.append(f"{r} cannot plan {m}x{n}x{k}: {e}")
    console.print(picks_table(picks))
    for line in refused:
        console.print(line, style="red", highlight=False, markup=False)
    todo = []
    for m, n, k in shapes:
        kk = measured_k(m, n, k, max_flop)
        if kk is None:
            console.print(f"not measured: {m}x{n}x{k} (output {m * n} > {SKINNY_OUTPUT})",
                          highlight=False)
        else:
            todo.append((m, n, kk, k))
    measured: list[Shape] = []
    # redrawn between steps only: a refresh thread would share the cores being timed
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("measuring", total=len(todo))

        def step(what: str) -> None:
            progress.update(task, description=what)
            progress.refresh()

        for m, n, kk, k in todo:
            timed, noise_ = measure_shape(m, n, kk, factors, warmup, repeats, with_iree=True,
                                          step=step, criteria=criteria(pick_of(m, n, kk)))
            measured.append(Shape(k, tuple(timed), noise_))
            progress.advance(task)
    verdicts = [verdict(s, pick_of) for s in measured]
    if measured:
        console.print(measured_table(measured, verdicts))
        console.print(noise.summary([s.measured for s in measured if s.measured is not None],
                                    "shape"), highlight=False)
        bench_goals.show(goals(verdicts, measured), console)
    return picks, verdicts, measured


def picks_table(picks: Sequence[Pick]) -> Table:
    key = host_key()
    t = Table(title="split-K factor each resolver picks (spyre, gpu: float16; cpu: float32, the "
                    f"stock preset on {key.cores} cores with this host's table) and the op's "
                    "predicted time", title_justify="left")
    t.add_column("M x N x K")
    names = list(dict.fromkeys(p.resolver for p in picks))
    for name in names:
        t.add_column(f"{name} factor", justify="right")
        t.add_column(f"{name} us", justify="right")
    rows: dict[tuple[int, int, int], dict[str, Pick]] = {}
    for p in picks:
        rows.setdefault((p.m, p.n, p.k), {})[p.resolver] = p
    for (m, n, k), by in rows.items():
        cells = []
        for name in names:
            p = by.get(name)
            cells += ["refused", "-"] if p is None else [str(p.factor), f"{p.predicted_us:,.1f}"]
        t.add_row(f"{m} x {n} x {k}", *cells)
    return t


def measured_table(measured: Sequence[Shape], verdicts: Sequence[Verdict]) -> Table:
    factors = sorted({t.factor for s in measured for t in s.timed if t.factor > 0})
    t = Table(title=f"measured on this machine (float32, IREE llvm-cpu, {os.cpu_count()} cores, "
                    "the stock cpu target's plans): least ms per factor of K; IREE's own "
                    "compile of the unsplit matmul", title_justify="left")
    t.add_column("M x N x K")
    for f in factors:
        t.add_column(str(f), justify="right")
    for c in ("IREE", "fastest", "cpu pick", "fastest / pick", "IREE / pick"):
        t.add_column(c, justify="right")
    for s, v in zip(measured, verdicts, strict=True):
        by = {x.factor: x for x in s.timed}
        label = f"{v.m} x {v.n} x {v.k}" + (
            f" (K/{v.k_full // v.k} of {v.k_full})" if v.k != v.k_full else "")
        ratio = "-" if v.ratio is None else (
            f"{v.ratio:.2f}" if v.ratio >= GOAL else f"[red]{v.ratio:.2f}[/red]")
        iree = "-" if v.iree_ratio is None else f"{v.iree_ratio:.2f}"
        t.add_row(label, *(f"{by[f].least * 1e3:.2f}" if f in by else "-" for f in factors),
                  "-" if v.iree_s is None else f"{v.iree_s * 1e3:.2f}",
                  str(v.fastest), str(v.pick), ratio, iree)
    return t


def goals(verdicts: Sequence[Verdict], measured: Sequence[Shape] = ()
          ) -> list[bench_goals.Goal]:
    """The suite's goals over the verdicts (see the module docstring), each judged over the
    resampled rounds of ``measured`` (the shapes, in the verdicts' order; none: exact
    figures) and inconclusive where a shape was timed under a load over the cores; given
    ``measured``, also the goal that every way's output matched (they are checked as they are
    prepared, so a mismatch stops the run before it is timed)."""
    out = []
    what = f"the cpu pick runs within {GOAL:.0%} of the fastest factor (worst fastest / pick)"
    unmeasured = [f"{v.m}x{v.n}x{v.k} (pick {v.pick})" for v in verdicts if v.ratio is None]
    if unmeasured:
        out.append(bench_goals.count(f"{what}: the pick measured", unmeasured, len(verdicts)))
    shapes = list(measured) if measured else [None] * len(verdicts)
    timed = [(v, s) for v, s in zip(verdicts, shapes, strict=True) if v.ratio is not None]
    if timed:
        ratios, slowers = [], []
        for v, s in timed:
            if s is None:  # exact figures
                ratios.append(np.array([v.ratio]))
                slowers.append(np.array([(v.pick_s or 0) / v.unsplit_s]))
                continue
            figs = figures([t.factor for t in s.timed], v.pick)
            assert figs is not None
            reps = noise.resampled_least(s.rounds)
            ratios.append(figs[0](reps))
            slowers.append(figs[1](reps))
        noisy = next((s.noisy for _, s in timed if s is not None and s.noisy), "")
        worst = min(timed, key=lambda vs: vs[0].ratio or 0.0)[0]
        ratio = noise.verdict("fastest / pick", worst.ratio or 0.0, np.min(ratios, axis=0),
                              GOAL, at_most=False, noisy=noisy)
        out.append(bench_goals.judged(
            what, ratio, "{:.2f}",
            f"{worst.m}x{worst.n}x{worst.k}: pick {worst.pick}, fastest {worst.fastest}; "
            f"{sum((v.ratio or 0.0) >= GOAL for v, _ in timed)} of {len(timed)} shapes within"))
        slow = max(timed, key=lambda vs: (vs[0].pick_s or 0) / vs[0].unsplit_s)[0]
        slower = noise.verdict("pick / no split", (slow.pick_s or 0) / slow.unsplit_s,
                               np.max(slowers, axis=0), 1 + TOLERANCE, noisy=noisy)
        out.append(bench_goals.judged(
            f"the cpu pick is no slower than no split (beyond {TOLERANCE:.0%}, a tie; worst "
            "pick / no split)", slower, "{:.2f}",
            f"{slow.m}x{slow.n}x{slow.k}: split {slow.pick} {(slow.pick_s or 0) * 1e3:.2f} ms, "
            f"no split {slow.unsplit_s * 1e3:.2f} ms"))
    if measured:
        ways = [t for s in measured for t in s.timed]
        out.append(bench_goals.count(
            "IREE's output matches the unplanned program for every factor", [], len(ways)))
    return out


def to_doc(verdicts: Sequence[Verdict], measured: Sequence[Shape]) -> dict[str, Any]:
    key = host_key()
    return {"format": FORMAT,
            "host": {"cpu": key.model, "cores": key.cores, "iree": key.iree},
            "goal": GOAL, "verdicts": [asdict(v) for v in verdicts],
            "shapes": [{"k_full": s.k_full, "timed": [asdict(t) for t in s.timed],
                        "noise": None if s.measured is None else s.measured.to_doc()}
                       for s in measured]}


@dataclass(frozen=True)
class Measurement:
    """One factor of one shape in the shipped measurements (``SHIPPED_FORMAT``: one core per
    slice, on the CI machine): K as measured, ``k_full`` as listed, the median of the calls."""

    m: int
    n: int
    k: int
    k_full: int
    factor: int
    median_s: float
    check_ok: bool


def shipped() -> list[Measurement]:
    """The measurements behind ``CPU_SPLIT_K`` (``frontend/data/cpu_splitk_measurements.json``)."""
    doc = json.loads(resources.files("apportion.frontend").joinpath(SHIPPED).read_text())
    assert doc["format"] == SHIPPED_FORMAT
    return [Measurement(r["m"], r["n"], r["k"], r["k_full"], r["factor"], r["median_s"],
                        r["check_ok"]) for r in doc["measurements"]]


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    from apportion.frontend.models import load_models

    found = from_models(args.models, lambda: shapes_of(load_models(args.models)))[:args.limit]
    _, verdicts, measured = run(found, console)
    return Outcome(to_doc(verdicts, measured), goals(verdicts, measured))


SUITE = Suite("splitk", frozenset({"models"}),
              "each resolver's split-K pick, and the skinny shapes' factors timed in IREE beside "
              "IREE's own unsplit compile", _suite)
