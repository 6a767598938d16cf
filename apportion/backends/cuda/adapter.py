"""The cuda backend behind the one backend interface (``apportion.backends``): a schedule's
parallel IR, for a target whose foralls map to GPU blocks (the ``gpu`` preset), built into a
build (``build.build``: upstream MLIR lowers each ``scf.forall`` to a CUDA kernel, a
core of the plan a block) and run on this machine's NVIDIA GPU (``build.run_build``, in a
child process), the outputs read back as the reference executor's arrays.

It runs only where a GPU is: ``supports`` cites ``cuda-needs-gpu`` on a machine without the
NVIDIA driver (make a build there with ``apportion cuda build`` and run it on a GPU machine:
``cuda run``, ``cuda check``), ``cuda-needs-gpu-target`` for a plan whose foralls map to cores,
``cuda-one-device`` for a mesh schedule; then what the parallel IR refuses, by the limit it
cites. A run needs the ``mlir`` extra and a C compiler driver to build.

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> [limit.id for limit in BACKEND.supports(planned)]
['cuda-needs-gpu-target']
"""

from __future__ import annotations

import ctypes
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from apportion.backends import Backend, Planned
from apportion.backends.cuda.build import build, read_run, run_build
from apportion.errors import ApportionError
from apportion.limits import LIMITS_BY_ID, Limit, refused
from apportion.mlir.module import one_module_ir
from apportion.runtime.reference import bind_inputs, check_gathers
from apportion.schedule.mesh import MeshSchedule
from apportion.schedule.values import Schedule

#: threads per block a run splits each block's work over
#: (``mlir.gpu_threads.thread_tiles``), as ``apportion cuda build`` does
DEFAULT_THREADS = 128


def has_gpu() -> bool:
    """Whether this machine has the NVIDIA driver a build runs with (``libcuda.so.1``)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def supports(planned: Planned | MeshSchedule) -> tuple[Limit, ...]:
    """The documented limits that stop a run of ``planned`` here (see the module docstring):
    a mesh schedule, foralls that map to no GPU blocks, no GPU, then the parallel IR's own
    (emitted, not lowered)."""
    if isinstance(planned, MeshSchedule):
        return (LIMITS_BY_ID["cuda-one-device"],)
    schedule = planned.lowered
    if schedule.forall_mapping != "gpu_blocks":
        return (LIMITS_BY_ID["cuda-needs-gpu-target"],)
    if not has_gpu():
        return (LIMITS_BY_ID["cuda-needs-gpu"],)
    try:
        one_module_ir(schedule, "cuda")
    except ApportionError as e:
        return refused(e)
    return ()


def run(schedule: Schedule, inputs: Mapping[str, Any], *, threads: int | None = None
        ) -> dict[str, np.ndarray]:
    """Build ``schedule`` (bound at the run's sizes and loop counts) with ``inputs`` into a
    build in a temporary folder, run it on this machine's GPU and return the inputs and
    outputs as storage arrays; ``threads``: per block (None: ``DEFAULT_THREADS``). A gather
    index outside its table is refused, as the reference executor refuses it."""
    program = schedule.program
    env = bind_inputs(program, inputs)
    with tempfile.TemporaryDirectory(prefix="apportion-cuda-") as tmp:
        built = build(schedule, Path(tmp) / "build", inputs=env,
                      threads=DEFAULT_THREADS if threads is None else threads)
        run_build(built.path, Path(tmp) / "results")
        _, _, results = read_run(built.path, Path(tmp) / "results")
    check_gathers(program, results)
    return {**env, **{n: results[n] for n in program.outputs}}


BACKEND = Backend("cuda", "the parallel IR for the gpu target built into CUDA kernels and run "
                  "on this machine's NVIDIA GPU (apportion cuda build / run / check elsewhere)",
                  supports, run=run)
