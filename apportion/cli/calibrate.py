"""`apportion calibrate`: fit the cost model's coefficients to measured kernel times.

Two sources of measurements:

* a measurements file (``apportion/cost/calibrate.py`` describes the format; the Spyre
  measurements ship as ``frontend/data/spyre_measurements.json``);
* ``--measure``: kernels timed on this machine with the planned executor, one thread per core
  (matmul, pointwise exp and mul, sum reductions, a handful of shapes each, on one core and on
  all of them), the way ``apportion/frontend/data/cpu_measurements.json`` was made.

The model's prediction of a record is the op's ``OpContext.time_us`` under the record's split
(``predictor``); the fit itself lives in the cost layer. After the fit, each record marked
``best`` is checked against the search ``balanced`` makes: the rank of the measured-best split
among every feasible candidate split, by the fitted model's predicted time.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.cost.calibrate import (
    Calibration,
    Measurement,
    Predictor,
    default_fit,
    dumps_measurements,
    fit,
    matmul_document,
    read_measurements,
    split_text,
    target_toml,
)
from apportion.errors import CalibrationError
from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program
from apportion.passes.geometry import OpContext
from apportion.passes.layouts import layouts
from apportion.passes.work_distribution import candidates, ranked
from apportion.target.presets import PRESETS
from apportion.target.target import Target

#: the packaged measurements, by preset name
PACKAGED = {"spyre": "data/spyre_measurements.json", "cpu": "data/cpu_measurements.json"}


def packaged_path(preset: str) -> Path:
    """The packaged measurements file of ``preset``."""
    return Path(str(resources.files("apportion.frontend").joinpath(PACKAGED[preset])))


def load(path: str | Path) -> tuple[Measurement, ...]:
    """The records of a measurements file (program documents read as program format v1)."""
    return read_measurements(path, from_dict)


# --- the model's view of a record ----------------------------------------------------------------

def _record_target(target: Target, m: Measurement) -> Target:
    """``target`` with the record's core count. The cpu preset's ``max_cores`` is this machine's
    core count, so a record timed on a bigger machine widens it; any other target's
    ``max_cores`` is a limit of the device."""
    if target.cores == m.cores:
        return target
    top = max(target.max_cores, m.cores) if target.name == "cpu" else target.max_cores
    if m.cores > top:
        raise CalibrationError(f"field 'cores' {m.cores} is more than the {top} cores "
                               f"(max_cores) of target {target.name!r} ({m.shape})")
    return replace(target, cores=m.cores, max_cores=top)


def context(target: Target, m: Measurement, cache: dict[Any, Any] | None = None) -> OpContext:
    """The OpContext of the measured op on ``target`` with the record's core count."""
    t = _record_target(target, m)
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
    rank: int  # 1: no feasible candidate is predicted faster
    candidates: int  # feasible candidate splits searched
    predicted_us: float  # the measured-best split's predicted time
    pick: dict[str, int]  # the split balanced picks
    pick_us: float

    @property
    def first(self) -> bool:
        return self.rank == 1


def rank_split(target: Target, m: Measurement) -> Rank:
    """The rank of ``m``'s split among every feasible split ``balanced`` searches, by predicted
    time (ties share the better rank)."""
    ctx = context(target, m)
    ones = {d: 1 for d in ctx.sizes}
    times = [ctx.time_us(s) for s in candidates(ctx, ones) if ctx.feasible(s)]
    mine = ctx.time_us(dict(m.splits))
    rank = 1 + sum(t < mine * (1 - 1e-9) for t in times)
    best = ranked(ctx, ones, 1)
    pick = best[0] if best else dict(m.splits)
    return Rank(m, rank, len(times), mine, pick, ctx.time_us(pick))


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


def time_planned(planned: Any, inputs: Mapping[str, Any], threads: int, repeats: int = 5
                 ) -> float:
    """Median wall time in microseconds of ``planned.run(inputs, threads=threads)`` over
    ``repeats`` runs after one warm-up run, numpy's BLAS on one thread. The one timing function
    of ``calibrate --measure`` and ``bench costmodel``."""
    from apportion.cli.bench_harness import interleaved

    with one_blas_thread():
        (timing,) = interleaved([lambda: planned.run(inputs, threads=threads)], repeats,
                                warmup=1)
    return timing.median * 1e6


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


@dataclass(frozen=True)
class Timed:
    """One program planned for a target and timed on this machine."""

    planned: Any  # PlannedProgram
    threads: int
    time_us: float


def time_program(program: Program, target: Target, repeats: int = 5, seed: int = 0) -> Timed:
    """Plan ``program`` for ``target`` (balanced) and time its planned run, one thread per
    core, on fixed random inputs."""
    from apportion.planned import plan
    from apportion.runtime import random_inputs

    planned = plan(program, target)
    inputs = random_inputs(program, seed)
    return Timed(planned, target.cores, time_planned(planned, inputs, target.cores, repeats))


def measure(target: Target, core_counts: Sequence[int], console: Console | None = None,
            kernels: Sequence[tuple[str, tuple[int, ...]]] = KERNELS, repeats: int = 7
            ) -> list[Measurement]:
    """Time every kernel on this machine with each core count (``target`` with that many
    cores, one thread per core); one record each, its split the one ``balanced`` planned."""
    console = console or Console()
    out: list[Measurement] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("timing kernels", total=len(kernels) * len(core_counts))
        for kind, shape in kernels:
            spec_kind, spec = kernel_spec(kind, shape)
            doc = matmul_document(spec) if spec_kind == "matmul" else spec
            program = from_dict(doc)
            op = program.ops[0]
            for n in core_counts:
                progress.update(task, description=f"timing {kind} {'x'.join(map(str, shape))} "
                                f"on {n} core{'s' if n > 1 else ''}")
                timed = time_program(program, with_cores(target, n), repeats)
                splits = timed.planned.op(op.name).split_map
                out.append(Measurement(program, op.name, n, splits, round(timed.time_us, 1),
                                       False, (spec_kind, spec)))
                progress.advance(task)
    return out


def with_cores(target: Target, n: int) -> Target:
    """``target`` with ``n`` cores (``max_cores`` widened where it is smaller)."""
    return replace(target, cores=n, max_cores=max(target.max_cores, n))


# --- the command ---------------------------------------------------------------------------------

def parse_fit(text: str | None, target: Target) -> tuple[str, ...]:
    """``--fit a,b,c`` as names (checked when fitting), or the target's default."""
    if text is None:
        return default_fit(target)
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise CalibrationError(f"--fit {text!r}: expected comma-separated coefficient names, "
                               "such as --fit mac_rate,mem_bandwidth,overlap")
    from apportion.cost.calibrate import check_fit_names

    return check_fit_names(names)


def _num(value: float) -> str:
    return f"{value:.4g}"


def coefficient_table(cal: Calibration) -> Table:
    t = Table(title=f"coefficients of {cal.base.name}", title_justify="left")
    for col in ("coefficient", "before", "after", "change", "bounds", "note"):
        t.add_column(col, justify="left" if col in ("coefficient", "note") else "right")
    for c in cal.coefficients:
        change = f"{c.after / c.before - 1:+.1%}" if c.before else "-"
        note = [] if c.determined else ["no record depends on it"]
        if c.tied:
            note.append(f"only its combination with {', '.join(c.tied)} is fitted")
        if c.at_bound:
            note.append(f"at its {c.at_bound} bound")
        t.add_row(c.name, _num(c.before), _num(c.after), change,
                  f"[{_num(c.low)}, {_num(c.high)}]", "; ".join(note))
    return t


def record_table(cal: Calibration) -> Table:
    t = Table(title="records: predicted vs measured", title_justify="left")
    for col in ("#", "shape", "cores", "splits", "measured us", "before us", "fitted us",
                "error"):
        t.add_column(col, justify="left" if col in ("shape", "splits") else "right")
    for i, r in enumerate(cal.records):
        m = r.measurement
        t.add_row(str(i), m.shape + (" (best)" if m.best else ""), str(m.cores), m.split_text,
                  f"{m.time_us:.1f}", f"{r.before_us:.1f}", f"{r.predicted_us:.1f}",
                  f"{r.rel_error:+.1%}")
    return t


def rank_lines(target: Target, measurements: Sequence[Measurement]) -> list[str]:
    lines = []
    for m in measurements:
        if not m.best:
            continue
        r = rank_split(target, m)
        verdict = "first" if r.first else f"NOT first (balanced picks {split_text(r.pick)} at " \
            f"{r.pick_us:.1f} us)"
        lines.append(f"{m.shape} on {m.cores} cores: measured-best {m.split_text} ranks "
                     f"{r.rank} of {r.candidates} candidate splits ({r.predicted_us:.1f} us): "
                     f"{verdict}")
    return lines


def command(measurements_path: str | None, target: Target, preset: str | None,
            fit_text: str | None, out: Path | None, save: Path | None, cores: int | None,
            console: Console) -> int:
    """``apportion calibrate``: every input checked (by the caller: the output paths) before the
    fit; prints the coefficients, the records and the ranks; writes the TOML target."""
    names = parse_fit(fit_text, target)
    if measurements_path is not None:
        measurements = load(measurements_path)
        source = measurements_path
    else:
        n = cores or os.cpu_count() or 1
        counts = sorted({1, n})
        console.print(f"timing {len(KERNELS)} kernels on this machine with "
                      f"{' and '.join(map(str, counts))} core(s), one thread per core",
                      highlight=False)
        measurements = tuple(measure(target, counts, console))
        source = "this machine"
        if target.name == "cpu":  # the stock cpu target's split-K table, measured here too
            from apportion.targets.host_splitk import measure_table_again

            measure_table_again(console)
        if save is not None:
            _write(save, "--save", dumps_measurements(measurements))
            console.print(f"wrote {save} ({len(measurements)} measurements)", highlight=False)
    predict = predictor()
    for i, m in enumerate(measurements):  # every record fits the target before any fitting
        try:
            _record_target(target, m)
        except CalibrationError as e:
            raise CalibrationError(f"{source}: record {i}: {e}") from None
    cal = fit(measurements, target, predict, names)
    console.print(f"fitted {', '.join(names)} of {target.name} to {len(measurements)} "
                  f"measurements ({source})", highlight=False)
    console.print(coefficient_table(cal))
    console.print(record_table(cal))
    console.print(f"RMS log error {cal.base_rms_log_error:.3f} -> {cal.rms_log_error:.3f}; "
                  f"worst record {max(abs(r.rel_error) for r in cal.records):.1%} off",
                  highlight=False)
    for line in rank_lines(cal.target, measurements):
        console.print(line, highlight=False)
    if out is not None:
        comment = [f"fitted by apportion calibrate to {len(measurements)} measurements "
                   f"({source}); RMS log error {cal.rms_log_error:.3f}"]
        _write(out, "-o", target_toml(cal, preset if preset in PRESETS else None, comment))
        console.print(f"wrote {out}", highlight=False)
    return 0


def _write(path: Path, option: str, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise CalibrationError(f"{option} {str(path)!r}: cannot write: {e.strerror or e}"
                               ) from None


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")

