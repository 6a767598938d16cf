"""Measuring this host's split-K table: matmuls with K split every way, planned by the stock
``cpu`` target, compiled by IREE and timed here (``target/host.py`` keeps the table; the ``cpu``
preset reads it).

Each shape ``y[m,n] = x[m,k] @ w[k,n]`` (float32) is planned by the ``cpu`` preset as it stands
on this machine (all its cores) with its K split into each factor of ``FACTORS`` (pinned with
the program's ``split_k``; a factor is measured where its slices hold at least ``LEAST_SLICE``
of K and the target plans it): exactly the plan the target runs when its table names that
factor, more slices than cores included (a core then runs several). Each plan is emitted as
parallel IR, compiled by IREE (llvm-cpu, cached), checked once against the unplanned program (a
mismatch is an ExecutionError: a wrong result is no timing), then timed (``time_shape``, on
``cost/noise.py``): ``WARMUP`` untimed calls, then rounds that call every factor once, in
reverse order every other round (a drift of the machine's speed, or another process's load,
falls on all factors alike), at least ``REPEATS`` rounds and more until the shape's choice is
stable (``choice_criteria``: the factor chosen the same for the last rounds, and its time within
``REGRET`` of the fastest factor's across the resampled rounds), up to ``MAX_ROUNDS`` or
``BUDGET_S`` seconds timed; a factor more than ``DROP`` times slower than the fastest after
``FIRST_ROUNDS`` rounds stops being timed (it can be neither the fastest nor near it). A
factor's time is the least of its rounds: load from other work only ever adds time, so the
least is the one least disturbed (the median is kept beside it).

The measurer (``measure_host``) measures nothing where the load average is already over the
machine's cores, and reports a table whose shapes are not all stable, or that was measured
while the load went over the cores, as untrusted: ``target/host.py`` then caches nothing.

The shapes measured by default (``default_shapes``) are the skinny-output split-K shapes of the
packaged models file (``split_k_shapes_MNK``, output ``M*N <= SKINNY_OUTPUT``, K halved until
``2*M*N*K <= MAX_FLOP``): the matmuls of the models apportion plans whose outputs are too small
to occupy the cores without a split of K.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.backends.iree import runtime as iree
from apportion.backends.iree.run import iree_run
from apportion.cost.noise import Criterion, Load, Measured, Rules, load_average, until_stable
from apportion.errors import ApportionError, ExecutionError, PlanningError
from apportion.frontend.json_format import from_dict
from apportion.frontend.models import load_models
from apportion.ir.program import Program
from apportion.mlir.builder import symbol_name
from apportion.mlir.forall import forall_mlir
from apportion.mlir.kernels import matmul_func
from apportion.passes.pipeline import plan
from apportion.plans.plan import Plan
from apportion.runtime.check import expect
from apportion.runtime.reference import random_inputs, run_unplanned
from apportion.schedule.lower import lower, planned_counts
from apportion.schedule.values import Schedule
from apportion.target.host import (
    FACTORS,
    REGRET,
    HostKey,
    HostMeasurement,
    HostTable,
    ShapeTimes,
    chosen_factor,
    factors_of,
    host_table,
    untrusted_why,
)
from apportion.target.presets import CPU_SPLIT_K, cpu
from apportion.target.target import Target

log = logging.getLogger(__name__)

#: measured shapes: output M*N at most this
SKINNY_OUTPUT = 256 * 256
#: measured shapes: K is halved until 2*M*N*K is at most this
MAX_FLOP = 2e9
#: untimed calls of each factor, then at least this many timed rounds
WARMUP, REPEATS = 2, 15
#: more rounds until the shape's choice is stable, up to MAX_ROUNDS or BUDGET_S seconds timed
BUDGET_S, MAX_ROUNDS = 20.0, 300
#: after FIRST_ROUNDS rounds, factors over DROP times the fastest's least time stop (the first
#: calls are no guide: a cold call can take twenty times a warm one)
FIRST_ROUNDS, DROP = 2, 2.0


def shape_rules(repeats: int = REPEATS) -> Rules:
    """How long one shape is timed (see the module docstring)."""
    return Rules(min_rounds=repeats, max_rounds=max(repeats, MAX_ROUNDS), budget_s=BUDGET_S,
                 drop_after=FIRST_ROUNDS, drop=DROP)


def matmul_program(m: int, n: int, k: int, dtype: str = "float32", factor: int | None = None
                   ) -> Program:
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


def measured_k(m: int, n: int, k: int, max_flop: float = MAX_FLOP) -> int | None:
    """K as measured (halved until 2*M*N*K <= ``max_flop``), or None where the output is not
    skinny (M*N > ``SKINNY_OUTPUT``).

    >>> measured_k(128, 256, 131072), measured_k(768, 768, 65536)
    (16384, None)
    """
    if m * n > SKINNY_OUTPUT:
        return None
    while 2 * m * n * k > max_flop and k % 2 == 0:
        k //= 2
    return k


def default_shapes(models: dict[str, Any] | None = None) -> list[tuple[int, int, int]]:
    """The skinny split-K shapes of the models file, K as measured (see the module docstring).

    >>> default_shapes({"split_k_shapes_MNK": [[1, 4096, 14336], [768, 768, 65536]]})
    [(1, 4096, 14336)]
    """
    rows = (models or load_models())["split_k_shapes_MNK"]
    out = []
    for m, n, k in rows:
        kk = measured_k(m, n, k)
        if kk is not None:
            out.append((m, n, kk))
    return out


def factor_target() -> Target:
    """The cpu preset as it stands on this machine, with the shipped split table (the pinned
    factor decides, and no host table is measured to make the target that measures one)."""
    return cpu(split_k_table=CPU_SPLIT_K)


def split_of(plan_: Plan) -> tuple[int, int]:
    """The matmul's slices of K and the cores its partial op runs on (1, cores: not split)."""
    names = [o.name for o in plan_.ops]
    if "mm.partial" in names:
        partial = plan_.op("mm.partial")
        assert partial.split_k is not None
        return partial.split_k.factor, partial.cores
    return 1, plan_.op("mm").cores


def _timer(vmfb: bytes, function: str, arrays: Sequence[np.ndarray]) -> Callable[[], None]:
    """A callable that runs ``function`` once on ``arrays`` (uploaded once, to the runtime's
    device buffers) and copies its result to the host: what one timed call is."""
    import iree.runtime as rt

    config = rt.Config("local-task")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    fn = ctx.modules.module[function]
    args = [rt.asdevicearray(config.device, np.ascontiguousarray(a)) for a in arrays]

    def once() -> None:
        np.asarray(fn(*args).to_host())

    return once


@dataclass(frozen=True)
class Prepared:
    """One way of computing a shape, ready to time: its factor of K (0: IREE's own compile of
    the unsplit matmul), the compile's seconds (0.0: cached), the check against the unplanned
    program and the timed call."""

    m: int
    n: int
    k: int
    factor: int
    compile_s: float
    cached: bool
    max_abs_err: float
    once: Callable[[], None]


@dataclass(frozen=True)
class Operands:
    """One shape's random inputs and the unplanned program's output on them, made once and
    shared by every way of computing the shape."""

    program: Program
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]


def operands(m: int, n: int, k: int) -> Operands:
    """The float32 matmul's random inputs and its unplanned output."""
    program = matmul_program(m, n, k)
    inputs = {name: np.asarray(v) for name, v in random_inputs(program).items()}
    return Operands(program, inputs, run_unplanned(program, inputs))


def _checked(what: str, ops: Operands, got: dict[str, Any]) -> float:
    """The largest error of ``got`` against the unplanned output; ExecutionError on a
    mismatch (a wrong result is no timing)."""
    check = expect(ops.program, inputs=ops.inputs, expected=ops.expected).compare(got)[0]
    if not check.ok:
        raise ExecutionError(f"{what} differs in IREE from the unplanned program (max abs err "
                             f"{check.max_abs_err:.3g})")
    return float(check.max_abs_err)


def prepare(m: int, n: int, k: int, factor: int, ops: Operands | None = None) -> Prepared:
    """Plan the float32 matmul with K split ``factor`` ways (``factor_target``; PlanningError
    where it cannot), run it once in
    IREE against the unplanned program (ExecutionError on a mismatch), compile it (cached) and
    load it with its inputs (``ops``, else fresh ones) for timing."""
    ops = ops or operands(m, n, k)
    program = matmul_program(m, n, k, "float32", factor)
    target = factor_target()
    result = plan(program, target)
    planned = result.rewritten if result.rewritten is not None else program
    got, cores = split_of(result)
    if got != factor:
        raise ExecutionError(f"split-K measurement {m}x{n}x{k}: split_k {factor} planned as "
                             f"{got} slices on {cores} cores")
    schedule = _lowered(planned, result, target)
    run = iree_run(schedule, ops.inputs)
    err = _checked(f"{m}x{n}x{k} with K split {factor} ways", ops, run.tensors)
    compiled = iree.compile_mlir(forall_mlir(schedule))
    once = _timer(compiled.vmfb, symbol_name(planned.name),
                  [ops.inputs[name] for name in program.inputs])
    return Prepared(m, n, k, factor, run.compile_s, run.cached, err, once)


def _lowered(program: Program, result: Plan, target: Target) -> Schedule:
    """The plan's schedule at its symbolic loop counts' planned values, as
    ``PlannedProgram.lowered`` has it."""
    return lower(program, result, target, params=planned_counts(result) or None)


def prepare_unsplit_iree(m: int, n: int, k: int, ops: Operands | None = None) -> Prepared:
    """IREE's own compile of the unsplit matmul (``mlir.kernels.matmul_func``: IREE tiles and
    threads it itself), checked once against the unplanned program and loaded for timing
    (``factor`` 0)."""
    ops = ops or operands(m, n, k)
    compiled = iree.compile_mlir(matmul_func(m, n, k), lower=False)
    arrays = [ops.inputs[name] for name in ops.program.inputs]
    got = iree.run_vmfb(compiled.vmfb, "mm", [(a, "f32") for a in arrays], ["f32"]).outputs[0]
    err = _checked(f"IREE's unsplit matmul {m}x{n}x{k}", ops, {"y": got})
    return Prepared(m, n, k, 0, compiled.compile_s, compiled.cached, err,
                    _timer(compiled.vmfb, "mm", arrays))


def choice_criteria(factors: Sequence[int]) -> Callable[[np.ndarray], list[Criterion]]:
    """What the host table decides from one shape's times (``factors``: each way's factor of
    K, 0 for IREE's own compile, which is no choice): the factor chosen (``chosen_factor``) is
    within ``REGRET`` of the fastest factor's time.

    >>> crit = choice_criteria([1, 2, 4])(np.array([2.0, 1.0, 1.02]))[0]
    >>> crit.name, float(crit.figure(np.array([2.0, 1.0, 1.02])))
    ("factor 2's time over the fastest factor's", 1.0)
    """
    split = [i for i, f in enumerate(factors) if f > 0]

    def criteria(est: np.ndarray) -> list[Criterion]:
        c = chosen_factor({factors[i]: float(est[i]) for i in split})
        at = factors.index(c)
        return [Criterion(f"factor {c}'s time over the fastest factor's",
                          lambda t: t[..., at] / t[..., split].min(axis=-1), 1 + REGRET)]

    return criteria


def choice_key(factors: Sequence[int]) -> Callable[[np.ndarray], int]:
    """The factor chosen at the estimates: it must settle too."""
    split = [i for i, f in enumerate(factors) if f > 0]
    return lambda est: chosen_factor({factors[i]: float(est[i]) for i in split})


def time_shape(calls: Sequence[Callable[[], None]], factors: Sequence[int],
               criteria: Callable[[np.ndarray], Sequence[Criterion]] | None = None,
               warmup: int = WARMUP, rules: Rules | None = None,
               clock: Callable[[], float] | None = None,
               load: Callable[[], float | None] = load_average) -> Measured:
    """Time each way of a shape (``calls``, of ``factors``) in rounds until stable (see the
    module docstring; ``criteria``: ``choice_criteria`` unless given), after ``warmup``
    untimed calls of each.

    >>> m = time_shape([lambda: None, lambda: None], [1, 2], warmup=0,
    ...                rules=Rules(min_rounds=3, max_rounds=3))
    >>> m.rounds
    3
    """
    import time

    from apportion.cost.noise import timed

    tick = clock or time.perf_counter
    for call in calls:
        for _ in range(warmup):
            call()
    return until_stable([timed(c, tick) for c in calls],
                        criteria or choice_criteria(factors), rules or shape_rules(),
                        key=choice_key(factors), names=[f"factor {f}" for f in factors],
                        load=load)


@dataclass(frozen=True)
class Timed:
    """One way of computing one shape, timed: ``Prepared``'s fields and its seconds."""

    m: int
    n: int
    k: int
    factor: int
    compile_s: float
    cached: bool
    max_abs_err: float
    seconds: tuple[float, ...]

    @property
    def least(self) -> float:
        return min(self.seconds)

    @property
    def median(self) -> float:
        return float(np.median(self.seconds))


def measure_shape(m: int, n: int, k: int, factors: Sequence[int] = FACTORS,
                  warmup: int = WARMUP, repeats: int = REPEATS, with_iree: bool = False,
                  step: Callable[[str], None] | None = None,
                  criteria: Callable[[list[int]], Callable[[np.ndarray], Sequence[Criterion]]]
                  | None = None) -> tuple[list[Timed], Measured]:
    """Every factor of ``factors_of(k, factors)`` the target plans (and, ``with_iree``, IREE's
    own unsplit compile, factor 0) prepared, then timed in interleaved rounds until stable
    (``time_shape``; ``criteria(ways' factors)``: what must be stable, ``choice_criteria``
    unless given). ``step`` hears each stage."""
    say = step or (lambda _: None)
    say(f"{m}x{n}x{k}: inputs and the unplanned output")
    ops = operands(m, n, k)
    prepared = []
    for f in factors_of(k, factors):
        say(f"{m}x{n}x{k}: K split {f}: plan, compile, check")
        try:
            prepared.append(prepare(m, n, k, f, ops))
        except PlanningError as e:  # the target cannot plan this factor: it is no choice
            if f == 1:
                raise
            log.info("split-K measurement %sx%sx%s: factor %s not planned: %s", m, n, k, f, e)
    if with_iree:
        say(f"{m}x{n}x{k}: IREE's unsplit matmul: compile, check")
        prepared.append(prepare_unsplit_iree(m, n, k, ops))
    say(f"{m}x{n}x{k}: timing {len(prepared)} ways until stable")
    ways = [p.factor for p in prepared]
    measured = time_shape([p.once for p in prepared], ways,
                          None if criteria is None else criteria(ways), warmup,
                          shape_rules(repeats))
    return [Timed(p.m, p.n, p.k, p.factor, p.compile_s, p.cached, p.max_abs_err,
                  tuple(v for v in t if not np.isnan(v)))
            for p, t in zip(prepared, measured.seconds, strict=True)], measured


def shape_times(timed: Sequence[Timed], measured: Measured | None = None) -> ShapeTimes:
    """The host table's record of one shape's timings (IREE's own compile left out), with the
    rounds and the spread of the chosen factor's least time where ``measured``."""
    first = timed[0]
    times = tuple((t.factor, t.least) for t in timed if t.factor > 0)
    spread = 0.0
    if measured is not None:  # the chosen factor's least time, known within this fraction
        chosen = chosen_factor(dict(times))
        spread = measured.spread[[t.factor for t in timed].index(chosen)]
    return ShapeTimes(first.m, first.n, first.k, times,
                      measured.rounds if measured is not None else 0, round(spread, 4))


def trust(shapes: Sequence[ShapeTimes], measured: Sequence[Measured]) -> HostMeasurement:
    """The shapes as a measurer's answer: trusted where every shape's measurement is (stable,
    its choice within ``REGRET`` of the fastest, no load over the cores), else why not."""
    load = Load.across([m.load for m in measured])
    bad = [(s, m) for s, m in zip(shapes, measured, strict=True) if not m.trusted]
    why = ""
    if bad:
        s, m = bad[0]
        why = (f"{len(bad)} of {len(shapes)} shapes could not be trusted ({s.m}x{s.n}x{s.k}: "
               f"{m.untrusted_why})")
    return HostMeasurement(tuple(shapes), not bad, why, (load.before, load.after))


def measure(shapes: Sequence[tuple[int, int, int]], console: Console | None = None,
            factors: Sequence[int] = FACTORS, warmup: int = WARMUP, repeats: int = REPEATS
            ) -> HostMeasurement:
    """Time every factor of each shape (``measure_shape``) under a progress bar."""
    console = console or Console(stderr=True)
    out, noise = [], []
    # redrawn between steps only: a refresh thread would share the cores being timed
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("split-K table", total=len(shapes))

        def step(what: str) -> None:
            progress.update(task, description=f"measuring this host's split-K table: {what}")
            progress.refresh()

        for m, n, k in shapes:
            timed, measured = measure_shape(m, n, k, factors, warmup, repeats, step=step)
            out.append(shape_times(timed, measured))
            noise.append(measured)
            progress.advance(task)
            progress.refresh()
    return trust(out, noise)


def measure_host(key: HostKey, load: Callable[[], float | None] = load_average
                 ) -> HostMeasurement:
    """The measurer ``import apportion`` registers: the default shapes on this host, with a
    progress bar on stderr; nothing measured where the load average is already over the
    machine's cores (the measurement could not be trusted)."""
    console = Console(stderr=True)
    before = load()
    if before is not None and before > key.cores:
        return HostMeasurement((), False, f"the load average {before:.2f} is over this "
                               f"machine's {key.cores} cores, so nothing was measured",
                               (before, None))
    shapes = default_shapes()
    console.print(f"measuring the split-K table of this host ({key.model}, {key.cores} cores, "
                  f"IREE {key.iree}): {len(shapes)} matmul shapes, once per host",
                  highlight=False)
    return measure(shapes, console)


def host_table_view(table: HostTable) -> Table:
    """A host table as a rich table: per shape the least ms of each factor, the factor chosen
    and the shapes its row holds."""
    factors = sorted({f for s in table.shapes for f, _ in s.seconds})
    t = Table(title=f"split-K table of this host ({table.key.model}, {table.key.cores} cores, "
                    f"IREE {table.key.iree}): least ms per factor of K, the stock cpu target's "
                    "plans", title_justify="left")
    t.add_column("M x N x K")
    for f in factors:
        t.add_column(str(f), justify="right")
    t.add_column("chosen", justify="right")
    t.add_column("row holds (M, N, K)")
    for s, row in zip(table.shapes, table.rows, strict=True):
        by = dict(s.seconds)
        t.add_row(f"{s.m} x {s.n} x {s.k}",
                  *(f"{by[f] * 1e3:.2f}" if f in by else "-" for f in factors), str(s.factor),
                  ", ".join(f"{lo}..{hi}" for lo, hi in (row.m, row.n, row.k)))
    return t


def measure_table_again(console: Console) -> HostTable | None:
    """``calibrate --measure``'s part: this host's split-K table measured (again, unless this
    process just measured it), cached and printed (None: ``APPORTION_CPU_SPLIT_K=shipped``, or
    a measurement that could not be trusted, which is not cached)."""
    table = host_table(measure_again=True)
    if table is None:
        why = untrusted_why()
        console.print("split-K table: APPORTION_CPU_SPLIT_K=shipped, the shipped table applies; "
                      "not measured" if why is None else f"split-K table: not cached ({why}); "
                      "the shipped table applies", highlight=False)
        return None
    console.print(host_table_view(table))
    return table


def fingerprint(shapes: Sequence[tuple[int, int, int]] | None = None,
                factors: Sequence[int] = (1, 2, 8)) -> str:
    """The sha256 of the IR the stock target emits for ``shapes`` (default: the default shapes)
    with K split each of ``factors`` ways: the code a host table times, part of its key (a
    planner or emitter that emits other code makes the table measured again).

    >>> len(fingerprint([(1, 64, 2048)]))
    64
    """
    import hashlib

    target = factor_target()
    h = hashlib.sha256()
    for m, n, k in default_shapes() if shapes is None else shapes:
        for f in factors_of(k, factors):
            program = matmul_program(m, n, k, "float32", f)
            try:
                result = plan(program, target)
            except ApportionError as e:  # a factor the target cannot plan is part of the code
                h.update(str(e).encode())
                continue
            planned = result.rewritten if result.rewritten is not None else program
            h.update(forall_mlir(_lowered(planned, result, target)).encode())
    return h.hexdigest()
