"""The one entry for running a planned program: loop nests tile by tile, other plans op by op.

>>> import apportion as ap
>>> from apportion.runtime.reference import compare, random_inputs, run_unplanned
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> xs = random_inputs(planned.program)
>>> got = run_planned(planned.program, planned.plan, xs)
>>> all(c.ok for c in compare(run_unplanned(planned.program, xs), got, planned.program))
True
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from apportion.backends.reference.loops import run_tiled
from apportion.errors import ExecutionError
from apportion.ir.program import Program
from apportion.plans.plan import Plan
from apportion.runtime.reference import run_sliced


def run_planned(program: Program, plan: Plan, inputs: Mapping[str, np.ndarray],
                threads: int | None = None, params: Mapping[str, int] | None = None
                ) -> dict[str, np.ndarray]:
    """Run ``program`` as ``plan`` divides it, core slice by core slice.

    A plan with loop nests or scratchpad buffers runs in simulated device memory and per-core
    scratchpads (``loops.run_tiled``, iteration by iteration; ``params`` gives symbolic loop
    counts); any other plan op by op on whole arrays (``reference.run_sliced``). ``threads`` > 1
    runs an op's cores concurrently (same numbers). Returns the inputs and every tensor held
    whole in device memory.
    """
    if plan.groups or any(b.space == "lx" for b in plan.buffers):
        return run_tiled(program, plan, inputs, threads=threads, params=params)
    if params:
        raise ExecutionError(f"params {sorted(params)} given, but plan of {program.name!r} has "
                             "no loop with a symbolic count")
    return run_sliced(program, plan, inputs, threads=threads)
