"""A program sharded over a mesh, run by the torch backend: every device's core schedule run
by the threaded executor (``executor.TorchExecutor`` of the schedule as lowered, an op's core
slices on ``threads`` threads), the collectives and finishes between devices by the
schedule's own host data movement (``schedule.mesh.MeshSteps``). Devices whose segments are
equal share one schedule, so one executor (and its steps, built once) serves them all.

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

from apportion.errors import ExecutionError
from apportion.schedule.mesh import MeshSchedule, MeshSteps


def run_mesh(schedule: MeshSchedule, inputs: Mapping[str, Any], *, seed: int = 0,
             timeout_s: float | None = None, device: str | None = None,
             threads: int | None = None) -> dict[str, np.ndarray]:
    """Run ``schedule`` on the host ``inputs`` with torch kernels, each device's segments one
    device after another, an op's core slices on ``threads`` threads (default 1); returns the
    program's outputs by name as storage arrays. Nothing is drawn at random (``seed`` is
    unused); ``timeout_s`` and ``device`` (a process runner's and an accelerator's) are
    refused: the kernels run on the CPU in this process."""
    from apportion.backends.torch.executor import TorchExecutor
    from apportion.backends.torch.tensors import from_torch_storage

    if timeout_s is not None or device not in (None, "cpu"):
        raise ExecutionError("the torch backend runs the mesh in this process on the CPU: "
                             "timeout_s and device apply to the dtensor backend")
    executors: dict[int, TorchExecutor] = {}

    try:
        steps = MeshSteps(schedule, inputs)
        for step in steps:
            s = step.launch.schedule
            if id(s) not in executors:
                executors[id(s)] = TorchExecutor(s, 1 if threads is None else threads)
            outs = executors[id(s)].run(step.inputs)
            steps.give(step, {name: from_torch_storage(t) for name, t in outs.items()})
        return steps.outputs()
    finally:
        for ex in executors.values():
            ex.close()
