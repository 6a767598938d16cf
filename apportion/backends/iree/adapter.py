"""The iree backend behind the one backend interface (``apportion.backends``): a schedule's
parallel IR (``forall``) compiled by IREE for the CPU and run (``run.iree_run``),
whole-tensor fallbacks on the host between modules. ``supports`` emits the parallel IR of the
plan's lowered schedule without compiling it, so what the emitter refuses is known before a
compile, by the documented limit it cites.

Its ``run_mesh`` runs a program sharded over a mesh, lowered (``schedule.mesh.MeshSchedule``,
from ``sharding.lower.lower_plan``): every device's segments as IREE modules, the collectives
between them on the host (``mesh.run_mesh``).

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> BACKEND.supports(planned)
()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from apportion.backends import Backend, Planned
from apportion.backends.iree.mesh import run_mesh
from apportion.backends.iree.run import iree_run, modules
from apportion.errors import ApportionError, ExecutionError
from apportion.limits import Limit, refused
from apportion.mlir.forall import forall_mlir
from apportion.schedule.mesh import Compute, MeshSchedule
from apportion.schedule.values import Schedule


def supports(planned: Planned) -> tuple[Limit, ...]:
    """The documented limits that stop IREE from running ``planned``: its lowered schedule
    cut at its host ops as ``iree_run`` cuts it, and each part's parallel IR emitted (not
    compiled). An emitter error that cites no limit is a bug and propagates. A mesh schedule:
    every device's launches emitted."""
    try:
        if isinstance(planned, MeshSchedule):
            _emit_mesh(planned)
        else:
            for module in modules(planned.lowered):
                forall_mlir(module.covering)
    except ApportionError as e:
        return refused(e)
    return ()


def _emit_mesh(schedule: MeshSchedule) -> None:
    for stage in schedule.stages:
        if isinstance(stage, Compute):
            for launch in stage.launches:
                forall_mlir(launch.schedule)


def run(schedule: Schedule, inputs: Mapping[str, Any], *, threads: int | None = None
        ) -> dict[str, np.ndarray]:
    """Compile (or take from the cache) and run ``schedule`` (bound at the run's sizes and
    loop counts) in IREE on ``inputs``. Returns the inputs and outputs as storage arrays. IREE
    runs with its own task pool: ``threads`` is refused."""
    if threads is not None:
        raise ExecutionError("threads applies to the reference and torch backends; IREE runs "
                             "with its own task pool")
    if isinstance(schedule, MeshSchedule):
        raise ExecutionError(f"the mesh schedule of {schedule.program.name!r} runs by run_mesh")
    return iree_run(schedule, inputs).tensors


def run_mesh_schedule(schedule: MeshSchedule, inputs: Mapping[str, Any], *, seed: int = 0,
                      timeout_s: float | None = None, device: str | None = None,
                      threads: int | None = None) -> dict[str, np.ndarray]:
    """Every device's segments compiled (or taken from the cache) and run in IREE, the
    collectives and finishes between them on the host (``mesh.run_mesh``); returns the
    program's outputs as storage arrays. The schedule is lowered at bound sizes and counts;
    IREE runs with its own task pool on the CPU in this process: ``threads``, ``timeout_s``
    and ``device`` are refused (``seed`` is unused: nothing is drawn at random)."""
    if threads is not None:
        raise ExecutionError("threads applies to the reference and torch backends; IREE runs "
                             "with its own task pool")
    if timeout_s is not None or device not in (None, "cpu"):
        raise ExecutionError("IREE runs the mesh's modules in this process on the CPU: "
                             "timeout_s and device apply to the dtensor backend")
    return run_mesh(schedule, inputs).outputs


BACKEND = Backend("iree", "the parallel IR (emit --forall) compiled and run by IREE on the CPU",
                  supports, run=run, run_mesh=run_mesh_schedule)
