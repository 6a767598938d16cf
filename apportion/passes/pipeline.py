"""The planning pipeline: every pass, in order, in one function."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from apportion.errors import PlanningError
from apportion.ir.program import Program
from apportion.passes.auto_tile import choose_counts
from apportion.passes.buffers import TensorRole, buffer_roles, loop_steps
from apportion.passes.coarse_tile import GroupTiling, Tiling, coarse_tile
from apportion.passes.geometry import OpContext, check_spans, slice_sizes
from apportion.passes.group_distribution import align_group, group_time
from apportion.passes.layouts import layouts, tensor_layouts
from apportion.passes.scratchpad import plan_group, scratchpad
from apportion.passes.span_reduction import span_reduction
from apportion.passes.work_distribution import STRATEGIES, distribute, greedy
from apportion.plans.plan import OpPlan, Plan
from apportion.target.target import Target

Stage = Callable[[str, object], None]


def plan(program: Program, target: Target, strategy: str = "balanced",
         debug: Stage | None = None, auto_tile: bool = False) -> Plan:
    """Plan ``program`` for ``target``.

    ``debug``, when given, is called with each stage's name and result, and the plan is verified
    after the last pass. ``auto_tile`` replaces the integer loop counts of every tiling group by
    the smallest whose per-iteration working set fits the scratchpad.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.target import spyre
    >>> p = plan(load("examples/mlp.json"), spyre(cores=32))
    >>> p.op("gate").split_map   # balanced: the lowest predicted time
    {'m': 2, 'n': 15, 'k': 1}
    >>> plan(load("examples/fused.json"), spyre(cores=32)).op("add").sizes
    {'m': 512, 'n': 1024}
    """
    if strategy not in STRATEGIES:
        raise PlanningError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    dump = debug or (lambda name, value: None)
    # 1. layouts: device layout of every tensor; stick dims and planning units of every op
    tlayouts = tensor_layouts(program, target)
    op_layouts = layouts(program, target)
    dump("layouts", op_layouts)
    # 2. coarse tiling: loop nests of the tiling groups (auto_tile: counts whose working set
    #    fits), per-iteration sizes, and which buffers each tensor needs (tile, full, accumulator)
    if auto_tile:
        program = choose_counts(program, op_layouts, target.scratchpad_capacity,
                                lambda p, g: _working_set(p, target, strategy, g))
    tiling = coarse_tile(program, op_layouts)
    roles = buffer_roles(program, tiling)
    sizes = {op.name: tiling.sizes(op) for op in program.ops}
    dump("coarse_tile", tiling)
    # 3. span reduction: minimum splits that keep every per-core span within the limit
    ctxs = {op.name: OpContext(op, program, target, op_layouts[op.name], tlayouts, sizes[op.name])
            for op in program.ops}
    minimum, span_errors = {}, {}
    for op in program.ops:
        minimum[op.name], span_errors[op.name] = _minimum(ctxs[op.name], strategy)
    dump("span_reduction", minimum)
    # 4. work distribution: splits of every dim under the strategy (pins from the program win);
    #    a split reduction dim is split-K, chosen here with the rest. Then, under balanced,
    #    group distribution: splits agreeing across a loop group where that keeps tiles on chip
    splits = {op.name: _splits(ctxs[op.name], minimum[op.name], strategy, span_errors[op.name])
              for op in program.ops}
    dump("work_distribution", splits)
    if strategy == "balanced":
        for g in tiling.groups:
            splits.update(_align(g, target, roles, ctxs, minimum, splits, tiling))
        dump("group_distribution", splits)
    op_plans = {o.name: _op_plan(ctxs[o.name], minimum[o.name], splits[o.name], tiling)
                for o in program.ops}
    # 5. scratchpad planning: lifetimes in each loop body, scratchpad offsets, device addresses
    steps = {g.index: loop_steps(program, g, roles) for g in tiling.groups}
    groups, buffers = scratchpad(program, target, tiling, roles, op_plans, steps)
    groups = tuple(replace(g, iteration_time_us=round(group_time(
        tiling.groups[i], ctxs, splits, frozenset(g.lx_tensors)), 4))
        for i, g in enumerate(groups))
    dump("scratchpad", (groups, buffers))
    result = Plan(program.name, target.name, target.cores, strategy,
                  tuple(op_plans[o.name] for o in program.ops), groups=groups, buffers=buffers)
    if debug:
        verify(program, target, result)
    return result


def _minimum(ctx: OpContext, strategy: str) -> tuple[dict[str, int], PlanningError | None]:
    try:
        return span_reduction(ctx.op, ctx.program, ctx.target, ctx.layout, ctx.tlayouts,
                              ctx.sizes, allow_uneven=strategy == "balanced"), None
    except PlanningError as e:
        if strategy == "greedy":
            raise
        # balanced searches every assignment itself; the walk's error stands if none fits
        return {d: 1 for d in ctx.sizes}, e


def _splits(ctx: OpContext, minimum: dict[str, int], strategy: str,
            span_error: PlanningError | None) -> dict[str, int]:
    start = minimum if strategy == "greedy" else {d: 1 for d in ctx.sizes}
    try:
        return distribute(ctx, start, strategy, ctx.program.pins.get(ctx.op.name))
    except PlanningError:
        if span_error is not None:
            raise span_error from None
        raise


def _align(group: GroupTiling, target: Target, roles: dict[str, TensorRole],
           ctxs: dict[str, OpContext], minimum: dict[str, dict[str, int]],
           splits: dict[str, dict[str, int]], tiling: Tiling) -> dict[str, dict[str, int]]:
    """Pass `group_distribution` on one group (see its module)."""
    program = ctxs[group.ops[0]].program
    fixed = frozenset(n for n in group.ops
                      if program.pins.get(n) or program.op(n).kind == "fallback")
    greedy_splits: dict[str, dict[str, int] | None] = {}
    for n in group.ops:
        try:
            greedy_min, _ = _minimum(ctxs[n], "greedy")
            greedy_splits[n] = greedy(ctxs[n], greedy_min)
        except PlanningError:
            greedy_splits[n] = None
    return align_group(group, target, roles, ctxs, {n: splits[n] for n in group.ops}, fixed,
                       greedy_splits,
                       lambda n, s: _op_plan(ctxs[n], minimum[n], s, tiling))


def _working_set(program: Program, target: Target, strategy: str, group: int) -> int:
    """Stages 2 to 5 for one tiling group's ops only: its per-iteration working set per core.

    Splits are the op-by-op ones: aligned splits keep more tiles on chip and so need more
    scratchpad, and a count chosen on them would re-read the weights of a group more often;
    group distribution then fills the capacity the chosen count leaves.
    """
    op_layouts = layouts(program, target)
    tlayouts = tensor_layouts(program, target)
    tiling = coarse_tile(program, op_layouts)
    roles = buffer_roles(program, tiling)
    g = tiling.groups[group]
    op_plans = {}
    for name in g.ops:
        op = program.op(name)
        ctx = OpContext(op, program, target, op_layouts[name], tlayouts, tiling.sizes(op))
        minimum, err = _minimum(ctx, strategy)
        op_plans[name] = _op_plan(ctx, minimum, _splits(ctx, minimum, strategy, err), tiling)
    return plan_group(program, target, g, roles, op_plans)[0].working_set_bytes


def _op_plan(ctx: OpContext, minimum: dict[str, int], splits: dict[str, int],
             tiling: Tiling) -> OpPlan:
    op = ctx.op
    tile = tiling.tile(op.name)
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
        loop=None if tile is None else tile.loop,
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
    for b in result.buffers:
        if b.offset % target.alignment:
            raise PlanningError(f"tensor {b.tensor!r}: {b.space} offset {b.offset} is not a "
                                f"multiple of {target.alignment}")
        if b.space == "lx" and b.end > target.scratchpad_capacity:
            raise PlanningError(f"tensor {b.tensor!r}: scratchpad bytes {b.offset}..{b.end} "
                                f"exceed the capacity {target.scratchpad_capacity}")
