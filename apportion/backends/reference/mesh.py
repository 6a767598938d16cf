"""A program sharded over a mesh, run by the reference backend: every device's core schedule
run as the reference runs one device's (in simulated memory where it has loop nests or
scratchpad buffers, ``loops.run_schedule``; else op by op on whole arrays,
``execute.run_sliced_schedule``), the collectives and finishes between them by the schedule's
own host data movement (``schedule.mesh.MeshSteps``, which this runner drives). What a mesh
schedule means: every other mesh runner is checked against the unplanned program as this one
is.

>>> from apportion.frontend.json_format import load
>>> from apportion.runtime.reference import compare, random_inputs, run_unplanned
>>> from apportion.sharding.lower import lower_plan
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
>>> xs = random_inputs(s.program)
>>> all(c.ok for c in compare(run_unplanned(s.program, xs), run_mesh(s, xs), s.program))
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from apportion.backends.reference.execute import in_memory, run_sliced_schedule
from apportion.backends.reference.loops import run_schedule
from apportion.errors import ExecutionError
from apportion.schedule.mesh import DeviceLaunch, MeshSchedule, MeshSteps


def run_mesh(schedule: MeshSchedule, inputs: Mapping[str, Any], *, seed: int = 0,
             timeout_s: float | None = None, device: str | None = None,
             threads: int | None = None) -> dict[str, np.ndarray]:
    """Run ``schedule`` on the host ``inputs``: each device's segments one device after
    another, each core schedule as the reference runs it (``threads`` > 1: an op's cores
    concurrently, the same numbers); returns the program's outputs by name as storage arrays.
    Nothing is drawn at random (``seed`` is unused); ``timeout_s`` and ``device`` (a
    process runner's and an accelerator's) are refused."""
    if timeout_s is not None or device not in (None, "cpu"):
        raise ExecutionError("the reference backend runs the mesh in this process on the CPU: "
                             "timeout_s and device apply to the dtensor backend")

    steps = MeshSteps(schedule, inputs)
    for step in steps:
        steps.give(step, _compute(step.launch, step.inputs, threads))
    return steps.outputs()


def _compute(launch: DeviceLaunch, env: Mapping[str, np.ndarray], threads: int | None
             ) -> dict[str, np.ndarray]:
    s = launch.schedule
    if in_memory(s):
        return run_schedule(s, env, threads=threads)
    return run_sliced_schedule(s, env, threads=threads)
