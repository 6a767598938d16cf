"""Automatic loop counts: for each tiling group, the counts with the lowest predicted time.

The program's tiling groups say which ops and which dims are tiled at each level; this picks the
integer counts. Candidates divide their dims into whole sticks and stay within the target's
``max_loop_count`` (symbolic counts are kept as they are); they come in order of total
iterations, ties going to the larger outer count.

A candidate *fits* when its per-iteration working set fits the scratchpad capacity, measured by
planning the group's ops alone, op by op (coarse tiling, span reduction and work distribution of
those ops, then the group's scratchpad placement). Among the fitting candidates (the first
``MAX_TIMED`` of them, in the order above) and the count-1 option (every level once: the group
untiled, whatever does not fit the scratchpad staying in device memory), the one with the lowest
predicted time of the whole group wins: its iterations times the predicted time of one
iteration, planned as the pipeline plans it (work distribution, then group distribution under
``balanced``) with the tensors the scratchpad keeps costing no device-memory traffic, as
``GroupPlan.iteration_time_us``. Weights a group reads again every iteration cost again every
iteration, so a count that fits but re-reads them more than untiled loses to count 1. A
candidate replaces an earlier one only when it is cheaper by more than a relative 1e-9, so ties
go to fewer iterations. When no candidate fits, auto-tiling refuses, naming the least working
set it found.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping

from apportion.errors import PlanningError
from apportion.ir.program import LoopLevel, Program, TilingGroup
from apportion.passes.buffers import group_roles
from apportion.passes.coarse_tile import GroupTiling, TileMemo, coarse_tile, tile_group
from apportion.passes.geometry import OpContext, PlanCache, Splits, divisors
from apportion.passes.group_distribution import align_group, group_cost
from apportion.passes.layouts import Layouts, OpLayout
from apportion.passes.placement import plan_group
from apportion.passes.span_reduction import span_reduction
from apportion.passes.split_k import split_k as split_k_pass
from apportion.passes.split_k import with_split_k
from apportion.passes.strategy import Strategy
from apportion.passes.work_distribution import op_splits, time_lower_bound
from apportion.target.split_k import Resolver
from apportion.target.target import Target

#: the most count combinations tried for one group
MAX_CANDIDATES = 4096
#: the most fitting count combinations whose predicted time is compared, fewest iterations first
MAX_TIMED = 16


def candidate_counts(program: Program, group: TilingGroup, op_layouts: Mapping[str, OpLayout],
                     max_count: int, limit: int = MAX_CANDIDATES) -> list[tuple[int | str, ...]]:
    """The first ``limit`` valid count tuples of ``group``, fewest total iterations first (ties:
    the larger outer count first).

    A best-first search over the levels, outermost first: a partial tuple's iterations bound
    those of every tuple completing it, so tuples come out in order and a deep nest whose
    candidates number millions is never listed whole.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.target import spyre
    >>> p = load("examples/fused.json")
    >>> candidate_counts(p, p.tiling[0], layouts(p, spyre()).ops, 65535)[:4]
    [(1, 1), (2, 1), (1, 2), (4, 1)]
    """
    ops = [program.op(n) for n in group.ops]
    sizes: dict[str, int] = {}
    per: dict[str, int] = {}
    for op in ops:
        for d, n in op.dims:
            sizes.setdefault(d, n)
            per[d] = max(per.get(d, 1), dict(op_layouts[op.name].unit_elems).get(d, 1))

    def options(level: int, cur: dict[str, int]) -> list[tuple[int | str, dict[str, int]]]:
        """The counts of ``level`` (with the dim sizes they leave) given the outer levels."""
        lv = group.loops[level]
        if isinstance(lv.count, str):
            return [(lv.count, cur)]
        dims = [d for d in lv.dims if d in cur]
        common = math.gcd(*(cur[d] for d in dims)) if dims else 1
        return [(c, {**cur, **{d: cur[d] // c for d in dims}})
                for c in divisors(common, max_count)
                if c == 1 or not any((cur[d] // c) % per[d] for d in dims)]

    def key(counts: tuple[int | str, ...]) -> tuple[int, tuple[int, ...]]:
        ints = [c if isinstance(c, int) else 1 for c in counts]
        return math.prod(ints), tuple(-c for c in ints)

    out: list[tuple[int | str, ...]] = []
    tie = itertools.count()  # states with equal keys leave in the order they came
    heap: list[tuple[tuple[int, tuple[int, ...]], int, tuple[int | str, ...], dict[str, int]]]
    heap = [(key(()), next(tie), (), sizes)]
    while heap and len(out) < limit:
        _, _, counts, cur = heapq.heappop(heap)
        if len(counts) == len(group.loops):
            out.append(counts)
            continue
        for c, nxt in options(len(counts), cur):
            heapq.heappush(heap, (key((*counts, c)), next(tie), (*counts, c), nxt))
    return out


def with_counts(program: Program, index: int, counts: tuple[int | str, ...]) -> Program:
    """``program`` with tiling group ``index``'s loop counts replaced."""
    g = program.tiling[index]
    loops = tuple(LoopLevel(c, lv.dims) for c, lv in zip(counts, g.loops, strict=True))
    return program.with_group(index, TilingGroup(g.ops, loops))


def auto_tile(program: Program, target: Target, lay: Layouts, strategy: Strategy,
              cache: PlanCache | None = None, split_k: Resolver | None = None) -> Program:
    """``program`` with every group's integer counts set to the fastest candidate (see the
    module docstring); ``cache`` keeps the op plans of one candidate for the identical ops of
    the others and for the pipeline.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.passes.strategy import Balanced
    >>> from apportion.target import spyre
    >>> p = load("examples/softmax_tiled.json")
    >>> auto_tile(p, spyre(), layouts(p, spyre()), Balanced()).tiling[0].loops[0].count
    1
    """
    cache = cache or PlanCache()
    memo = TileMemo()  # every group but the one tried is the same in each trial
    # Once a trial has tiled its whole program, every group but the one tried is known to
    # tile: a trial's program differs from it in that group alone (the best of a group is
    # itself such a trial), so later trials tile their own group only.
    others_tile = False
    capacity = target.scratchpad_capacity
    for index, group in enumerate(program.tiling):
        first_error: PlanningError | None = None
        smallest: tuple[int, tuple[int | str, ...]] | None = None
        best: tuple[float, Program] | None = None
        fitting = 0
        for counts in candidate_counts(program, group, lay.ops, target.max_loop_count):
            once = all(isinstance(c, str) or c == 1 for c in counts)
            trial_program = with_counts(program, index, counts)
            try:
                trial = Trial(trial_program, target, lay, strategy, index, cache, split_k,
                              memo, others_tile)
                others_tile = True  # its program tiled whole (coarse_tile raises first)
                ws = trial.working_set
                fits = ws <= capacity
                if not fits and (smallest is None or ws < smallest[0]):
                    smallest = (ws, counts)
                if not fits and not once:
                    continue
                fitting += fits
                if best is not None and \
                        trial.iterations * trial.lower_bound() >= best[0] * (1 - 1e-9):
                    continue  # cannot beat the best so far: no need to plan it
                total = trial.iterations * trial.iteration_time()
            except PlanningError as e:
                first_error = first_error or e
                continue
            if best is None or total < best[0] * (1 - 1e-9):
                best = (total, trial_program)
            if fitting == MAX_TIMED:
                break
        if not fitting:
            if smallest is None and first_error is not None:
                raise first_error
            at = f"; the least is {smallest[0]} bytes at counts {list(smallest[1])}" \
                if smallest else ""
            raise PlanningError(f"tiling group {list(group.ops)}: no loop counts over "
                                f"{[list(lv.dims) for lv in group.loops]} make the per-iteration "
                                f"working set fit the scratchpad capacity {capacity} bytes per "
                                f"core{at}")
        assert best is not None
        program = best[1]
    return program


class Trial:
    """Tiling group ``index`` of ``program`` planned as auto-tiling weighs it: its ops alone,
    op by op, for the working set; as the pipeline would, for the predicted time."""

    def __init__(self, program: Program, target: Target, lay: Layouts, strategy: Strategy,
                 index: int, cache: PlanCache | None = None,
                 split_k: Resolver | None = None, memo: TileMemo | None = None,
                 others_tile: bool = False) -> None:
        self.strategy = strategy
        self.cache = cache = cache or PlanCache()
        # ``others_tile``: every group but ``index`` is known to tile (see ``auto_tile``), so
        # only this one is tiled; otherwise the whole program, raising what it raises
        group: GroupTiling = tile_group(program, index, lay.ops, target.max_loop_count, memo) \
            if others_tile else \
            coarse_tile(program, lay.ops, target.max_loop_count, memo).groups[index]
        self.group = group
        loops = {t.op: t.loop for t in group.tiles}
        sizes = {t.op: t.size_map for t in group.tiles}
        ctxs = {n: OpContext(program.op(n), program, target, lay.ops[n], lay.tensors,
                             sizes[n], loops[n]) for n in group.ops}
        # the reduction splits the pipeline will fix (pins, the user's or the target's resolver)
        pins = {n: f for n, f in program.split_k_pins.items() if n in ctxs}
        self.ctxs = with_split_k(ctxs, split_k_pass(ctxs, pins, split_k))
        spans = span_reduction(self.ctxs, strategy)
        self.splits = Splits({n: op_splits(ctx, spans, strategy, cache)
                              for n, ctx in self.ctxs.items()})
        self.roles = group_roles(program, group)  # the roles of this group's tensors
        plans = {n: cache.op_plan(ctx, spans.of(n), self.splits[n], loops[n])
                 for n, ctx in self.ctxs.items()}
        #: bytes per core one iteration needs, its ops planned alone
        self.working_set = plan_group(program, target, group, self.roles, plans)[0] \
            .working_set_bytes
        #: iterations of the nest (a symbolic count as one)
        self.iterations = math.prod(c for c in group.counts if isinstance(c, int))

    def lower_bound(self) -> float:
        """A lower bound on ``iteration_time()``: each op at the least time any split could
        give it, every tile the group makes on chip."""
        tiles = frozenset(t for t, r in self.roles.items()
                          if r.role == "tile" and r.group == self.group.index)
        total = 0.0
        for ctx in self.ctxs.values():
            mine = frozenset(ctx.slots) & tiles
            slots = tuple(i for i, t in enumerate(ctx.slots) if t in mine)
            total += self.cache.get(("bound", ctx.signature, slots),
                                    lambda c=ctx, m=mine: time_lower_bound(c, m))
        return total

    def iteration_time(self) -> float:
        """Predicted time of one iteration, the group planned as the pipeline plans it."""
        baseline = self.strategy.group_baseline
        if baseline is not None:  # the pipeline aligns the group's splits
            return align_group(self.group, self.ctxs, self.roles, self.splits, self.cache,
                               baseline=baseline)[1]
        return group_cost(self.group, self.ctxs, self.roles, self.splits.by_op, self.cache)


def working_set(program: Program, target: Target, lay: Layouts, strategy: Strategy,
                index: int) -> int:
    """Bytes per core one iteration of tiling group ``index`` needs, its ops planned alone."""
    return Trial(program, target, lay, strategy, index).working_set
