"""The dtensor backend behind the one backend interface (``apportion.backends``): a sharding
plan over a mesh of devices run on ``torch.distributed``, one process per device
(``dtensor.run_dtensor``). It takes a bound ``ShardingPlan`` (``ap.sharding``, ``--mesh``),
not a plan for one device's cores. It lives here, above the backends, because it runs what the
sharding layer plans; the registry imports it by module path on first use.

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
from apportion.backends.limits import LIMITS_BY_ID, Limit, refusals
from apportion.errors import ExecutionError
from apportion.runtime.reference import bind_inputs
from apportion.sharding.dtensor import check_plan, run_dtensor
from apportion.sharding.plan import ShardingPlan


def supports(planned: Any) -> tuple[Limit, ...]:
    """The documented limits that stop a distributed run of ``planned``: not a sharding plan,
    no PyTorch, or placements DTensor cannot express (``dtensor.check_plan``)."""
    if not isinstance(planned, ShardingPlan):
        return (LIMITS_BY_ID["dtensor-needs-mesh"],)
    if importlib.util.find_spec("torch") is None:
        return (LIMITS_BY_ID["needs-pytorch"],)
    return refusals(lambda: check_plan(planned))


def run(planned: ShardingPlan, inputs: Mapping[str, Any],
        params: Mapping[str, int] | None = None, sizes: Mapping[str, int] | None = None,
        threads: int | None = None, timeout_s: float = 120.0, device: str = "auto"
        ) -> dict[str, np.ndarray]:
    """Run the bound sharding plan ``planned`` on ``inputs``, one process per device
    (``device``: auto, cpu or cuda); ``sizes`` binds symbolic mesh axis sizes. Returns the
    inputs and the gathered outputs as storage arrays. Every rank runs its own ops: ``threads``
    and symbolic loop counts (``params``) are refused."""
    if threads is not None:
        raise ExecutionError("threads applies to the reference and torch backends; the dtensor "
                             "backend runs one process per device")
    if params:
        raise ExecutionError(f"params {sorted(params)} given, but the dtensor backend runs "
                             "sharding plans, which have no symbolic loop counts")
    env = bind_inputs(planned.program, inputs)
    done = run_dtensor(planned, env, timeout_s=timeout_s, sizes=sizes or None, device=device)
    return {**env, **done.outputs}


BACKEND = Backend("dtensor", "a sharding plan over a mesh, one torch.distributed process per "
                  "device (with --mesh)", supports, run=run)
