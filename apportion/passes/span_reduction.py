"""Pass `span_reduction` (mandatory, first of the splitting passes).

A core's span of a tensor is the contiguous device memory it must address; it must stay within
the target's span limit. For every operand whose unsplit span is over the limit, walk its device
dims outermost first; at each, search the products of valid slice counts of the dims that feed
it, within the core budget and above the counts already committed. If some fit, take the one with
the largest span that fits (fewest cores); otherwise take the smallest span (most progress) and go
inward. At most one reduction dim may be split for span. The result is the minimum split per dim;
work distribution starts from it (``greedy`` may grow a forced minimum to any legal factor).

The strategy (``passes/strategy.py``) says whether a dim with no fitting even split may take an
uneven whole-stick one (``uneven``) and whether a walk that finds no fitting split refuses the op
(``span_refusal_final``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from apportion.errors import PlanningError
from apportion.ir.op import Op
from apportion.passes.geometry import OpContext, divisors, slice_sizes
from apportion.passes.strategy import Strategy
from apportion.target.target import Target


@dataclass(frozen=True)
class SpanSplits:
    """The span reduction pass's result: per op, the minimum split of each dim.

    Under ``balanced`` an op whose walk finds no fitting split starts from no split at all (the
    search covers every assignment itself) and keeps the walk's error in ``refused``, raised if
    work distribution finds nothing either; under ``greedy`` the error is raised at once.
    """

    minimum: Mapping[str, Mapping[str, int]]
    refused: Mapping[str, PlanningError]

    def __post_init__(self) -> None:
        object.__setattr__(self, "minimum", MappingProxyType(
            {op: MappingProxyType(dict(m)) for op, m in self.minimum.items()}))
        object.__setattr__(self, "refused", MappingProxyType(dict(self.refused)))

    def of(self, op: str) -> dict[str, int]:
        return dict(self.minimum[op])


def span_reduction(ctxs: Mapping[str, OpContext], strategy: Strategy) -> SpanSplits:
    """The span reduction pass over every op (``ctxs``: each op's context).

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.geometry import contexts
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.passes.strategy import Balanced
    >>> from apportion.target import spyre
    >>> p = load("examples/lm_head_prime_vocab.json")
    >>> ctxs = contexts(p, spyre(), layouts(p, spyre()), {o.name: o.sizes for o in p.ops})
    >>> span_reduction(ctxs, Balanced()).of("lm_head")
    {'t': 1, 'v': 2, 'k': 1}
    """
    minimum, refused = {}, {}
    for name, ctx in ctxs.items():
        minimum[name], err = op_minimum(ctx, strategy)
        if err is not None:
            refused[name] = err
    return SpanSplits(minimum, refused)


def op_minimum(ctx: OpContext, strategy: Strategy
               ) -> tuple[dict[str, int], PlanningError | None]:
    """One op's minimum splits; where the strategy's refusal is not final (``balanced``) a
    refusal is returned, not raised."""
    try:
        return minimum_splits(ctx, allow_uneven=strategy.uneven), None
    except PlanningError as e:
        if strategy.span_refusal_final:  # greedy and its variants
            raise
        return {d: 1 for d in ctx.sizes}, e


def minimum_splits(ctx: OpContext, allow_uneven: bool = False) -> dict[str, int]:
    """Minimum splits per dim that bring every operand of the op within the span limit.

    The op's (per-iteration) iteration space is ``ctx.sizes``; ``allow_uneven`` lets a dim with
    no fitting even split take an uneven whole-stick split (the ``balanced`` strategy). Dims the
    target cannot split (``ctx.splittable``) are never cut.
    """
    op, target, layout, sizes = ctx.op, ctx.target, ctx.layout, ctx.sizes
    per = dict(layout.unit_elems)
    units = layout.units(sizes)
    commit = {d: 1 for d in sizes}
    if not op.kind.divisible:
        worst = ctx.span_check(commit).worst
        if worst:
            raise PlanningError(f"op {op.name!r}: fallback op cannot be divided but tensor "
                                f"{worst[0]!r} spans {worst[1]} bytes > limit {target.span_limit}")
        return commit
    reductions = set(op.reduction_dims)
    for reach in ctx.reaches:
        tl = reach.layout
        index = _union_index(op, reach.tensor)

        def span_of(splits: dict[str, int], reach=reach) -> int:
            return reach.span(slice_sizes(sizes, per, splits))

        if span_of(commit) <= target.span_limit:
            continue
        for ddim in tl.dims:
            if ddim.part == "in_stick":
                continue
            feeding = [d for d in index[ddim.tensor_dim]
                       if units[d] > 1 and ctx.splittable(d) and d not in ctx.fixed_map]
            if not feeding:
                continue
            choice = _best_at(feeding, commit, units, reductions, target, span_of, False)
            if allow_uneven and (choice is None or span_of(choice) > target.span_limit):
                alt = _best_at(feeding, commit, units, reductions, target, span_of, True)
                if alt is not None and (choice is None or span_of(alt) <= target.span_limit):
                    choice = alt
            if choice is None:
                continue
            commit = choice
            if span_of(commit) <= target.span_limit:
                break
        span = span_of(commit)
        if span > target.span_limit:
            split_red = [d for d in reductions if commit[d] > 1]
            why = (f"; reduction dim {split_red[0]!r} is already split and at most one may be"
                   if split_red else "")
            dims = ", ".join(f"{d}={sizes[d]}" for d in dict.fromkeys(
                d for ds in index for d in ds))
            raise PlanningError(
                f"op {op.name!r}: tensor {reach.tensor!r} (dims {dims}) spans {span} bytes per "
                f"core > limit {target.span_limit} with {math.prod(commit.values())} of "
                f"{target.cores} cores (splits {commit}){why}; no valid split count fits"
                + ("" if allow_uneven else " (strategy balanced may use uneven splits)"))
    return commit


def _union_index(op: Op, tensor: str) -> tuple[tuple[str, ...], ...]:
    """Per dim of ``tensor``, the op dims its accesses index it through, in order of use."""
    accs = [a for a in op.operands if a.tensor == tensor]
    return tuple(tuple(dict.fromkeys(d for a in accs for d in a.index[k].dims))
                 for k in range(len(accs[0].index)))


def _best_at(feeding: list[str], commit: dict[str, int], units: dict[str, int],
             reductions: set[str], target: Target, span_of, uneven: bool) -> dict[str, int] | None:
    """The best commitment for one device dim, or None when no count improves on ``commit``."""
    options = []
    for d in feeding:
        counts = range(commit[d], min(units[d], target.cores) + 1) if uneven else [
            c for c in divisors(units[d], target.cores) if c >= commit[d]]
        options.append(counts)
    others = math.prod(v for d, v in commit.items() if d not in feeding)
    current = span_of(commit)
    fits, rest = [], []
    for combo in itertools.product(*options):
        trial = {**commit, **dict(zip(feeding, combo, strict=True))}
        if trial == commit or others * math.prod(combo) > target.cores:
            continue
        if sum(1 for d in reductions if trial[d] > 1) > 1:
            continue
        span = span_of(trial)
        cores = math.prod(trial.values())
        if span <= target.span_limit:
            fits.append((span, cores, trial))
        elif span < current:  # progress only: a split that leaves the span as it was is waste
            rest.append((span, cores, trial))
    if fits:  # largest span that fits = fewest cores
        return max(fits, key=lambda x: (x[0], -x[1]))[2]
    if rest:  # most progress
        return min(rest, key=lambda x: (x[0], x[1]))[2]
    return None
