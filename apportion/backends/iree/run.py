"""Running a plan on IREE: its parallel IR (``backends.iree.forall``) compiled and run by
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
from apportion.backends.iree.bodies import supported
from apportion.backends.iree.forall import (
    forall_mlir,
    mlir_type,
    size_symbols,
    symbol_name,
    symbols,
    verify_mlir,
)
from apportion.backends.limits import cite
from apportion.errors import ExecutionError, ProgramError
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.passes.bind import bind_plan, infer_sizes
from apportion.plans.plan import Plan
from apportion.plans.tiles import core_boxes, resolve_counts, tile_box
from apportion.runtime.reference import (
    OutputCheck,
    bind_inputs,
    compare,
    evaluate_op,
    random_inputs,
    run_unplanned,
)
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


def check_counts(program: Program, plan: Plan, params: Mapping[str, int] | None) -> None:
    """Raise ExecutionError, as the reference executor would, when a loop count (symbolic ones
    from ``params``) does not divide a tiled dim or cuts it into partial planning units."""
    needed = symbols(plan)
    extra = sorted(set(params or {}) - set(needed))
    if extra:
        raise ExecutionError(f"params {extra} given, but plan of {program.name!r} has no such "
                             "symbolic loop count")
    for g in plan.groups:
        resolve_counts(g.counts, params)
        for name in g.ops:
            op, opl = program.op(name), plan.op(name)
            # an op's own loops: fewer levels (a lesser depth) or more (a loop of its own)
            counts = resolve_counts(opl.loop.count if opl.loop else (), params)
            tile = tile_box(op.sizes, opl.loop, (0,) * len(counts), counts, op.name)
            core_boxes(opl, tile)


def host_ops(program: Program) -> tuple[str, ...]:
    """The ops the IREE backend runs on the host: those whose kind its per-kind table lacks
    (``backends.iree.bodies``), numpy's random generators, which no compiled module reproduces.
    Every other whole-tensor kind (gathers, reshapes, concatenations, constants, ranges, top-k)
    is parallel IR."""
    return tuple(op.name for op in program.ops if not supported(op.kind))


def segments(program: Program, plan: Plan) -> list[tuple[Program, Plan] | Op]:
    """``program`` cut at its host ops: each maximal run of the others as a program of its own
    (its inputs: what the run reads from before it; its outputs: what later ops or the program
    need; its tiling groups and their loop plans), and each host op alone. A run that nothing
    after it reads (dead ops only) is left out. A host op must sit outside every loop group.

    >>> import apportion as ap
    >>> p = ap.load("examples/mlp.json")
    >>> [type(s).__name__ for s in segments(p, ap.plan(p, ap.targets.spyre(cores=8)).plan)]
    ['tuple']
    """
    host = set(host_ops(program))
    if not host:
        return [(program, plan)]
    for g in plan.groups:
        inside = sorted(host & set(g.ops))
        if inside:
            op = program.op(inside[0])
            raise ExecutionError(f"IREE backend: op {op.name!r} ({op.kind.name}) runs on the "
                                 f"host but sits in loop group {list(g.path)} {list(g.ops)}; a "
                                 "host step runs between IREE modules, outside every loop group "
                                 f"{cite('iree-host-op-in-loop-group')}")
    runs: list[list[Op] | Op] = []
    for op in program.ops:
        if op.name in host:
            runs.append(op)
        elif runs and isinstance(runs[-1], list):
            runs[-1].append(op)
        else:
            runs.append([op])
    out: list[tuple[Program, Plan] | Op] = []
    for i, run in enumerate(runs):
        if not isinstance(run, list):
            out.append(run)
            continue
        made = {op.out.tensor for op in run}
        later = {a.tensor for op in program.ops[program.ops.index(run[-1]) + 1:]
                 for a in op.ins} | set(program.outputs)
        outs = [op.out.tensor for op in run if op.out.tensor in later]
        if not outs:
            continue  # dead ops: nothing reads what they make
        ins = list(dict.fromkeys(a.tensor for op in run for a in op.ins
                                 if a.tensor not in made))
        used = set(ins) | made
        names = {op.name for op in run}
        part = replace(program, name=f"{program.name}_part{i}",
                       tensors=tuple(t for t in program.tensors if t.name in used),
                       inputs=tuple(ins), outputs=tuple(outs), ops=tuple(run),
                       tiling=tuple(t for t in program.tiling if set(t.ops) <= names),
                       work_division=(), split_k=())
        part_plan = replace(plan, program=part.name,
                            ops=tuple(o for o in plan.ops if o.name in names),
                            groups=tuple(g for g in plan.groups if set(g.ops) <= names),
                            buffers=(), rewritten=None)
        out.append((part, part_plan))
    return out


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
    if host:
        if symbolic is not None and symbolic.symbols or sizes:
            raise ExecutionError(f"IREE backend: program {program.name!r} has run-time sizes "
                                 f"and whole-tensor fallback ops ({', '.join(host)})"
                                 "; run it with the reference or torch backend "
                                 f"{cite('iree-host-ops-with-runtime-sizes')}")
        return _run_segments(program, plan, target, inputs, params, cache_dir)
    given_outputs = program.outputs
    extra = gather_indices(program)
    if extra:  # the module also returns the indices its gathers compute, to check them
        program = replace(program, outputs=(*program.outputs, *extra))
        if symbolic is not None and symbolic.symbols:
            symbolic = replace(symbolic, outputs=program.outputs)
    loop_params = dict(params or {})
    bound_program, bound_plan = program, plan
    size_args: list[int] = []
    if symbolic is not None and symbolic.symbols:
        given = {**(sizes or {}), **{k: loop_params.pop(k) for k in list(loop_params)
                                     if k in symbolic.symbol_map}}
        found = infer_sizes(symbolic, inputs, given)
        try:
            bound_program, bound_plan = bind_plan(symbolic, plan, target, found)
        except ProgramError as e:
            raise ExecutionError(str(e)) from None
        text = forall_mlir(program, plan, target, symbolic=symbolic)
        at = {**symbolic.planning_sizes(), **found}
        size_args = [at[s] for s in size_symbols(symbolic)]
    elif sizes:
        raise ExecutionError(f"program {program.name!r} has no run-time sizes; got "
                             f"{sorted(sizes)}")
    else:
        text = forall_mlir(program, plan, target)
    verify_mlir(text)
    check_counts(bound_program, bound_plan, loop_params or None)
    env = bind_inputs(bound_program, inputs)
    check_gathers(bound_program, env)  # the indices the program takes, before compiling
    compiled = iree.compile_mlir(text, cache_dir)
    args = [(env[n], mlir_type(program.tensor(n).dtype)) for n in program.inputs]
    args += [(int(loop_params[s]), "index") for s in symbols(plan)]
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


def iree_check(program: Program, plan: Plan, target: Target, seed: int = 0,
               params: Mapping[str, int] | None = None,
               cache_dir: str | os.PathLike[str] | None = None,
               symbolic: Program | None = None) -> tuple[list[OutputCheck], IreeRun]:
    """Run in IREE and unplanned on the same random inputs; compare every output. A program
    with run-time sizes (``symbolic``, see ``iree_run``) runs at the sizes ``params`` names
    (the others at their planning sizes), ``symbolic`` unplanned at those sizes the reference."""
    reference = program
    if symbolic is not None and symbolic.symbols:
        try:
            reference = symbolic.bind({k: v for k, v in (params or {}).items()
                                       if k in symbolic.symbol_map})
        except ProgramError as e:
            raise ExecutionError(str(e)) from None
    inputs = random_inputs(reference, seed)
    run = iree_run(program, plan, target, inputs, params, cache_dir, symbolic)
    return compare(run_unplanned(reference, inputs), run.tensors, reference), run
