"""A ``MeshSchedule`` run on ``torch.distributed``: one process per device, DTensors placed and
redistributed as the schedule's layouts say, checked against the reference executor.

``run_mesh(schedule, inputs)`` starts one process per mesh device (``spawn``; the ``gloo``
backend on the CPU over loopback, or ``nccl`` with one GPU per rank where the machine has a GPU
per device: ``device="auto"``, or ``cpu`` / ``cuda`` to choose); each rank runs every stage of
the schedule on its device (``rank``: inputs placed, ops on DTensors or local shards,
collectives as redistributions or its own steps for uneven cuts, finishes, a placement check
after each) and rank 0 hands the gathered outputs back (``runtime.check.expect`` compares them
with the reference executor's run of the unsharded program). ``launch`` watches the ranks: a failing
or killed rank ends the run naming the root-cause rank and where it was; ``timeout_s`` bounds
the whole run; ``fault`` injects a failure on one rank at one op (``raise`` or ``kill``), for
tests. ``run_mesh_many`` runs several schedules over meshes of one device count in one launch
(PyTorch imported once per rank).

A schedule is built bound (``sharding.lower.lower_plan(plan, sizes)``): a mesh with symbolic
sizes is bound before it is lowered. A dim split over several mesh axes must list them in mesh
order (DTensor nests the cuts of several mesh dims on one tensor dim in mesh order,
``check_schedule``). Needs the ``torch`` extra.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.lower import lower_plan
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
>>> check_schedule(s)
>>> from apportion.runtime.check import expect
>>> want = expect(s.program)
>>> run = run_mesh(s, want.inputs)                       # doctest: +SKIP
>>> all(c.ok for c in want.compare(run)), run.backend     # doctest: +SKIP
(True, 'gloo')
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.backends.dtensor import launch as launching
from apportion.backends.dtensor.rank import worker
from apportion.errors import ExecutionError
from apportion.frontend.json_format import dumps
from apportion.limits import cite
from apportion.runtime.reference import bind_inputs, random_inputs
from apportion.schedule.mesh import Collective, Compute, MeshFinish, MeshSchedule


@dataclass(frozen=True)
class DistRun:
    """What a distributed run gave: the outputs gathered on rank 0, the placement checks one
    rank made (inputs, ops, steps, finishes), the ops torch ran on DTensors (its propagation
    checked against the schedule), the ops rank 0 ran in all, and the wall time."""

    outputs: dict[str, np.ndarray]
    placement_checks: int
    native_ops: tuple[str, ...]
    wall_s: float
    #: the process group's backend: ``gloo`` (CPU) or ``nccl`` (one GPU per rank)
    backend: str = "gloo"
    #: how many ops rank 0's launches hold
    ops: int = 0


def check_schedule(schedule: MeshSchedule) -> None:
    """Refuse what PyTorch's DTensor cannot express: a dim split over axes out of mesh order;
    and a schedule whose devices are not the mesh's ranks in row-major order."""
    names = [a.name for a in schedule.axes]
    order = {a: i for i, a in enumerate(names)}
    for lay in schedule.layouts:
        for i, axes in enumerate(lay.split):
            if list(axes) != sorted(axes, key=order.__getitem__):
                raise ExecutionError(f"{lay.local} (tensor {lay.tensor!r}): dim {i} is split "
                                     f"over {'*'.join(axes)}, not in mesh order "
                                     f"({', '.join(names)}); DTensor nests the cuts of one dim "
                                     f"in mesh order {cite('dtensor-axes-in-mesh-order')}")
    sizes = [a.size for a in schedule.axes]
    for dev in schedule.devices:
        want = tuple(zip(names, (int(c) for c in np.unravel_index(dev.index, sizes)),
                         strict=True)) if sizes else ()
        if tuple(dev.coords) != want:
            raise ExecutionError(f"{dev} of {schedule.program.name!r}: a rank of a row-major "
                                 f"DeviceMesh {schedule.mesh} has coordinates {want}")


def resolve_device(device: str, world: int) -> str:
    """``cpu`` or ``cuda`` for ``world`` ranks: ``auto`` takes cuda when there is a GPU per
    rank; an explicit ``cuda`` without enough GPUs is an error naming the counts.

    >>> resolve_device("cpu", 4)
    'cpu'
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ExecutionError(f"device {device!r}: expected auto, cpu or cuda")
    if device == "cpu":
        return device
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cuda" and gpus < world:
        raise ExecutionError(f"device cuda: the mesh has {world} devices, one process each, "
                             f"but this machine has {gpus} GPU{'s' if gpus != 1 else ''}")
    return "cuda" if gpus >= world else "cpu"


def job(schedule: MeshSchedule, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """What a rank needs of ``schedule``, in a form that pickles (programs as JSON; the
    registry's kinds hold functions): the program, mesh axes, devices, layouts, the stages
    (a compute stage as each device's key into ``segments``, its launch's program) and the
    host inputs."""
    segments: dict[Any, str] = {}
    stages: list[tuple[str, Any]] = []
    for stage in schedule.stages:
        if isinstance(stage, Compute):
            keys = []
            for launch in stage.launches:
                prog = launch.schedule.program
                key = segments.setdefault(prog, str(len(segments)))
                keys.append(key)
            stages.append(("compute", tuple(keys)))
        elif isinstance(stage, MeshFinish):
            stages.append(("finish", stage.parts))
        else:
            assert isinstance(stage, Collective)
            stages.append(("collective", stage))
    return {"program": dumps(schedule.program),
            "axes": tuple((a.name, a.size) for a in schedule.axes),
            "devices": schedule.devices, "layouts": schedule.layouts, "stages": stages,
            "segments": {key: dumps(prog) for prog, key in segments.items()},
            "inputs": {n: np.asarray(v) for n, v in inputs.items()}}


def run_mesh(schedule: MeshSchedule, inputs: Mapping[str, Any] | None = None, *, seed: int = 0,
             timeout_s: float = 120.0, device: str = "auto", threads: int | None = None,
             fault: Mapping[str, Any] | None = None) -> DistRun:
    """Run ``schedule`` on ``torch.distributed`` (see the module docstring) on ``inputs``
    (None: random ones of ``seed``); ``device`` is ``cpu`` (gloo), ``cuda`` (nccl, one GPU per
    rank) or ``auto`` (cuda where there is a GPU per rank). Every rank runs its own ops:
    ``threads`` is refused."""
    if threads is not None:
        raise ExecutionError("threads applies to the reference and torch backends; the dtensor "
                             "backend runs one process per device")
    return run_mesh_many([schedule], [inputs], seed, timeout_s, fault, device)[0]


def run_mesh_many(schedules: Sequence[MeshSchedule],
                  inputs: Sequence[Mapping[str, Any] | None] | None = None, seed: int = 0,
                  timeout_s: float = 120.0, fault: Mapping[str, Any] | None = None,
                  device: str = "auto") -> list[DistRun]:
    """Several schedules over meshes of one device count, one after another in one launch of
    the processes (PyTorch is imported once per rank)."""
    try:
        import torch.multiprocessing  # noqa: F401 - the launch spawns with it
    except ImportError:
        raise ExecutionError("the dtensor backend needs PyTorch: install the torch extra "
                             f"(pip install -e '.[torch]') {cite('needs-pytorch')}") from None
    if not schedules:
        return []
    world = len(schedules[0].devices)
    device = resolve_device(device, world)
    jobs = []
    for k, schedule in enumerate(schedules):
        check_schedule(schedule)
        if len(schedule.devices) != world:
            raise ExecutionError(f"schedules of one launch need one device count: "
                                 f"{len(schedule.devices)} != {world}")
        given = None if inputs is None else inputs[k]
        xs = random_inputs(schedule.program, seed) if given is None else \
            bind_inputs(schedule.program, given)
        jobs.append(job(schedule, xs))
    start = time.monotonic()
    results = launching.launch({"jobs": jobs, "fault": dict(fault) if fault else None}, world,
                               timeout_s, ", ".join(repr(s.program.name) for s in schedules),
                               worker, (device,))
    wall = time.monotonic() - start
    backend = "nccl" if device == "cuda" else "gloo"
    return [DistRun(r["outputs"], r["checks"], tuple(r["native"]), wall, backend, r["ops"])
            for r in results]
