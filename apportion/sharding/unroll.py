"""Per-device programs: a sharding plan unrolled into one ordinary program per device, with
explicit collective steps between: what ``lower.lower_plan`` lowers to the mesh schedule.

Every device runs the same *stages* in the same order (SPMD): compute segments, each a normal
apportion ``Program`` over that device's shards (``ap.plan`` plans it on the device's cores),
and ``UnrolledStep`` steps that every device takes part in. A device's segment holds its part of
each op (``rules.local_op``: its shard of the iteration space, its operands' shards, accesses
shifted by where its shards start) and the local cuts of resharding (a ``slice`` step is a
``copy`` op reading the part of its block the device keeps); the other steps of a transfer
(all-gather, all-reduce, reduce-scatter, all-to-all) are collectives. A mean or argmax whose
reduction is split over devices ends its part with a ``rules.DeviceFinish`` stage (elementwise on
the device: the local mean scaled to its share of the whole count, or the argmax's value and
global index packed into keys), between segments. Devices may differ in their shapes (uneven
shards) and offsets, so each device has its own programs.

A partial value (a device's part of a sum split over devices, waiting for its reduction) is
held in its partial dtype (``Sharding.held_dtype``: a float16 or bfloat16 sum's or mean's in
float32, the accumulator dtype), in the segment that makes it and in every step that moves it
while it is partial; the reduction that makes it whole casts it to the tensor's dtype, so it
rounds once, as the unplanned program's accumulator does.

A plan on a mesh with symbolic axis sizes unrolls once they are bound: ``unroll(plan,
sizes={"N": 4})`` binds them (``ShardingPlan.bind``) and refuses a mesh left unbound, naming
the axis.

Each segment keeps what the source program says about how its ops are planned on a device's
cores, restricted to the segment's ops and at the sizes the device sees (``carry_tiling``):

* a tiling group becomes, in each segment holding some of its ops, one group per unbroken run
  of them (a collective, a finish or a local cut of resharding between two of its ops ends a
  run: a device's loops cannot hold a step every device takes at once; the resharding of a
  tensor made before the group is done before its first op, ``plan.transfer_point``, so only
  data made inside the group can cut it). A run keeps the
  group's loop levels, **counts unchanged**, over the device's share of each tiled dim, so a
  device's tile is its share divided by the count, never larger than the source's tile: what
  fit the scratchpad still fits. A count that does not divide a device's share of its dim (an
  uneven or odd shard) is a ``PlanningError`` naming the group, the level, the dim, the count,
  the device and its share, and so is a dim the run's ops see at different sizes (split over
  the mesh in one op, whole in another). A level no op of a run tiles is dropped (an op of
  the run only recomputed the same box along it), and a run whose ops sit only in such levels
  runs untiled. A symbolic count stays symbolic (the planner sizes each device's tiles at its
  smallest value; ``params={"T": 16}`` of the run or lowering gives it). Every run and every
  change is recorded (``Unrolled.tiling``, ``GroupCarry``), and ``tiling_lines`` says what
  became of each group;
* ``work_division`` and ``split_k`` pins stay on the op they pin (the device's part of it,
  same name, same dims), the pinned core splits unchanged: they now split the device's share.
  A pin that does not fit the share is the planner's error naming the op, dim and factor,
  with the device and segment said (``oracle.planned``). The extra ``.value`` op of an
  argmax split over devices is not pinned.

``lower.lower_plan`` lowers these programs to the mesh schedule every backend runs;
``oracle`` runs them as they are, with the reference executor and numpy collectives, as an
independent check of that path.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> u = unroll(search(load("examples/mlp.json"), parse("tp=2"), outputs="replicated"))
>>> [type(s).__name__ for s in u.devices[0].stages]
['Program', 'UnrolledStep', 'Program', 'UnrolledStep']
>>> u.distinct_segments
2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from apportion.errors import PlanningError
from apportion.ir.affine import AffineExpr
from apportion.ir.op import Access, Op
from apportion.ir.program import LoopLevel, Program, TensorType, TilingGroup
from apportion.sharding.collectives import Step
from apportion.sharding.plan import ShardingPlan, Transfer, transfer_point
from apportion.sharding.rules import DeviceFinish, local_ops


@dataclass(frozen=True)
class UnrolledStep:
    """One communicating step that every device runs at once: each device's local
    ``source`` (its shard of ``tensor`` in ``step.src``) becomes its ``result`` (in
    ``step.dst``)."""

    tensor: str
    source: str
    result: str
    step: Step

    def __str__(self) -> str:
        return f"{self.result} = {self.step}({self.source})"


Stage = Program | UnrolledStep | DeviceFinish


@dataclass(frozen=True)
class GroupCarry:
    """What became of source tiling group ``group`` (its index in the program's ``tiling``) in
    one run of its ops on one device: the run's ops (``ops``, in segment ``segment``), the
    group they form there (``carried``; None: the run is untiled, ``changes`` says why), the
    device's share of each dim its loops tile (``shares``), and every way the carried group
    differs from the source's other than its sizes (``changes``: levels or dims left out)."""

    device: int
    segment: str
    group: int
    ops: tuple[str, ...]
    carried: TilingGroup | None
    shares: tuple[tuple[str, int], ...] = ()
    changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceProgram:
    """What device ``device`` runs: its stages (compute segments, collectives, finishes), and
    where its shards of the program's inputs and outputs come from and go (``(tensor, local
    name, block)``, the block as ``(start, stop)`` per dim); ``tiling``: what became of the
    source's tiling groups in its segments."""

    device: int
    coords: tuple[tuple[str, int], ...]
    stages: tuple[Stage, ...]
    inputs: tuple[tuple[str, str, tuple[tuple[int, int], ...]], ...]
    outputs: tuple[tuple[str, str, tuple[tuple[int, int], ...]], ...]
    tiling: tuple[GroupCarry, ...] = ()

    @property
    def segments(self) -> tuple[Program, ...]:
        return tuple(s for s in self.stages if isinstance(s, Program))


def carry_tiling(group: TilingGroup, ops: Sequence[Op], origin: Mapping[str, str],
                 source: Program, where: str
                 ) -> tuple[TilingGroup | None, tuple[tuple[str, int], ...], tuple[str, ...]]:
    """Source tiling ``group`` restricted to ``ops``, one unbroken run of its ops as a device
    runs them (``origin``: local op name -> the source op it is part of; ``where`` names the
    device in errors): the carried group (None: untiled), the device's share of each tiled
    dim, and the changes made (see the module docstring for the rule).

    >>> from apportion.frontend.json_format import load
    >>> p = load("examples/fused.json")
    >>> local = [replace(o, dims=tuple((d, n // 2 if d == "m" else n) for d, n in o.dims))
    ...          for o in p.ops]
    >>> g, shares, changes = carry_tiling(p.tiling[0], local, {"add": "add", "mul": "mul"}, p,
    ...                                   "device 0")
    >>> [(lv.count, lv.dims) for lv in g.loops], shares, changes
    ([(2, ('m',)), (4, ('n',))], (('m', 512), ('n', 4096)), ())
    """
    name = f"tiling group {list(group.ops)}"
    seen: dict[str, tuple[int, str]] = {}
    for o in ops:  # the group's loops step one size per dim letter, as in the source
        for d, n in o.dims:
            first = seen.setdefault(d, (n, o.name))
            if first[0] != n:
                whole = source.op(origin[o.name]).sizes[d]
                raise PlanningError(
                    f"{name} cannot be kept on {where}: dim {d!r} is {first[0]} there in op "
                    f"{first[1]!r} but {n} in op {o.name!r} (of {whole}: the mesh splits it "
                    "in one op and not the other); the group's loops need one size per dim")
    depth = {o.name: group.depth(origin[o.name]) for o in ops}
    kept = [k for k, lv in enumerate(group.loops)
            if any(depth[o.name] > k and any(d in o.sizes for d in lv.dims) for o in ops)]
    changes = [f"level {k} ({lv.count} over {', '.join(lv.dims)}) left out: no op of the run "
               "tiles it" for k, lv in enumerate(group.loops) if k not in kept]
    new_depth = {n: sum(1 for k in kept if k < d) for n, d in depth.items()}
    if not kept or min(new_depth.values()) == 0:
        changes.append("the run is untiled: " + ("none of its ops has a tiled dim" if not kept
                                                 else "some of its ops sit only in levels "
                                                 "left out"))
        return None, (), tuple(changes)
    sizes = {d: n for d, (n, _) in seen.items()}
    shares: dict[str, int] = {}
    levels = []
    for k in kept:
        lv = group.loops[k]
        dims = tuple(d for d in lv.dims if d in sizes)
        if len(dims) < len(lv.dims):
            gone = [d for d in lv.dims if d not in sizes]
            changes.append(f"level {k}: dim{'s' if len(gone) > 1 else ''} "
                           f"{', '.join(gone)} left out (no op of the run has it)")
        for d in dims:
            shares.setdefault(d, sizes[d])
            if not isinstance(lv.count, int):
                continue  # a run-time count: the planner sizes it at its smallest value
            if sizes[d] % lv.count:
                o = source.op(origin[seen[d][1]])
                raise PlanningError(
                    f"{name} cannot be kept on {where}: loop level {k} count {lv.count} does "
                    f"not divide dim {d!r} as the device sees it: {sizes[d]} of op "
                    f"{o.name!r}'s {o.sizes[d]}"
                    f"{' after outer levels' if shares[d] != sizes[d] else ''}; give the "
                    f"group a count dividing every device's share of {d!r}, or keep {d!r} "
                    "whole over the mesh")
            sizes[d] //= lv.count
        levels.append(LoopLevel(lv.count, dims, lv.min, lv.max))
    depths = tuple((n, d) for n, d in new_depth.items() if d < len(levels))
    carried = TilingGroup(tuple(o.name for o in ops), tuple(levels), depths)
    return carried, tuple(shares.items()), tuple(changes)


def _slice_op(t: Transfer, k: int, step: Step, src_name: str, dst_name: str,
              plan: ShardingPlan, coords: Mapping[str, int],
              types: dict[str, TensorType]) -> Op:
    """The local cut of a ``slice`` step: a copy of the part of its block the device keeps."""
    tensor = plan.program.tensor(t.tensor)
    sizes = {a.name: a.size for a in plan.mesh.axes}
    src_block = step.src.block(tensor.shape, coords, sizes)
    dst_block = step.dst.block(tensor.shape, coords, sizes)
    dims = tuple((f"d{j}", hi - lo) for j, (lo, hi) in enumerate(dst_block))
    index = tuple(AffineExpr(((f"d{j}", 1),), dst_block[j][0] - src_block[j][0])
                  for j in range(len(dims)))
    types[dst_name] = TensorType(dst_name, tuple(n for _, n in dims),
                                 step.dst.held_dtype(tensor.dtype))
    out = Access(dst_name, tuple(AffineExpr.dim(d) for d, _ in dims))
    return Op(f"reshard.{t.name}.{k}", "copy", out, (Access(src_name, index),), dims)


def _schedule(plan: ShardingPlan) -> list[tuple[str, Any]]:
    """The stages every device runs, in order: ("op", index) and ("step", (transfer, k)).

    A transfer is made right before its reader, but for a reader inside a tiling group of a
    tensor made before the group starts: that transfer is made before the group's first op,
    so that it does not cut the group's run of ops on the devices (the data it moves is the
    same, made earlier)."""
    n = len(plan.program.ops)
    before: dict[int, list[Transfer]] = {}
    for t in plan.transfers:
        before.setdefault(transfer_point(plan.program, t), []).append(t)
    out: list[tuple[str, Any]] = []
    for i in range(n + 1):
        for t in before.get(i, []):
            out.extend(("step", (t, k)) for k in range(len(t.steps)))
        if i < n:
            out.append(("op", i))
    return out


def step_names(t: Transfer, k: int) -> tuple[str, str]:
    src = t.source if k == 0 else f"{t.name}~{k}"
    dst = t.name if k == len(t.steps) - 1 else f"{t.name}~{k + 1}"
    return src, dst


def _device(plan: ShardingPlan, device: int, schedule: list[tuple[str, Any]]) -> DeviceProgram:
    p, mesh = plan.program, plan.mesh
    group_of = {n: gi for gi, g in enumerate(p.tiling) for n in g.ops}
    coords = mesh.coords(device)
    sizes = {a.name: a.size for a in mesh.axes}
    types: dict[str, TensorType] = {}
    ins = []
    for name, s in plan.inputs:
        t = p.tensor(name)
        types[name] = TensorType(name, s.local_shape(t.shape, coords, sizes), t.dtype)
        ins.append((name, name, s.block(t.shape, coords, sizes)))
    entries: list[Op | UnrolledStep | DeviceFinish] = []
    origin: dict[str, str] = {}  # local op -> the source op it is (part of)
    for what, item in schedule:
        if what == "op":
            op = p.ops[item]
            shard = plan.ops[item]
            lops, lt, finish = local_ops(op, p, mesh, shard.strategy, coords, shard.reads)
            types.update(lt)
            entries.extend(lops)
            origin.update((lop.name, op.name) for lop in lops)
            if finish is not None:
                entries.append(finish)
            continue
        t, k = item
        step = t.steps[k]
        src, dst = step_names(t, k)
        if step.kind == "slice":
            entries.append(_slice_op(t, k, step, src, dst, plan, coords, types))
        else:
            tt = p.tensor(t.tensor)
            # a reduction leaving the value whole casts it to the tensor's dtype; one
            # leaving it partial keeps the partial dtype (``Sharding.held_dtype``)
            types[dst] = TensorType(dst, step.dst.local_shape(tt.shape, coords, sizes),
                                    step.dst.held_dtype(tt.dtype))
            entries.append(UnrolledStep(t.tensor, src, dst, step))
    outs = []
    for name, s, local in plan.outputs:
        outs.append((name, local, s.block(p.tensor(name).shape, coords, sizes)))
    # what each entry reads, to know what a segment hands on
    reads_after: list[set[str]] = [set() for _ in range(len(entries) + 1)]
    final = {local for _, local, _ in outs}
    later: set[str] = set(final)
    for i in range(len(entries) - 1, -1, -1):
        reads_after[i + 1] = set(later)
        e = entries[i]
        later |= {a.tensor for a in e.ins} if isinstance(e, Op) else \
            set(e.sources) if isinstance(e, DeviceFinish) else {e.source}
    stages: list[Stage] = []
    run: list[int] = []
    carries: list[GroupCarry] = []
    where = f"device {device} ({', '.join(f'{a}={i}' for a, i in coords.items())})"

    def close() -> None:
        if not run:
            return
        ops: list[Op] = [entries[i] for i in run]  # type: ignore[misc]
        assert all(isinstance(o, Op) for o in ops)
        made = [o.out.tensor for o in ops]
        seg_in = list(dict.fromkeys(a.tensor for o in ops for a in o.ins
                                    if a.tensor not in made))
        after = reads_after[run[-1] + 1]
        seg_out = [m for m in made if m in after] or [made[-1]]
        names = dict.fromkeys([*seg_in, *made])
        seg_name = f"{p.name}.d{device}.s{len(stages)}"
        groups = []
        for gi, run_ops in _group_runs(ops, origin, group_of):
            carried, shares, changes = carry_tiling(p.tiling[gi], run_ops, origin, p, where)
            carries.append(GroupCarry(device, seg_name, gi, tuple(o.name for o in run_ops),
                                      carried, shares, changes))
            if carried is not None:
                groups.append(carried)
        # pins stay on the op they pin (its device part has its name and dims)
        pins = tuple((o.name, p.pins[o.name]) for o in ops if o.name in p.pins)
        split_k = tuple((o.name, p.split_k_pins[o.name]) for o in ops
                        if o.name in p.split_k_pins)
        stages.append(Program(seg_name, tuple(types[n] for n in names), tuple(seg_in),
                              tuple(seg_out), tuple(ops), tuple(groups),
                              tuple((n, tuple(d.items())) for n, d in pins), split_k))
        run.clear()

    for i, e in enumerate(entries):
        if isinstance(e, Op):
            run.append(i)
        else:
            close()
            stages.append(e)
    close()
    return DeviceProgram(device, tuple(coords.items()), tuple(stages), tuple(ins), tuple(outs),
                         tuple(carries))


def _group_runs(ops: Sequence[Op], origin: Mapping[str, str], group_of: Mapping[str, int]
                ) -> list[tuple[int, list[Op]]]:
    """The unbroken runs of one source group's ops in a segment's ``ops`` (a local cut between
    two of them ends a run), with the group's index."""
    runs: list[tuple[int, list[Op]]] = []
    last: int | None = None
    for o in ops:
        gi = group_of.get(origin.get(o.name, ""))
        if gi is not None and gi == last:
            runs[-1][1].append(o)
        elif gi is not None:
            runs.append((gi, [o]))
        last = gi
    return runs


@dataclass(frozen=True)
class Unrolled:
    """A sharding plan as one program per device (see the module docstring)."""

    plan: ShardingPlan
    devices: tuple[DeviceProgram, ...]

    @property
    def program(self) -> Program:
        return self.plan.program

    @cached_property
    def counts(self) -> tuple[str, ...]:
        """The symbolic loop counts of the source's tiling groups (a planned run needs each)."""
        return tuple(dict.fromkeys(lv.count for g in self.program.tiling for lv in g.loops
                                   if isinstance(lv.count, str)))

    @property
    def tiling(self) -> tuple[GroupCarry, ...]:
        """Every run of a source tiling group's ops on every device (``GroupCarry``)."""
        return tuple(c for dev in self.devices for c in dev.tiling)

    def tiling_lines(self) -> list[str]:
        """One line per source tiling group: how each device runs it (see ``carry_tiling``).

        >>> from apportion.frontend.json_format import load
        >>> from apportion.sharding.mesh import parse
        >>> from apportion.sharding.propagate import propagate
        >>> from apportion.sharding.spec import Sharding
        >>> rows = Sharding((("tp",), ()))
        >>> u = unroll(propagate(load("examples/fused.json"), parse("tp=2"),
        ...                      annotations={"a": rows, "z": rows}))
        >>> print(*u.tiling_lines())
        tiling group ['add', 'mul'] on every device: 2 over m, 4 over n of its m=512, n=4096
        """
        lines = []
        for gi, g in enumerate(self.program.tiling):
            runs = [c for c in self.tiling if c.group == gi]
            per_dev = [[c for c in runs if c.device == d.device] for d in self.devices]
            texts = {d: "; then ".join(_run_text(c, len(rs)) for c in rs)
                     for d, rs in enumerate(per_dev)}
            name = f"tiling group {list(g.ops)}"
            if len(set(texts.values())) == 1:
                lines.append(f"{name} on every device: {texts[0]}")
            else:
                lines.append(f"{name}: " + "; ".join(f"device {d}: {t}"
                                                     for d, t in texts.items()))
        return lines

    @cached_property
    def distinct_segments(self) -> int:
        return len({segment_key(s) for dev in self.devices for s in dev.segments})


def _run_text(c: GroupCarry, runs: int) -> str:
    """``2 over m, 4 over n of its m=512, n=4096``: the counts over the device's shares (and
    the run's ops when the group is cut into several runs, and its changes)."""
    ops = f"ops {', '.join(c.ops)}: " if runs > 1 else ""
    if c.carried is None:
        how = "untiled"
    else:
        how = ", ".join(f"{lv.count} over {'+'.join(lv.dims)}" for lv in c.carried.loops) + \
            " of its " + ", ".join(f"{d}={n}" for d, n in c.shares)
    return ops + how + "".join(f" ({x})" for x in c.changes)


def segment_key(seg: Program) -> Program:
    """A segment without its device in its name: devices with equal shards share its plan."""
    return replace(seg, name=seg.name.split(".d")[0] + ".s" + seg.name.rsplit(".s", 1)[1])


def unroll(plan: ShardingPlan, sizes: Mapping[str, int] | None = None) -> Unrolled:
    """The per-device programs of ``plan``; ``sizes`` binds the symbolic axis sizes of its
    mesh (``ShardingPlan.bind``), which must all be bound."""
    plan = plan.bind(sizes)
    schedule = _schedule(plan)
    return Unrolled(plan, tuple(_device(plan, d, schedule) for d in range(plan.mesh.devices)))
