"""Running a schedule on IREE: its parallel IR (``mlir.forall``, one module for every run-time
size and loop count: ``mlir.module``) compiled and run by IREE (``backends.iree.runtime``).

A run takes a schedule bound at its run-time sizes and symbolic loop counts
(``PlannedProgram.schedule``); what IREE compiles is the schedule it binds
(``Schedule.covering``), called with this run's sizes and counts. Ops the parallel IR has no
construction for (``mlir.module.host_ops``: numpy's random numbers) run on the host with the
reference executor's kernels, between IREE modules for the runs of other ops (the schedule
cut by ``schedule.parts.segments``). A gather index outside its table is refused after the
run, as the reference executor refuses it (``runtime.reference.check_gathers``).

>>> import apportion as ap
>>> from apportion.runtime.check import expect
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> want = expect(planned.program)
>>> run = iree_run(planned.lowered, want.inputs)             # doctest: +SKIP
>>> all(c.ok for c in want.compare(run)), run.compile_s > 0  # doctest: +SKIP
(True, True)
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from apportion.backends.iree import runtime as iree
from apportion.errors import ExecutionError
from apportion.ir.op import Op
from apportion.limits import cite
from apportion.mlir.forall import forall_mlir, verify_mlir
from apportion.mlir.module import call, host_ops, with_gather_indices
from apportion.runtime.reference import bind_inputs, check_gathers, evaluate_op
from apportion.schedule.parts import enclosing, ops_in, part, segments
from apportion.schedule.values import Schedule


@dataclass(frozen=True)
class IreeRun:
    """One run in IREE: the inputs and outputs by name (storage arrays, as the reference
    executor gives them), seconds compiling (0.0 when the module came from the cache), whether
    it did, and seconds the call took."""

    tensors: dict[str, np.ndarray]
    compile_s: float
    cached: bool
    run_s: float


def iree_run(schedule: Schedule, inputs: Mapping[str, np.ndarray],
             cache_dir: str | os.PathLike[str] | None = None) -> IreeRun:
    """Emit the module of ``schedule`` (bound at the run's sizes and loop counts) as parallel
    IR, verify it, compile it (or take it from the cache) and run it on ``inputs``; returns the
    inputs and outputs. A schedule with run-time sizes compiles one module for every size, so
    one compile serves them all (see the module docstring for host ops and gathers)."""
    host = host_ops(schedule.program)
    if host and schedule.given is not None:
        return _run_lifted(schedule, inputs, cache_dir, host)
    if host:
        return _run_segments(schedule, inputs, cache_dir, host)
    s = with_gather_indices(schedule)
    text = forall_mlir(s.covering)
    verify_mlir(text)
    program = schedule.program
    env = bind_inputs(program, inputs)
    check_gathers(program, env)  # the indices the program takes, before compiling
    compiled = iree.compile_mlir(text, cache_dir)
    c = call(s, env)
    run = iree.run_vmfb(compiled.vmfb, c.function, [(v, elt) for _, v, elt in c.arguments],
                        [elt for _, _, elt in c.results])
    tensors = dict(env)
    for (name, shape, _), a in zip(c.results, run.outputs, strict=True):
        tensors[name] = a.reshape(shape)
    check_gathers(program, tensors)
    tensors = {n: a for n, a in tensors.items() if n in env or n in program.outputs}
    return IreeRun(tensors, compiled.compile_s, compiled.cached, run.run_s)


def modules(schedule: Schedule) -> list[Schedule]:
    """What a run of ``schedule`` compiles: the schedule of each IREE module, host ops cut out
    (``segments``; with run-time sizes, the host ops that read nothing lifted); the refusals a
    run makes.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
    >>> modules(planned.lowered) == [planned.lowered]
    True
    """
    host = host_ops(schedule.program)
    if schedule.given is not None:
        if not host:
            return [schedule]
        rest = _lifted(schedule, host)
        return [rest] if rest.program.outputs else []
    _check_host(schedule, host)
    return [s for s in segments(schedule, host) if isinstance(s, Schedule)]


def _check_host(schedule: Schedule, host: tuple[str, ...]) -> None:
    """Refuse a host op that reads tensors inside a loop: it runs between modules."""
    for name in host:
        op = schedule.program.op(name)
        loops = enclosing(schedule, name) if op.ins else ()
        if loops:
            group = [s.op for s in ops_in(loops[0])]
            raise ExecutionError(f"IREE backend: op {op.name!r} ({op.kind.name}) runs on the "
                                 f"host but sits in loop group {list(loops[0].path)} {group}; "
                                 "a host step that reads tensors runs between IREE modules, "
                                 f"outside every loop group {cite('iree-host-op-in-loop-group')}")


def _run_segments(schedule: Schedule, inputs: Mapping[str, np.ndarray],
                  cache_dir: str | os.PathLike[str] | None, host: tuple[str, ...]) -> IreeRun:
    _check_host(schedule, host)
    program = schedule.program
    env = bind_inputs(program, inputs)
    compile_s, run_s, cached = 0.0, 0.0, True
    for seg in segments(schedule, host):
        if isinstance(seg, Op):
            start = time.perf_counter()
            env[seg.out.tensor] = np.asarray(evaluate_op(seg, program, env))
            run_s += time.perf_counter() - start
            continue
        done = iree_run(seg, {n: env[n] for n in seg.program.inputs}, cache_dir)
        env.update({n: done.tensors[n] for n in seg.program.outputs})
        compile_s += done.compile_s
        run_s += done.run_s
        cached = cached and done.cached
    return IreeRun({n: env[n] for n in (*program.inputs, *program.outputs)}, compile_s, cached,
                   run_s)


def _lifted(schedule: Schedule, host: tuple[str, ...]) -> Schedule:
    """A schedule with run-time sizes without its host ops, which must read nothing (random
    numbers): the rest, its program named as the whole's, the host ops' results among its
    inputs."""
    program = schedule.program
    reading = [n for n in host if program.op(n).ins]
    if reading:
        raise ExecutionError(f"IREE backend: program {program.name!r} has run-time sizes and "
                             f"host ops that read tensors ({', '.join(reading)}); run it with "
                             "the reference or torch backend "
                             f"{cite('iree-host-ops-with-runtime-sizes')}")
    return part(schedule, [op.name for op in program.ops if op.name not in host],
                program.outputs, program.name)


def _run_lifted(schedule: Schedule, inputs: Mapping[str, np.ndarray],
                cache_dir: str | os.PathLike[str] | None, host: tuple[str, ...]) -> IreeRun:
    """A schedule with run-time sizes and host ops that read nothing (random numbers): those
    computed on the host at the run's sizes, then one module for every size with their
    results as inputs."""
    rest = _lifted(schedule, host)
    program = schedule.program
    env = bind_inputs(program, inputs)
    start = time.perf_counter()
    for name in host:
        op = program.op(name)
        env[op.out.tensor] = np.asarray(evaluate_op(op, program, env))
    compile_s, cached, run_s = 0.0, True, time.perf_counter() - start
    if rest.program.outputs:  # else every output is an input or a host op's result
        done = iree_run(rest, {n: env[n] for n in rest.program.inputs}, cache_dir)
        env.update(done.tensors)
        compile_s, cached, run_s = done.compile_s, done.cached, run_s + done.run_s
    return IreeRun({n: env[n] for n in (*program.inputs, *program.outputs)}, compile_s, cached,
                   run_s)
