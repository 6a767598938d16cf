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

from collections.abc import Callable, Mapping

from apportion.passes.buffers import TensorRole
from apportion.passes.coarse_tile import GroupTiling
from apportion.passes.geometry import OpContext
from apportion.passes.scratchpad import plan_group
from apportion.passes.work_distribution import ranked
from apportion.plans.plan import OpPlan
from apportion.target.target import Target

#: best assignments of each op that seed group-wide trials (its greedy one seeds one more)
SEEDS_PER_OP = 6

Splits = dict[str, dict[str, int]]
MakePlan = Callable[[str, dict[str, int]], OpPlan]


def group_time(group: GroupTiling, ctxs: Mapping[str, OpContext], splits: Splits,
               resident: frozenset[str]) -> float:
    """Predicted time of one iteration of the group's ops with ``resident`` tensors on chip."""
    return sum(ctxs[n].time_us(splits[n], resident) for n in group.ops)


def align_group(group: GroupTiling, target: Target, roles: dict[str, TensorRole],
                ctxs: Mapping[str, OpContext], splits: Splits, fixed: frozenset[str],
                greedy: Mapping[str, dict[str, int] | None], make_plan: MakePlan) -> Splits:
    """The group's splits after the search described in the module docstring.

    ``splits`` are the op-by-op splits of every op in the group, ``fixed`` the ops whose splits
    must not change (pinned, fallback), ``greedy`` each op's greedy splits (None where greedy
    finds none), which seed trials too and bound what a trial may predict for the op, and
    ``make_plan`` the OpPlan of an op under given splits.
    """
    program = ctxs[group.ops[0]].program
    limits = {n: float("inf") if greedy[n] is None else ctxs[n].time_us(greedy[n])
              for n in group.ops}

    seen: dict[tuple, float] = {}  # trials recur: seeds differ in dims some ops lack

    def cost(trial: Splits) -> float:
        key = tuple(tuple(trial[n].items()) for n in group.ops)
        if key not in seen:
            plans = {n: make_plan(n, trial[n]) for n in group.ops}
            gp, _ = plan_group(program, target, group, roles, plans)
            seen[key] = group_time(group, ctxs, trial, frozenset(gp.lx_tensors))
        return seen[key]

    best = {n: splits[n] for n in group.ops}
    best_cost = cost(best)
    tried: set[tuple[tuple[str, int], ...]] = set()
    for name in group.ops:
        if name in fixed:
            continue
        ctx = ctxs[name]
        own = greedy[name]
        for seed in [*([own] if own else []), *ranked(ctx, {d: 1 for d in ctx.sizes},
                                                      SEEDS_PER_OP)]:
            key = tuple(sorted((d, c) for d, c in seed.items() if c > 1))
            if key in tried:
                continue
            tried.add(key)
            trial = {}
            for n in group.ops:
                follows = None if n in fixed else _follow(ctxs[n], dict(key), limits[n])
                trial[n] = splits[n] if follows is None else follows
            c = cost(trial)
            # an op that gains nothing by following (a split-K reader paying its combine to
            # keep one input on chip) goes back to its own splits
            for n in group.ops:
                if trial[n] != splits[n]:
                    back = {**trial, n: splits[n]}
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
