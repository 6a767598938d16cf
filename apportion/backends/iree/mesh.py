"""A program sharded over a mesh, run in IREE: the per-device segments run as IREE modules,
with the collectives between them on the host. ``apportion.mlir.mesh`` renders the same
schedule as every device's module, with its collectives as IREE's own ops.

Consumes only a ``schedule.mesh.MeshSchedule`` (``apportion.sharding.lower`` makes one).

``run_mesh`` runs each device's segments with ``backends.iree.run.iree_run`` (compiled once per
distinct segment; the module cache keeps them) and performs every collective and finish on the
host with the schedule's own data movement (``schedule.mesh.MeshSteps``: ``Collective.move``,
``FinishPart.apply``), as every mesh runner does (``runtime.check.expect`` compares the
outputs with the unplanned program's). The host stands in for the channel because IREE's CPU
driver has no collectives: the device modules compile for ``llvm-cpu``, but creating their
channel fails at run time (``hal.channel.create``: "collectives not implemented" in ``local_task``).

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.lower import lower_plan
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> from apportion.runtime.check import expect
>>> s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
>>> want = expect(s.program)
>>> run = run_mesh(s, want.inputs)                         # doctest: +SKIP
>>> all(c.ok for c in want.compare(run)), run.modules       # doctest: +SKIP
(True, 2)
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from apportion.backends.iree.run import iree_run
from apportion.schedule.mesh import MeshSchedule, MeshSteps


@dataclass(frozen=True)
class MeshRun:
    """One run of a mesh schedule: the outputs by name (storage arrays), how many distinct
    segment modules ran, seconds compiling them (0.0 when all came from the cache), whether
    all did, seconds in IREE calls, and seconds of collectives and finishes on the host."""

    outputs: dict[str, np.ndarray]
    modules: int
    compile_s: float
    cached: bool
    run_s: float
    host_s: float


def run_mesh(schedule: MeshSchedule, inputs: Mapping[str, np.ndarray],
             cache_dir: str | os.PathLike[str] | None = None) -> MeshRun:
    """Every device's segments run in IREE, the collectives and finishes between them on the
    host by the schedule's own data movement (``schedule.mesh.MeshSteps``); returns the outputs
    by name (see the module docstring)."""
    compile_s = run_s = inside_s = 0.0
    cached = True
    modules: set[int] = set()

    start = time.perf_counter()
    steps = MeshSteps(schedule, inputs)
    for step in steps:
        begun = time.perf_counter()
        segment = step.launch.schedule
        # the segment's schedule at the mesh's loop counts: the module's count arguments
        done = iree_run(segment, step.inputs, cache_dir)
        if id(segment) not in modules:
            modules.add(id(segment))
            compile_s += done.compile_s
            cached = cached and done.cached
        run_s += done.run_s
        inside_s += time.perf_counter() - begun
        steps.give(step, {n: done.tensors[n] for n in segment.program.outputs})
    outputs = steps.outputs()
    return MeshRun(outputs, len(modules), compile_s, cached, run_s,
                   time.perf_counter() - start - inside_s)
