"""Splits keyed by index coefficients, as the reference design stores them.

The reference keys each loop variable of an op by its coefficients in the flattened (row-major)
write index and in each read index; two dims with equal coefficient signatures cannot be told
apart there, which is why plans here key by dim name and only export this form.
"""

from __future__ import annotations

from typing import Any

from apportion.errors import PlanningError
from apportion.ir.op import Access
from apportion.ir.program import Program
from apportion.plans.plan import OpPlan, Plan


def _flat_coeff(index: tuple, shape: tuple[int, ...], dim: str) -> int:
    stride, total = 1, 0
    for e, size in zip(reversed(index), reversed(shape), strict=True):
        total += e.coeff(dim) * stride
        stride *= size
    return total


def _strided_shape(program: Program, plan: Plan, op_plan: OpPlan, access: Access
                   ) -> tuple[int, ...]:
    """The shape whose row-major strides key ``access``: its tile buffer's in the op's loop group,
    else the whole tensor's."""
    if op_plan.loop is not None:
        for b in plan.buffers_of(access.tensor):
            if b.kind == "tile" and b.group == op_plan.loop.group:
                return b.shape
    return program.tensor(access.tensor).shape


def coefficient_splits(program: Program, plan: Plan, op_plan: OpPlan) -> dict[str, Any]:
    """``{"(write, (read0, read1, ...))": split}`` for one op, plus the dim for each key.

    Coefficients are over row-major strides: of the tile buffer for an operand that lives in a
    ``tile`` buffer of the op's loop group (the reference indexes a tile by per-tile strides),
    else of the whole tensor. A dim of size 1 (per loop iteration) has nothing to split and is
    left out. Two dims of size > 1 with the same signature cannot be told apart by this keying:
    ``PlanningError``.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.pipeline import plan
    >>> from apportion.target import spyre
    >>> prog = load("examples/mlp.json")
    >>> p = plan(prog, spyre())
    >>> coefficient_splits(prog, p, p.op("act"))["splits"]
    {'(1, (1,))': 1, '(2816, (2816,))': 32}
    >>> prog = load("examples/fused.json")   # y is a (512, 1024) tile inside the loops
    >>> p = plan(prog, spyre(cores=32))
    >>> coefficient_splits(prog, p, p.op("mul"))["dims"]
    {'(4096, (1024, 4096))': 'm', '(1, (1, 1))': 'n'}
    """
    op = program.op(op_plan.name)
    write_shape = _strided_shape(program, plan, op_plan, op.out)
    read_shapes = [_strided_shape(program, plan, op_plan, a) for a in op.ins]
    sizes = op_plan.sizes
    splits: dict[str, int] = {}
    dims: dict[str, str] = {}
    for d, n in op_plan.splits:
        if sizes[d] == 1:
            continue
        write = _flat_coeff(op.out.index, write_shape, d)
        reads = tuple(_flat_coeff(a.index, s, d)
                      for a, s in zip(op.ins, read_shapes, strict=True))
        key = f"({write}, {reads})"
        if key in dims:
            raise PlanningError(
                f"op {op.name!r}: dims {dims[key]!r} and {d!r} both have index coefficients "
                f"{key} (write, reads); the coefficient-keyed export cannot tell them apart")
        splits[key] = n
        dims[key] = d
    return {"op": op.name, "splits": dict(sorted(splits.items())), "dims": dims}
