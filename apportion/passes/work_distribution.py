"""Pass `work_distribution`: how many cores work on each dim of each op.

Two strategies:

* ``greedy`` reproduces the reference design: keep the span splits as minimums, rank the output
  dims by decreasing size in planning units and give each the largest divisor that fits the core
  budget left, then split at most one reduction dim (none if span reduction split one).
* ``balanced`` (default) searches every assignment satisfying the same constraints (span limit,
  whole sticks, at most one reduction dim, product of splits <= cores), uneven splits included,
  and keeps the lowest predicted time; ties go to even splits, fewer cores, then outer dims.
  The greedy assignment is among those searched, so balanced is never predicted slower.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping

from apportion.errors import PlanningError
from apportion.passes.geometry import OpContext, Splits, check_spans, divisors
from apportion.passes.span_reduction import SpanSplits

STRATEGIES = ("balanced", "greedy")


def core_split(size: int, cores: int) -> int:
    """Largest ``i <= cores`` dividing ``size``.

    >>> core_split(4096, 24), core_split(769, 32)
    (16, 1)
    """
    return divisors(size, cores)[-1]  # 1 divides every size: never empty for cores >= 1


def greedy(ctx: OpContext, minimum: dict[str, int]) -> dict[str, int]:
    """The reference design's split assignment, starting from the span splits ``minimum``."""
    units, op = ctx.units, ctx.op
    splits = dict(minimum)
    budget = ctx.target.cores // math.prod(minimum.values())
    ranked = sorted(op.parallel_dims, key=lambda d: -units[d])  # stable: ties keep dim order
    for d in ranked:
        if budget <= 1:
            break
        base = splits[d]
        extra = core_split(units[d] // base, budget) if units[d] % base == 0 else 1
        splits[d] = base * extra
        budget //= extra
    reducible = [d for d in op.reduction_dims if ctx.splittable(d)]
    if budget > 1 and not any(minimum[d] > 1 for d in op.reduction_dims) and reducible:
        best = max(reducible, key=lambda d: core_split(units[d], budget))
        splits[best] = core_split(units[best], budget)
    return splits


def candidates(ctx: OpContext, minimum: dict[str, int], uneven: bool = True
               ) -> Iterator[dict[str, int]]:
    """Every split assignment within the core budget and at most one split reduction dim.

    Each dim's count is at least ``minimum``; without ``uneven`` counts divide the dim's units.
    Span limits are not checked here.
    """
    units, cores = ctx.units, ctx.target.cores
    dims = list(ctx.sizes)
    reductions = set(ctx.op.reduction_dims)

    def options(d: str) -> list[int]:
        hi = min(units[d], cores) if ctx.splittable(d) else minimum[d]
        if uneven:
            return list(range(minimum[d], hi + 1))
        return [c for c in divisors(units[d], hi) if c >= minimum[d]]

    opts = {d: options(d) for d in dims}

    def rec(i: int, acc: dict[str, int], prod: int, red_split: bool) -> Iterator[dict[str, int]]:
        if i == len(dims):
            yield dict(acc)
            return
        d = dims[i]
        for c in opts[d]:
            if prod * c > cores:
                break
            if c > 1 and d in reductions and red_split:
                continue
            acc[d] = c
            yield from rec(i + 1, acc, prod * c, red_split or (c > 1 and d in reductions))
        acc.pop(d, None)

    yield from rec(0, {}, 1, False)


def _rank(ctx: OpContext, splits: dict[str, int]) -> tuple:
    even = all(ctx.units[d] % s == 0 for d, s in splits.items())
    order = tuple(-s for s in splits.values())  # prefer splitting outer (earlier) dims
    return (round(ctx.time_us(splits), 9), not even, math.prod(splits.values()), order)


def ranked(ctx: OpContext, minimum: dict[str, int], k: int) -> list[dict[str, int]]:
    """The ``k`` best feasible assignments, best first, in ``balanced``'s order."""
    feasible = (s for s in candidates(ctx, minimum) if ctx.feasible(s))
    return heapq.nsmallest(k, feasible, key=lambda s: _rank(ctx, s))


def balanced(ctx: OpContext, minimum: dict[str, int]) -> dict[str, int]:
    """The feasible assignment with the lowest predicted time (see module docstring)."""
    best = ranked(ctx, minimum, 1)
    if not best:
        raise PlanningError(f"op {ctx.op.name!r}: no split assignment within {ctx.target.cores} "
                            "cores keeps every operand within the span limit")
    return best[0]


def best_utilization(ctx: OpContext, minimum: dict[str, int]) -> tuple[float, dict[str, int]]:
    """The bound: highest utilization of any feasible assignment (exhaustive search).

    Returns it with the assignment reaching it (ties to the lowest predicted time), so the
    time that utilization would cost can be compared with ``balanced``'s.
    """
    best, best_key = {}, (0.0, 0.0)
    for s in candidates(ctx, minimum):
        if ctx.feasible(s):
            key = (ctx.utilization(s), -ctx.time_us(s))
            if key > best_key:
                best, best_key = s, key
    return best_key[0], best


def check_pins(ctx: OpContext, pins: dict[str, int]) -> dict[str, int]:
    """Validate pinned splits of ``work_division`` and return them."""
    op, units = ctx.op, ctx.units
    for d, n in pins.items():
        if n > 1 and not ctx.splittable(d):
            raise PlanningError(
                f"op {op.name!r}: work_division splits reduction dim {d!r} ({ctx.sizes[d]} "
                f"elements) {n} ways, but its last stick of {ctx.per[d]} is padded and target "
                f"{ctx.target.name!r} cannot split a padded reduction across cores")
        if n < 1:
            raise PlanningError(f"op {op.name!r}: work_division pins dim {d!r} to {n}; splits "
                                "must be >= 1")
        if units[d] % n:
            unit = "sticks" if d in ctx.layout.stick_dims else "elements"
            raise PlanningError(f"op {op.name!r}: work_division split {n} of dim {d!r} does not "
                                f"divide its {units[d]} {unit}")
    if math.prod(pins.values()) > ctx.target.cores:
        raise PlanningError(f"op {op.name!r}: work_division {pins} uses "
                            f"{math.prod(pins.values())} cores > {ctx.target.cores}")
    red = [d for d in op.reduction_dims if pins.get(d, 1) > 1]
    if len(red) > 1:
        raise PlanningError(f"op {op.name!r}: work_division splits reduction dims {red}; at most "
                            "one reduction dim may be split")
    return pins


def work_distribution(ctxs: Mapping[str, OpContext], spans: SpanSplits, strategy: str) -> Splits:
    """The work distribution pass: every op's splits under ``strategy`` (program pins win).

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.geometry import contexts
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.passes.span_reduction import span_reduction
    >>> from apportion.target import spyre
    >>> p = load("examples/mlp.json")
    >>> ctxs = contexts(p, spyre(), layouts(p, spyre()), {o.name: o.sizes for o in p.ops})
    >>> work_distribution(ctxs, span_reduction(ctxs, "greedy"), "greedy")["gate"]
    {'m': 32, 'n': 1, 'k': 1}
    """
    return Splits({name: op_splits(ctx, spans, strategy) for name, ctx in ctxs.items()})


def op_splits(ctx: OpContext, spans: SpanSplits, strategy: str) -> dict[str, int]:
    """One op's splits; under ``balanced`` a span refusal stands when the search finds none."""
    minimum = spans.of(ctx.op.name)
    start = minimum if strategy == "greedy" else {d: 1 for d in ctx.sizes}
    try:
        return distribute(ctx, start, strategy, ctx.program.pins.get(ctx.op.name))
    except PlanningError:
        refused = spans.refused.get(ctx.op.name)
        if refused is not None:
            raise refused from None
        raise


def distribute(ctx: OpContext, minimum: dict[str, int], strategy: str,
               pins: dict[str, int] | None = None) -> dict[str, int]:
    """Splits for one op under ``strategy``; pinned dims keep their pinned counts."""
    if strategy not in STRATEGIES:
        raise PlanningError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    divisible = ctx.op.kind.divisible
    if not divisible and any(n != 1 for n in (pins or {}).values()):
        raise PlanningError(f"op {ctx.op.name!r}: a fallback op runs on one core; work_division "
                            f"{pins} cannot split it")
    if not divisible or pins:
        if pins and divisible:
            check_pins(ctx, pins)
        fixed = {d: (pins or {}).get(d, 1) if divisible else 1 for d in ctx.sizes}
        worst = check_spans(ctx.op, ctx.sizes, ctx.layout, fixed, ctx.tlayouts, ctx.target).worst
        if worst is not None:
            why = "fallback op cannot be divided but" if not divisible else \
                f"work_division {pins} leaves"
            raise PlanningError(f"op {ctx.op.name!r}: {why} tensor {worst[0]!r} spanning "
                                f"{worst[1]} bytes > limit {ctx.target.span_limit}")
        return fixed
    if strategy == "greedy":
        return greedy(ctx, minimum)
    return balanced(ctx, minimum)
