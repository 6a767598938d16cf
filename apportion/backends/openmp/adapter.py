"""The openmp backend behind the one backend interface (``apportion.backends``): the plan's
parallel IR (``emit --forall``, the function IREE compiles) lowered by upstream MLIR 22, each
``scf.forall`` an OpenMP work-sharing loop, JIT-compiled and run on this machine's cores
(``run.openmp_run``). ``supports`` emits the parallel IR without lowering it, so what the
emitter refuses is known up front, by the documented limit it cites; a run without the
``mlir`` extra is refused naming the extra.

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
from apportion.backends.limits import Limit, refusals
from apportion.backends.openmp.run import openmp_run, parallel_ir
from apportion.errors import ExecutionError
from apportion.schedule.mesh import MeshSchedule

#: the refusal of a mesh schedule
_MESH = ("the openmp backend runs one device's plan; the mesh schedule of {!r} runs with the "
         "reference, torch or iree backend")


def supports(planned: Planned) -> tuple[Limit, ...]:
    """The documented limits that stop this backend from running ``planned``: its parallel IR
    emitted (not lowered). It runs one device's plan, no mesh schedule (no ``run_mesh``)."""
    if isinstance(planned, MeshSchedule):
        raise ExecutionError(_MESH.format(planned.program.name))
    return refusals(lambda: parallel_ir(planned.program, planned.plan, planned.target,
                                        planned.given if planned.symbols else None))


def run(planned: Planned, inputs: Mapping[str, Any], params: Mapping[str, int] | None = None,
        sizes: Mapping[str, int] | None = None, threads: int | None = None
        ) -> dict[str, np.ndarray]:
    """Lower (or take from this process's cache) and run ``planned`` with OpenMP on ``inputs``
    (at the run-time sizes their shapes and ``sizes`` give; ``params``: symbolic loop counts),
    ``threads`` OpenMP threads (None: the runtime's default, ``OMP_NUM_THREADS`` or the
    cores). Returns the inputs and outputs as storage arrays."""
    if isinstance(planned, MeshSchedule):
        raise ExecutionError(_MESH.format(planned.program.name))
    return openmp_run(planned.program, planned.plan, planned.target, inputs, params,
                      symbolic=planned.given if planned.symbols else None,
                      sizes=sizes or None, threads=threads).tensors


BACKEND = Backend("openmp", "the parallel IR (emit --forall) lowered by upstream MLIR to OpenMP "
                  "and run on this machine's cores", supports, run=run)
