"""The torch backend behind the one backend interface (``apportion.backends``): the plan run
core slice by core slice with PyTorch kernels, an op's cores on a thread pool
(``executor.run_torch``); torch is imported with the executor, when the backend is first used.
``run_mesh`` runs a program sharded over a mesh, lowered (``schedule.mesh.MeshSchedule``):
each device's core schedule by the same executor, the data between devices moved by the
schedule (``mesh.run_mesh``).

>>> import apportion as ap
>>> from apportion.runtime import random_inputs
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> xs = random_inputs(planned.program)
>>> BACKEND.supports(planned), BACKEND.run(planned.lowered, xs)["z"].shape
((), (1024, 4096))
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np

from apportion.backends import Backend, Planned
from apportion.backends.torch.mesh import run_mesh
from apportion.limits import LIMITS_BY_ID, Limit
from apportion.runtime.reference import bind_inputs
from apportion.schedule.mesh import MeshSchedule
from apportion.schedule.values import Schedule


def supports(planned: Planned | MeshSchedule) -> tuple[Limit, ...]:
    """The torch backend runs every plan and every mesh schedule the reference runs, once
    PyTorch is installed."""
    if importlib.util.find_spec("torch") is None:
        return (LIMITS_BY_ID["needs-pytorch"],)
    return ()


def run(schedule: Schedule, inputs: Mapping[str, Any], *, threads: int | None = None
        ) -> dict[str, np.ndarray]:
    """Run ``schedule`` (bound at the run's sizes and loop counts) on ``inputs`` with torch
    kernels (``threads``: the pool's size, default 1). Returns the inputs and outputs as the
    reference's storage arrays."""
    from apportion.backends.torch.executor import run_torch
    from apportion.backends.torch.tensors import from_torch_storage

    env = bind_inputs(schedule.program, inputs)
    outs = run_torch(schedule, env, threads=1 if threads is None else threads)
    return {**env, **{name: from_torch_storage(t) for name, t in outs.items()}}


BACKEND = Backend("torch", "PyTorch kernels, an op's core slices on a thread pool", supports,
                  run=run, run_mesh=run_mesh)
