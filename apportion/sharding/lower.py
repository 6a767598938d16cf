"""A sharding plan lowered to the device level of the schedule (``schedule.mesh``).

``lower_mesh(unrolled)`` turns the per-device programs of ``unroll`` into a ``MeshSchedule``:
every device's compute segments, each planned by ``ap.plan`` for the device's cores and
lowered to its core ``Schedule`` (``schedule.lower``; equal segments planned and lowered once
and shared), so the device's launches are over its cores, nested inside the device level
(the two planners lower into one form), and every resharding step as a
``Collective`` carrying each device's box of the tensor before and after it, as the plan's
shardings cut them (``Sharding.block``), with the groups of devices along its mesh axis. A
``slice`` step, which ``unroll`` runs as a local copy op inside a segment, becomes a stage of
its own here, so that every data movement of the plan is a step a backend sees. The finish
of a mean or argmax split over devices becomes a ``MeshFinish`` with each device's part.
A collective moving a partial value moves it in its partial dtype (``Collective.dtype``: float32
for a float16 sum's partials) and the reduction that makes it whole says the tensor's dtype
(``Collective.result_dtype``); a partial value's ``Layout.dtype`` says the dtype the devices hold
it in.

Symbolic loop counts of the program's tiling groups, which the segments keep, are bound when
the segments are lowered: ``params`` gives them (``run --mesh --param T=16``); a count not
given is lowered at the value its tiles were planned at (``schedule.lower.planned_counts``),
the schedule an emitter keeping the count symbolic reads.

Backends consume the ``MeshSchedule`` and never import ``apportion.sharding``.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
>>> s.summary()
'mlp over tp=2: 2 devices, 2 stages (1 compute, 1 collectives: 1 reduce_scatter)'
>>> s.collectives[0].dst_boxes
(((0, 256), (0, 512)), ((0, 256), (512, 1024)))
>>> launch = s.launches(0)[0]
>>> launch.name, launch.schedule.cores, [str(a) for a in s.worker_axes(launch.schedule.steps[0])]
('mlp.d0.s0', 32, ['tp:2', 'm:4', 'n:8'])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from apportion.errors import PlanningError
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.plans.tiles import Region
from apportion.schedule.lower import planned_counts
from apportion.schedule.mesh import (
    Collective,
    Compute,
    Device,
    DeviceLaunch,
    Layout,
    MeshFinish,
    MeshSchedule,
    MeshStage,
    Placement,
    group_order,
)
from apportion.sharding.collectives import Step, keyed, read_group
from apportion.sharding.plan import ShardingPlan
from apportion.sharding.rules import DeviceFinish
from apportion.sharding.spec import Sharding
from apportion.sharding.unroll import DeviceProgram, Unrolled, UnrolledStep, step_names, unroll
from apportion.target.target import Target

# what one device does at one stage, before planning: a run of ops (with the segment it is
# part of), a slice, a collective or a finish
_Entry = tuple[str, Any]


def lower_plan(plan: ShardingPlan, sizes: Mapping[str, int] | None = None,
               target: Target | None = None, params: Mapping[str, int] | None = None
               ) -> MeshSchedule:
    """``plan`` unrolled (``sizes`` bind a symbolic mesh) and lowered; each segment planned
    for ``target`` (default: the plan's) and lowered at the symbolic loop counts ``params``."""
    return lower_mesh(unroll(plan, sizes), target, params)


def lower_mesh(unrolled: Unrolled, target: Target | None = None,
               params: Mapping[str, int] | None = None) -> MeshSchedule:
    """The ``MeshSchedule`` of the per-device programs ``unrolled`` (see the module
    docstring); each segment planned for ``target`` (default: the plan's) and lowered at the
    symbolic loop counts ``params`` (one not given: at its planned value). A name in
    ``params`` that is no loop count of the program is refused."""
    from apportion.planned import plan as plan_program

    plan = unrolled.plan
    tgt = target or plan.target
    counts = dict(params or {})
    unknown = sorted(set(counts) - set(unrolled.counts))
    if unknown:
        raise PlanningError(f"the per-device programs of {plan.program.name!r} have no symbolic "
                            f"loop count {unknown[0]!r} (their counts: "
                            f"{', '.join(unrolled.counts) or 'none'})")
    slices = _slice_steps(plan)
    per_device = [_entries(dev, slices) for dev in unrolled.devices]
    shapes = [[kind for kind, _ in entries] for entries in per_device]
    if any(s != shapes[0] for s in shapes):  # unroll gives every device the same stages
        raise PlanningError(f"sharding plan of {plan.program.name!r}: the devices' stages "
                            "differ, so they cannot run in step")
    programs = [_segments(plan.program.name, dev, entries)
                for dev, entries in zip(unrolled.devices, per_device, strict=True)]
    lowered: dict[Program, DeviceLaunch] = {}
    stages: list[MeshStage] = []
    for k, (kind, _) in enumerate(per_device[0]):
        if kind == "ops":
            launches = []
            for d in range(len(unrolled.devices)):
                seg = programs[d][k]
                key = replace(seg, name=f"{plan.program.name}.s{k}")
                if key not in lowered:
                    pp = plan_program(seg, tgt)
                    at = {**planned_counts(pp.plan),
                          **{c: v for c, v in counts.items() if c in pp.params}}
                    # lowered once, bound at the counts (the lowered one its ``unbound``)
                    lowered[key] = DeviceLaunch(seg.name, pp.schedule(params=at))
                launches.append(DeviceLaunch(seg.name, lowered[key].schedule))
            stages.append(Compute(tuple(launches)))
        elif kind == "finish":
            fins = [per_device[d][k][1] for d in range(len(unrolled.devices))]
            stages.append(MeshFinish(fins[0].op, tuple(f.part() for f in fins)))
        else:
            stages.append(_collective(plan, [per_device[d][k][1]
                                             for d in range(len(unrolled.devices))], kind))
    devices = tuple(Device(dev.device, dev.coords,
                           tuple(Placement(t, local, box) for t, local, box in dev.inputs),
                           tuple(Placement(t, local, box) for t, local, box in dev.outputs))
                    for dev in unrolled.devices)
    return MeshSchedule(plan.program, plan.mesh.spec(), tgt, devices, tuple(stages),
                        _layouts(plan))


def _slice_steps(plan: ShardingPlan) -> dict[str, tuple[str, Step]]:
    """The local-cut copy ops ``unroll`` makes, by op name (``reshard.TRANSFER.K``): the
    tensor the transfer reshards and the step."""
    return {f"reshard.{t.name}.{k}": (t.tensor, s) for t in plan.transfers
            for k, s in enumerate(t.steps) if s.kind == "slice"}


def _entries(dev: DeviceProgram, slices: Mapping[str, tuple[str, Step]]) -> list[_Entry]:
    """The device's stages with each segment cut at its slice copies."""
    out: list[_Entry] = []
    for stage in dev.stages:
        if isinstance(stage, UnrolledStep):
            out.append(("collective", stage))
        elif isinstance(stage, DeviceFinish):
            out.append(("finish", stage))
        else:
            run: list[Op] = []
            for op in stage.ops:
                if op.name in slices:
                    if run:
                        out.append(("ops", (tuple(run), stage)))
                        run = []
                    out.append(("slice", (op, *slices[op.name])))
                else:
                    run.append(op)
            if run:
                out.append(("ops", (tuple(run), stage)))
    return out


def _reads(kind: str, item: Any) -> set[str]:
    if kind == "ops":
        return {a.tensor for op in item[0] for a in op.ins}
    if kind == "slice":
        return {item[0].ins[0].tensor}
    if kind == "finish":
        return set(item.sources)
    return {item.source}


def _segments(name: str, dev: DeviceProgram, entries: list[_Entry]) -> dict[int, Program]:
    """Each run of ops as a program of its own, by stage index: its inputs what it reads from
    before it, its outputs what later stages or the device's outputs read."""
    later = {local for _, local, _ in dev.outputs}
    after: list[set[str]] = [set() for _ in entries]
    for k in range(len(entries) - 1, -1, -1):
        after[k] = set(later)
        later |= _reads(*entries[k])
    out: dict[int, Program] = {}
    for k, (kind, item) in enumerate(entries):
        if kind != "ops":
            continue
        ops, seg = item
        made = [op.out.tensor for op in ops]
        ins = list(dict.fromkeys(a.tensor for op in ops for a in op.ins if a.tensor not in made))
        outs = [m for m in dict.fromkeys(made) if m in after[k]] or [made[-1]]
        names = dict.fromkeys([*ins, *made])
        mine = {op.name for op in ops}
        for g in seg.tiling:  # unroll ends a tiling run at a local cut, so none spans one
            if not set(g.ops) <= mine and set(g.ops) & mine:
                raise PlanningError(f"segment {seg.name!r} of device {dev.device}: tiling group "
                                    f"{list(g.ops)} spans a local cut of resharding")
        # the segment's tiling groups and core pins, restricted to this run's ops
        out[k] = replace(seg, name=f"{name}.d{dev.device}.s{k}",
                         tensors=tuple(seg.tensor(n) for n in names), inputs=tuple(ins),
                         outputs=tuple(outs), ops=ops,
                         tiling=tuple(g for g in seg.tiling if set(g.ops) <= mine),
                         work_division=tuple(w for w in seg.work_division if w[0] in mine),
                         split_k=tuple(p for p in seg.split_k if p[0] in mine))
    return out


def _boxes(plan: ShardingPlan, step: Step, tensor: str) -> tuple[tuple[Region, ...], ...]:
    """Every device's box of ``tensor`` before and after ``step``, as the plan cuts it."""
    shape = plan.program.tensor(tensor).shape
    sizes = {a.name: a.size for a in plan.mesh.axes}
    coords = [plan.mesh.coords(d) for d in range(plan.mesh.devices)]
    return (tuple(step.src.block(shape, c, sizes) for c in coords),
            tuple(step.dst.block(shape, c, sizes) for c in coords))


def _collective(plan: ShardingPlan, items: list[Any], kind: str) -> Collective:
    """One step, from every device's part of it (the same step on each)."""
    if kind == "slice":
        op, tensor, step = items[0]
        return step_collective(plan, step, tensor, op.ins[0].tensor, op.out.tensor)
    c: UnrolledStep = items[0]
    return step_collective(plan, c.step, c.tensor, c.source, c.result)


def step_collective(plan: ShardingPlan, step: Step, tensor: str, source: str, result: str
                    ) -> Collective:
    """Resharding ``step`` of ``tensor``'s value ``source`` into ``result`` as the mesh
    schedule's ``Collective``: every device's box before and after, the groups of devices it
    runs between, the dtypes it moves and makes.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.sharding.mesh import parse
    >>> from apportion.sharding.search import search
    >>> plan = search(load("examples/mlp.json"), parse("tp=2"), outputs="replicated")
    >>> t = plan.transfers[-1]
    >>> str(step_collective(plan, t.steps[0], t.tensor, t.source, t.name))
    'y@1 = all_gather(tp) dim 1(y)'
    """
    mesh = plan.mesh
    src, dst = _boxes(plan, step, tensor)
    # a halo across several peered axes reads from the devices differing along any of them
    groups = group_order({read_group(mesh, d, step.axes) for d in range(mesh.devices)})
    # partials move in their partial dtype; the reduction that makes them whole casts
    dtype = plan.program.tensor(tensor).dtype
    moved, made = step.src.held_dtype(dtype), step.dst.held_dtype(dtype)
    return Collective(step.kind, tensor, source, result, moved, ",".join(step.axes), groups,
                      src, dst, step.dim, step.to_dim, step.reducer,
                      unpack=step.reducer is not None and keyed(step.reducer)
                      and not step.dst.partial, result_dtype=made if made != moved else None)


def _layouts(plan: ShardingPlan) -> tuple[Layout, ...]:
    """How the mesh holds every value the devices name alike (``Layout``): the inputs as
    placed, each op's result as its strategy writes it (an op split into local parts and a
    finish: the finish's result), and each resharding step's result; the reads of an op are
    among these (an input, an op's result or a transfer's)."""
    shape = plan.program.tensor
    sizes = {a.name: a.size for a in plan.mesh.axes}
    coords = [plan.mesh.coords(d) for d in range(plan.mesh.devices)]
    out: dict[str, Layout] = {}

    def add(tensor: str, local: str, s: Sharding) -> None:
        t = shape(tensor)
        boxes = tuple(s.block(t.shape, c, sizes) for c in coords)
        held = s.held_dtype(t.dtype)
        out.setdefault(local, Layout(tensor, local, s.dims, s.partial, s.reducer, boxes,
                                     held if held != t.dtype else None))

    for name, s in plan.inputs:
        add(name, name, s)
    for op, shard in zip(plan.program.ops, plan.ops, strict=True):
        add(op.out.tensor, op.out.tensor, shard.strategy.out)
    for t in plan.transfers:
        for k, step in enumerate(t.steps):
            src, dst = step_names(t, k)
            add(t.tensor, src, step.src)
            add(t.tensor, dst, step.dst)
    return tuple(out.values())
