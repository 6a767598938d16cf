"""What ``apportion calibrate`` does (the command is ``cli/calibrate.py``): kernels timed on this
machine, each record's predicted time and rank among the splits ``balanced`` searches, and each
shape left out of the fit in turn, to fit the cost model's coefficients to measured kernel times.

Two sources of measurements:

* a measurements file (``apportion/cost/calibrate.py`` describes the format; the Spyre
  measurements ship as ``frontend/data/spyre_measurements.json``);
* ``--measure``: kernels timed on this machine with the planned executor, one thread per core:
  every split ``balanced`` searches (1 up to all the cores: none, m, n and k of a matmul on two
  cores) of matmuls, pointwise exp and mul and sum reductions, a kernel's splits timed in
  interleaved rounds, the way ``apportion/frontend/data/cpu_measurements.json`` was made. The
  rounds go on until the kernel's fastest split is settled and every split's least time is
  known within ``PRECISION`` (``cost/noise.py``; ``REPEATS`` to ``MAX_REPEATS`` rounds); each
  record keeps its rounds, spread and the load average. Measurements that could not be trusted
  (a kernel not settled, or the load average over the machine's cores) are fitted and shown,
  and saved with ``--save`` (their noise recorded), but no fitted target is written from them:
  the command says why and exits with status 3 (``INCONCLUSIVE``). Only a cpu target can be
  measured here, on at most this machine's cores.

The model's prediction of a record is the op's ``OpContext.time_us`` under the record's split
(``predictor``); the fit itself lives in the cost layer. After the fit, each record marked
``best`` is checked against the search ``balanced`` makes: the rank of the measured-best split
among every feasible candidate split, by the fitted model's predicted time, a tie counting
against the model (``rank_split``). Then each shape is left out in turn: the same coefficients
fitted to the other shapes' records predict it (``shape_checks``), and the table says where the
fastest split is missed, the time is off by more than 30%, or only one split was measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.cost import noise
from apportion.cost.calibrate import (
    Measurement,
    Predictor,
    by_shape,
    matmul_document,
    read_measurements,
    split_text,
)
from apportion.errors import CalibrationError
from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program
from apportion.passes.geometry import OpContext
from apportion.passes.layouts import layouts
from apportion.passes.work_distribution import candidates, ranked
from apportion.target.host import REGRET, TOLERANCE
from apportion.target.target import Target

#: a shape left out of the fit is predicted within this fraction of its measured time
LOO_ERROR_GOAL = 0.30
#: the packaged measurements, by preset name
PACKAGED = {"spyre": "data/spyre_measurements.json", "cpu": "data/cpu_measurements.json"}
#: ``--measure``: a kernel's splits are timed at least REPEATS rounds, at most MAX_REPEATS
REPEATS, MAX_REPEATS = 7, 40
#: ``--measure``: every split's least time known within this fraction of it
PRECISION = 0.10
#: the exit status of ``calibrate --measure`` on measurements that could not be trusted
INCONCLUSIVE = 3


def packaged_path(preset: str) -> Path:
    """The packaged measurements file of ``preset``."""
    return Path(str(resources.files("apportion.frontend").joinpath(PACKAGED[preset])))


def load(path: str | Path) -> tuple[Measurement, ...]:
    """The records of a measurements file (program documents read as program format v1)."""
    return read_measurements(path, from_dict)


# --- the model's view of a record ----------------------------------------------------------------

def record_target(target: Target, m: Measurement) -> Target:
    """``target`` with the record's core count. A host target's ``max_cores`` (the cpu
    preset's) is this machine's core count, so a record timed on a bigger machine widens it;
    any other target's ``max_cores`` is a limit of the device."""
    if target.cores == m.cores:
        return target
    top = max(target.max_cores, m.cores) if target.host else target.max_cores
    if m.cores > top:
        raise CalibrationError(f"field 'cores' {m.cores} is more than the {top} cores "
                               f"(max_cores) of target {target.name!r} ({m.shape})")
    return replace(target, cores=m.cores, max_cores=top)


def context(target: Target, m: Measurement, cache: dict[Any, Any] | None = None) -> OpContext:
    """The OpContext of the measured op on ``target`` with the record's core count."""
    t = record_target(target, m)
    key = (id(m), t.stick_bytes, t.layout)
    hit = None if cache is None else cache.get(key)
    if hit is None or hit[0] is not m:
        lay = layouts(m.program, t)
        hit = (m, lay.ops[m.op], lay.tensors)
        if cache is not None:
            cache[key] = hit
    op = m.program.op(m.op)
    return OpContext(op, m.program, t, hit[1], hit[2], dict(op.sizes))


def predictor() -> Predictor:
    """``predict(target, measurement)``: the model's time of the record's op and split (device
    layouts cached per record: they depend on the stick size, not on the fitted figures)."""
    cache: dict[Any, Any] = {}

    def predict(target: Target, m: Measurement) -> float:
        return context(target, m, cache).time_us(dict(m.splits))

    return predict


@dataclass(frozen=True)
class Rank:
    """Where the measured-best split of a record stands in ``balanced``'s search."""

    measurement: Measurement
    rank: int  # 1 + candidates predicted faster or as fast (ties count against the model)
    candidates: int  # feasible candidate splits searched
    predicted_us: float  # the measured-best split's predicted time
    pick: dict[str, int]  # the split balanced picks
    pick_us: float
    tied: int = 0  # other candidates predicted exactly as fast

    @property
    def first(self) -> bool:
        return self.rank == 1


#: two predicted times this close (relative) are a tie
TIE = 1e-9


def rank_split(target: Target, m: Measurement) -> Rank:
    """The rank of ``m``'s split among every feasible split ``balanced`` searches, by predicted
    time: 1 + the number of other candidates predicted faster or exactly as fast. A tie counts
    against the model: a model that cannot tell the measured best from another split has not
    picked it (balanced's tie-break is not a prediction).

    >>> from apportion.target import spyre
    >>> m = load(packaged_path("spyre"))[0]
    >>> rank_split(spyre(), m).rank
    1
    """
    ctx = context(target, m)
    ones = {d: 1 for d in ctx.sizes}
    mine_split = dict(m.splits)
    others = [ctx.time_us(s) for s in candidates(ctx, ones)
              if s != mine_split and ctx.feasible(s)]
    mine = ctx.time_us(mine_split)
    faster = sum(t < mine * (1 - TIE) for t in others)
    tied = sum(abs(t - mine) <= mine * TIE for t in others)
    best = ranked(ctx, ones, 1)
    pick = best[0] if best else mine_split
    return Rank(m, 1 + faster + tied, len(others) + 1, mine, pick, ctx.time_us(pick), tied)


def best_records(measurements: Sequence[Measurement]) -> list[Measurement]:
    """The measured-best record of each shape: the one marked ``best``, else the fastest."""
    by_shape: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        by_shape.setdefault((m.shape, m.cores), []).append(m)
    out = []
    for group in by_shape.values():
        marked = [m for m in group if m.best]
        out += marked or [min(group, key=lambda m: m.time_us)]
    return out


@dataclass(frozen=True)
class ShapeCheck:
    """One measured shape against the model: its measured-best record predicted by the model
    that was fitted with it (``model_us``) and by a fit that never saw the shape (leave one
    out: ``loo_us``, and the rank and pick of that fit's search)."""

    shape: str
    cores: int
    measured: int  # splits measured for the shape
    best_split: dict[str, int]
    measured_us: float
    model_us: float  # predicted by the model fitted with every shape
    model_rank: int
    loo_us: float  # predicted by the fit without this shape
    rank: int  # of the measured best in the leave-one-out fit's search, ties against it
    candidates: int
    tied: int
    pick: dict[str, int]  # the split balanced picks under the leave-one-out fit
    pick_us: float

    @property
    def loo_error(self) -> float:
        """Leave-one-out predicted / measured - 1."""
        return self.loo_us / self.measured_us - 1

    @property
    def single(self) -> bool:
        """Only one split of the shape was measured: nothing measured shows it is the fastest,
        so its rank tests the model against the record's claim, not against a measurement."""
        return self.measured == 1

    def missed(self, error_goal: float) -> bool:
        """The leave-one-out fit does not pick the measured best or is off by more than
        ``error_goal``."""
        return self.rank != 1 or abs(self.loo_error) > error_goal


def shape_checks(measurements: Sequence[Measurement], target: Target, base: Target,
                 names: Sequence[str], console: Console | None = None) -> list[ShapeCheck]:
    """Every shape of ``measurements`` checked: ``target`` (the model fitted with them all)
    and, for each shape, ``names`` of ``base`` fitted to the other shapes' records."""
    from apportion.cost.calibrate import leave_one_out

    predict = predictor()
    groups = by_shape(measurements)
    best = {m.key: m for m in best_records(measurements)}
    with Progress(console=console or Console(), transient=True) as progress:
        task = progress.add_task("leave one out", total=len(groups))

        def step(key: tuple[str, int]) -> None:
            progress.update(task, description=f"fitting without {key[0]} on {key[1]} cores")
            progress.advance(task)

        held = leave_one_out(measurements, base, predict, names, progress=step)
    out = []
    for h in held:
        m = best[h.key]
        r = rank_split(h.calibration.target, m)
        full = rank_split(target, m)
        out.append(ShapeCheck(m.shape, m.cores, len(groups[h.key]), dict(m.splits), m.time_us,
                              full.predicted_us, full.rank, r.predicted_us, r.rank,
                              r.candidates, r.tied, r.pick, r.pick_us))
    return out


def check_table(rows: Sequence[ShapeCheck], title: str, error_goal: float) -> Table:
    """The leave-one-out table: each shape predicted by a fit that did not see it. Its notes:
    a shape with one measured split (nothing measured can beat it: its rank is untested by the
    device), splits tied with the measured best (ranked ahead of it), a miss."""
    t = Table(title=title, title_justify="left")
    for col in ("shape", "cores", "splits", "measured best", "measured us", "model us",
                "left out: us", "error", "balanced picks", "rank", "note"):
        t.add_column(col, justify="left" if col in ("shape", "measured best", "balanced picks",
                                                      "note") else "right",
                     no_wrap=col != "note")
    for r in rows:
        note = []
        if r.single:
            note.append("only split measured")
        if r.tied:
            note.append(f"{r.tied} tied, ranked ahead")
        if r.missed(error_goal):
            note.append("MISS")
        t.add_row(r.shape, str(r.cores), str(r.measured), split_text(r.best_split),
                  f"{r.measured_us:.1f}", f"{r.model_us:.1f}", f"{r.loo_us:.1f}",
                  f"{r.loo_error:+.1%}", split_text(r.pick), f"{r.rank} of {r.candidates}",
                  "; ".join(note))
    return t


# --- timing on this machine ----------------------------------------------------------------------

def _openblas() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """Get and set the thread count of numpy's bundled OpenBLAS, or None where there is none."""
    import ctypes

    import numpy

    for lib_path in sorted(Path(numpy.__file__).parent.parent.glob("numpy.libs/*openblas*")):
        try:
            lib = ctypes.CDLL(str(lib_path))  # already loaded by numpy: the same library
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas_", "64_"), ("scipy_openblas_", ""),
                               ("openblas_", "64_"), ("openblas_", "")):
            get = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
            if get is not None and put is not None:
                put.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
                return get, put
    return None


@contextmanager
def one_blas_thread() -> Iterator[bool]:
    """numpy's OpenBLAS on one thread inside the block: one core of the plan is one thread, and
    a matmul that spread over every core by itself would time the machine, not the core. Yields
    False where the thread count cannot be set (no bundled OpenBLAS)."""
    blas = _openblas()
    if blas is None:
        yield False
        return
    get, put = blas
    before = get()
    put(1)
    try:
        yield True
    finally:
        put(before)


def pointwise_document(fn: str, m: int, n: int, dtype: str) -> dict[str, Any]:
    """``y[m,n] = fn(x[m,n])`` (or ``fn(x, z)`` for a binary ``fn`` such as mul)."""
    ins = ["x[m,n]", "z[m,n]"] if fn == "mul" else ["x[m,n]"]
    tensors = {a[0]: {"shape": [m, n], "dtype": dtype} for a in ins}
    return {"format": "apportion.program/1", "name": f"{fn}_{m}x{n}", "tensors": tensors,
            "inputs": list(tensors), "outputs": ["y"],
            "ops": [{"name": fn, "op": fn, "out": "y[m,n]", "ins": ins}]}


def reduction_document(fn: str, m: int, n: int, dtype: str) -> dict[str, Any]:
    """``y[m,0] = fn over n of x[m,n]``."""
    return {"format": "apportion.program/1", "name": f"{fn}_{m}x{n}",
            "tensors": {"x": {"shape": [m, n], "dtype": dtype}}, "inputs": ["x"],
            "outputs": ["y"], "ops": [{"name": fn, "op": fn, "out": "y[m,0]", "ins": ["x[m,n]"]}]}


DTYPE = "float32"  # numpy has no fast float16 matmul; float16 kernels compute in float32 anyway
#: the kernels ``--measure`` times: (kind, spec); matmul specs are (M, K, N), the others (m, n)
KERNELS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("matmul", (256, 1024, 1024)), ("matmul", (512, 512, 2048)), ("matmul", (1024, 2048, 256)),
    ("matmul", (128, 4096, 512)), ("matmul", (2048, 256, 512)),
    ("exp", (1024, 2048)), ("exp", (4096, 512)), ("exp", (256, 8192)),
    ("mul", (1024, 2048)), ("mul", (4096, 1024)),
    ("sum", (2048, 2048)), ("sum", (8192, 512)), ("sum", (512, 8192)),
)


def kernel_spec(kind: str, shape: tuple[int, ...]) -> tuple[str, dict[str, Any]]:
    """A kernel's record spec: the matmul shorthand, or a program document."""
    if kind == "matmul":
        m, k, n = shape
        return "matmul", {"M": m, "K": k, "N": n, "dtype": DTYPE}
    if kind == "sum":
        return "program", reduction_document(kind, *shape, DTYPE)
    return "program", pointwise_document(kind, *shape, DTYPE)


#: at most this many splits of one kernel are timed before only the even ones are
MAX_SPLITS = 64


def kernel_splits(program: Program, target: Target, limit: int = MAX_SPLITS
                  ) -> list[dict[str, int]]:
    """Every split of ``program``'s op that ``balanced`` searches on ``target`` (1 up to all
    its cores), valid and feasible, fewest cores first; past ``limit`` of them, only the even
    ones (each dim cut into equal slices), so a many-core machine times a sane number.

    >>> from apportion.target import cpu
    >>> p = from_dict(matmul_document({"M": 64, "K": 64, "N": 64, "dtype": "float32"}))
    >>> [split_text(s) for s in kernel_splits(p, cpu(cores=2))]
    ['m1 n1 k1', 'm1 n1 k2', 'm1 n2 k1', 'm2 n1 k1']
    """
    op = program.ops[0]
    lay = layouts(program, target)
    ctx = OpContext(op, program, target, lay.ops[op.name], lay.tensors, dict(op.sizes))
    ones = {d: 1 for d in ctx.sizes}
    found = [s for s in candidates(ctx, ones) if ctx.valid(s)]
    if len(found) > limit:
        found = [s for s in found if all(ctx.units[d] % n == 0 for d, n in s.items())]
    return sorted(found, key=lambda s: math.prod(s.values()))


def pinned(program: Program, splits: Mapping[str, int]) -> Program:
    """``program`` with its only op pinned to ``splits``."""
    return replace(program, work_division=((program.ops[0].name, tuple(splits.items())),))


def fastest_criteria(t: np.ndarray) -> list[noise.Criterion]:
    """What a kernel's splits (fewest cores first) are timed until: the split taken as the
    fastest (the first within ``TOLERANCE`` of the fastest time, as the host's split-K table
    chooses) stays within ``REGRET`` of the fastest over the resampled rounds.

    >>> [c.name for c in fastest_criteria(np.array([1.0, 0.52, 0.5]))]
    ['split 1 over the fastest']
    """
    at = fastest_index(t)
    return [noise.Criterion(f"split {at} over the fastest",
                            lambda x: x[..., at] / x.min(axis=-1), 1 + REGRET)]


def fastest_index(t: np.ndarray) -> int:
    """The first split within ``TOLERANCE`` of the fastest (the decision that must settle)."""
    return int(np.argmax(t <= t.min() * (1 + TOLERANCE)))


def measure(target: Target, core_counts: Sequence[int], console: Console | None = None,
            kernels: Sequence[tuple[str, tuple[int, ...]]] = KERNELS, repeats: int = REPEATS,
            load: Callable[[], float | None] = noise.load_average
            ) -> tuple[list[Measurement], list[noise.Measured]]:
    """Time every split (1 up to ``max(core_counts)`` cores, ``kernel_splits``) of every kernel
    on this machine, ``target`` with that many cores, one thread per core; one record per
    split (its noise kept), and each kernel's measurement. A kernel's splits are timed in
    interleaved rounds, so load elsewhere on the machine slows each of them alike rather than
    one of them, until settled (``fastest_criteria``, every split within ``PRECISION``)."""
    from apportion.cost.timing import until_stable
    from apportion.planned import plan
    from apportion.runtime import random_inputs

    console = console or Console()
    n = max(core_counts)
    t = with_cores(target, n)
    out: list[Measurement] = []
    kernels_measured: list[noise.Measured] = []
    work = []
    for kind, shape in kernels:
        spec_kind, spec = kernel_spec(kind, shape)
        program = from_dict(matmul_document(spec) if spec_kind == "matmul" else spec)
        work.append((kind, shape, spec_kind, spec, program, kernel_splits(program, t)))
    rules = noise.Rules(min_rounds=repeats, max_rounds=max(repeats, MAX_REPEATS),
                        precision=PRECISION)
    # redrawn between kernels only: a refresh thread would share the cores being timed
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("timing kernels", total=sum(len(w[-1]) for w in work))
        for kind, shape, spec_kind, spec, program, splits in work:
            progress.update(task, description=f"timing {kind} {'x'.join(map(str, shape))}: "
                            f"{len(splits)} splits on up to {n} cores, until settled")
            progress.refresh()
            inputs = random_inputs(program, 0)
            runs = [plan(pinned(program, s), t) for s in splits]
            calls = [lambda r=r, x=inputs: r.run(x, threads=n) for r in runs]
            with one_blas_thread():
                timings, measured = until_stable(
                    calls, rules, fastest_criteria, warmup=1,
                    names=[split_text(s) for s in splits], load=load)
            kernels_measured.append(measured)
            op = program.ops[0].name
            record = {"rounds": measured.rounds,
                      "load": [measured.load.before, measured.load.after]}
            for s, timing, spread in zip(splits, timings, measured.spread, strict=True):
                out.append(Measurement(program, op, n, s, round(timing.min * 1e6, 1),
                                       False, (spec_kind, spec),
                                       record | {"spread": round(spread, 4)}))
            progress.advance(task, len(splits))
    return out, kernels_measured


def untrusted(kernels: Sequence[tuple[str, tuple[int, ...]]],
              measured: Sequence[noise.Measured]) -> str:
    """Why ``measure``'s kernels cannot be trusted ("" where they can)."""
    bad = [(k, m) for k, m in zip(kernels, measured, strict=True) if not m.trusted]
    if not bad:
        return ""
    (kind, shape), m = bad[0]
    return (f"{len(bad)} of {len(measured)} kernels could not be trusted ({kind} "
            f"{'x'.join(map(str, shape))}: {m.untrusted_why})")


def with_cores(target: Target, n: int) -> Target:
    """``target`` with ``n`` cores (``max_cores`` widened where it is smaller)."""
    return replace(target, cores=n, max_cores=max(target.max_cores, n))


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of positive ``values`` (nan for none).

    >>> geometric_mean([1.0, 4.0])
    2.0
    """
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")

