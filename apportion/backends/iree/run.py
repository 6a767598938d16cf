"""Running a plan on IREE: its parallel IR (``mlir.forall``) compiled and run by
IREE (``backends.iree.runtime``), checked against the reference executor.

This module joins an emitter and an executor, which the import contracts keep apart
(``backends-independent``), so it sits above both and below ``planned``.

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> checks, run = iree_check(planned.program, planned.plan, planned.target)  # doctest: +SKIP
>>> all(c.ok for c in checks), run.compile_s > 0                              # doctest: +SKIP
(True, True)
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from apportion.backends.iree import runtime as iree
from apportion.errors import EmitError, ExecutionError, ProgramError
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.limits import cite
from apportion.mlir.bodies import supported
from apportion.mlir.forall import (
    forall_mlir,
    mlir_type,
    size_symbols,
    symbol_name,
    symbols,
    verify_mlir,
)
from apportion.plans.plan import Plan
from apportion.runtime.reference import (
    OutputCheck,
    bind_inputs,
    compare,
    evaluate_op,
    random_inputs,
    run_unplanned,
)
from apportion.schedule.lower import infer_sizes, lower, planned_counts
from apportion.schedule.values import Schedule
from apportion.target.target import Target

BACKENDS = ("reference", "iree")


@dataclass(frozen=True)
class IreeRun:
    """One run in IREE: the inputs and outputs by name (storage arrays, as the reference
    executor gives them), seconds compiling (0.0 when the module came from the cache), whether
    it did, and seconds the call took."""

    tensors: dict[str, np.ndarray]
    compile_s: float
    cached: bool
    run_s: float


def emitted(program: Program, plan: Plan, target: Target, symbolic: Program | None = None
            ) -> Schedule:
    """The schedule a module is emitted from (``forall.forall_mlir``): ``plan`` lowered at the
    values its symbolic loop counts were planned at (they stay the function's arguments), of
    ``symbolic``, the program as given, where it has run-time sizes (``program`` and ``plan``
    are then at its planning sizes): the function covers every size.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/dynamic_k.json"), ap.targets.spyre(cores=8))
    >>> s = emitted(planned.program, planned.plan, planned.target, planned.given)
    >>> s.given is planned.given, s.sizes
    (True, (('K', 65536),))
    """
    if (plan.target, plan.cores) != (target.name, target.cores):
        raise EmitError(f"plan is for {plan.target!r} with {plan.cores} cores, not "
                        f"{target.name!r} with {target.cores}")
    source = symbolic if symbolic is not None and symbolic.symbols else program
    return lower(source, plan, target, params=planned_counts(plan) or None)


def host_ops(program: Program) -> tuple[str, ...]:
    """The ops the IREE backend runs on the host: those whose kind its per-kind table lacks
    (``mlir.bodies``), numpy's random generators, which no compiled module reproduces.
    Every other whole-tensor kind (gathers, reshapes, concatenations, constants, ranges, top-k)
    is parallel IR."""
    return tuple(op.name for op in program.ops if not supported(op.kind))


def segments(program: Program, plan: Plan) -> list[tuple[Program, Plan] | Op]:
    """``program`` cut at its host ops: the host ops that read nothing (random numbers) first,
    lifted out of wherever they sit (a loop group included), then each maximal run of the
    other ops as a program of its own (its inputs: what the run reads from before it, a lifted
    op's result among them; its outputs: what later ops or the program need; its tiling groups
    and their loop plans) with each host op that reads tensors alone between them. A run that
    nothing after it reads (dead ops only) is left out. A host op that reads tensors must sit
    outside every loop group.

    >>> import apportion as ap
    >>> p = ap.load("examples/mlp.json")
    >>> [type(s).__name__ for s in segments(p, ap.plan(p, ap.targets.spyre(cores=8)).plan)]
    ['tuple']
    """
    host = set(host_ops(program))
    if not host:
        return [(program, plan)]
    lifted = [op for op in program.ops if op.name in host and not op.ins]
    cut = host - {op.name for op in lifted}
    for g in plan.groups:
        inside = sorted(cut & set(g.ops))
        if inside:
            op = program.op(inside[0])
            raise ExecutionError(f"IREE backend: op {op.name!r} ({op.kind.name}) runs on the "
                                 f"host but sits in loop group {list(g.path)} {list(g.ops)}; a "
                                 "host step that reads tensors runs between IREE modules, "
                                 f"outside every loop group {cite('iree-host-op-in-loop-group')}")
    runs: list[list[Op] | Op] = []
    for op in program.ops:
        if op.name in cut:
            runs.append(op)
        elif op.name in host:
            continue  # lifted: computed before everything
        elif runs and isinstance(runs[-1], list):
            runs[-1].append(op)
        else:
            runs.append([op])
    out: list[tuple[Program, Plan] | Op] = list(lifted)
    for i, run in enumerate(runs):
        if not isinstance(run, list):
            out.append(run)
            continue
        later = {a.tensor for op in program.ops[program.ops.index(run[-1]) + 1:]
                 for a in op.ins} | set(program.outputs)
        if not any(op.out.tensor in later for op in run):
            continue  # dead ops: nothing reads what they make
        part = part_program(program, run, later, f"{program.name}_part{i}")
        names = {op.name for op in run}
        groups = (replace(g, ops=tuple(n for n in g.ops if n in names)) for g in plan.groups)
        part_plan = replace(plan, program=part.name,
                            ops=tuple(o for o in plan.ops if o.name in names),
                            groups=tuple(g for g in groups if g.ops), buffers=(),
                            rewritten=None)
        out.append((part, part_plan))
    return out


def part_program(program: Program, run: list[Op], later: set[str], name: str) -> Program:
    """The program of the ops ``run`` (consecutive but for lifted host ops) of ``program``:
    its inputs what the run reads and does not make, its outputs what it makes that ``later``
    names, its tiling groups those of ``program`` restricted to the run's ops."""
    made = {op.out.tensor for op in run}
    ins = tuple(dict.fromkeys(a.tensor for op in run for a in op.ins if a.tensor not in made))
    outs = tuple(op.out.tensor for op in run if op.out.tensor in later)
    names = {op.name for op in run}
    used = set(ins) | made
    tiling = tuple(replace(t, ops=tuple(n for n in t.ops if n in names),
                           depths=tuple((n, d) for n, d in t.depths if n in names))
                   for t in program.tiling if names & set(t.ops))
    return replace(program, name=name, tensors=tuple(t for t in program.tensors if t.name in used),
                   inputs=ins, outputs=outs, ops=tuple(run), tiling=tiling, work_division=(),
                   split_k=())


def gather_indices(program: Program) -> tuple[str, ...]:
    """The index tensors of the program's gathers that the program makes (not its inputs):
    ``iree_run`` returns them too, to check them after the run."""
    made = {op.out.tensor for op in program.ops}
    return tuple(dict.fromkeys(
        op.ins[1].tensor for op in program.ops
        if op.kind.name == "gather" and op.ins[1].tensor in made
        and op.ins[1].tensor not in program.outputs))


def check_gathers(program: Program, tensors: Mapping[str, np.ndarray]) -> None:
    """Raise ExecutionError, as the reference executor does (numpy's ``take``), for a gather
    index outside ``[-rows, rows)`` of its table; the module read a clamped row there."""
    for op in program.ops:
        if op.kind.name != "gather" or op.ins[1].tensor not in tensors:
            continue
        table, ids = (program.tensor(a.tensor) for a in op.ins)
        out = program.tensor(op.out.tensor)
        n_ids = math.prod(ids.shape)
        rows = math.prod(table.shape) // max(math.prod(out.shape) // max(n_ids, 1), 1)
        flat = np.asarray(tensors[op.ins[1].tensor]).reshape(-1).astype(np.int64)
        bad = flat[(flat < -rows) | (flat >= rows)]
        if bad.size:
            raise ExecutionError(f"op {op.name!r}: gather failed: index {int(bad[0])} is out "
                                 f"of bounds for axis 0 with size {rows}")


def iree_run(program: Program, plan: Plan, target: Target, inputs: Mapping[str, np.ndarray],
             params: Mapping[str, int] | None = None,
             cache_dir: str | os.PathLike[str] | None = None,
             symbolic: Program | None = None, sizes: Mapping[str, int] | None = None
             ) -> IreeRun:
    """Emit ``plan`` as parallel IR, verify it, compile it (or take it from the cache) and run
    it on ``inputs``; ``params`` gives the symbolic loop counts.

    Ops whose kind the backend has no parallel IR for (``host_ops``: numpy's random numbers)
    run on the host with the reference executor's kernels, between IREE modules for the runs
    of other ops (``segments``). A gather index outside its table is refused after the run,
    as the reference executor refuses it (``check_gathers``).

    ``symbolic`` is the program as given where it has run-time sizes (``program`` and ``plan``
    are then at its planning sizes, as ``PlannedProgram`` holds them): the module covers every
    size, so one compile serves them all; a run takes its sizes from the inputs' shapes (and
    ``sizes``, or sizes named in ``params``), checks them as the reference executor would
    (bounds, split-K cuts into whole planning units) and gets the outputs at those sizes.
    """
    host = host_ops(program)
    if host and symbolic is not None and symbolic.symbols:
        return _run_lifted(program, plan, target, inputs, params, cache_dir, symbolic, sizes)
    if host:
        if sizes:
            raise ExecutionError(f"program {program.name!r} has no run-time sizes; got "
                                 f"{sorted(sizes)}")
        return _run_segments(program, plan, target, inputs, params, cache_dir)
    b = bind_run(program, plan, target, inputs, params, symbolic, sizes)
    program, symbolic, bound, loop_params, size_args, given_outputs = (
        b.program, b.symbolic, b.bound, b.loop_params, b.size_args, b.given_outputs)
    schedule = emitted(program, plan, target, symbolic)
    text = forall_mlir(schedule)
    verify_mlir(text)
    bound_program = bound.program
    env = bind_inputs(bound_program, inputs)
    check_gathers(bound_program, env)  # the indices the program takes, before compiling
    compiled = iree.compile_mlir(text, cache_dir)
    args = [(env[n], mlir_type(program.tensor(n).dtype)) for n in program.inputs]
    args += [(int(loop_params[s]), "index") for s in symbols(schedule)]
    args += [(n, "index") for n in size_args]
    results = [mlir_type(program.tensor(n).dtype) for n in program.outputs]
    run = iree.run_vmfb(compiled.vmfb, symbol_name(program.name), args, results)
    tensors = dict(env)
    for name, a in zip(program.outputs, run.outputs, strict=True):
        tensors[name] = a.reshape(bound_program.tensor(name).shape)
    check_gathers(bound_program, tensors)
    tensors = {n: a for n, a in tensors.items() if n in env or n in given_outputs}
    return IreeRun(tensors, compiled.compile_s, compiled.cached, run.run_s)


def _run_segments(program: Program, plan: Plan, target: Target,
                  inputs: Mapping[str, np.ndarray], params: Mapping[str, int] | None,
                  cache_dir: str | os.PathLike[str] | None) -> IreeRun:
    env = bind_inputs(program, inputs)
    compile_s, run_s, cached = 0.0, 0.0, True
    for seg in segments(program, plan):
        if isinstance(seg, Op):
            start = time.perf_counter()
            env[seg.out.tensor] = np.asarray(evaluate_op(seg, program, env))
            run_s += time.perf_counter() - start
            continue
        part, part_plan = seg
        done = iree_run(part, part_plan, target, {n: env[n] for n in part.inputs}, params,
                        cache_dir)
        env.update({n: done.tensors[n] for n in part.outputs})
        compile_s += done.compile_s
        run_s += done.run_s
        cached = cached and done.cached
    return IreeRun({n: env[n] for n in (*program.inputs, *program.outputs)}, compile_s, cached,
                   run_s)


def lift(program: Program, plan: Plan, symbolic: Program
         ) -> tuple[list[Op], Program, Plan, Program]:
    """A program with run-time sizes (``symbolic``, planned at its planning sizes as ``program``
    with ``plan``) without its host ops, which must read nothing (random numbers): those ops,
    then the rest at the planning sizes, its plan, and the rest as given, the lifted ops'
    results among their inputs."""
    host = set(host_ops(program))
    lifted = [op for op in symbolic.ops if op.name in host]
    reading = [op.name for op in lifted if op.ins]
    if reading:
        raise ExecutionError(f"IREE backend: program {program.name!r} has run-time sizes and "
                             f"host ops that read tensors ({', '.join(reading)}); run it with "
                             "the reference or torch backend "
                             f"{cite('iree-host-ops-with-runtime-sizes')}")
    names = {op.name for op in lifted}
    later = set(program.outputs)
    part = part_program(program, [op for op in program.ops if op.name not in names], later,
                        program.name)
    given = part_program(symbolic, [op for op in symbolic.ops if op.name not in names], later,
                         program.name)
    groups = (replace(g, ops=tuple(n for n in g.ops if n not in names)) for g in plan.groups)
    part_plan = replace(plan, ops=tuple(o for o in plan.ops if o.name not in names),
                        groups=tuple(g for g in groups if g.ops), buffers=(), rewritten=None)
    return lifted, part, part_plan, given


def modules(program: Program, plan: Plan, symbolic: Program | None = None
            ) -> list[tuple[Program, Plan, Program | None]]:
    """What a run compiles: (program, plan, program as given where it has run-time sizes) of
    each IREE module, host ops cut out (``segments``, ``lift``); the refusals a run makes.

    >>> import apportion as ap
    >>> p = ap.load("examples/mlp.json")
    >>> len(modules(p, ap.plan(p, ap.targets.spyre(cores=8)).plan))
    1
    """
    if symbolic is not None and symbolic.symbols:
        if not host_ops(program):
            return [(program, plan, symbolic)]
        _, part, part_plan, given = lift(program, plan, symbolic)
        return [(part, part_plan, given)] if part.outputs else []
    return [(*s, None) for s in segments(program, plan) if isinstance(s, tuple)]


def _run_lifted(program: Program, plan: Plan, target: Target,
                inputs: Mapping[str, np.ndarray], params: Mapping[str, int] | None,
                cache_dir: str | os.PathLike[str] | None, symbolic: Program,
                sizes: Mapping[str, int] | None) -> IreeRun:
    """A program with run-time sizes and host ops that read nothing (random numbers): those
    computed on the host at the run's sizes, then one module for every size with their results
    as inputs."""
    lifted, part, part_plan, given_part = lift(program, plan, symbolic)
    found = {**(sizes or {}), **{k: v for k, v in (params or {}).items()
                                 if k in symbolic.symbol_map}}
    try:
        bound = symbolic.bind(infer_sizes(symbolic, inputs, found))
    except ProgramError as e:
        raise ExecutionError(str(e)) from None
    env = bind_inputs(bound, inputs)
    start = time.perf_counter()
    for op in lifted:
        env[op.out.tensor] = np.asarray(evaluate_op(op, bound, env))
    compile_s, cached, run_s = 0.0, True, time.perf_counter() - start
    if part.outputs:  # else every output is an input or a host op's result
        done = iree_run(part, part_plan, target, {n: env[n] for n in part.inputs}, params,
                        cache_dir, given_part, sizes)
        env.update(done.tensors)
        compile_s, cached, run_s = done.compile_s, done.cached, run_s + done.run_s
    return IreeRun({n: env[n] for n in (*program.inputs, *program.outputs)}, compile_s, cached,
                   run_s)


def iree_check(program: Program, plan: Plan, target: Target, seed: int = 0,
               params: Mapping[str, int] | None = None,
               cache_dir: str | os.PathLike[str] | None = None,
               symbolic: Program | None = None) -> tuple[list[OutputCheck], IreeRun]:
    """Run in IREE and unplanned on the same random inputs; compare every output. A program
    with run-time sizes (``symbolic``, see ``iree_run``) runs at the sizes ``params`` names
    (the others at their planning sizes), ``symbolic`` unplanned at those sizes the reference."""
    reference = reference_at(program, symbolic, params)
    inputs = random_inputs(reference, seed)
    run = iree_run(program, plan, target, inputs, params, cache_dir, symbolic)
    return compare(run_unplanned(reference, inputs), run.tensors, reference), run


@dataclass(frozen=True)
class BoundRun:
    """A run's arguments bound, before anything compiles: the program (with the indices its
    gathers compute as extra outputs), the program as given where it has run-time sizes, the
    schedule bound at the run's sizes and loop counts (every error of either raised as the
    reference executor raises it), the loop counts left after sizes named in ``params``, the
    size arguments in the function's order, and the outputs the caller asked for."""

    program: Program
    symbolic: Program | None
    bound: Schedule
    loop_params: dict[str, int]
    size_args: list[int]
    given_outputs: tuple[str, ...]

    def arguments(self, env: Mapping[str, np.ndarray], schedule: Schedule
                  ) -> list[tuple[str, np.ndarray | int, str]]:
        """The function's arguments in order, each (name, value, element type): the inputs
        of ``env`` as the emitter types them, then ``schedule``'s symbolic loop counts and the
        run-time sizes (``size0``, ...) as ``index``."""
        out: list[tuple[str, np.ndarray | int, str]] = [
            (n, env[n], mlir_type(self.program.tensor(n).dtype)) for n in self.program.inputs]
        out += [(s, int(self.loop_params[s]), "index") for s in symbols(schedule)]
        out += [(f"size{k}", int(v), "index") for k, v in enumerate(self.size_args)]
        return out

    def results(self) -> list[tuple[str, tuple[int, ...], str]]:
        """The function's results in order, each (name, shape at the run's sizes, element
        type)."""
        return [(n, tuple(self.bound.program.tensor(n).shape),
                 mlir_type(self.program.tensor(n).dtype)) for n in self.program.outputs]


def bind_run(program: Program, plan: Plan, target: Target, inputs: Mapping[str, np.ndarray],
             params: Mapping[str, int] | None, symbolic: Program | None,
             sizes: Mapping[str, int] | None) -> BoundRun:
    """Bind a run of the parallel IR (``iree_run``; the openmp backend's too): see BoundRun."""
    given_outputs = program.outputs
    extra = gather_indices(program)
    if extra:  # the module also returns the indices its gathers compute, to check them
        program = replace(program, outputs=(*program.outputs, *extra))
        if symbolic is not None and symbolic.symbols:
            symbolic = replace(symbolic, outputs=program.outputs)
    loop_params = dict(params or {})
    size_args: list[int] = []
    if symbolic is not None and symbolic.symbols:
        given = {**(sizes or {}), **{k: loop_params.pop(k) for k in list(loop_params)
                                     if k in symbolic.symbol_map}}
        found = infer_sizes(symbolic, inputs, given)
        # bound at the run's sizes and loop counts: every error of either raised here, as the
        # reference executor raises it, before anything compiles
        bound = lower(symbolic, plan, target, found, loop_params or None)
        at = {**symbolic.planning_sizes(), **found}
        size_args = [at[s] for s in size_symbols(symbolic)]
    elif sizes:
        raise ExecutionError(f"program {program.name!r} has no run-time sizes; got "
                             f"{sorted(sizes)}")
    else:
        bound = lower(program, plan, target, params=loop_params or None)
    return BoundRun(program, symbolic, bound, loop_params, size_args, given_outputs)


def one_module_ir(program: Program, plan: Plan, target: Target, backend: str,
                  symbolic: Program | None = None) -> tuple[Schedule, str]:
    """The schedule a backend that runs one module emits (``emitted``) and its parallel IR.
    Refuses, naming ``backend``, the op and the documented limit, an op the IR has no
    construction for (IREE runs those on the host between its modules).

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    >>> "scf.forall" in one_module_ir(planned.program, planned.plan, planned.target, "x")[1]
    True
    """
    host = host_ops(program)
    if host:
        op = program.op(host[0])
        raise ExecutionError(f"{backend} backend: op {op.name!r} ({op.kind.name}) has no "
                             "parallel IR (IREE runs it on the host between modules; this "
                             f"backend runs one module) {cite('iree-kind-without-mlir')}")
    schedule = emitted(program, plan, target, symbolic)
    return schedule, forall_mlir(schedule)


def reference_at(program: Program, symbolic: Program | None,
                 params: Mapping[str, int] | None) -> Program:
    """The unplanned program a check compares with: ``symbolic`` bound at the sizes ``params``
    names (the others at their planning sizes) where it has run-time sizes, else ``program``."""
    if symbolic is None or not symbolic.symbols:
        return program
    try:
        return symbolic.bind({k: v for k, v in (params or {}).items()
                              if k in symbolic.symbol_map})
    except ProgramError as e:
        raise ExecutionError(str(e)) from None
