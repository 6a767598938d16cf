"""Automatic loop counts: for each tiling group, the fewest iterations whose working set fits.

The program's tiling groups say which ops and which dims are tiled at each level; this picks the
integer counts. Candidates divide their dims into whole sticks and stay within the target's
``max_loop_count`` (symbolic counts are kept as they are); they are tried by total iterations,
ties going to the larger outer count, and the first whose per-iteration working set fits the
capacity wins.

A candidate's working set is measured by planning the group's ops alone, op by op (coarse tiling,
span reduction and work distribution of those ops, then the group's scratchpad placement).
Aligned splits keep more tiles on chip and so need more scratchpad, and a count chosen on them
would re-read the weights of a group more often; group distribution then fills the capacity the
chosen count leaves.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import replace

from apportion.errors import PlanningError
from apportion.ir.program import LoopLevel, Program, TilingGroup
from apportion.passes.buffers import buffer_roles
from apportion.passes.coarse_tile import coarse_tile
from apportion.passes.geometry import OpContext, divisors
from apportion.passes.layouts import Layouts, OpLayout
from apportion.passes.placement import plan_group
from apportion.passes.span_reduction import span_reduction
from apportion.passes.work_distribution import op_splits
from apportion.target.target import Target

#: the most count combinations tried for one group
MAX_CANDIDATES = 4096


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
    tiling = tuple(TilingGroup(g.ops, loops) if i == index else other
                   for i, other in enumerate(program.tiling))
    return replace(program, tiling=tiling)


def auto_tile(program: Program, target: Target, lay: Layouts, strategy: str) -> Program:
    """``program`` with every group's integer counts set to the first candidate that fits.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.target import spyre
    >>> p = load("examples/softmax_tiled.json")
    >>> auto_tile(p, spyre(), layouts(p, spyre()), "balanced").tiling[0].loops[0].count
    1
    """
    capacity = target.scratchpad_capacity
    for index, group in enumerate(program.tiling):
        first_error: PlanningError | None = None
        smallest: tuple[int, tuple[int | str, ...]] | None = None
        for counts in candidate_counts(program, group, lay.ops, target.max_loop_count):
            trial = with_counts(program, index, counts)
            try:
                ws = working_set(trial, target, lay, strategy, index)
            except PlanningError as e:
                first_error = first_error or e
                continue
            if ws <= capacity:
                program = trial
                break
            if smallest is None or ws < smallest[0]:
                smallest = (ws, counts)
        else:
            if smallest is None and first_error is not None:
                raise first_error
            at = f"; the least is {smallest[0]} bytes at counts {list(smallest[1])}" \
                if smallest else ""
            raise PlanningError(f"tiling group {list(group.ops)}: no loop counts over "
                                f"{[list(lv.dims) for lv in group.loops]} make the per-iteration "
                                f"working set fit the scratchpad capacity {capacity} bytes per "
                                f"core{at}")
    return program


def working_set(program: Program, target: Target, lay: Layouts, strategy: str,
                index: int) -> int:
    """Bytes per core one iteration of tiling group ``index`` needs, its ops planned alone."""
    tiling = coarse_tile(program, lay.ops, target.max_loop_count)
    group = tiling.groups[index]
    ctxs = {n: OpContext(program.op(n), program, target, lay.ops[n], lay.tensors,
                         tiling.sizes(program.op(n))) for n in group.ops}
    spans = span_reduction(ctxs, strategy)
    plans = {n: ctx.op_plan(spans.of(n), op_splits(ctx, spans, strategy), group.tile(n).loop)
             for n, ctx in ctxs.items()}
    return plan_group(program, target, group, buffer_roles(program, tiling), plans)[0] \
        .working_set_bytes
