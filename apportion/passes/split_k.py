"""Pass `split_k`: how each op's reduction dim is split across cores, decided by the target.

For every op with a reducer (reductions and matmul) the pass asks, in order: the program's pin
(``"split_k": {"mm": 8}``), then the resolver the planner was given (a Python callable), then the
target's resolver (``Target.split_k``: ``cost``, ``gpu``, ``table`` or ``none``; see
``apportion.target.split_k``). A decision fixes the split of the op's widest reduction dim (the
op's other reduction dims stay whole) before span reduction and work distribution, which then
divide the remaining cores among the other dims; ``cost`` (Spyre's) decides nothing here and
leaves the reduction split to work distribution's search by predicted time.

A resolver's factor is capped at what the op and target allow (the dim's planning units, the
core count); a pinned factor that cannot be honoured is an error naming op, dim and factor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from apportion.cost.model import batch_dims, matmul_rows
from apportion.errors import PlanningError
from apportion.ir.kinds import Category
from apportion.passes.geometry import OpContext
from apportion.plans.plan import SplitK
from apportion.target.split_k import ReductionShape, Resolver, gpu_slices, table_slices


@dataclass(frozen=True)
class SplitKDecisions:
    """The split-K pass's result: per op, its ``SplitK`` or None (left to work distribution)."""

    by_op: Mapping[str, SplitK | None]

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_op", MappingProxyType(dict(self.by_op)))


def reduction_shape(ctx: OpContext) -> ReductionShape | None:
    """The op's reduction problem as resolvers see it, or None for ops without a reducer."""
    op = ctx.op
    if op.kind.reducer is None or not op.kind.divisible or not op.reduction_dims:
        return None
    sizes = ctx.sizes
    dim = max(op.reduction_dims, key=lambda d: (ctx.units[d], -op.reduction_dims.index(d)))
    k = math.prod(sizes[d] for d in op.reduction_dims)
    dtype = ctx.program.tensor(op.ins[0].tensor).dtype
    if op.category is Category.MATMUL:
        rows, batch = matmul_rows(op), batch_dims(op)
        second = set(op.ins[1].dims)
        cols = tuple(d for d in op.out.dims if d in second and d not in batch)
        return ReductionShape(math.prod(sizes[d] for d in batch),
                              math.prod(sizes[d] for d in rows),
                              math.prod(sizes[d] for d in cols), k, dim, dtype, op.name)
    return ReductionShape(1, math.prod(sizes[d] for d in op.out.dims), 1, k, dim, dtype, op.name)


def _target_slices(ctx: OpContext, shape: ReductionShape) -> tuple[int | None, str]:
    target = ctx.target
    if target.split_k == "gpu":
        return gpu_slices(shape) or 1, "gpu"
    if target.split_k == "table":
        found = table_slices(target.split_k_table, shape)
        return (None, "cost") if found is None else (found, "table")
    if target.split_k == "none":
        return 1, "none"
    return None, "cost"


def split_k(ctxs: Mapping[str, OpContext], pins: Mapping[str, int],
            user: Resolver | None = None) -> SplitKDecisions:
    """The split-K pass (see the module docstring).

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.geometry import contexts
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.target import spyre
    >>> p = load("examples/mlp.json")
    >>> ctxs = contexts(p, spyre(), layouts(p, spyre()), {o.name: o.sizes for o in p.ops})
    >>> split_k(ctxs, {"down": 4}).by_op["down"]
    SplitK(dims=('k',), factor=4, by='pinned')
    >>> split_k(ctxs, {}).by_op["down"] is None   # spyre: left to the cost model's search
    True
    """
    out: dict[str, SplitK | None] = {}
    for name, ctx in ctxs.items():
        shape = reduction_shape(ctx)
        if name in pins:
            out[name] = _pinned(ctx, shape, pins[name])
            continue
        if shape is None:
            out[name] = None
            continue
        slices, by = (user(shape), "user") if user is not None else (None, "cost")
        if slices is None:
            slices, by = _target_slices(ctx, shape)
        if slices is None:
            out[name] = None
            continue
        if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
            raise PlanningError(f"op {name!r}: the {by} split-K resolver returned {slices!r}; "
                                "it must return a positive int (slices) or None")
        cap = min(ctx.units[shape.dim], ctx.target.cores) if ctx.splittable(shape.dim) else 1
        out[name] = SplitK((shape.dim,), min(slices, cap), by)
    return SplitKDecisions(out)


def _pinned(ctx: OpContext, shape: ReductionShape | None, factor: int) -> SplitK:
    name = ctx.op.name
    if shape is None:
        raise PlanningError(f"op {name!r}: split_k pins {factor} slices, but a "
                            f"{ctx.op.category} op has no reduction dim to split")
    d = shape.dim
    if factor > 1 and not ctx.splittable(d):
        raise PlanningError(f"op {name!r}: split_k {factor} of reduction dim {d!r}: its last "
                            f"stick is padded and target {ctx.target.name!r} cannot split it")
    if factor > ctx.units[d] or factor > ctx.target.cores:
        unit = "sticks" if d in ctx.layout.stick_dims else "elements"
        raise PlanningError(f"op {name!r}: split_k {factor} of reduction dim {d!r} exceeds its "
                            f"{ctx.units[d]} {unit} or the target's {ctx.target.cores} cores")
    return SplitK((d,), factor, "pinned")


def with_split_k(ctxs: Mapping[str, OpContext], decisions: SplitKDecisions
                 ) -> dict[str, OpContext]:
    """The contexts with each decision fixed (``OpContext.fixed``)."""
    out = {}
    for name, ctx in ctxs.items():
        d = decisions.by_op.get(name)
        out[name] = ctx if d is None else replace(
            ctx, fixed=tuple((dim, d.factor) for dim in d.dims))
    return out
