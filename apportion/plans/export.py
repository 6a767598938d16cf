"""Splits keyed by index coefficients, as the reference design stores them.

The reference keys each loop variable of an op by its coefficients in the flattened (row-major)
write index and in each read index; two dims with equal coefficient signatures cannot be told
apart there, which is why plans here key by dim name and only export this form.
"""

from __future__ import annotations

from typing import Any

from apportion.ir.program import Program
from apportion.plans.plan import OpPlan


def _flat_coeff(index: tuple, shape: tuple[int, ...], dim: str) -> int:
    stride, total = 1, 0
    for e, size in zip(reversed(index), reversed(shape), strict=True):
        total += e.coeff(dim) * stride
        stride *= size
    return total


def coefficient_splits(program: Program, op_plan: OpPlan) -> dict[str, Any]:
    """``{"(write, (read0, read1, ...))": split}`` for one op, plus the dim for each key.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.pipeline import plan
    >>> from apportion.target import spyre
    >>> prog = load("examples/mlp.json")
    >>> coefficient_splits(prog, plan(prog, spyre()).op("act"))["splits"]
    {'(1, (1,))': 1, '(2816, (2816,))': 32}
    """
    op = program.op(op_plan.name)
    out_shape = program.tensor(op.out.tensor).shape
    splits, dims = {}, {}
    for d, n in op_plan.splits:
        write = _flat_coeff(op.out.index, out_shape, d)
        reads = tuple(_flat_coeff(a.index, program.tensor(a.tensor).shape, d) for a in op.ins)
        key = f"({write}, {reads})"
        splits[key] = n
        dims[key] = d
    return {"op": op.name, "splits": dict(sorted(splits.items())), "dims": dims}
