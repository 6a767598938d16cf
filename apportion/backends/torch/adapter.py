"""The torch backend behind the one backend interface (``apportion.backends``): the plan run
core slice by core slice with PyTorch kernels, an op's cores on a thread pool
(``executor.run_torch``); torch is imported with the executor, when the backend is first used.
``run_mesh`` runs a program sharded over a mesh, lowered (``schedule.mesh.MeshSchedule``):
each device's core schedule by the same executor, the data between devices moved by the
schedule (``mesh.run_mesh``).

>>> import apportion as ap
>>> from apportion.runtime import random_inputs
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> BACKEND.supports(planned), BACKEND.run(planned, random_inputs(planned.program))["z"].shape
((), (1024, 4096))
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.backends import Backend, Planned
from apportion.backends.torch.mesh import run_mesh
from apportion.ir.program import Program
from apportion.limits import LIMITS_BY_ID, Limit
from apportion.plans.plan import Plan
from apportion.runtime.reference import bind_inputs
from apportion.schedule.mesh import MeshSchedule


@dataclass(frozen=True)
class _Bound:
    """A program and its plan at bound sizes: what ``run_torch`` reads."""

    program: Program
    plan: Plan


def supports(planned: Planned | MeshSchedule) -> tuple[Limit, ...]:
    """The torch backend runs every plan and every mesh schedule the reference runs, once
    PyTorch is installed."""
    if importlib.util.find_spec("torch") is None:
        return (LIMITS_BY_ID["needs-pytorch"],)
    return ()


def run(planned: Planned, inputs: Mapping[str, Any], params: Mapping[str, int] | None = None,
        sizes: Mapping[str, int] | None = None, threads: int | None = None
        ) -> dict[str, np.ndarray]:
    """Run ``planned`` on ``inputs`` with torch kernels (at the run-time sizes their shapes and
    ``sizes`` give; ``params``: symbolic loop counts; ``threads``: the pool's size, default 1).
    Returns the inputs and outputs as the reference's storage arrays."""
    from apportion.backends.torch.executor import run_torch
    from apportion.backends.torch.tensors import from_torch_storage

    program, plan = planned.bound(sizes)
    env = bind_inputs(program, inputs)
    outs = run_torch(_Bound(program, plan), env, threads=1 if threads is None else threads,
                     params=params)
    return {**env, **{name: from_torch_storage(t) for name, t in outs.items()}}


BACKEND = Backend("torch", "PyTorch kernels, an op's core slices on a thread pool", supports,
                  run=run, run_mesh=run_mesh)
