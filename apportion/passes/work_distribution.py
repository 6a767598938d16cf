"""Pass `work_distribution`: how many cores work on each dim of each op.

Two strategies (objects of ``passes/strategy.py``):

* ``greedy`` (``Greedy()``) reproduces the reference design: keep the span splits as minimums,
  rank the output dims by decreasing size in planning units and give each the largest divisor
  that fits the core budget left, then split at most one reduction dim (none if span reduction
  split one). It follows the reference's newer rule for a dim the span limit forces to split:
  the forced minimum may grow to any legal factor (a divisor of the dim's units, at least the
  minimum, within the cores the other dims leave), not only to multiples of it; 6 rows on 3
  cores with a forced split of 2 give 3 (the older rule keeps 2: no multiple of 2 fits). A
  span-forced reduction split grows the same way, after the output dims. ``greedy-multiples``
  (``Greedy(rule="multiples")``) keeps the older rule (the reference before the change), for
  comparison.
* ``balanced`` (``Balanced()``, default) searches every assignment satisfying the same
  constraints (span limit, whole sticks, at most one reduction dim, product of splits <=
  cores), uneven splits included, and keeps the lowest predicted time; ties go to even splits,
  fewer cores, then outer dims. The greedy assignment is among those searched, so balanced is
  never predicted slower.

The search is a depth-first walk over the dims in order that skips every partial assignment
whose *lower bound* cannot beat the best found so far (the ``k``-th best, for the few best that
group distribution asks for). The bound is the cost model's own terms at their least over the
assignments completing the partial one: compute time at the smallest slices the remaining core
budget allows (and never below the op's work spread over every core), memory time of the bytes
each operand must move at least once (every slice of a tensor its op reads through whole dims is
fetched once: the tensor's bytes in all) or of the slices already cut, broadcast contention of the
cuts made, combine, stick-split and batch-split costs of the cuts made, and each of the target's
own terms (``Target.cost_terms``) at its ``least`` (0 unless the term bounds itself). Each term
is monotone in the splits, so the bound never exceeds the time of any completion; what the model
adds that the bound leaves out (batch drain, core sync and scaling, a target's term bounded by
0) is >= 0 and only weakens the bound: a new term of the model must be bounded here or be >= 0
(``op_cost`` refuses a target term's negative time). A subtree is skipped only when even its
bound is predicted slower than the incumbent (with a relative slack of 1e-9 for rounding): the
result is the exhaustive search's, assignment for assignment
(``ranked(..., exhaustive=True)`` is the plain enumeration it is tested against). Children are
visited best bound first, so a good incumbent comes early. Spans only shrink as splits grow: when
the fewest cuts fit the span limit every candidate does and none is checked; otherwise a subtree
whose smallest slices still exceed it is skipped. On the model shapes of ``apportion bench
workdiv`` the search evaluates about a tenth of the candidates (3 to 4 times faster in all).

Identical ops are planned once (``PlanCache``): ``work_distribution`` keeps each op's splits by
its signature, and an op whose signature was seen takes them.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterator, Mapping

from apportion.cost.model import batch_dims, largest_slice, matmul_rows, slice_bytes
from apportion.errors import PlanningError
from apportion.ir.kinds import Category
from apportion.passes.geometry import (
    OpContext,
    PlanCache,
    Splits,
    check_pins,
    divisors,
)
from apportion.passes.span_reduction import SpanSplits
from apportion.passes.strategy import Balanced, Greedy, GreedyRule, Strategy


def core_split(size: int, cores: int) -> int:
    """Largest ``i <= cores`` dividing ``size``.

    >>> core_split(4096, 24), core_split(769, 32)
    (16, 1)
    """
    return divisors(size, cores)[-1]  # 1 divides every size: never empty for cores >= 1


def greedy(ctx: OpContext, minimum: dict[str, int], rule: GreedyRule = "any"
           ) -> dict[str, int]:
    """The reference design's split assignment, starting from the span splits ``minimum``.

    ``rule`` is how a span-forced minimum grows: ``"any"`` legal factor (the reference's newer
    rule) or only ``"multiples"`` of it (the older one); dims without a forced split take the
    largest divisor of their units within the cores left either way.

    >>> from apportion.passes.geometry import OpContext
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.target import spyre
    >>> from apportion.frontend.json_format import loads
    >>> p = loads('{"name": "r", "tensors": {"x": {"shape": [6, 64], "dtype": "float16"}}, '
    ...   '"inputs": ["x"], "outputs": ["y"], "ops": [{"name": "e", "op": "exp", '
    ...   '"out": "y[m,n]", "ins": ["x[m,n]"]}]}')
    >>> t = spyre(cores=3)
    >>> ctx = OpContext(p.op("e"), p, t, layouts(p, t).ops["e"], layouts(p, t).tensors,
    ...                 {"m": 6, "n": 64})
    >>> greedy(ctx, {"m": 2, "n": 1}), greedy(ctx, {"m": 2, "n": 1}, "multiples")
    ({'m': 3, 'n': 1}, {'m': 2, 'n': 1})
    """
    if rule == "multiples":
        return _greedy_multiples(ctx, minimum)
    if rule != "any":
        raise PlanningError(f"unknown greedy rule {rule!r}; valid: any, multiples")
    units, op, cores = ctx.units, ctx.op, ctx.target.cores
    splits = {**minimum, **ctx.fixed_map}
    fixed = ctx.fixed_map

    def grow(d: str) -> None:
        others = math.prod(v for x, v in splits.items() if x != d)
        allowed = cores // others
        legal = [c for c in divisors(units[d], allowed) if c >= splits[d]]
        if legal:
            splits[d] = legal[-1]

    ranked = sorted(op.parallel_dims, key=lambda d: -units[d])  # stable: ties keep dim order
    for d in ranked:
        if d not in fixed:
            grow(d)
    forced = [d for d in op.reduction_dims if splits[d] > 1]
    if forced:
        if forced[0] not in fixed:
            grow(forced[0])
        return splits
    budget = cores // math.prod(splits.values())
    reducible = [d for d in op.reduction_dims if ctx.options(d, 1, 2) == (1, 2)]
    if budget > 1 and reducible:
        best = max(reducible, key=lambda d: core_split(units[d], budget))
        splits[best] = core_split(units[best], budget)
    return splits


def _greedy_multiples(ctx: OpContext, minimum: dict[str, int]) -> dict[str, int]:
    """The older rule: a forced minimum grows only by a factor dividing the units left."""
    units, op = ctx.units, ctx.op
    splits = {**minimum, **ctx.fixed_map}
    budget = ctx.target.cores // math.prod(splits.values())
    ranked = sorted(op.parallel_dims, key=lambda d: -units[d])  # stable: ties keep dim order
    for d in ranked:
        if budget <= 1:
            break
        base = splits[d]
        extra = core_split(units[d] // base, budget) if units[d] % base == 0 else 1
        splits[d] = base * extra
        budget //= extra
    reducible = [d for d in op.reduction_dims if ctx.options(d, 1, 2) == (1, 2)]
    if budget > 1 and not any(splits[d] > 1 for d in op.reduction_dims) and reducible:
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
        lo, hi = ctx.options(d, minimum[d], min(units[d], cores))
        if uneven or lo == hi:
            return list(range(lo, hi + 1))
        return [c for c in divisors(units[d], hi) if c >= lo]

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


def ranked(ctx: OpContext, minimum: dict[str, int], k: int, exhaustive: bool = False
           ) -> list[dict[str, int]]:
    """The ``k`` best feasible assignments, best first, in ``balanced``'s order.

    By the bounded search (module docstring); ``exhaustive`` ranks every candidate instead, to
    the same result.
    """
    if exhaustive:
        feasible = (s for s in candidates(ctx, minimum) if ctx.feasible(s))
        return heapq.nsmallest(k, feasible, key=lambda s: _rank(ctx, s))
    return _Search(ctx, minimum, k).run() if k > 0 else []


#: relative slack of a bound against the rounding of the time it bounds
_SLACK = 1 - 1e-9


def time_lower_bound(ctx: OpContext, resident: frozenset[str] = frozenset()) -> float:
    """A lower bound on ``ctx.time_us(s, resident)`` over every assignment ``s`` that
    ``candidates(ctx, {d: 1 ...})`` lists (which holds every split a pass may give the op:
    balanced's, greedy's, pinned ones, a loop group's), slack for rounding included."""
    return _Search(ctx, {d: 1 for d in ctx.sizes}, 1, resident).root() * _SLACK


class _Search:
    """The bounded depth-first search behind ``ranked``: the same candidates as
    ``candidates(ctx, minimum)``, the same keys as ``_rank``, the ``k`` smallest kept."""

    def __init__(self, ctx: OpContext, minimum: dict[str, int], k: int,
                 resident: frozenset[str] = frozenset()) -> None:
        self.ctx, self.k = ctx, k
        op, target, program = ctx.op, ctx.target, ctx.program
        units, cores = ctx.units, target.cores
        self.cores = cores
        self.dims = list(ctx.sizes)
        self.reductions = set(op.reduction_dims)

        def options(d: str) -> list[int]:
            lo, hi = ctx.options(d, minimum[d], min(units[d], cores))
            return list(range(lo, hi + 1))

        self.opts = {d: options(d) for d in self.dims}
        self.all_fit = False
        self.best: list[tuple[tuple, dict[str, int]]] = []  # (key, splits), ascending
        sizes, per = ctx.sizes, ctx.per
        # largest slice of each dim at each of its options (elements)
        self.slice = {d: {c: largest_slice({d: sizes[d]}, per, {d: c})[d] for c in self.opts[d]}
                      for d in self.dims}
        self.points = math.prod(sizes.values())
        self.work = op.kind.work_per_point
        category = op.category
        self.matmul = category is Category.MATMUL
        self.rate = 2 * target.mac_rate if self.matmul else (
            target.reduce_rate if category is Category.REDUCTION else target.sfp_rate)
        self.rows = matmul_rows(op)
        self.batch = batch_dims(op)
        self.out_dims = op.out.dims
        # operands as the memory term sees them: distinct tensors, inputs then the output;
        # ``whole``: bytes every assignment moves at least once (0 where not known)
        self.operands = []
        self.sticks = []
        seen: set[str] = set()
        for acc in (*op.ins, op.out):
            if acc.tensor in seen:
                continue
            seen.add(acc.tensor)
            if acc.index:
                self.sticks.append((acc.index[-1].dims, slice_bytes(acc, program, target, sizes)))
            if acc.tensor in resident:  # on chip: no device-memory traffic
                continue
            singles = [e.single_dim for e in acc.index if e.terms]
            whole = slice_bytes(acc, program, target, sizes) \
                if None not in singles and len(set(singles)) == len(singles) else 0
            self.operands.append((acc, acc is op.out, acc.dims, whole))

    def root(self) -> float:
        """The bound of every candidate (nothing assigned yet)."""
        return self._rest({}, *self._busy({}, 1, False))

    def run(self) -> list[dict[str, int]]:
        # spans only shrink as splits grow: when the fewest cuts fit, every candidate does
        self.all_fit = self.ctx.feasible({d: o[0] for d, o in self.opts.items()})
        if self.dims:
            self._walk(0, {}, 1, False, *self._busy({}, 1, False))
        else:  # an op over no dims: one assignment, the empty one
            self._leaf({})
        return [s for _, s in self.best]

    def _beaten(self, bound: float) -> bool:
        """True when no assignment of time at least ``bound`` can enter the ``k`` best."""
        return len(self.best) == self.k and round(bound * _SLACK, 9) > self.best[-1][0][0]

    def _walk(self, i: int, acc: dict[str, int], prod: int, red_split: bool, busy: float,
              small: dict[str, int]) -> None:
        """Every completion of ``acc`` (dims before ``i`` assigned) that may enter the best;
        ``busy`` and ``small`` are ``_busy``'s bound and slices for ``acc``."""
        d = self.dims[i]
        reduction = d in self.reductions
        last = i + 1 == len(self.dims)
        children = []
        for c in self.opts[d]:
            if prod * c > self.cores:
                break
            if c > 1 and reduction and red_split:
                continue
            acc[d] = c
            children.append((self._rest(acc, busy, {**small, d: self.slice[d][c]}), -c))
        acc.pop(d, None)
        children.sort()  # best bound first (more cores on a tie): a good incumbent early
        for bound, minus_c in children:
            if self._beaten(bound):
                break  # the rest are bounded higher still
            c = -minus_c
            acc[d] = c
            if last:
                self._leaf(dict(acc))
                continue
            below = prod * c, red_split or (c > 1 and reduction)
            busy2, small2 = self._busy(acc, *below)
            if not self.all_fit and not self._may_fit(small2):
                continue
            if not self._beaten(self._rest(acc, busy2, small2)):
                self._walk(i + 1, acc, *below, busy2, small2)
        acc.pop(d, None)

    def _leaf(self, splits: dict[str, int]) -> None:
        ctx = self.ctx
        key = _rank(ctx, splits)
        if len(self.best) == self.k and key >= self.best[-1][0]:
            return
        if not self.all_fit and not ctx.feasible(splits):
            return
        bisect.insort(self.best, (key, splits), key=lambda e: e[0])
        del self.best[self.k:]

    def _may_fit(self, small: dict[str, int]) -> bool:
        """False when even the smallest slices leave some operand over the span limit."""
        limit = self.ctx.target.span_limit
        return all(s <= limit for s in self.ctx.slice_spans(small).values())

    def _busy(self, acc: dict[str, int], prod: int, red_split: bool
              ) -> tuple[float, dict[str, int]]:
        """A lower bound on the overlapped compute and memory time of every assignment
        completing ``acc``, and the least elements per dim any of them leaves a core."""
        target = self.ctx.target
        left = self.cores // prod
        small: dict[str, int] = {}
        big: dict[str, int] = {}  # the most elements per dim
        for d in self.dims:
            if d in acc:
                small[d] = big[d] = self.slice[d][acc[d]]
                continue
            opts = self.opts[d]
            top = 1 if d in self.reductions and red_split else left
            j = bisect.bisect_right(opts, top) - 1
            small[d] = self.slice[d][opts[max(j, 0)]]
            big[d] = self.slice[d][opts[0]]
        points = max(math.prod(small.values()), self.points / self.cores)
        efficiency = 1.0
        if self.matmul:
            rows = math.prod(big[d] for d in self.rows)
            passes = -(-rows // target.pt_rows)
            efficiency = min(1.0, (passes / target.pt_full_passes) ** target.pt_exponent)
        compute = points * self.work / (self.rate * efficiency)
        fetched, per_core = 0.0, 0
        program = self.ctx.program
        for a, is_out, used, whole in self.operands:
            nbytes = slice_bytes(a, program, target, small)
            per_core += nbytes
            moved = max(nbytes * math.prod(acc.get(d, 1) for d in used), whole)
            if not is_out:
                cohort = math.prod(c for d, c in acc.items() if d not in used)
                moved *= max(1.0, (cohort / target.broadcast_cohort) ** target.broadcast_exponent)
            fetched += moved
        memory = max(fetched / target.mem_bandwidth, per_core / target.core_bandwidth) * 1e6
        return max(compute, memory) + target.overlap * min(compute, memory), small

    def _rest(self, acc: dict[str, int], busy: float, small: dict[str, int]) -> float:
        """The bound of every assignment completing ``acc``: ``busy`` (a bound for a partial
        assignment ``acc`` extends) with the batch-split, combine and stick-split costs of the
        cuts in ``acc``; ``small`` bounds the slices from below."""
        target = self.ctx.target
        b = math.prod(acc.get(d, 1) for d in self.batch)
        factor = target.batch_split_factor ** math.log2(b) if b > 1 else 1.0
        red = math.prod(acc.get(d, 1) for d in self.reductions)
        combine = 0.0
        if red > 1:
            combine = (red - 1) * math.prod(small[d] for d in self.out_dims) * \
                target.ring_us_per_element
        stick = 0.0
        for last, nbytes in self.sticks:
            cuts = math.prod(acc.get(d, 1) for d in last)
            if cuts > 1:
                stick += nbytes * math.log2(cuts)
        bound = busy * factor + combine + stick * target.stick_split_us_per_byte
        for term in target.cost_terms:
            ctx = self.ctx
            bound += term.least(ctx.op, ctx.program, target, ctx.sizes, acc, small)
        return bound


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


def work_distribution(ctxs: Mapping[str, OpContext], spans: SpanSplits, strategy: Strategy,
                      cache: PlanCache | None = None) -> Splits:
    """The work distribution pass: every op's splits under ``strategy`` (program pins win).

    With ``cache``, an op whose signature an earlier op had takes that op's splits.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.geometry import contexts
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.passes.span_reduction import span_reduction
    >>> from apportion.passes.strategy import Greedy
    >>> from apportion.target import spyre
    >>> p = load("examples/mlp.json")
    >>> ctxs = contexts(p, spyre(), layouts(p, spyre()), {o.name: o.sizes for o in p.ops})
    >>> work_distribution(ctxs, span_reduction(ctxs, Greedy()), Greedy())["gate"]
    {'m': 32, 'n': 1, 'k': 1}
    """
    return Splits({name: op_splits(ctx, spans, strategy, cache) for name, ctx in ctxs.items()})


def op_splits(ctx: OpContext, spans: SpanSplits, strategy: Strategy,
              cache: PlanCache | None = None) -> dict[str, int]:
    """One op's splits; under ``balanced`` a span refusal stands when the search finds none."""
    if cache is not None and cache.enabled:
        key = ("splits", strategy, ctx.signature, tuple(spans.of(ctx.op.name).items()))
        return dict(cache.get(key, lambda: tuple(op_splits(ctx, spans, strategy).items())))
    minimum = spans.of(ctx.op.name)
    start = strategy.start(minimum)
    try:
        return distribute(ctx, start, strategy, ctx.program.pins.get(ctx.op.name))
    except PlanningError:
        refused = spans.refused.get(ctx.op.name)
        if refused is not None:
            raise refused from None
        raise


def distribute(ctx: OpContext, minimum: dict[str, int], strategy: Strategy,
               pins: dict[str, int] | None = None) -> dict[str, int]:
    """Splits for one op under ``strategy`` (starting from ``minimum``); pinned dims keep their
    pinned counts."""
    if not isinstance(strategy, Balanced | Greedy):  # a name here is a caller's slip
        raise PlanningError(f"op {ctx.op.name!r}: work distribution needs a strategy object "
                            f"(Balanced(), Greedy()), got {type(strategy).__name__} "
                            f"{strategy!r}; parse_strategy turns a name into one")
    divisible = ctx.op.kind.divisible
    if not divisible and any(n != 1 for n in (pins or {}).values()):
        raise PlanningError(f"op {ctx.op.name!r}: a fallback op runs on one core; work_division "
                            f"{pins} cannot split it")
    if not divisible or pins:
        if pins and divisible:
            # a dim the pins leave out is whole, but for a reduction split the split-K stage
            # fixed (the pass leaves it to pins that name the reduction dim)
            pins = check_pins(ctx, {**ctx.fixed_map, **pins})
        fixed = {d: (pins or {}).get(d, 1) if divisible else 1 for d in ctx.sizes}
        worst = ctx.span_check(fixed).worst
        if worst is not None:
            why = "fallback op cannot be divided but" if not divisible else \
                f"work_division {pins} leaves"
            raise PlanningError(f"op {ctx.op.name!r}: {why} tensor {worst[0]!r} spanning "
                                f"{worst[1]} bytes > limit {ctx.target.span_limit}")
        return fixed
    if isinstance(strategy, Greedy):
        return greedy(ctx, minimum, strategy.rule)
    return balanced(ctx, minimum)
