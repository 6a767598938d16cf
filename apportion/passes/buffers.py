"""Pass `buffers`: which buffers each tensor needs once loops tile the program.

For a tensor made in a loop group:

* read only inside the group (or nowhere): a per-tile buffer at a fixed place that every
  iteration reuses (role ``tile``);
* read both inside and after it, or a program output read inside: a per-tile buffer for the
  readers inside, a full buffer for those after it, and a copy step in the loop writing each tile
  into its slice of the full one (role ``tile``, ``copy``);
* read only after the group, or a program output: written straight into its slice of a full
  buffer (role ``full``);
* made by an op tiled over a reduction dim: a full accumulator set to the reduction's identity
  before the loop level tiling the reduction, combined into every iteration (role
  ``accumulator``). Float results accumulate in float32, as hardware does, so that rounding
  happens once; the tensor then has a full buffer too, which a finish step after the loop nest
  fills (casting, and dividing a ``mean`` by its count).

Every other tensor (inputs, results of ops outside loops) has a full buffer. Readers outside a
loop always read full buffers. Where the buffers go is the `scratchpad` pass's decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apportion.ir.dtypes import FLOAT_DTYPES
from apportion.ir.op import REDUCTIONS, Op
from apportion.ir.program import Program
from apportion.passes.coarse_tile import GroupTiling, Tiling
from apportion.plans.memory import CombineOp, CopyOp, FinishOp, InitOp

ROLES = ("full", "tile", "accumulator")


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
        t = op.out.tensor
        group = tiling.group_of(op.name)
        if group is None:
            roles[t] = TensorRole(t, "full", producer=op.name)
            continue
        readers = [o.name for o in program.consumers(t)]
        inside = tuple(r for r in readers if r in group.ops)
        outside = tuple(r for r in readers if r not in group.ops)
        if t in program.outputs:
            outside += ("<output>",)
        if group.tile(op.name).reduction_level is not None:
            role, copy = "accumulator", False
        elif inside:
            role, copy = "tile", bool(outside)
        else:
            role, copy = ("full", False) if outside else ("tile", False)
        roles[t] = TensorRole(t, role, group.index, op.name, copy, inside, outside)
    return roles


def identity(fn: str) -> float:
    """The value a fresh accumulator of reduction ``fn`` starts from (matmul: 0).

    >>> identity("max"), identity("matmul")
    (-inf, 0.0)
    """
    return 0.0 if fn == "matmul" else REDUCTIONS[fn]


def accumulator_dtype(op: Op, program: Program) -> str:
    """The dtype an accumulator of ``op``'s result holds: float32 for floats, else the result's.

    >>> from apportion.frontend.json_format import load
    >>> p = load("examples/mlp.json")
    >>> accumulator_dtype(p.op("gate"), p)
    'float32'
    """
    dtype = program.tensor(op.out.tensor).dtype
    return "float32" if dtype in FLOAT_DTYPES else dtype


def needs_finish(op: Op, program: Program) -> bool:
    """True when an accumulated result needs a finish step (wider accumulator, or a mean)."""
    return op.fn == "mean" or accumulator_dtype(op, program) != program.tensor(op.out.tensor).dtype


Steps = tuple[tuple[InitOp, ...], tuple[CombineOp, ...], tuple[CopyOp, ...], tuple[FinishOp, ...]]


def loop_steps(program: Program, group: GroupTiling, roles: dict[str, TensorRole]) -> Steps:
    """The init, combine, copy and finish steps of one group's loop nest, in program order."""
    inits, combines, copies, finishes = [], [], [], []
    for name in group.ops:
        op = program.op(name)
        t = op.out.tensor
        role = roles[t]
        if role.role == "accumulator":
            fn = "sum" if op.kind == "matmul" else op.fn
            level = group.tile(name).reduction_level
            assert level is not None
            inits.append(InitOp(group.path, name, t, fn, identity(op.fn), level))
            combines.append(CombineOp(group.path, name, t, fn))
            if needs_finish(op, program):
                count = math.prod(op.sizes[d] for d in op.reduction_dims)
                finishes.append(FinishOp(group.path, name, t, fn, count))
        elif role.copy:
            copies.append(CopyOp(group.path, name, t))
    return tuple(inits), tuple(combines), tuple(copies), tuple(finishes)
