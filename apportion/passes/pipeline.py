"""The planning pipeline: every pass, in order, in one function."""

from __future__ import annotations

import math
from collections.abc import Callable

from apportion.errors import PlanningError
from apportion.ir.program import Program
from apportion.passes.layouts import layouts, tensor_layouts
from apportion.passes.span_reduction import check_spans, slice_sizes, span_reduction
from apportion.passes.work_distribution import STRATEGIES, OpContext, distribute
from apportion.plan.plan import OpPlan, Plan
from apportion.target.target import Target

Stage = Callable[[str, object], None]


def plan(program: Program, target: Target, strategy: str = "balanced",
         debug: Stage | None = None) -> Plan:
    """Plan ``program`` for ``target``.

    ``debug``, when given, is called with each stage's name and result, and the plan is verified
    after the last pass.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.target import spyre
    >>> p = plan(load("examples/mlp.json"), spyre(cores=32))
    >>> p.op("gate").cores
    32
    """
    if strategy not in STRATEGIES:
        raise PlanningError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    dump = debug or (lambda name, value: None)
    # 1. layouts: device layout of every tensor; stick dims and planning units of every op
    tlayouts = tensor_layouts(program, target)
    op_layouts = layouts(program, target)
    dump("layouts", op_layouts)
    # 2. per-op iteration space (coarse tiling shrinks it to one loop iteration; issue 3)
    sizes = {op.name: dict(op.dims) for op in program.ops}
    # 3. span reduction: minimum splits that keep every per-core span within the limit
    ctxs = {op.name: OpContext(op, program, target, op_layouts[op.name], tlayouts, sizes[op.name])
            for op in program.ops}
    minimum: dict[str, dict[str, int]] = {}
    span_errors: dict[str, PlanningError] = {}
    for op in program.ops:
        try:
            minimum[op.name] = span_reduction(op, program, target, op_layouts[op.name], tlayouts,
                                              sizes[op.name], allow_uneven=strategy == "balanced")
        except PlanningError as e:
            if strategy == "greedy":
                raise
            # balanced searches every assignment itself; the walk's error stands if none fits
            span_errors[op.name] = e
            minimum[op.name] = {d: 1 for d in sizes[op.name]}
    dump("span_reduction", minimum)
    # 4. work distribution: splits of every dim under the strategy (pins from the program win)
    splits = {}
    for op in program.ops:
        start = minimum[op.name] if strategy == "greedy" else {d: 1 for d in sizes[op.name]}
        try:
            splits[op.name] = distribute(ctxs[op.name], start, strategy,
                                         program.pins.get(op.name))
        except PlanningError:
            if op.name in span_errors:
                raise span_errors[op.name] from None
            raise
    dump("work_distribution", splits)
    result = Plan(program.name, target.name, target.cores, strategy,
                  tuple(_op_plan(ctxs[o.name], minimum[o.name], splits[o.name])
                        for o in program.ops))
    if debug:
        verify(program, target, result)
    return result


def _op_plan(ctx: OpContext, minimum: dict[str, int], splits: dict[str, int]) -> OpPlan:
    op = ctx.op
    spans = check_spans(op, ctx.sizes, ctx.layout, splits, ctx.tlayouts, ctx.target).spans
    return OpPlan(
        name=op.name, op=op.fn, kind=op.kind,
        iteration_space=tuple(ctx.sizes.items()),
        reduction_dims=op.reduction_dims,
        stick_dims=ctx.layout.stick_dims,
        unit_elems=ctx.layout.unit_elems,
        splits=tuple((d, splits[d]) for d in ctx.sizes),
        utilization=round(ctx.utilization(splits), 6),
        predicted_time_us=round(ctx.time_us(splits), 4),
        span_bytes=tuple(spans.items()),
        span_splits=tuple(minimum.items()),
    )


def verify(program: Program, target: Target, result: Plan) -> None:
    """Check the invariants every plan must hold; raise PlanningError naming the op otherwise."""
    for op_plan in result.ops:
        if op_plan.cores > target.cores:
            raise PlanningError(f"op {op_plan.name!r}: uses {op_plan.cores} cores > "
                                f"{target.cores}")
        over = {t: s for t, s in op_plan.span_bytes if s > target.span_limit}
        if over:
            raise PlanningError(f"op {op_plan.name!r}: spans {over} exceed {target.span_limit}")
        red = [d for d in op_plan.reduction_dims if op_plan.split_map[d] > 1]
        if len(red) > 1:
            raise PlanningError(f"op {op_plan.name!r}: splits reduction dims {red}")
        largest = slice_sizes(op_plan.sizes, dict(op_plan.unit_elems), op_plan.split_map)
        if math.prod(largest.values()) * op_plan.cores < math.prod(op_plan.sizes.values()):
            raise PlanningError(f"op {op_plan.name!r}: slices do not cover the iteration space")
