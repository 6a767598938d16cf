"""Pass `group_distribution`: splits that agree across a loop group, so tiles stay on chip.

Work distribution picks each op's splits alone. Inside a coarse-tiling group that can undo the
point of tiling: an intermediate goes to the scratchpad only when every core reading it reads
what the same core wrote, which needs producer and readers cut alike. A group of `matmul`,
`silu`, `matmul` planned op by op cuts rows for one and columns for the next, and every
intermediate makes a round trip through device memory.

Under ``balanced`` this pass revisits each group. It tries group-wide assignments seeded by the
best few assignments of each of its ops (by dim name: a seed ``{t: 2, f: 16}`` gives every op
of the group 2 cuts of ``t`` and 16 of ``f`` and none elsewhere); an op for which the seed is
not valid, or is predicted slower than ``greedy`` would be on it alone, keeps its own splits,
and so do pinned and fallback ops; then each op that follows goes back to its own splits where
that makes the trial cheaper. Each trial is placed by the scratchpad planner; its cost is
the sum of the ops' predicted times with the scratchpad-resident tensors costing no
device-memory traffic. The cheapest trial wins, the op-by-op splits on a tie, so a group never
gets a plan predicted slower than the one it had, and no op is predicted slower than greedy's.

Dim names only seed trials: whether a tensor really stays on chip is decided on the core boxes
of the planned ops, so two ops reusing a letter for unrelated dims cannot give a wrong plan.

``greedy`` reproduces the reference design, which plans ops alone; this pass leaves it as is.
"""

from __future__ import annotations

from collections.abc import Mapping

from apportion.errors import PlanningError
from apportion.passes.buffers import Buffers
from apportion.passes.coarse_tile import GroupTiling, Tiling
from apportion.passes.geometry import OpContext, Splits, group_time
from apportion.passes.placement import plan_group
from apportion.passes.span_reduction import SpanSplits, op_minimum
from apportion.passes.work_distribution import greedy, ranked

#: best assignments of each op that seed group-wide trials (its greedy one seeds one more)
SEEDS_PER_OP = 6

OpSplits = dict[str, dict[str, int]]


def group_distribution(ctxs: Mapping[str, OpContext], tiling: Tiling, bufs: Buffers,
                       spans: SpanSplits, splits: Splits) -> Splits:
    """The group distribution pass: every loop group's splits after the search above.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.pipeline import plan
    >>> from apportion.target import spyre
    >>> stages = {}
    >>> _ = plan(load("examples/fused.json"), spyre(), debug=stages.__setitem__)
    >>> stages["group_distribution"]["add"]
    {'m': 32, 'n': 1}
    """
    changed: OpSplits = {}
    for group in tiling.groups:
        changed.update(_align(group, ctxs, bufs, spans, splits))
    return splits.replace(changed)


def _greedy(ctx: OpContext) -> dict[str, int] | None:
    """The op's greedy splits alone, or None where greedy finds none."""
    try:
        return greedy(ctx, op_minimum(ctx, "greedy")[0])
    except PlanningError:
        return None


def _align(group: GroupTiling, ctxs: Mapping[str, OpContext], bufs: Buffers,
           spans: SpanSplits, splits: Splits) -> OpSplits:
    """One group's splits: op-by-op ones unless a group-wide trial is predicted cheaper."""
    first = ctxs[group.ops[0]]
    program, target = first.program, first.target
    # pinned and fallback ops keep their splits
    fixed = frozenset(n for n in group.ops
                      if program.pins.get(n) or not program.op(n).kind.divisible)
    own = {n: splits[n] for n in group.ops}
    greedy_splits = {n: None if n in fixed else _greedy(ctxs[n]) for n in group.ops}
    limits = {n: float("inf") if greedy_splits[n] is None else
              ctxs[n].time_us(greedy_splits[n]) for n in group.ops}
    seen: dict[tuple, float] = {}  # trials recur: seeds differ in dims some ops lack

    def cost(trial: OpSplits) -> float:
        key = tuple(tuple(trial[n].items()) for n in group.ops)
        if key not in seen:
            plans = {n: ctxs[n].op_plan(spans.of(n), trial[n], group.tile(n).loop)
                     for n in group.ops}
            gp, _ = plan_group(program, target, group, bufs.roles, plans)
            seen[key] = group_time(group.ops, ctxs, trial, frozenset(gp.lx_tensors))
        return seen[key]

    best, best_cost = own, cost(own)
    tried: set[tuple[tuple[str, int], ...]] = set()
    for name in group.ops:
        if name in fixed:
            continue
        ctx = ctxs[name]
        mine = greedy_splits[name]
        for seed in [*([mine] if mine else []), *ranked(ctx, {d: 1 for d in ctx.sizes},
                                                       SEEDS_PER_OP)]:
            key = tuple(sorted((d, c) for d, c in seed.items() if c > 1))
            if key in tried:
                continue
            tried.add(key)
            trial = {}
            for n in group.ops:
                follows = None if n in fixed else _follow(ctxs[n], dict(key), limits[n])
                trial[n] = own[n] if follows is None else follows
            c = cost(trial)
            # an op that gains nothing by following (a split-K reader paying its combine to
            # keep one input on chip) goes back to its own splits
            for n in group.ops:
                if trial[n] != own[n]:
                    back = {**trial, n: own[n]}
                    c_back = cost(back)
                    if c_back < c:
                        trial, c = back, c_back
            if c < best_cost * (1 - 1e-9):
                best, best_cost = trial, c
    return best


def _follow(ctx: OpContext, seed: dict[str, int], limit: float) -> dict[str, int] | None:
    """The seed's cuts on the op's own dims, or None when not valid or slower than ``limit``."""
    s = {d: seed.get(d, 1) for d in ctx.sizes}
    if not ctx.valid(s) or ctx.time_us(s) > limit * (1 + 1e-9):
        return None
    return s
