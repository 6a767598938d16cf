"""Pass `scratchpad`: where every buffer lives, scratchpad ("lx") offsets and device addresses.

The scratchpad is planned for the whole program. Each loop group's per-iteration tiles and
tile-sized accumulators are placed by ``placement.plan_group`` (see there for what may stay on
chip and how offsets are chosen); then the outputs of ops outside loop groups (a softmax's row
statistics, a norm's scale) by ``placement.plan_program``, around what the groups keep, by
their lifetimes in program order: such a tensor is kept once, in every core's scratchpad (its
part; buffer kind ``full``, space ``lx``), for all its readers. Device memory is a bump
allocator: every device buffer gets its own aligned address, inputs first, then in program
order; sizes are the device layout's (padded sticks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.passes.buffers import Buffers, accumulator_dtype
from apportion.passes.coarse_tile import Tiling
from apportion.passes.geometry import OpContext, Splits
from apportion.passes.placement import (
    align,
    buffer_shape,
    device_bytes,
    plan_group,
    plan_program,
)
from apportion.plans.memory import Buffer, GroupPlan
from apportion.plans.plan import OpPlan
from apportion.target.target import Target


@dataclass(frozen=True)
class Memory:
    """The scratchpad pass's result: one GroupPlan per loop group and every tensor's buffers."""

    groups: tuple[GroupPlan, ...]
    buffers: tuple[Buffer, ...]


def scratchpad(program: Program, target: Target, tiling: Tiling, bufs: Buffers,
               plans: dict[str, OpPlan], untiled: bool = True) -> Memory:
    """The scratchpad pass: one GroupPlan per loop group and every tensor's buffers
    (``untiled``: also keep outputs of ops outside loop groups on chip; a program with
    run-time sizes, re-cut at every size, keeps them in device memory).

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.pipeline import plan
    >>> from apportion.target import spyre
    >>> p = plan(load("examples/fused.json"), spyre(cores=32))
    >>> p.buffer("y").space, p.buffer("y").offset, p.buffer("z").space
    ('lx', 0, 'hbm')
    """
    roles = bufs.roles
    groups, lx = [], {}
    finished: set[str] = set()  # accumulators copied out by a finish step
    by_group = {}
    for g in tiling.groups:
        gp, placed = plan_group(program, target, g, roles, plans, bufs.steps[g.index])
        groups.append(gp)
        lx.update(placed)
        by_group[g.index] = (gp, placed)
        finished.update(f.tensor for f in gp.finishes)
    kept = plan_program(program, target, tiling, roles, plans, by_group) if untiled else {}
    buffers: list[Buffer] = []
    address = 0

    def hbm(tensor: str, kind: str, shape: tuple[int, ...], path: tuple[int, ...] = (),
            dtype: str = "") -> None:
        nonlocal address
        n = device_bytes(shape, dtype or program.tensor(tensor).dtype, target)
        buffers.append(Buffer(tensor, kind, "hbm", address, n, shape, path, dtype))
        address = align(address + n, target.alignment)

    for name in program.inputs:
        hbm(name, "full", program.tensor(name).shape)
    for op in program.ops:
        t, role = op.out.tensor, roles[op.out.tensor]
        full = program.tensor(t).shape
        group = None if role.group is None else tiling.groups[role.group]
        # a tile or accumulator buffer belongs to the loops it lives in: its producer's path,
        # cut at the buffer's depth for a tile
        path = () if group is None else group.tile(op.name).loop.group
        if role.role == "accumulator":
            assert group is not None
            acc = accumulator_dtype(op, program)
            dtype = "" if acc == program.tensor(t).dtype else acc
            level = group.tile(op.name).reduction_level
            assert level is not None
            if t not in finished:  # the accumulator is the tensor
                hbm(t, "accumulator", full, path, dtype)
                continue
            # tile-sized: the op's output over the loops outside the one tiling the reduction
            shape = buffer_shape(op, program, group, level)
            if t in lx:
                off, n = lx[t]
                buffers.append(Buffer(t, "accumulator", "lx", off, n, shape, path, dtype))
            else:
                hbm(t, "accumulator", shape, path, dtype)
            if role.inside:  # read in the group after its loop: the finish fills a tile buffer
                hbm(t, "tile", buffer_shape(op, program, group, role.depth), path[:role.depth])
            if role.outside or not role.inside:
                hbm(t, "full", full)
            continue
        if role.role == "tile":
            assert group is not None
            shape = buffer_shape(op, program, group, role.depth)
            path = path[:role.depth]
            if t in lx:
                off, n = lx[t]
                buffers.append(Buffer(t, "tile", "lx", off, n, shape, path))
            else:
                hbm(t, "tile", shape, path)
        if t in kept:  # an untiled op's output kept on chip
            off, n = kept[t]
            buffers.append(Buffer(t, "full", "lx", off, n, full))
        elif role.role == "full" or role.copy:
            hbm(t, "full", full)
    return Memory(tuple(groups), tuple(buffers))


def follow_pins(ctxs: Mapping[str, OpContext], tiling: Tiling, splits: Splits) -> Splits:
    """Splits of the ops next to pinned ones cut like them, so the tensors between stay on chip.

    An intermediate of ops outside loop groups stays in the scratchpad only when every core
    reading it reads what the same core wrote (``placement.plan_program``). Work distribution
    picks each op's splits alone, so when the user pins the ops of a softmax to cut heads and
    rows one way, the matmul making its scores and the one reading its probabilities may cut
    them another way, and those two tensors go through device memory. Here each unpinned op
    outside loop groups that makes a tensor a pinned op reads, or reads a tensor a pinned op
    makes, is given the pinned op's cuts of that tensor's axes (its other dims whole) when
    that is a valid split for it, every other op making or reading the tensor is pinned, and
    the predicted time of all of them, the tensor costing no device-memory traffic, is no more
    than with the op's own splits. The first tensor (in program order) that qualifies decides;
    a program without pins is left as it is.

    >>> import json
    >>> from apportion.frontend.json_format import loads
    >>> from apportion.passes.pipeline import plan
    >>> from apportion.target import spyre
    >>> doc = json.load(open("examples/attention.json"))
    >>> doc["work_division"] = {n: {"h": 2, "t": 16} for n in
    ...                         ("rowmax", "shift", "exp", "rowsum", "norm")}
    >>> p = plan(loads(json.dumps(doc)), spyre(cores=32))
    >>> p.op("pv").split_map["h"], p.op("pv").split_map["t"], p.buffer("p").space
    (2, 16, 'lx')
    """
    if not ctxs:
        return splits
    program = next(iter(ctxs.values())).program
    pinned = {n for n in ctxs if program.pins.get(n)}
    if not pinned:
        return splits
    grouped = {n for g in tiling.groups for n in g.ops}
    held = set(program.inputs) | set(program.outputs)
    changed: dict[str, dict[str, int]] = {}
    for op in program.ops:
        name = op.name
        if name in pinned or name in grouped or name not in ctxs or not op.kind.divisible:
            continue
        for tensor, seed in _pinned_neighbours(op, program, pinned, grouped, held, splits):
            ctx = ctxs[name]
            cand = {d: seed.get(d, 1) for d in ctx.sizes}
            own = splits[name]
            if cand == own or not ctx.valid(cand):
                continue
            # every other op making or reading the tensor: pinned ones, cut as they are
            others = {o.name for o in program.consumer_map.get(tensor, ())} | {
                program.producer_map[tensor].name}
            others.discard(name)
            if not others <= pinned or not others <= set(ctxs):
                continue  # an unpinned one would have to follow too
            kept = frozenset({tensor})
            before = ctx.time_us(own) + sum(ctxs[o].time_us(splits[o]) for o in others)
            after = ctx.time_us(cand, kept) + sum(ctxs[o].time_us(splits[o], kept)
                                                  for o in others)
            if after <= before * (1 + 1e-9):
                changed[name] = cand
                break
    return splits.replace(changed) if changed else splits


def _pinned_neighbours(op: Op, program: Program, pinned: set[str], grouped: set[str],
                       held: set[str], splits: Splits
                       ) -> list[tuple[str, dict[str, int]]]:
    """(tensor, a pinned op's cuts of its axes named by ``op``'s dims) for each intermediate
    between ``op`` and a pinned op outside loop groups, in program order."""
    out = []
    for acc in op.ins:  # a pinned producer
        prod = program.producer_map.get(acc.tensor)
        if prod is None or prod.name not in pinned or prod.name in grouped or \
                acc.tensor in held:
            continue
        out.append((acc.tensor, _axis_cuts(prod.out.index, splits[prod.name], acc.index)))
    if op.out.tensor not in held:  # pinned readers
        for reader in program.consumer_map.get(op.out.tensor, ()):
            if reader.name not in pinned or reader.name in grouped:
                continue
            for acc in reader.ins:
                if acc.tensor == op.out.tensor:
                    out.append((acc.tensor, _axis_cuts(acc.index, splits[reader.name],
                                                       op.out.index)))
                    break
    return out


def _axis_cuts(src_index: tuple, src_splits: Mapping[str, int], dst_index: tuple
               ) -> dict[str, int]:
    """Per tensor axis indexed by one dim on both sides: the source dim's cuts, keyed by the
    destination's dim."""
    out = {}
    for a, b in zip(src_index, dst_index, strict=True):
        da, db = a.single_dim, b.single_dim
        if da is not None and db is not None:
            out[db] = src_splits.get(da, 1)
    return out
