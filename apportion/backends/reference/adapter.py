"""The reference backend behind the one backend interface (``apportion.backends``): a plan's
schedule run core slice by core slice in numpy (``execute.execute``). It takes every plan: it
is what a plan means, and every other backend is checked against it. ``run_mesh`` runs a program
sharded over a mesh, lowered (``schedule.mesh.MeshSchedule``): each device's core schedule as
one device's is run, the data between devices moved by the schedule (``mesh.run_mesh``).

>>> import apportion as ap
>>> from apportion.runtime import random_inputs
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> BACKEND.supports(planned), sorted(BACKEND.run(planned.lowered,
...                                               random_inputs(planned.program)))[:3]
((), ['a', 'b', 'c'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from apportion.backends import Backend, Planned
from apportion.backends.reference.execute import execute
from apportion.backends.reference.mesh import run_mesh
from apportion.limits import Limit
from apportion.schedule.mesh import MeshSchedule
from apportion.schedule.values import Schedule


def supports(planned: Planned | MeshSchedule) -> tuple[Limit, ...]:
    """No limits: the reference runs every plan the planner makes, and every mesh schedule
    (``run_mesh``)."""
    return ()


def run(schedule: Schedule, inputs: Mapping[str, Any], *, threads: int | None = None
        ) -> dict[str, np.ndarray]:
    """Run ``schedule`` (bound at the run's sizes and loop counts) on ``inputs``; ``threads``:
    an op's cores run concurrently. Returns the inputs and every tensor held whole, as storage
    arrays."""
    return execute(schedule, inputs, threads=threads)


BACKEND = Backend("reference", "numpy, core slice by core slice (loop nests in simulated "
                  "memory): what a plan means", supports, run=run, run_mesh=run_mesh)
