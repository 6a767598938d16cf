"""The toy backend: a schedule's parallel IR rendered by ``apportion.mlir`` (one module) and
run sequentially by upstream MLIR's execution engine. It lives in its own folder and names
itself in the ``apportion.backends`` entry-point group; nothing of apportion is edited for it.

It runs static programs only: a run-time size or symbolic loop count would be an ``index``
argument, which the engine's entry does not pass. It says so by a limit of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from apportion.backends import Backend
from apportion.errors import ApportionError, ExecutionError
from apportion.limits import Limit
from apportion.mlir import upstream
from apportion.mlir.module import call, one_module_ir
from apportion.schedule.values import Schedule

STATIC_ONLY = Limit("toy-static-only", "the toy backend runs programs without run-time sizes "
                    "or symbolic loop counts", ("toy",), "tests/backends/toy/adapter.py")


def supports(planned: Any) -> tuple[Limit, ...]:
    """The toy's limits for ``planned``: its own, and those of the parallel IR (rendered, not
    run: what ``apportion.mlir`` refuses cites apportion's documented limits)."""
    from apportion.limits import refused

    schedule = planned.lowered
    if schedule.given is not None or schedule.params:
        return (STATIC_ONLY,)
    try:
        one_module_ir(schedule, "toy")
    except ApportionError as e:
        return refused(e)
    return ()


def run(schedule: Schedule, inputs: Mapping[str, Any], *, threads: int | None = None
        ) -> dict[str, np.ndarray]:
    """Render ``schedule`` as one module and run it with upstream MLIR; returns the inputs and
    the outputs."""
    if threads is not None:
        raise ExecutionError("the toy backend runs on one thread: threads must be None")
    text = one_module_ir(schedule, "toy")
    c = call(schedule, inputs)
    program = schedule.program
    outs = upstream.run_function(
        text, c.function, [v for _, v, _ in c.arguments],
        [(shape, program.tensor(n).dtype) for n, shape, _ in c.results],
        [program.tensor(n).dtype for n, _, _ in c.arguments])
    return {**inputs, **dict(zip(program.outputs, outs, strict=True))}


BACKEND = Backend("toy", "a schedule's parallel IR run sequentially by upstream MLIR",
                  supports, run=run)
