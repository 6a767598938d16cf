"""The reference backend behind the one backend interface (``apportion.backends``): the plan
run core slice by core slice in numpy (``execute.run_planned``). It takes every plan: it is what
a plan means, and every other backend is checked against it. ``run_mesh`` runs a program
sharded over a mesh, lowered (``schedule.mesh.MeshSchedule``): each device's core schedule as
one device's is run, the data between devices moved by the schedule (``mesh.run_mesh``).

>>> import apportion as ap
>>> from apportion.runtime import random_inputs
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> BACKEND.supports(planned), sorted(BACKEND.run(planned, random_inputs(planned.program)))[:3]
((), ['a', 'b', 'c'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from apportion.backends import Backend, Planned
from apportion.backends.reference.execute import run_planned
from apportion.backends.reference.mesh import run_mesh
from apportion.limits import Limit
from apportion.schedule.mesh import MeshSchedule


def supports(planned: Planned | MeshSchedule) -> tuple[Limit, ...]:
    """No limits: the reference runs every plan the planner makes, and every mesh schedule
    (``run_mesh``)."""
    return ()


def run(planned: Planned, inputs: Mapping[str, Any], params: Mapping[str, int] | None = None,
        sizes: Mapping[str, int] | None = None, threads: int | None = None
        ) -> dict[str, np.ndarray]:
    """Run ``planned`` on ``inputs`` (at the run-time sizes their shapes and ``sizes`` give);
    ``params``: symbolic loop counts; ``threads``: an op's cores run concurrently. Returns the
    inputs and every tensor held whole, as storage arrays."""
    program, plan = planned.bound(sizes)
    return run_planned(program, plan, inputs, threads=threads, params=params)


BACKEND = Backend("reference", "numpy, core slice by core slice (loop nests in simulated "
                  "memory): what a plan means", supports, run=run, run_mesh=run_mesh)
