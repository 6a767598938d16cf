"""Pass `buffers`: which buffers each tensor needs once loops tile the program.

For a tensor made in a loop group:

* read only inside the group (or nowhere): a per-tile buffer at a fixed place that every
  iteration reuses (role ``tile``); it holds the producer's tile at the depth of the loops the
  producer shares with all its readers (``depth``): a producer in an inner loop read after that
  loop writes its tiles one by one into a buffer holding the outer loop's tile;
* read both inside and after it, or a program output read inside: a per-tile buffer for the
  readers inside, a full buffer for those after it, and a copy step in the loop writing each tile
  into its slice of the full one (role ``tile``, ``copy``);
* read only after the group, or a program output: written straight into its slice of a full
  buffer (role ``full``);
* made by an op tiled over a reduction dim: an accumulator set to the reduction's identity
  before the loop tiling the reduction, combined into every iteration (role ``accumulator``).
  It holds the op's output over the loops outside that loop only (tile-sized; the whole tensor
  when the reduction is tiled by the outermost level), and a finish step at the end of that
  loop copies it out into the tensor's buffers (its full one, and a tile buffer where ops of the
  group read it after the loop), casting and dividing a ``mean`` by its count. Float results
  accumulate in float32, as hardware does, so that rounding happens once. Only an accumulator of
  the whole tensor that needs neither cast nor division is the tensor's buffer itself, with no
  finish step.

Every other tensor (inputs, results of ops outside loops) has a full buffer. Readers outside a
loop always read full buffers. Where the buffers go is the `scratchpad` pass's decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.passes.coarse_tile import GroupTiling, Tiling, common_depth
from apportion.plans.memory import CombineOp, CopyOp, FinishOp, InitOp


@dataclass(frozen=True)
class TensorRole:
    """The buffers one tensor needs: ``role``, whether a tile is also copied out, and readers."""

    tensor: str
    role: str
    group: int | None = None  # index of the group making it, None outside loops
    producer: str | None = None
    copy: bool = False
    inside: tuple[str, ...] = ()  # readers in the producer's group
    outside: tuple[str, ...] = ()  # readers after it ("<output>" for a program output)
    #: loops a tile buffer lives in: those the producer shares with every reader in the group
    #: (its own depth without readers there); the buffer holds the producer's tile at that depth
    depth: int = 0


def buffer_roles(program: Program, tiling: Tiling) -> dict[str, TensorRole]:
    """The role of every tensor of ``program`` under ``tiling``.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.coarse_tile import coarse_tile
    >>> p = load("examples/fused.json")
    >>> r = buffer_roles(p, coarse_tile(p))
    >>> r["y"].role, r["z"].role
    ('tile', 'full')
    """
    roles = {name: TensorRole(name, "full") for name in program.inputs}
    for op in program.ops:
        group = tiling.group_of(op.name)
        roles[op.out.tensor] = TensorRole(op.out.tensor, "full", producer=op.name) \
            if group is None else _grouped_role(program, group, op)
    return roles


def group_roles(program: Program, group: GroupTiling) -> dict[str, TensorRole]:
    """The roles of the tensors ``group``'s ops make, as ``buffer_roles`` gives them: what a
    trial of one group needs, at the cost of that group alone."""
    return {(op := program.op(n)).out.tensor: _grouped_role(program, group, op)
            for n in group.ops}


def _grouped_role(program: Program, group: GroupTiling, op: Op) -> TensorRole:
    t = op.out.tensor
    readers = [o.name for o in program.consumers(t)]
    members = group.positions
    inside = tuple(r for r in readers if r in members)
    outside = tuple(r for r in readers if r not in members)
    if t in program.output_set:
        outside += ("<output>",)
    loop = group.tile(op.name).loop
    depth = min((common_depth(loop, group.tile(r).loop) for r in inside),
                default=len(loop.count))
    if group.tile(op.name).reduction_level is not None:
        role, copy = "accumulator", False
    elif inside:
        role, copy = "tile", bool(outside)
    else:
        role, copy = ("full", False) if outside else ("tile", False)
    return TensorRole(t, role, group.index, op.name, copy, inside, outside, depth)


def accumulator_dtype(op: Op, program: Program) -> str:
    """The dtype an accumulator of ``op``'s result holds: float32 for floats, else the result's.

    >>> from apportion.frontend.json_format import load
    >>> p = load("examples/mlp.json")
    >>> accumulator_dtype(p.op("gate"), p)
    'float32'
    """
    reducer = op.kind.reducer
    assert reducer is not None, f"op {op.name!r} does not accumulate"
    return reducer.accumulator_dtype(program.tensor(op.out.tensor).dtype)


def needs_finish(op: Op, program: Program) -> bool:
    """True when an accumulated result needs a finish step (wider accumulator, or a mean)."""
    reducer = op.kind.reducer
    assert reducer is not None, f"op {op.name!r} does not accumulate"
    return reducer.finish is not None or \
        accumulator_dtype(op, program) != program.tensor(op.out.tensor).dtype


Steps = tuple[tuple[InitOp, ...], tuple[CombineOp, ...], tuple[CopyOp, ...], tuple[FinishOp, ...]]


@dataclass(frozen=True)
class Buffers:
    """The buffers pass's result: every tensor's role, and each loop group's extra steps."""

    roles: Mapping[str, TensorRole]
    steps: Mapping[int, Steps]

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", MappingProxyType(dict(self.roles)))
        object.__setattr__(self, "steps", MappingProxyType(dict(self.steps)))


def buffers(program: Program, tiling: Tiling) -> Buffers:
    """The buffers pass: roles of every tensor, and the init, combine, copy and finish steps of
    every loop group.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.coarse_tile import coarse_tile
    >>> p = load("examples/softmax_tiled.json")
    >>> b = buffers(p, coarse_tile(p))
    >>> b.roles["s"].role, [c.tensor for c in b.steps[0][2]]
    ('tile', [])
    """
    roles = buffer_roles(program, tiling)
    return Buffers(roles, {g.index: loop_steps(program, g, roles) for g in tiling.groups})


def loop_steps(program: Program, group: GroupTiling, roles: Mapping[str, TensorRole]) -> Steps:
    """The init, combine, copy and finish steps of one group's loop nest, in program order."""
    inits, combines, copies, finishes = [], [], [], []
    for name in group.ops:
        op = program.op(name)
        t = op.out.tensor
        role = roles[t]
        if role.role == "accumulator":
            reducer = op.kind.reducer
            assert reducer is not None
            fn = reducer.name
            level = group.tile(name).reduction_level
            assert level is not None
            inits.append(InitOp(group.path, name, t, fn, reducer.identity, level))
            combines.append(CombineOp(group.path, name, t, fn))
            # the copy-out at the end of the reduction's loop; the scratchpad pass drops it
            # where the accumulator stays in device memory and can be the tensor itself
            count = math.prod(op.sizes[d] for d in op.reduction_dims)
            finishes.append(FinishOp(group.path, name, t, fn, count, level))
        elif role.copy:
            copies.append(CopyOp(group.path, name, t))
    return tuple(inits), tuple(combines), tuple(copies), tuple(finishes)
