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

from dataclasses import dataclass

from apportion.ir.program import Program
from apportion.passes.buffers import Buffers, accumulator_dtype
from apportion.passes.coarse_tile import Tiling
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
