"""The one entry for running a planned program: its schedule, loop nests tile by tile in
simulated memory, other plans op by op on whole arrays.

>>> import apportion as ap
>>> from apportion.runtime.reference import compare, random_inputs, run_unplanned
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> xs = random_inputs(planned.program)
>>> got = run_planned(planned.program, planned.plan, xs)
>>> all(c.ok for c in compare(run_unplanned(planned.program, xs), got, planned.program))
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from apportion.backends.reference.loops import run_schedule
from apportion.errors import ExecutionError
from apportion.ir.program import Program
from apportion.plans.plan import Plan
from apportion.runtime.reference import bind_inputs, evaluate_op, run_op_boxes
from apportion.schedule.lower import lower
from apportion.schedule.values import Host, Launch, Loop, Schedule, Step
from apportion.target.target import Target


def in_memory(schedule: Schedule) -> bool:
    """Whether ``schedule`` runs in simulated memory: it has a loop nest, or keeps a tensor in
    the cores' scratchpads."""
    return any(isinstance(s, Loop) for s in schedule.steps) or \
        any(b.space == "lx" for b in schedule.buffers)


def run_planned(program: Program, plan: Plan, inputs: Mapping[str, np.ndarray],
                threads: int | None = None, params: Mapping[str, int] | None = None,
                target: Target | None = None) -> dict[str, np.ndarray]:
    """Run ``program`` as ``plan`` divides it: its schedule (``schedule.lower``, for
    ``target``, default the plan's target by name; ``params``: symbolic loop counts), core
    slice by core slice.

    A schedule with loop nests or scratchpad buffers runs in simulated device memory and
    per-core scratchpads (``loops.run_schedule``, iteration by iteration); any other op by op
    on whole arrays (``run_sliced_schedule``). ``threads`` > 1 runs an op's cores concurrently
    (same numbers). Returns the inputs and every tensor held whole in device memory.
    """
    schedule = lower(program, plan, plan.target if target is None else target, params=params)
    if in_memory(schedule):
        return run_schedule(schedule, inputs, threads=threads)
    return run_sliced_schedule(schedule, inputs, threads=threads)


def run_sliced(program: Program, plan: Plan, inputs: Mapping[str, np.ndarray],
               threads: int | None = None) -> dict[str, np.ndarray]:
    """Run every op core slice by core slice as an untiled ``plan`` divides it (its schedule,
    ``run_sliced_schedule``; no simulated memory: each op reads whole arrays); returns every
    tensor.

    Raises ExecutionError when an op's cores miss or repeat iteration points, or when the plan
    does not match the program or has loop nests (``run_planned`` runs those). ``threads``
    > 1 runs an op's cores concurrently; the numbers are the same as sequentially.

    >>> import apportion as ap
    >>> from apportion.runtime.reference import random_inputs
    >>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
    >>> run_sliced(planned.program, planned.plan, random_inputs(planned.program))["y"].shape
    (256, 1024)
    """
    return run_sliced_schedule(lower(program, plan, plan.target), inputs, threads)


def run_sliced_schedule(schedule: Schedule, inputs: Mapping[str, np.ndarray],
                        threads: int | None = None) -> dict[str, np.ndarray]:
    """Run a schedule without loops op by op on whole arrays: every launch box by box
    (``reference.run_op_boxes``, which checks that the boxes cover the op's iteration space
    once), every host step whole; returns every tensor."""
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
        raise ExecutionError(f"op {first!r} sits in a loop nest: run the plan with "
                             "run_planned (apportion.backends.reference), which runs loop "
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
