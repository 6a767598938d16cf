"""Pass `span_tiling`: a counted loop where no split keeps an op within the span limit.

The span limit bounds the contiguous device memory one core addresses in one kernel launch.
Splitting an op's dims over cores shrinks each core's span, but not always enough: a
``[1, 8195, 256, 64]`` float16 tensor (256.1 MiB) on 4 cores has no even split of its 8195 rows
(``greedy`` refuses), and on one core, or for a tensor larger than the limit times the cores, no
split of any kind exists (``balanced`` refuses too).

Loop tiling is the answer of last resort. For every op outside the program's tiling groups for
which the strategy finds no split (``greedy``: span reduction's walk over even splits fails;
``balanced``: its exhaustive search over even and uneven splits finds no feasible assignment),
this pass wraps the op alone in a new one-level tiling group over one of its dims, so that each
iteration's tile fits. It chooses the dim and the smallest count that fits: for every dim, the
counts that divide it into whole planning units (sticks for stick dims) and stay within the
target's ``max_loop_count``, smallest first, until the tile's per-iteration context is feasible
under the strategy; the smallest count over all dims wins, ties going to the lower predicted time
of the whole loop (count times one tile's time under the strategy's split), then to dims the
output indexes (a tiled reduction dim accumulates), then to outer dims. A reduction dim is a
candidate only when its kind accumulates across loop iterations (``Reducer.tileable``). Where no
tile of whole sticks fits, the same choice runs over tiles of part of a stick of a dim the op
only reads (one its output's innermost index does not use), any count dividing its elements:
a reduction over GPT-2's 50257-word vocabulary in float32 (a padded last stick, which Spyre
cannot split over cores) loops over 29 tiles of 1733 words. Each tile's span counts the stick
its first word lies in (``geometry.Reach``).

Fallback ops (one core, whole) and ops already in a tiling group are left alone, and an op no
single-dim loop fits keeps the strategy's error. In a program with run-time sizes
(``symbolic``, planned at its planning sizes) the loop cuts a dim of static size only: its count
divides that dim at every run-time size, and the tile planned at the largest size bounds every
smaller one. An op whose only fitting loops would cut a run-time size (which would restrict the
sizes a run may take to multiples of the count) is refused, naming the op, the tensor, the
run-time size and the limit, and where a smaller bound of the size fits, the largest such
bound. The added groups are
appended to the program's ``tiling`` (paths after the program's own groups) and named in the
result, so that the plan's ``GroupPlan.added`` says why each exists (plan format ``added``; the
report's loop-group line).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from apportion.errors import PlanningError
from apportion.ir.op import Op
from apportion.ir.program import LoopLevel, Program, TilingGroup
from apportion.passes.geometry import OpContext, PlanCache, divisors
from apportion.passes.layouts import Layouts, layouts
from apportion.passes.span_reduction import SpanSplits, minimum_splits, op_minimum
from apportion.passes.strategy import Strategy
from apportion.passes.work_distribution import op_splits, ranked
from apportion.plans.plan import LoopInfo
from apportion.target.target import Target

#: ``GroupPlan.added`` of a group this pass adds
REASON = "span"


@dataclass(frozen=True)
class SpanTile:
    """One loop the pass added: the op, the dim it tiles, the count, and the tile's splits."""

    op: str
    dim: str
    count: int
    group: int  # index of the added group in the program's ``tiling``


@dataclass(frozen=True)
class SpanTiling:
    """The pass's result: the program with its added groups, and what was added."""

    program: Program
    added: Mapping[str, SpanTile]  # op -> its loop

    def __post_init__(self) -> None:
        object.__setattr__(self, "added", MappingProxyType(dict(self.added)))

    @property
    def groups(self) -> dict[int, SpanTile]:
        """Index in ``program.tiling`` -> the loop added there."""
        return {t.group: t for t in self.added.values()}


def fits(ctx: OpContext, strategy: Strategy) -> bool:
    """True when ``strategy`` finds a split of the op (at ``ctx.sizes``) within the span limit.

    ``greedy``: the span reduction's walk over even splits succeeds (greedy only adds cuts to
    it); ``balanced``: the walk with uneven splits succeeds, or failing that the exhaustive
    search finds a feasible assignment. Pinned splits fit when they do.
    """
    pins = ctx.program.pins.get(ctx.op.name)
    if pins:
        if any(n < 1 or n > ctx.units.get(d, 0) for d, n in pins.items()):
            return True  # invalid pins: work distribution names the fault
        fixed = {d: pins.get(d, 1) for d in ctx.sizes}
        return ctx.feasible(fixed)
    if ctx.feasible({d: 1 for d in ctx.sizes}):
        return True
    try:
        minimum_splits(ctx, allow_uneven=strategy.uneven)
        return True
    except PlanningError:
        if strategy.span_refusal_final:
            return False
    return bool(ranked(ctx, {d: 1 for d in ctx.sizes}, 1))


def span_tiling(program: Program, target: Target, lay: Layouts, strategy: Strategy,
                cache: PlanCache | None = None, symbolic: Program | None = None
                ) -> SpanTiling:
    """The span tiling pass (see the module docstring). ``symbolic``: the program with its
    run-time sizes, when ``program`` is it bound at its planning sizes.

    >>> from apportion.frontend.json_format import loads
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.passes.strategy import Balanced, Greedy
    >>> from apportion.target import spyre
    >>> p = loads('{"name": "big", "tensors": {"x": {"shape": [1, 8195, 256, 64], '
    ...   '"dtype": "float16"}}, "inputs": ["x"], "outputs": ["y"], "ops": [{"name": "e", '
    ...   '"op": "exp", "out": "y[a,b,c,d]", "ins": ["x[a,b,c,d]"]}]}')
    >>> t = spyre(cores=4)
    >>> span_tiling(p, t, layouts(p, t), Greedy()).added["e"]
    SpanTile(op='e', dim='b', count=5, group=0)
    >>> span_tiling(p, t, layouts(p, t), Balanced()).added   # an uneven split of b fits
    mappingproxy({})
    """
    if program.symbols:
        raise PlanningError(f"program {program.name!r}: span tiling plans a program at its "
                            "planning sizes; bind it first and pass it as symbolic")
    grouped = {n for g in program.tiling for n in g.ops}
    added: dict[str, SpanTile] = {}
    groups = list(program.tiling)
    for op in program.ops:
        if op.name in grouped or not op.kind.divisible or op.merges_output:
            continue  # merged writes stay outside loop nests (see coarse_tile)
        ctx = OpContext(op, program, target, lay.ops[op.name], lay.tensors, dict(op.sizes))
        if fits(ctx, strategy):
            continue
        run_time = frozenset(symbolic.dim_symbols.get(op.name, {})) if symbolic else frozenset()
        choice = choose_loop(ctx, strategy, target.max_loop_count, cache, run_time)
        if choice is None and symbolic is not None and run_time:
            raise PlanningError(_run_time_refusal(ctx, strategy, symbolic, target))
        if choice is None:
            continue  # no single-dim loop fits: the strategy's own error stands
        d, count = choice
        added[op.name] = SpanTile(op.name, d, count, len(groups))
        groups.append(TilingGroup((op.name,), (LoopLevel(count, (d,)),)))
    if not added:
        return SpanTiling(program, {})
    return SpanTiling(replace(program, tiling=tuple(groups)), added)


def loop_candidates(op: Op, per: Mapping[str, int], max_count: int,
                    part_stick: bool = False) -> list[tuple[str, int]]:
    """(dim, count) pairs a one-level loop around ``op`` may take: counts > 1 dividing the dim
    into whole planning units of ``per`` elements, within ``max_count``; parallel dims, then
    reduction dims whose kind accumulates across iterations.

    With ``part_stick``, instead the counts that divide a stick dim the op only reads (not in
    its output's innermost index) into tiles of part of a stick: the elements it has, where
    whole sticks do not divide it (a padded last stick: GPT-2's 50257-word vocabulary is 29
    tiles of 1733). Each iteration loads part of a stick; none writes one another writes.

    >>> from apportion.ir.op import Access
    >>> op = Op.build("e", "exp", Access.parse("y[m,n]"), (Access.parse("x[m,n]"),),
    ...               {"m": 6, "n": 128})
    >>> loop_candidates(op, {"m": 1, "n": 64}, 100)
    [('m', 2), ('m', 3), ('m', 6), ('n', 2)]
    >>> op = Op.build("s", "sum", Access.parse("y[m,0]"), (Access.parse("x[m,n]"),),
    ...               {"m": 2, "n": 96})
    >>> [c for _, c in loop_candidates(op, {"m": 1, "n": 64}, 100, part_stick=True)]
    [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    """
    dims = [*op.parallel_dims,
            *(op.reduction_dims if op.kind.tileable_reduction else ())]
    written = set(op.out.index[-1].dims) if op.out.index else set()
    out = []
    for d in dims:
        n, unit = op.sizes[d], per.get(d, 1)
        if part_stick:
            if unit > 1 and d not in written:
                out += [(d, c) for c in divisors(n, max_count) if c > 1 and (n // c) % unit]
            continue
        if n % unit:
            continue  # a padded last stick: tiles of whole sticks cannot cover it evenly
        out += [(d, c) for c in divisors(n // unit, max_count) if c > 1]
    return out


def choose_loop(ctx: OpContext, strategy: Strategy, max_count: int,
                cache: PlanCache | None = None, keep: frozenset[str] = frozenset()
                ) -> tuple[str, int] | None:
    """The dim and count of the loop around ``ctx.op`` (see the module docstring), or None;
    dims in ``keep`` (run-time sizes) are never cut. Tiles of whole sticks first; where none
    fits, tiles of part of a stick of a dim the op only reads (``loop_candidates``), which
    read a stick at each tile boundary twice."""
    for part_stick in (False, True):
        found = _choose_among(ctx, strategy, cache, [
            (d, c) for d, c in loop_candidates(ctx.op, ctx.per, max_count, part_stick)
            if d not in keep])
        if found is not None:
            return found
    return None


def _choose_among(ctx: OpContext, strategy: Strategy, cache: PlanCache | None,
                  candidates: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The smallest count of ``candidates`` whose tile fits (ties: the lower predicted time
    of the whole loop, then output dims, then outer dims), or None."""
    op = ctx.op
    best_count: dict[str, int] = {}
    for d, c in candidates:
        if d in best_count or any(c > b for b in best_count.values()):
            continue  # this dim already fits at a smaller count, or another dim does
        tile = _tile_ctx(ctx, d, c)
        if fits(tile, strategy):
            best_count[d] = c
    if not best_count:
        return None
    least = min(best_count.values())
    tied = [d for d, c in best_count.items() if c == least]
    if len(tied) == 1:
        return tied[0], least
    order = {d: i for i, d in enumerate(op.dim_names)}

    def key(d: str) -> tuple[float, bool, int]:
        return (round(least * _time(_tile_ctx(ctx, d, least), strategy, cache), 9),
                d in op.reduction_dims, order[d])

    best = min(tied, key=key)
    return best, least


def _tile_ctx(ctx: OpContext, d: str, count: int) -> OpContext:
    sizes = {**ctx.sizes, d: ctx.sizes[d] // count}
    loop = LoopInfo((0,), (count,), ((d,),))
    return replace(ctx, sizes=sizes, loop=loop)


def _time(ctx: OpContext, strategy: Strategy, cache: PlanCache | None) -> float:
    """Predicted time of one tile under the strategy's split (infinite where none exists)."""
    try:
        minimum, err = op_minimum(ctx, strategy)
        spans = SpanSplits({ctx.op.name: minimum}, {} if err is None else {ctx.op.name: err})
        return ctx.time_us(op_splits(ctx, spans, strategy, cache))
    except PlanningError:
        return math.inf


def _run_time_refusal(ctx: OpContext, strategy: Strategy, symbolic: Program,
                      target: Target) -> str:
    """Why op ``ctx.op`` of a program with run-time sizes cannot be planned: it fits the span
    limit only in a loop (the strategy's own refusal), with the largest bound of each of its
    run-time sizes at which it fits without one."""
    op = ctx.op
    try:
        minimum_splits(ctx, allow_uneven=strategy.uneven)
        detail = (f"no split over {target.cores} cores keeps its spans within "
                  f"{target.span_limit} bytes")
    except PlanningError as e:
        detail = str(e).removeprefix(f"op {op.name!r}: ")
    dims = symbolic.dim_symbols.get(op.name, {})
    hints = []
    for sym in dict.fromkeys(dims.values()):
        s = symbolic.symbol_map[sym]
        top = _largest_fitting(ctx, strategy, symbolic, sym, target)
        used = ", ".join(f"dim {d!r}" for d, n in dims.items() if n == sym)
        hints.append(f"run-time size {sym!r} ({used}) is planned at {s.planning_size}; "
                     + (f"no size from its min {s.min} fits" if top is None else
                        f"bound it with a max of at most {top}"))
    return (f"op {op.name!r}: {detail}; no loop over its dims of static size fits, and a loop "
            f"of last resort never cuts a run-time size (a run would then take only multiples "
            f"of its count): {'; '.join(hints)}")


def _largest_fitting(ctx: OpContext, strategy: Strategy, symbolic: Program, sym: str,
                     target: Target) -> int | None:
    """The largest size of symbol ``sym`` (the others at their planning sizes) at which op
    ``ctx.op`` fits the span limit without a loop, by bisection (spans grow with the size);
    None when its min does not fit."""

    def fits_at(size: int) -> bool:
        bound = symbolic.bind({sym: size})
        lay = layouts(bound, target)
        op = bound.op(ctx.op.name)
        return fits(OpContext(op, bound, target, lay.ops[op.name], lay.tensors,
                              dict(op.sizes)), strategy)

    s = symbolic.symbol_map[sym]
    lo, hi = s.min, s.planning_size  # the planning size does not fit
    if not fits_at(lo):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_at(mid) else (lo, mid)
    return lo
