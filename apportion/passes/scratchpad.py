"""Pass `scratchpad`: where every buffer lives, scratchpad ("lx") offsets and device addresses.

Each loop group's per-iteration tiles are placed by ``placement.plan_group`` (see there for what
may stay on chip and how offsets are chosen). Device memory is a bump allocator: every device
buffer gets its own aligned address, inputs first, then in program order; sizes are the device
layout's (padded sticks).
"""

from __future__ import annotations

from dataclasses import dataclass

from apportion.ir.program import Program
from apportion.passes.buffers import Buffers, accumulator_dtype, needs_finish
from apportion.passes.coarse_tile import Tiling
from apportion.passes.placement import align, device_bytes, plan_group, tile_shape
from apportion.plans.memory import Buffer, GroupPlan
from apportion.plans.plan import OpPlan
from apportion.target.target import Target


@dataclass(frozen=True)
class Memory:
    """The scratchpad pass's result: one GroupPlan per loop group and every tensor's buffers."""

    groups: tuple[GroupPlan, ...]
    buffers: tuple[Buffer, ...]


def scratchpad(program: Program, target: Target, tiling: Tiling, bufs: Buffers,
               plans: dict[str, OpPlan]) -> Memory:
    """The scratchpad pass: one GroupPlan per loop group and every tensor's buffers.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.pipeline import plan
    >>> from apportion.target import spyre
    >>> p = plan(load("examples/fused.json"), spyre(cores=32))
    >>> p.buffer("y").space, p.buffer("y").offset, p.buffer("z").space
    ('lx', 0, 'hbm')
    """
    roles = bufs.roles
    groups, lx = [], {}
    for g in tiling.groups:
        gp, placed = plan_group(program, target, g, roles, plans, bufs.steps[g.index])
        groups.append(gp)
        lx.update(placed)
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
        path = () if role.group is None else tiling.groups[role.group].path
        if role.role == "accumulator":
            acc = accumulator_dtype(op, program)
            hbm(t, "accumulator", full, path, "" if acc == program.tensor(t).dtype else acc)
            if needs_finish(op, program):
                hbm(t, "full", full)
            continue
        if role.role == "tile":
            shape = tile_shape(op, program, plans[op.name].sizes)
            if t in lx:
                off, n = lx[t]
                buffers.append(Buffer(t, "tile", "lx", off, n, shape, path))
            else:
                hbm(t, "tile", shape, path)
        if role.role == "full" or role.copy:
            hbm(t, "full", full)
    return Memory(tuple(groups), tuple(buffers))
