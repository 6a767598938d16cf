"""An independent oracle for sharding plans: the per-device programs (``unroll``) run as they
are, with the reference executor and numpy collectives (``collectives.apply``), without the
mesh schedule.

What runs a sharded program is the plan lowered to its mesh schedule (``lower.lower_plan``)
and a backend's ``run_mesh``. This module checks that path from the side: it shares the
per-device programs with it, but none of the lowering, the schedule's data movement or a
backend, so the tests compare the two (the reference mesh runner gives bit for bit what
``run(planned=True)`` gives).

``shard_inputs`` cuts each host input into the devices' shards (numpy views of the host array,
no copy per device); ``unshard_outputs`` assembles each output from the devices' shards
(checking that replicas agree); ``run`` does the three with the reference executor and numpy
collectives and returns the outputs by name, so the caller keeps the program's signature.
``run(planned=True)`` runs each device's segments as ``ap.plan`` plans them for its cores
(``planned``, core slice by core slice), its tiling groups' symbolic loop counts taken from
``params``. ``check`` compares a run on random inputs with the unsharded program.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> from apportion.sharding.unroll import unroll
>>> u = unroll(search(load("examples/mlp.json"), parse("tp=2"), outputs="replicated"))
>>> all(c.ok for c in check(u))
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from apportion.errors import ApportionError, ExecutionError, PlanningError
from apportion.ir.program import Program
from apportion.runtime.check import expect
from apportion.runtime.reference import (
    OutputCheck,
    bind_inputs,
    random_inputs,
    run_unplanned,
)
from apportion.schedule.mesh import assemble_outputs
from apportion.sharding.collectives import apply
from apportion.sharding.rules import DeviceFinish
from apportion.sharding.unroll import Unrolled, UnrolledStep, segment_key
from apportion.target.target import Target


def shard_inputs(unrolled: Unrolled, inputs: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
    """Each device's shards of the inputs: views of the host arrays (in storage dtype)."""
    host = bind_inputs(unrolled.program, inputs)
    return [{local: host[name][tuple(slice(lo, hi) for lo, hi in block)]
             for name, local, block in dev.inputs} for dev in unrolled.devices]


def unshard_outputs(unrolled: Unrolled, envs: Sequence[Mapping[str, np.ndarray]]
                    ) -> dict[str, np.ndarray]:
    """Each output assembled from the devices' shards; replicas must agree."""
    return assemble_outputs(unrolled.program,
                            [[(local, block) for _, local, block in dev.outputs]
                             for dev in unrolled.devices],
                            [dev.device for dev in unrolled.devices], envs)


def run(unrolled: Unrolled, inputs: Mapping[str, Any] | None = None, planned: bool = False,
        target: Target | None = None, seed: int = 0,
        params: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Run every device's stages with the reference executor (``planned``: each segment as
    ``ap.plan`` plans it for the device's cores, its tiling groups' symbolic loop counts taken
    from ``params``) and numpy collectives; returns the outputs by name."""
    program = unrolled.program
    xs = random_inputs(program, seed) if inputs is None else inputs
    envs = shard_inputs(unrolled, xs)
    plans = _segment_plans(unrolled, target) if planned else {}
    if planned:
        _check_counts(unrolled, params)
    devices = unrolled.devices
    for k in range(len(devices[0].stages)):
        first = devices[0].stages[k]
        if isinstance(first, DeviceFinish):
            for dev, env in zip(devices, envs, strict=True):
                fin = dev.stages[k]
                assert isinstance(fin, DeviceFinish)
                env[fin.result] = fin.run(env)
            continue
        if isinstance(first, UnrolledStep):
            arrays = [env[first.source] for env in envs]
            dtype = first.step.dst.held_dtype(program.tensor(first.tensor).dtype)
            shape = program.tensor(first.tensor).shape
            for env, res in zip(envs, apply(first.step, arrays, unrolled.plan.mesh, dtype,
                                            shape), strict=True):
                env[first.result] = res
            continue
        for dev, env in zip(devices, envs, strict=True):
            seg = dev.stages[k]
            assert isinstance(seg, Program)
            given = {n: env[n] for n in seg.inputs}
            if planned:
                sp = plans[segment_key(seg)]
                res = sp.run(given, params={k: v for k, v in (params or {}).items()
                                            if k in sp.params} or None)
            else:
                res = run_unplanned(seg, given)
            env.update({n: res[n] for n in seg.outputs})
    return unshard_outputs(unrolled, envs)


def check(unrolled: Unrolled, seed: int = 0, planned: bool = False,
          target: Target | None = None, params: Mapping[str, int] | None = None
          ) -> list[OutputCheck]:
    """The per-device programs run on random inputs against the unsharded program
    (``runtime.check``)."""
    want = expect(unrolled.program, seed)
    return want.compare(run(unrolled, want.inputs, planned, target, params=params))


def planned(unrolled: Unrolled, target: Target | None = None) -> list[list[Any]]:
    """Per device, each segment planned by ``ap.plan`` for the device's cores (identical
    segments planned once), with the tiling groups and pins it carries
    (``unroll.carry_tiling``): a group's loops are the plan's loop groups.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.sharding.mesh import parse
    >>> from apportion.sharding.propagate import propagate
    >>> from apportion.sharding.spec import Sharding
    >>> from apportion.sharding.unroll import unroll
    >>> p = load("examples/fused.json")
    >>> rows = Sharding((("tp",), ()))
    >>> u = unroll(propagate(p, parse("tp=2"), annotations={"a": rows, "z": rows}))
    >>> [[g.counts for g in seg.plan.groups] for seg in planned(u)[1]]
    [[(2, 4)]]
    """
    plans = _segment_plans(unrolled, target)
    return [[plans[segment_key(s)] for s in dev.segments] for dev in unrolled.devices]


def _check_counts(unrolled: Unrolled, params: Mapping[str, int] | None) -> None:
    """Refuse a planned run missing a symbolic loop count or given a name that is none."""
    given = dict(params or {})
    counts = unrolled.counts
    missing = [c for c in counts if c not in given]
    unknown = sorted(set(given) - set(counts))
    if missing or unknown:
        what = (f"needs a value for symbolic loop count {', '.join(missing)}" if missing
                else f"has no symbolic loop count {unknown[0]!r}")
        raise ExecutionError(f"the per-device programs of {unrolled.program.name!r} {what} "
                             f"(its counts: {', '.join(counts) or 'none'})")


def _segment_plans(unrolled: Unrolled, target: Target | None) -> dict[Program, Any]:
    from apportion.planned import plan

    tgt = target or unrolled.plan.target
    out: dict[Program, Any] = {}
    for dev in unrolled.devices:
        for seg in dev.segments:
            key = segment_key(seg)
            if key in out:
                continue
            try:
                out[key] = plan(replace(seg, name=seg.name), tgt)
            except ApportionError as e:  # a pin or tile the device's share cannot take
                coords = ", ".join(f"{a}={i}" for a, i in dev.coords)
                raise PlanningError(f"device {dev.device} ({coords}), segment "
                                    f"{seg.name!r} (its shares of the ops): {e}") from None
    return out
