"""The dtensor backend behind the one backend interface (``apportion.backends``): a program
sharded over a mesh of devices, lowered to its ``MeshSchedule`` (``sharding.lower.lower_plan``,
``--mesh``), run on ``torch.distributed``, one process per device (``runner.run_mesh``). It
runs no plan for one device's cores: ``supports`` refuses one.

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> [limit.id for limit in BACKEND.supports(planned)]
['dtensor-needs-mesh']
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np

from apportion.backends import Backend
from apportion.backends.dtensor.runner import check_schedule
from apportion.backends.dtensor.runner import run_mesh as run_dist
from apportion.errors import ApportionError
from apportion.limits import LIMITS_BY_ID, Limit, refused
from apportion.schedule.mesh import MeshSchedule


def supports(planned: Any) -> tuple[Limit, ...]:
    """The documented limits that stop a distributed run of ``planned``: not a mesh schedule,
    no PyTorch, or layouts DTensor cannot express (``runner.check_schedule``)."""
    if not isinstance(planned, MeshSchedule):
        return (LIMITS_BY_ID["dtensor-needs-mesh"],)
    if importlib.util.find_spec("torch") is None:
        return (LIMITS_BY_ID["needs-pytorch"],)
    try:
        check_schedule(planned)
    except ApportionError as e:
        return refused(e)
    return ()


def run_mesh(schedule: MeshSchedule, inputs: Mapping[str, Any], *, seed: int = 0,
             timeout_s: float | None = None, device: str | None = None,
             threads: int | None = None) -> dict[str, np.ndarray]:
    """``schedule`` run on ``inputs``, one process per device (``device``: auto, cpu or cuda;
    None: auto), within ``timeout_s`` (None: 120 s); the program's outputs by name. Every rank
    runs its own ops: ``threads`` is refused."""
    run = run_dist(schedule, inputs, seed=seed,
                   timeout_s=120.0 if timeout_s is None else timeout_s,
                   device=device or "auto", threads=threads)
    return run.outputs


BACKEND = Backend("dtensor", "a program sharded over a mesh, one torch.distributed process per "
                  "device (with --mesh)", supports, run_mesh=run_mesh)
