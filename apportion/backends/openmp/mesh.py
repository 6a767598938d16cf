"""A program sharded over a mesh, run by the openmp backend: every device's segments as the
parallel IR this backend runs for one device (``run.openmp_run``: ``scf.forall`` lowered by
upstream MLIR to OpenMP and JIT-compiled, once per distinct segment: devices whose segments are
equal share one schedule, so one module), the collectives and finishes between devices by the
schedule's own host data movement (``schedule.mesh.MeshSteps``), as every mesh runner does.

``mesh_parallel_ir`` is what ``supports`` emits up front: each distinct segment's parallel IR,
so a segment the emitter refuses is refused by the documented limit it cites before anything
is lowered.

>>> from apportion.frontend.json_format import load
>>> from apportion.mlir import upstream
>>> from apportion.sharding.lower import lower_plan
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> s = lower_plan(search(load("examples/megatron.json"), parse("tp=2")))
>>> len(mesh_parallel_ir(s)) == s.distinct()
True
>>> from apportion.runtime.check import expect
>>> if upstream.available() and upstream.openmp_library() is not None:
...     want = expect(s.program)
...     run = run_mesh(s, want.inputs, threads=2)
...     assert all(c.ok for c in want.compare(run)) and run.modules == s.distinct()
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from apportion.backends.openmp import engine as omp
from apportion.backends.openmp.run import openmp_run, parallel_ir
from apportion.schedule.mesh import MeshSchedule, MeshSteps


@dataclass(frozen=True)
class OpenmpMeshRun:
    """One run of a mesh schedule: the outputs by name (storage arrays), how many distinct
    segment modules ran, seconds lowering and compiling them (0.0 when every one was
    compiled before in this process), seconds in the modules' calls, seconds of the rest (the
    collectives and finishes on the host, binding the segments' arguments), and the OpenMP
    team size each call ran with."""

    outputs: dict[str, np.ndarray]
    modules: int
    compile_s: float
    run_s: float
    host_s: float
    threads: int


def mesh_parallel_ir(schedule: MeshSchedule) -> tuple[str, ...]:
    """The parallel IR of every distinct segment of ``schedule``, as ``run_mesh`` lowers it
    (not lowered here); an op the IR has no construction for is refused naming the op and
    the documented limit, as for one device's plan."""
    return tuple(parallel_ir(launch.schedule) for launch in schedule.distinct_launches())


def run_mesh(schedule: MeshSchedule, inputs: Mapping[str, np.ndarray],
             threads: int | None = None, lowering: omp.Lowering = omp.PARALLEL
             ) -> OpenmpMeshRun:
    """Every device's segments run with ``threads`` OpenMP threads (None: the runtime's
    default), each segment's module lowered by ``lowering`` and compiled once (or taken from
    this process's cache), the collectives and finishes between them on the host by the
    schedule's own data movement; the outputs by name (see the module docstring)."""
    compile_s = run_s = inside_s = 0.0
    modules: set[int] = set()
    team = threads if threads is not None else omp.max_threads()

    start = time.perf_counter()
    steps = MeshSteps(schedule, inputs)
    for step in steps:
        begun = time.perf_counter()
        segment = step.launch.schedule
        # the segment's schedule at the mesh's loop counts: the module's count arguments
        done = openmp_run(segment, step.inputs, team, lowering)
        if id(segment) not in modules:
            modules.add(id(segment))
            compile_s += done.compile_s
        run_s += done.run_s
        inside_s += time.perf_counter() - begun
        steps.give(step, {n: done.tensors[n] for n in segment.program.outputs})
    outputs = steps.outputs()
    host_s = time.perf_counter() - start - inside_s
    return OpenmpMeshRun(outputs, len(modules), compile_s, run_s, host_s, team)
