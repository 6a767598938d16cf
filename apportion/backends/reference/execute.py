"""The one entry for running a schedule: loop nests tile by tile in simulated memory, other
schedules op by op on whole arrays.

>>> import apportion as ap
>>> from apportion.runtime.reference import compare, random_inputs, run_unplanned
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> xs = random_inputs(planned.program)
>>> got = execute(planned.lowered, xs)
>>> all(c.ok for c in compare(run_unplanned(planned.program, xs), got, planned.program))
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from apportion.backends.reference.loops import run_schedule
from apportion.errors import ExecutionError
from apportion.runtime.reference import bind_inputs, evaluate_op, run_op_boxes
from apportion.schedule.values import Host, Launch, Loop, Schedule, Step


def in_memory(schedule: Schedule) -> bool:
    """Whether ``schedule`` runs in simulated memory: it has a loop nest, or keeps a tensor in
    the cores' scratchpads."""
    return any(isinstance(s, Loop) for s in schedule.steps) or \
        any(b.space == "lx" for b in schedule.buffers)


def execute(schedule: Schedule, inputs: Mapping[str, np.ndarray], threads: int | None = None
            ) -> dict[str, np.ndarray]:
    """Run ``schedule`` (a plan lowered, bound at the run's sizes and loop counts) core slice
    by core slice.

    A schedule with loop nests or scratchpad buffers runs in simulated device memory and
    per-core scratchpads (``loops.run_schedule``, iteration by iteration); any other op by op
    on whole arrays (``run_sliced_schedule``). ``threads`` > 1 runs an op's cores concurrently
    (same numbers). Returns the inputs and every tensor held whole in device memory.
    """
    if in_memory(schedule):
        return run_schedule(schedule, inputs, threads=threads)
    return run_sliced_schedule(schedule, inputs, threads=threads)


def run_sliced_schedule(schedule: Schedule, inputs: Mapping[str, np.ndarray],
                        threads: int | None = None) -> dict[str, np.ndarray]:
    """Run a schedule without loops op by op on whole arrays: every launch box by box
    (``reference.run_op_boxes``, which checks that the boxes cover the op's iteration space
    once), every host step whole; returns every tensor.

    Raises ExecutionError when an op's cores miss or repeat iteration points, or when the
    schedule has loop nests (``execute`` runs those). ``threads`` > 1 runs an op's cores
    concurrently; the numbers are the same as sequentially.

    >>> import apportion as ap
    >>> from apportion.runtime.reference import random_inputs
    >>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
    >>> run_sliced_schedule(planned.lowered, random_inputs(planned.program))["y"].shape
    (256, 1024)
    """
    program = schedule.program
    for step in schedule.steps:
        _check_sliced(step)
    env = bind_inputs(program, inputs)
    pool = ThreadPoolExecutor(max_workers=threads) if threads and threads > 1 else None
    try:
        for step in schedule.steps:
            assert isinstance(step, Launch | Host)
            op = program.op(step.op)
            if isinstance(step, Host):
                env[op.out.tensor] = evaluate_op(op, program, env)  # type: ignore[assignment]
                continue
            boxes = [b for b in step.boxes_at(()) if b is not None]
            env[op.out.tensor] = run_op_boxes(op, program, env, boxes, pool)
    finally:
        if pool is not None:
            pool.shutdown()
    return env


def _check_sliced(step: Step) -> None:
    if isinstance(step, Loop):
        first = next((s.op for s in _ops(step)), "-")
        raise ExecutionError(f"op {first!r} sits in a loop nest: run the schedule with "
                             "execute (apportion.backends.reference), which runs loop "
                             "nests tile by tile")
    if isinstance(step, Launch) and any(a.level != "core" for a in step.axes):
        over = ", ".join(f"{a} ({a.level})" for a in step.axes if a.level != "core")
        raise ExecutionError(f"launch of op {step.op!r} over {over}: the reference backend "
                             "runs one device's schedule over its cores")
    if not isinstance(step, Launch | Host):
        raise ExecutionError(f"the reference backend cannot run schedule step "
                             f"{type(step).__name__} outside a loop nest: {step}")


def _ops(loop: Loop) -> Sequence[Launch | Host]:
    out: list[Launch | Host] = []
    for s in loop.body:
        if isinstance(s, Loop):
            out += _ops(s)
        elif isinstance(s, Launch | Host):
            out.append(s)
    return out
