"""`apportion bench splitk`: the split-K factor each target's resolver picks, and on this machine
which factor is fastest.

Two tables over ``split_k_shapes_MNK`` of the models file (each ``[M, N, K]``, one matmul
``y[m,n] = x[m,k] @ w[k,n]``):

* **picks**: the factor of K each resolver picks and the op's predicted time: ``spyre`` (the cost
  model's search, float16), ``gpu`` (IREE's GPU heuristic, float16) and ``cpu`` (the preset's
  split table, float32). The ``cpu`` pick is read from the preset with its core count raised to
  ``WIDE`` (the split-K pass caps a factor at the target's cores; on a 2-core machine the stock
  preset would cap every pick at 2).
* **measured**: the skinny-output shapes (``M*N <= SKINNY_OUTPUT``), each planned in float32
  with K split into every factor of ``FACTORS`` (pinned with the program's ``split_k``) on the
  ``cpu`` preset with ``cores = factor`` (the split of K takes every core, so the output stays
  whole and the factor alone varies), emitted as parallel IR, compiled by IREE (cached) and run
  on this machine. A shape whose work exceeds ``MAX_FLOP`` has its K divided by the smallest
  power of two that brings it under (the table says so). Each run is checked once against the
  unplanned program, then timed: ``WARMUP`` calls, then the median of ``REPEATS``
  (``time.perf_counter`` around the call and the copy of its small result to the host; inputs
  already in the runtime's device buffers, one runtime context per factor; the factors of a
  shape timed in interleaved rounds, so that the machine's drift falls on all of them). Per
  shape: the fastest factor, the ``cpu`` resolver's pick for the measured shape and the fastest
  time over the pick's.

Goals (``goals``, checked by ``--check``): on every measured shape the ``cpu`` pick runs within
``GOAL`` of the fastest factor (fastest / pick at least ``GOAL``), and IREE's output matches the
unplanned program for every factor (a mismatch exits 1 even without ``--check``: it is a wrong
result, not a slow one).

The measurements behind the ``cpu`` preset's split table (``target/presets.CPU_SPLIT_K``) are
``frontend/data/cpu_splitk_measurements.json``, written by this command's ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.backends.iree import runtime as iree
from apportion.backends.iree.forall import forall_mlir, mlir_type, symbol_name
from apportion.backends.iree.run import emitted
from apportion.cli import goals as bench_goals
from apportion.cli.bench_harness import Outcome, Suite, interleaved
from apportion.cli.usage import from_models
from apportion.errors import ExecutionError
from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program
from apportion.planned import PlannedProgram, plan
from apportion.runtime.reference import random_inputs
from apportion.target.presets import cpu, gpu, spyre
from apportion.target.target import Target

#: the factors of K measured
FACTORS = (1, 2, 4, 8, 16, 32, 64)
#: measured shapes: output M*N at most this
SKINNY_OUTPUT = 256 * 256
#: measured shapes: K is divided by a power of two until 2*M*N*K is at most this
MAX_FLOP = 2e9
#: untimed calls, then timed ones (the median counts)
WARMUP, REPEATS = 2, 15
#: the pick's time should be within this fraction of the fastest: fastest / pick >= GOAL
GOAL = 0.9
#: the cpu preset's core count when its pick is read (the pass caps a factor at the cores)
WIDE = 64
#: the packaged measurements
MEASUREMENTS = "data/cpu_splitk_measurements.json"
FORMAT = "apportion.splitk-measurements/1"


def matmul_program(m: int, n: int, k: int, dtype: str, factor: int | None = None) -> Program:
    """``y[m,n] = x[m,k] @ w[k,n]``, its K split pinned to ``factor`` when given.

    >>> matmul_program(32, 32, 4096, "float32", 4).split_k
    (('mm', 4),)
    """
    doc: dict[str, Any] = {
        "name": "splitk",
        "tensors": {"x": {"shape": [m, k], "dtype": dtype}, "w": {"shape": [k, n], "dtype": dtype}},
        "inputs": ["x", "w"], "outputs": ["y"],
        "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
    }
    if factor is not None:
        doc["split_k"] = {"mm": factor}
    return from_dict(doc)


def wide_cpu(cores: int = WIDE) -> Target:
    """The cpu preset (its split table included) with ``cores`` cores."""
    return dataclasses.replace(cpu(), cores=cores, max_cores=max(cores, cpu().max_cores))


def resolvers() -> dict[str, tuple[Callable[[], Target], str]]:
    """Resolver name -> (its target, the dtype it plans in)."""
    return {"spyre": (spyre, "float16"), "gpu": (gpu, "float16"), "cpu": (wide_cpu, "float32")}


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
    """The factor the cpu preset's resolver picks for a float32 matmul (cores raised)."""
    return pick("cpu", m, n, k).factor


@dataclass(frozen=True)
class Measurement:
    """One factor of one shape timed on this machine (K as measured, ``k_full`` as listed)."""

    m: int
    n: int
    k: int
    k_full: int
    factor: int
    splits: dict[str, int]
    compile_s: float
    cached: bool
    times_s: list[float]
    median_s: float
    check_ok: bool
    max_abs_err: float


def measured_shape(m: int, n: int, k: int, max_flop: float = MAX_FLOP) -> int | None:
    """K as measured (halved until 2*M*N*K <= ``max_flop``), or None where the output is not
    skinny (M*N > ``SKINNY_OUTPUT``).

    >>> measured_shape(128, 256, 131072), measured_shape(768, 768, 65536)
    (16384, None)
    """
    if m * n > SKINNY_OUTPUT:
        return None
    while 2 * m * n * k > max_flop and k % 2 == 0:
        k //= 2
    return k


def _timer(vmfb: bytes, function: str, arrays: Sequence[np.ndarray]) -> Callable[[], None]:
    """A callable that runs ``function`` once on ``arrays`` (uploaded once) and copies its
    result to the host: what one timed call is."""
    import iree.runtime as rt

    config = rt.Config("local-task")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    fn = ctx.modules.module[function]
    args = [rt.asdevicearray(config.device, np.ascontiguousarray(a)) for a in arrays]

    def once() -> None:
        np.asarray(fn(*args).to_host())

    return once


@dataclass
class _Prepared:
    """One factor ready to time: what was planned, compiled and checked, and the timer."""

    m: int
    n: int
    k: int
    k_full: int
    factor: int
    splits: dict[str, int]
    compile_s: float
    cached: bool
    check_ok: bool
    max_abs_err: float
    once: Callable[[], None]


def prepare(m: int, n: int, k: int, k_full: int, factor: int) -> _Prepared:
    """Plan the matmul with K split ``factor`` ways (float32) on the cpu preset with ``factor``
    cores, check it once in IREE against the unplanned program, compile it (cached) and load
    it with its inputs for timing."""
    target = dataclasses.replace(cpu(), cores=factor, max_cores=max(factor, cpu().max_cores))
    planned: PlannedProgram = plan(matmul_program(m, n, k, "float32", factor), target)
    got, _, _, cores = split_of(planned)
    if got != factor or cores != factor:
        raise ExecutionError(f"{m}x{n}x{k}: split_k {factor} planned as {got} slices on "
                             f"{cores} cores")
    check = planned.check(backend="iree")[0]
    text = forall_mlir(emitted(planned.program, planned.plan, planned.target))
    compiled = iree.compile_mlir(text)
    program = planned.program
    if any(mlir_type(program.tensor(t).dtype) != "f32" for t in program.inputs):
        raise ExecutionError("bench splitk times float32 programs only")
    inputs = random_inputs(program)
    once = _timer(compiled.vmfb, symbol_name(program.name),
                  [np.asarray(inputs[name]) for name in program.inputs])
    return _Prepared(m, n, k, k_full, factor, dict(planned.ops[0].split_map), compiled.compile_s,
                     compiled.cached, check.ok, float(check.max_abs_err), once)


def time_interleaved(prepared: Sequence[_Prepared], warmup: int = WARMUP,
                     repeats: int = REPEATS) -> list[Measurement]:
    """Time every factor of one shape in rounds (each round calls every factor once, so a
    drift of the machine's speed falls on all of them alike); the median of each."""
    timings = interleaved([p.once for p in prepared], repeats, warmup=warmup)
    return [Measurement(p.m, p.n, p.k, p.k_full, p.factor, p.splits, p.compile_s, p.cached,
                        list(t.seconds), t.median, p.check_ok, p.max_abs_err)
            for p, t in zip(prepared, timings, strict=True)]


@dataclass(frozen=True)
class Verdict:
    """One measured shape: the fastest factor, the cpu pick and fastest / pick time."""

    m: int
    n: int
    k: int
    k_full: int
    fastest: int
    fastest_s: float
    pick: int
    pick_s: float | None  # None: the pick was not measured

    @property
    def ratio(self) -> float | None:
        return None if self.pick_s is None else self.fastest_s / self.pick_s


def verdicts(records: Sequence[Measurement], pick_of: Callable[[int, int, int], int] = cpu_pick
             ) -> list[Verdict]:
    """Per measured shape (in order of appearance): fastest factor and the pick's ratio."""
    shapes: dict[tuple[int, int, int, int], list[Measurement]] = {}
    for r in records:
        shapes.setdefault((r.m, r.n, r.k, r.k_full), []).append(r)
    out = []
    for (m, n, k, k_full), rows in shapes.items():
        best = min(rows, key=lambda r: r.median_s)
        chosen = pick_of(m, n, k)
        at = next((r.median_s for r in rows if r.factor == chosen), None)
        out.append(Verdict(m, n, k, k_full, best.factor, best.median_s, chosen, at))
    return out


def machine() -> dict[str, Any]:
    """What the measurements ran on."""
    return {"cpu": iree.host_cpu().splitlines()[2:3] or [platform.processor()],
            "cores": os.cpu_count(), "iree": iree.compiler_version()}


def to_doc(records: Sequence[Measurement]) -> dict[str, Any]:
    return {"format": FORMAT, "machine": machine(), "factors": list(FACTORS),
            "warmup": WARMUP, "repeats": REPEATS, "max_flop": MAX_FLOP,
            "measurements": [dataclasses.asdict(r) for r in records]}


def from_doc(doc: dict[str, Any]) -> list[Measurement]:
    return [Measurement(**r) for r in doc["measurements"]]


def packaged() -> list[Measurement]:
    """The shipped measurements (``frontend/data/cpu_splitk_measurements.json``)."""
    import json

    text = resources.files("apportion.frontend").joinpath(MEASUREMENTS).read_text()
    return from_doc(json.loads(text))


def shapes_of(models: dict[str, Any]) -> list[tuple[int, int, int]]:
    rows = models["split_k_shapes_MNK"]
    if not isinstance(rows, list) or not all(
            isinstance(r, list) and len(r) == 3 and all(isinstance(v, int) and v > 0 for v in r)
            for r in rows):
        raise ValueError("split_k_shapes_MNK must be a list of [M, N, K] positive ints")
    return [(m, n, k) for m, n, k in rows]


def run(shapes: Sequence[tuple[int, int, int]], console: Console | None = None,
        factors: Sequence[int] = FACTORS, max_flop: float = MAX_FLOP, warmup: int = WARMUP,
        repeats: int = REPEATS) -> tuple[list[Pick], list[Measurement]]:
    """Print the picks table, measure the skinny shapes, print their verdicts."""
    console = console or Console()
    picks = [pick(r, m, n, k) for m, n, k in shapes for r in resolvers()]
    console.print(picks_table(picks))
    todo = []
    for m, n, k in shapes:
        kk = measured_shape(m, n, k, max_flop)
        if kk is None:
            console.print(f"not measured: {m}x{n}x{k} (output {m * n} > {SKINNY_OUTPUT})",
                          highlight=False)
        else:
            todo.append((m, n, kk, k))
    records: list[Measurement] = []
    # redrawn between steps only: a refresh thread would share the cores being timed
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("measuring", total=len(todo) * len(factors))
        for m, n, kk, k in todo:
            prepared: list[_Prepared] = []
            for f in factors:
                progress.update(task, description=f"{m}x{n}x{kk}: K split {f}, compile, check")
                progress.refresh()
                if f == 1 or (kk % f == 0 and kk // f >= 16):
                    prepared.append(prepare(m, n, kk, k, f))
                progress.advance(task)
            progress.update(task, description=f"{m}x{n}x{kk}: timing {len(prepared)} factors")
            progress.refresh()
            records += time_interleaved(prepared, warmup, repeats)
            prepared.clear()
    if records:
        console.print(measured_table(records))
        bench_goals.show(goals(records), console)
    bad = [r for r in records if not r.check_ok]
    for r in bad:
        console.print(f"[red]{r.m}x{r.n}x{r.k} split {r.factor}: IREE output differs from the "
                      f"unplanned program (max abs err {r.max_abs_err:.3g})[/red]")
    return picks, records


def picks_table(picks: Sequence[Pick]) -> Table:
    t = Table(title="split-K factor each resolver picks (spyre, gpu: float16; cpu: float32, "
                    f"its preset on {WIDE} cores) and the op's predicted time",
              title_justify="left")
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
            p = by[name]
            cells += [str(p.factor), f"{p.predicted_us:,.1f}"]
        t.add_row(f"{m} x {n} x {k}", *cells)
    return t


def measured_table(records: Sequence[Measurement]) -> Table:
    factors = sorted({r.factor for r in records})
    t = Table(title=f"measured on this machine (float32, IREE llvm-cpu, {os.cpu_count()} cores): "
                    "median ms per factor of K", title_justify="left")
    t.add_column("M x N x K")
    for f in factors:
        t.add_column(str(f), justify="right")
    for c in ("fastest", "cpu pick", "fastest / pick"):
        t.add_column(c, justify="right")
    vs = {(v.m, v.n, v.k): v for v in verdicts(records)}
    shapes: dict[tuple[int, int, int, int], dict[int, Measurement]] = {}
    for r in records:
        shapes.setdefault((r.m, r.n, r.k, r.k_full), {})[r.factor] = r
    for (m, n, k, k_full), by in shapes.items():
        v = vs[(m, n, k)]
        label = f"{m} x {n} x {k}" + (f" (K/{k_full // k} of {k_full})" if k != k_full else "")
        ratio = "-" if v.ratio is None else (
            f"{v.ratio:.2f}" if v.ratio >= GOAL else f"[red]{v.ratio:.2f}[/red]")
        t.add_row(label, *(f"{by[f].median_s * 1e3:.2f}" if f in by else "-" for f in factors),
                  str(v.fastest), str(v.pick), ratio)
    return t


def goals(records: Sequence[Measurement],
          pick_of: Callable[[int, int, int], int] = cpu_pick) -> list[bench_goals.Goal]:
    """The suite's goals over the measured ``records`` (see the module's docstring)."""
    vs = verdicts(records, pick_of)
    out = []
    what = f"the cpu pick runs within {GOAL:.0%} of the fastest factor (worst fastest / pick)"
    unmeasured = [f"{v.m}x{v.n}x{v.k} (pick {v.pick})" for v in vs if v.ratio is None]
    if unmeasured:
        out.append(bench_goals.count(f"{what}: the pick measured", unmeasured, len(vs)))
    timed = [v for v in vs if v.ratio is not None]
    if timed:
        worst = min(timed, key=lambda v: v.ratio or 0.0)
        ratio = worst.ratio or 0.0
        out.append(bench_goals.at_least(
            what, ratio, GOAL, "{:.2f}",
            f"{worst.m}x{worst.n}x{worst.k}: pick {worst.pick}, fastest {worst.fastest}; "
            f"{sum((v.ratio or 0.0) >= GOAL for v in timed)} of {len(timed)} shapes within"))
    out.append(bench_goals.count(
        "IREE's output matches the unplanned program for every factor",
        [f"{r.m}x{r.n}x{r.k} split {r.factor} (max abs err {r.max_abs_err:.3g})"
         for r in records if not r.check_ok], len(records)))
    return out


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    from apportion.frontend.models import load_models

    found = from_models(args.models, lambda: shapes_of(load_models(args.models)))[:args.limit]
    _, records = run(found, console)
    # a wrong result fails with or without --check
    return Outcome(to_doc(records), goals(records), failed=not all(r.check_ok for r in records))


SUITE = Suite("splitk", frozenset({"models"}),
              "each resolver's split-K pick, and the skinny shapes' factors timed in IREE", _suite)
