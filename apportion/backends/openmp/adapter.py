"""The openmp backend behind the one backend interface (``apportion.backends``): a schedule's
parallel IR (``emit --forall``, the function IREE compiles) lowered by upstream MLIR 22, each
``scf.forall`` an OpenMP work-sharing loop, JIT-compiled and run on this machine's cores
(``run.openmp_run``). ``supports`` emits the parallel IR of the plan's lowered schedule
without lowering it, so what the emitter refuses is known up front, by the documented limit it
cites; a run without the ``mlir`` extra is refused naming the extra.

Its ``run_mesh`` runs a program sharded over a mesh, lowered (``schedule.mesh.MeshSchedule``,
from ``sharding.lower.lower_plan``): every device's segments as OpenMP modules, the collectives
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
from apportion.backends.openmp.mesh import mesh_parallel_ir, run_mesh
from apportion.backends.openmp.run import openmp_run, parallel_ir
from apportion.errors import ApportionError, ExecutionError
from apportion.limits import Limit, refused
from apportion.schedule.mesh import MeshSchedule
from apportion.schedule.values import Schedule


def supports(planned: Planned | MeshSchedule) -> tuple[Limit, ...]:
    """The documented limits that stop this backend from running ``planned``: its parallel IR
    emitted (not lowered); of a mesh schedule, every distinct segment's."""
    try:
        if isinstance(planned, MeshSchedule):
            mesh_parallel_ir(planned)
        else:
            parallel_ir(planned.lowered)
    except ApportionError as e:
        return refused(e)
    return ()


def run(schedule: Schedule, inputs: Mapping[str, Any], *, threads: int | None = None
        ) -> dict[str, np.ndarray]:
    """Lower (or take from this process's cache) and run ``schedule`` (bound at the run's
    sizes and loop counts) with OpenMP on ``inputs``, ``threads`` OpenMP threads (None: the
    runtime's default, ``OMP_NUM_THREADS`` or the cores). Returns the inputs and outputs as
    storage arrays."""
    if isinstance(schedule, MeshSchedule):
        raise ExecutionError(f"the mesh schedule of {schedule.program.name!r} runs by run_mesh")
    return openmp_run(schedule, inputs, threads).tensors


def run_mesh_schedule(schedule: MeshSchedule, inputs: Mapping[str, Any], *, seed: int = 0,
                      timeout_s: float | None = None, device: str | None = None,
                      threads: int | None = None) -> dict[str, np.ndarray]:
    """Every device's segments lowered and JIT-compiled (or taken from this process's cache)
    and run with ``threads`` OpenMP threads (None: the runtime's default), the collectives
    and finishes between them on the host (``mesh.run_mesh``); returns the program's outputs
    as storage arrays. The modules run on this machine's CPU: ``timeout_s`` and ``device``
    are refused (``seed`` is unused: nothing is drawn at random)."""
    if timeout_s is not None or device not in (None, "cpu"):
        raise ExecutionError("the openmp backend runs the mesh's modules on this machine's "
                             "CPU: timeout_s and device apply to the dtensor backend")
    return run_mesh(schedule, inputs, threads).outputs


BACKEND = Backend("openmp", "the parallel IR (emit --forall) lowered by upstream MLIR to OpenMP "
                  "and run on this machine's cores", supports, run=run,
                  run_mesh=run_mesh_schedule)
