"""`apportion bench costmodel`: the cost model against measured kernel times.

For a device target (default ``spyre``): one row per measured shape of a measurements file
(default: the packaged measurements of the target): the measured-best split and its time, the
split ``balanced`` picks, the predicted time of both, and the rank of the measured-best split
among every feasible candidate split (1 + the candidates predicted faster or exactly as fast:
a tie counts against the model). Then the same shapes left out: for each shape, the target's
default fit (``cost/calibrate.py``'s ``DEFAULT_FIT``) of every other shape's records predicts
it, an honest test of the model on a shape it was not fitted to; a shape with only one measured
split is flagged (nothing measured shows its split is the fastest).

For the ``cpu`` target: a set of matmul, norm (mean then mul) and MLP programs planned for this
machine and run one thread per core (numpy's BLAS on one thread), timed as ``apportion calibrate
--measure`` times its kernels: the programs of a core count in interleaved rounds
(``cost/noise.py``: each program once per round, in reverse order every other round), one
warm-up run each, at least ``MIN_ROUNDS`` rounds and more until the goal's worst factor is
settled (met or missed over its whole interval across the resampled rounds), up to
``MAX_ROUNDS``; each program's fastest run is its measured time (load elsewhere only lengthens a
run), set against its predicted time (the sum of its ops'), and a line under the table gives the
noise (rounds, spread, load average before and after). Both sections print the geometric mean of
predicted over measured time.

Goals (``goals``, checked by ``--check``): for measured kernels, the measured-best split ranks
first among the candidates by predicted time on every shape (``balanced`` would pick it), and
its predicted time is within ``SHAPE_ERROR_GOAL`` of the measured one (the bound
``tests/passes/test_measured_shapes.py`` holds Spyre to), both under the target as given and
with each shape left out of the fit; for the programs timed here, every predicted time is within
a factor ``PROGRAM_FACTOR_GOAL`` of the measured one either way, judged over the resampled rounds:
inconclusive (too noisy, ``--check`` exit status 3) where the worst factor's interval holds the
goal or the load average went over the machine's cores.

The leave-one-out fit of the cpu measurements (ten coefficients of a model with kinks, some of
them tied) ends at points that differ with the last bits of the arithmetic, so on another CPU
or BLAS build its near ties may rank and its errors fall differently (``cost/calibrate.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.bench import goals as bench_goals
from apportion.bench.harness import Outcome, Suite
from apportion.cost import noise
from apportion.cost.calibrate import by_shape, default_fit, split_text
from apportion.cost.timing import until_stable
from apportion.errors import UsageError
from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program
from apportion.report.tables import predicted_total_us
from apportion.target.target import Target
from apportion.workflows.calibration import (
    ShapeCheck,
    best_records,
    check_table,
    geometric_mean,
    load,
    one_blas_thread,
    packaged_path,
    rank_split,
    shape_checks,
    with_cores,
)

#: a measured kernel's predicted time within this fraction of its measured time
SHAPE_ERROR_GOAL = 0.30
#: a program timed on this machine: predicted within this factor of measured, either way (the
#: cpu model is a coarse roofline fitted on a 2-core machine; it plans, it does not forecast)
PROGRAM_FACTOR_GOAL = 1.5
#: timed rounds of a core count's programs: at least MIN_ROUNDS, at most MAX_ROUNDS
MIN_ROUNDS, MAX_ROUNDS = 5, 30


@dataclass(frozen=True)
class ShapeRow:
    """One measured shape: the measured-best split against the model's choice."""

    shape: str
    cores: int
    measured_split: dict[str, int]
    measured_us: float
    predicted_us: float  # the measured-best split's predicted time
    balanced_split: dict[str, int]
    balanced_us: float  # predicted
    rank: int  # 1 + candidates predicted faster or as fast
    candidates: int
    measured: int = 0  # splits measured for the shape
    tied: int = 0  # candidates predicted exactly as fast as the measured best


@dataclass(frozen=True)
class ProgramRow:
    """One program planned for this machine and run: predicted vs measured (its fastest run
    over ``rounds`` interleaved rounds, known within ``spread``: its interval's width over
    it)."""

    program: str
    cores: int
    predicted_us: float
    measured_us: float
    rounds: int = 1
    spread: float = 0.0

    @property
    def factor(self) -> float:
        """Predicted over measured or measured over predicted, whichever is at least 1."""
        return max(self.predicted_us / self.measured_us, self.measured_us / self.predicted_us)


def shape_rows(target: Target, measurements_path: str | Path) -> list[ShapeRow]:
    """One row per measured shape: its measured-best split under ``target``."""
    records = load(measurements_path)
    groups = by_shape(records)
    rows = []
    for m in best_records(records):
        r = rank_split(target, m)
        rows.append(ShapeRow(m.shape, m.cores, dict(m.splits), m.time_us, r.predicted_us,
                             r.pick, r.pick_us, r.rank, r.candidates, len(groups[m.key]),
                             r.tied))
    return rows


def shape_table(rows: Sequence[ShapeRow], label: str, source: str) -> Table:
    t = Table(title=f"cost model of {label} against measured kernels ({source})",
              title_justify="left")
    for col in ("shape", "cores", "splits measured", "measured best", "measured us",
                "predicted us", "error", "balanced picks", "its predicted us", "rank of best"):
        t.add_column(col, justify="left" if col in ("shape", "measured best",
                                                      "balanced picks") else "right")
    for r in rows:
        t.add_row(r.shape, str(r.cores), f"{r.measured}{' (only one)' if r.measured == 1 else ''}",
                  split_text(r.measured_split), f"{r.measured_us:.1f}",
                  f"{r.predicted_us:.1f}", f"{r.predicted_us / r.measured_us - 1:+.1%}",
                  split_text(r.balanced_split), f"{r.balanced_us:.1f}",
                  f"{r.rank} of {r.candidates}")
    return t


def _doc(name: str, tensors: dict[str, list[int]], ops: list[dict[str, Any]],
         outputs: list[str], dtype: str) -> dict[str, Any]:
    return {"format": "apportion.program/1", "name": name,
            "tensors": {t: {"shape": s, "dtype": dtype} for t, s in tensors.items()},
            "inputs": list(tensors), "outputs": outputs, "ops": ops}


def cpu_programs(dtype: str = "float32") -> list[Program]:
    """The programs the cpu section plans and runs: matmuls, a norm (mean then mul), an MLP."""
    def op(name: str, fn: str, out: str, *ins: str) -> dict[str, Any]:
        return {"name": name, "op": fn, "out": out, "ins": list(ins)}

    def mm(m: int, k: int, n: int) -> dict[str, Any]:
        return _doc(f"matmul_{m}x{k}x{n}", {"x": [m, k], "w": [k, n]},
                    [op("mm", "matmul", "y[m,n]", "x[m,k]", "w[k,n]")], ["y"], dtype)

    def norm(t: int, h: int) -> dict[str, Any]:
        return _doc(f"norm_{t}x{h}", {"x": [t, h]},
                    [op("mean", "mean", "r[t,0]", "x[t,n]"),
                     op("scale", "mul", "y[t,n]", "x[t,n]", "r[t,0]")], ["y"], dtype)

    def mlp(t: int, h: int, f: int) -> dict[str, Any]:
        return _doc(f"mlp_{t}x{h}x{f}", {"x": [t, h], "wg": [h, f], "wu": [h, f], "wd": [f, h]},
                    [op("gate", "matmul", "g[m,n]", "x[m,k]", "wg[k,n]"),
                     op("up", "matmul", "u[m,n]", "x[m,k]", "wu[k,n]"),
                     op("act", "silu", "a[m,n]", "g[m,n]"),
                     op("glu", "mul", "hh[m,n]", "a[m,n]", "u[m,n]"),
                     op("down", "matmul", "y[m,n]", "hh[m,k]", "wd[k,n]")], ["y"], dtype)

    docs = [mm(512, 1024, 1024), mm(256, 2048, 512), norm(2048, 1024), norm(512, 4096),
            mlp(128, 1024, 2816), mlp(256, 512, 1408)]
    return [from_dict(d) for d in docs]


def factor_criterion(predicted_us: Sequence[float]) -> noise.Criterion:
    """The goal's figure over one core count's programs (the cases, in order, predicted
    ``predicted_us``): the worst factor between predicted and measured time, either way, at
    most ``PROGRAM_FACTOR_GOAL``.

    >>> c = factor_criterion([100.0, 300.0])
    >>> round(float(c.figure(np.array([200e-6, 250e-6]))), 6)  # 100 us run in 200: 2x
    2.0
    """
    predicted = np.array(predicted_us, dtype=float) * 1e-6  # the cases are timed in seconds

    def worst(t: np.ndarray) -> np.ndarray:
        ratio = predicted / t
        return np.maximum(ratio, 1 / ratio).max(axis=-1)

    return noise.Criterion("worst factor predicted/measured", worst, PROGRAM_FACTOR_GOAL)


def program_rows(target: Target, cores: Sequence[int], programs: Sequence[Program],
                 console: Console, min_rounds: int = MIN_ROUNDS,
                 load: Callable[[], float | None] = noise.load_average
                 ) -> tuple[list[ProgramRow], list[noise.Measured]]:
    """Each program planned for ``target`` at each core count and run one thread per core on
    fixed random inputs, a core count's programs timed in interleaved rounds until the goal's
    worst factor is settled; the rows and each core count's measurement (its noise)."""
    from apportion.planned import plan
    from apportion.runtime import random_inputs

    rows: list[ProgramRow] = []
    measured: list[noise.Measured] = []
    rules = noise.Rules(min_rounds=min_rounds, max_rounds=max(min_rounds, MAX_ROUNDS))
    # redrawn between core counts only: a refresh thread would share the cores being timed
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("timing programs", total=len(cores))
        for n in cores:
            t = with_cores(target, n)
            progress.update(task, description=f"timing {len(programs)} programs on {n} cores "
                            "in rounds, until settled")
            progress.refresh()
            planned = [plan(p, t) for p in programs]
            inputs = [random_inputs(p, 0) for p in programs]
            predicted = [predicted_total_us(pp.plan)[0] for pp in planned]
            calls = [lambda pp=pp, x=x, n=n: pp.run(x, threads=n)
                     for pp, x in zip(planned, inputs, strict=True)]
            with one_blas_thread():  # one core of the plan is one thread
                timings, m = until_stable(calls, rules, lambda _, p=predicted:
                                          [factor_criterion(p)], warmup=1,
                                          names=[p.name for p in programs], load=load)
            measured.append(m)
            rows += [ProgramRow(p.name, n, us, timing.min * 1e6, m.rounds, spread)
                     for p, us, timing, spread in zip(programs, predicted, timings, m.spread,
                                                      strict=True)]
            progress.advance(task)
    return rows, measured


def program_table(rows: Sequence[ProgramRow], label: str) -> Table:
    t = Table(title=f"cost model of {label} against planned runs on this machine (one "
              "thread per core)", title_justify="left")
    for col in ("program", "cores", "predicted us", "measured us", "predicted/measured"):
        t.add_column(col, justify="left" if col == "program" else "right")
    for r in rows:
        t.add_row(r.program, str(r.cores), f"{r.predicted_us:.1f}", f"{r.measured_us:.1f}",
                  f"{r.predicted_us / r.measured_us:.2f}")
    return t


def run(target: Target, measurements: str | None = None, cores: Sequence[int] | None = None,
        limit: int | None = None, console: Console | None = None,
        label: str | None = None) -> tuple[list[Any], list[noise.Measured]]:
    """Run the benchmark and print its table(s); returns every row and the measurement of each
    core count's programs (none off a ``cpu`` target).

    A host target (``Target.host``: the cpu preset, or a file from it) runs the cpu section
    (``cores``: core counts, default all of this machine's; ``limit``: only the first N
    programs), plus the table of ``measurements`` when given; any other target the measurements
    table (default: the packaged Spyre file). ``label`` names the target in the titles
    (default: its name).
    """
    console = console or Console()
    label = label or target.name
    results: list[Any] = []
    measured: list[noise.Measured] = []
    cpu = target.host  # timed on this machine
    path = measurements if measurements is not None else \
        str(packaged_path("cpu" if cpu else "spyre"))
    if path is not None:
        rows = shape_rows(target, path)
        source = Path(path).name
        console.print(shape_table(rows, label, source))
        console.print(f"geometric mean of predicted/measured: "
                      f"{geometric_mean([r.predicted_us / r.measured_us for r in rows]):.3f}; "
                      f"measured-best split ranked first on {sum(r.rank == 1 for r in rows)} of "
                      f"{len(rows)} shapes (ties counted against the model)", highlight=False)
        checks = left_out(target, path, rows, console)
        bench_goals.show(shape_goals(rows) + check_goals(checks), console)
        results += rows + checks
    if cpu:
        counts = list(cores or [os.cpu_count() or 1])
        rows_p, measured = program_rows(target, counts, cpu_programs()[:limit], console)
        console.print(program_table(rows_p, label))
        console.print(f"geometric mean of predicted/measured: "
                      f"{geometric_mean([r.predicted_us / r.measured_us for r in rows_p]):.3f}",
                      highlight=False)
        console.print(noise.summary(measured, "core count"), highlight=False)
        bench_goals.show(program_goals(rows_p, measured), console)
        results += rows_p
    return results, measured


def left_out(target: Target, path: str, rows: Sequence[ShapeRow], console: Console
             ) -> list[ShapeCheck]:
    """Each shape predicted by the target's default fit of the other shapes (printed), or
    nothing (said) where the file has one shape."""
    if len(rows) < 2:
        console.print("leave-one-out: the measurements hold one shape; nothing is left to fit "
                      "without it", highlight=False)
        return []
    names = default_fit(target)
    checks = shape_checks(load(path), target, target, names, console)
    console.print(check_table(checks, f"each shape left out: {', '.join(names)} of "
                              f"{target.name} fitted to the other shapes' records",
                              SHAPE_ERROR_GOAL))
    single = sum(c.single for c in checks)
    console.print(f"left out: the fastest split picked on {sum(c.rank == 1 for c in checks)} "
                  f"of {len(checks)} shapes, time within {SHAPE_ERROR_GOAL:.0%} on "
                  f"{sum(abs(c.loo_error) <= SHAPE_ERROR_GOAL for c in checks)}; {single} "
                  f"shape(s) with only one measured split", highlight=False)
    return checks


def check_goals(checks: Sequence[ShapeCheck]) -> list[bench_goals.Goal]:
    """The goals of the left-out shapes: each one's fastest split picked and its time within
    ``SHAPE_ERROR_GOAL`` by the fit that did not see it."""
    if not checks:
        return []
    worst = max(checks, key=lambda c: abs(c.loo_error))
    return [
        bench_goals.count("left out of the fit, the measured-best split ranks first",
                          [f"{c.shape}@{c.cores} ranks {c.rank} of {c.candidates} (balanced "
                           f"picks {split_text(c.pick)})" for c in checks if c.rank != 1],
                          len(checks)),
        bench_goals.at_most(f"left out of the fit, predicted within {SHAPE_ERROR_GOAL:.0%} of "
                            "measured (worst |error|)", abs(worst.loo_error), SHAPE_ERROR_GOAL,
                            "{:.1%}", f"{worst.shape}@{worst.cores}"),
    ]


def shape_goals(rows: Sequence[ShapeRow]) -> list[bench_goals.Goal]:
    """The goals of the measured-kernels table (see the module's docstring)."""
    if not rows:
        return []
    worst = max(rows, key=lambda r: abs(r.predicted_us / r.measured_us - 1))
    return [
        bench_goals.count("the measured-best split ranks first by predicted time",
                          [f"{r.shape}@{r.cores} ranks {r.rank} of {r.candidates}"
                           for r in rows if r.rank != 1], len(rows)),
        bench_goals.at_most(f"predicted time of the measured-best split within "
                            f"{SHAPE_ERROR_GOAL:.0%} of measured (worst |error|)",
                            abs(worst.predicted_us / worst.measured_us - 1), SHAPE_ERROR_GOAL,
                            "{:.1%}", f"{worst.shape}@{worst.cores}"),
    ]


def program_goals(rows: Sequence[ProgramRow], measured: Sequence[noise.Measured] = ()
                  ) -> list[bench_goals.Goal]:
    """The goal of the programs timed on this machine (see the module's docstring), judged
    over each core count's resampled rounds (``measured``, in the order of the rows' core
    counts; none: the rows' times are exact figures)."""
    if not rows:
        return []
    worst = max(rows, key=lambda r: r.factor)
    if measured:
        counts = list(dict.fromkeys(r.cores for r in rows))
        samples = np.max([factor_criterion([r.predicted_us for r in rows if r.cores == n])
                          .figure(m.resampled())
                          for n, m in zip(counts, measured, strict=True)], axis=0)
    else:
        samples = np.array([worst.factor])
    noisy = next((m.noisy for m in measured if m.noisy), "")
    v = noise.verdict("worst factor predicted/measured", worst.factor, samples,
                      PROGRAM_FACTOR_GOAL, noisy=noisy)
    return [bench_goals.judged(
        f"predicted time within a factor {PROGRAM_FACTOR_GOAL:g} of measured on every "
        f"program (worst factor)", v, "{:.2f}x",
        f"{worst.program}@{worst.cores}: predicted/measured "
        f"{worst.predicted_us / worst.measured_us:.2f}")]


def goals(rows: Sequence[Any], measured: Sequence[noise.Measured] = ()
          ) -> list[bench_goals.Goal]:
    """Every goal over ``run``'s rows (measured kernels and programs timed here), the
    programs' judged over ``measured`` (``run``'s measurements)."""
    return (shape_goals([r for r in rows if isinstance(r, ShapeRow)])
            + check_goals([r for r in rows if isinstance(r, ShapeCheck)])
            + program_goals([r for r in rows if isinstance(r, ProgramRow)], measured))


def check_options(target: Target, cores: Sequence[int] | None, limit: int | None) -> None:
    """Refuse ``--cores`` and ``--limit`` where ``run`` would drop them (they pick the programs
    timed on a host target, the cpu preset's), and core counts this machine lacks: a plan for
    more cores than it has is not timed as that plan."""
    if not target.host:
        flag = "--cores" if cores else "--limit" if limit is not None else None
        if flag is not None:
            raise UsageError(f"{flag} applies to bench costmodel --target cpu (programs timed on "
                             f"this machine); target {target.name!r} is compared with its "
                             "measured kernels")
        return
    n = os.cpu_count() or 1
    over = [c for c in cores or () if c > n]
    if over:
        raise UsageError(f"--cores {over[0]}: bench costmodel --target cpu times programs on "
                         f"this machine, which has {n} cores")


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    from apportion.target.presets import resolve

    target = resolve(args.target or "spyre")
    check_options(target, args.cores, args.limit)
    results, measured = run(target, args.measurements, args.cores, args.limit, console,
                            label=args.target)
    noise_of = dict(zip(dict.fromkeys(r.cores for r in results if isinstance(r, ProgramRow)),
                        measured, strict=True))
    return Outcome([dataclasses.asdict(r) | ({"noise": noise_of[r.cores].to_doc()}
                                             if isinstance(r, ProgramRow) else {})
                    for r in results], goals(results, measured))


SUITE = Suite("costmodel", frozenset({"cores", "measurements", "target"}),
              "the cost model against measured kernels or against planned runs on this machine",
              _suite)
