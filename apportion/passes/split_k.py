"""Pass `split_k`: how each op's reduction dim is split across cores, decided by the target.

For every op with a reducer (reductions and matmul) the pass asks, in order: the program's pin
(``"split_k": {"mm": 8}``), then the resolver the planner was given (a Python callable), then the
target's resolver (``Target.split_k``: ``cost``, ``gpu``, ``table`` or ``none``; see
``apportion.target.split_k``). A decision fixes the split of the op's widest reduction dim (the
op's other reduction dims stay whole) before span reduction and work distribution, which then
divide the remaining cores among the other dims; ``cost`` (Spyre's) decides nothing here and
leaves the reduction split to work distribution's search by predicted time.

A resolver's factor is capped at what the op and target allow (the dim's planning units, the
core count, the cores an op's ``work_division`` pins leave); a pinned factor that cannot be
honoured is an error naming op, dim and factor. A ``work_division`` pin naming a reduction dim is
the user's split of it: the resolvers are not asked. Other pins are checked against the op as
written and follow it into its partial and combine ops.

The pipeline then rewrites each decided split into two ops (``partials``): a partial op over
``[slices, ...output dims]`` reading the reduction dim as ``K/f * s + k``, its slice dim fixed
across ``f`` cores, and a combine op reducing the slices with the kind's reducer. Argmax (its
partials are value-index pairs), slices that are not whole sticks and ops in loop groups keep the
decided split inside the op instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from apportion.cost.model import batch_dims, matmul_rows
from apportion.errors import PlanningError
from apportion.ir.affine import AffineExpr
from apportion.ir.dtypes import FLOAT_DTYPES
from apportion.ir.kinds import Category
from apportion.ir.op import Access, Op
from apportion.ir.program import Program, Symbol, TensorType
from apportion.passes.coarse_tile import coarse_tile
from apportion.passes.geometry import OpContext, check_pins, contexts
from apportion.passes.layouts import layouts
from apportion.passes.relayout import relayout
from apportion.plans.plan import SplitK
from apportion.target.split_k import (
    ReductionShape,
    Resolver,
    SelectChain,
    gpu_chain,
    gpu_slices,
    table_chain,
    table_slices,
)
from apportion.target.target import Target


@dataclass(frozen=True)
class SplitKDecisions:
    """The split-K pass's result: per op, its ``SplitK`` or None (left to work distribution)."""

    by_op: Mapping[str, SplitK | None]

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_op", MappingProxyType(dict(self.by_op)))


def reduction_shape(ctx: OpContext, symbols: Mapping[str, Symbol] | None = None
                    ) -> ReductionShape | None:
    """The op's reduction problem as resolvers see it, or None for ops without a reducer.
    ``symbols`` maps the op's dims to the symbols naming their run-time sizes."""
    op = ctx.op
    if op.kind.reducer is None or not op.kind.divisible or not op.reduction_dims:
        return None
    sizes = ctx.sizes
    dim = max(op.reduction_dims, key=lambda d: (ctx.units[d], -op.reduction_dims.index(d)))
    k = math.prod(sizes[d] for d in op.reduction_dims)
    dtype = ctx.program.tensor(op.ins[0].tensor).dtype
    # a run-time K only when the split dim is the op's one reduction dim (else K is a product)
    sym = (symbols or {}).get(dim) if len(op.reduction_dims) == 1 else None
    symbol = None if sym is None else sym.name
    if op.category is Category.MATMUL:
        rows, batch = matmul_rows(op), batch_dims(op)
        second = set(op.ins[1].dims)
        cols = tuple(d for d in op.out.dims if d in second and d not in batch)
        return ReductionShape(math.prod(sizes[d] for d in batch),
                              math.prod(sizes[d] for d in rows),
                              math.prod(sizes[d] for d in cols), k, dim, dtype, op.name, symbol)
    return ReductionShape(1, math.prod(sizes[d] for d in op.out.dims), 1, k, dim, dtype, op.name,
                          symbol)


def _target_slices(ctx: OpContext, shape: ReductionShape
                   ) -> tuple[int | SelectChain | None, str]:
    target = ctx.target
    if shape.symbol is not None and target.split_k in ("gpu", "table"):
        unit, cap = ctx.per[shape.dim], target.cores
        chain = gpu_chain(shape, unit, cap) if target.split_k == "gpu" else table_chain(
            target.split_k_table, shape, unit, cap)
        if chain is None:
            return (1, "gpu") if target.split_k == "gpu" else (None, "cost")
        return chain, target.split_k
    if target.split_k == "gpu":
        return gpu_slices(shape) or 1, "gpu"
    if target.split_k == "table":
        found = table_slices(target.split_k_table, shape)
        return (None, "cost") if found is None else (found, "table")
    if target.split_k == "none":
        return 1, "none"
    return None, "cost"


def split_k(ctxs: Mapping[str, OpContext], pins: Mapping[str, int],
            user: Resolver | None = None,
            symbols: Mapping[str, Mapping[str, Symbol]] | None = None) -> SplitKDecisions:
    """The split-K pass (see the module docstring).

    ``symbols`` (op -> dim -> ``Symbol``) marks reduction sizes known only at run time: for those a
    resolver may return a ``SelectChain`` (``gpu`` and ``table`` do), and the decision carries
    it with its choice at the planning size.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.geometry import contexts
    >>> from apportion.passes.layouts import layouts
    >>> from apportion.target import spyre
    >>> p = load("examples/mlp.json")
    >>> ctxs = contexts(p, spyre(), layouts(p, spyre()), {o.name: o.sizes for o in p.ops})
    >>> split_k(ctxs, {"down": 4}).by_op["down"]
    SplitK(dims=('k',), factor=4, by='pinned', select=None)
    >>> split_k(ctxs, {}).by_op["down"] is None   # spyre: left to the cost model's search
    True
    """
    out: dict[str, SplitK | None] = {}
    for name, ctx in ctxs.items():
        shape = reduction_shape(ctx, (symbols or {}).get(name))
        held = ctx.program.pins.get(name, {})
        if name in pins:
            out[name] = _pinned(ctx, shape, pins[name])
            continue
        if shape is None or any(d in held for d in ctx.op.reduction_dims):
            # a work_division pin naming a reduction dim is the user's split of it
            out[name] = None
            continue
        if held:
            # the pins follow the op into its partial and combine ops: a fault names the op
            # and dim the user pinned, not theirs
            check_pins(ctx, held)
        slices, by = (user(shape), "user") if user is not None else (None, "cost")
        if slices is None:
            slices, by = _target_slices(ctx, shape)
        if slices is None:
            out[name] = None
            continue
        # the cores the op's pinned dims leave (work distribution keeps the pins)
        budget = ctx.target.cores // math.prod(held.values()) if held else ctx.target.cores
        cap = min(ctx.units[shape.dim], budget) if ctx.splittable(shape.dim) else 1
        if isinstance(slices, SelectChain):
            if held and max(slices.factors) > budget:
                out[name] = None  # the pins leave too few cores for the chain's slices
                continue
            out[name] = _chosen(ctx, shape, slices, by, (symbols or {}).get(name, {}).get(
                shape.dim))
            continue
        if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
            raise PlanningError(f"op {name!r}: the {by} split-K resolver returned {slices!r}; "
                                "it must return a positive int (slices), a SelectChain (for a "
                                "run-time K) or None")
        out[name] = SplitK((shape.dim,), min(slices, cap), by)
    return SplitKDecisions(out)


def _chosen(ctx: OpContext, shape: ReductionShape, chain: SelectChain, by: str,
            symbol: Symbol | None) -> SplitK:
    """A select chain's decision: its choice at the planning size, carrying the chain without
    the cases the symbol's bounds rule out; a static choice where K is static, one choice is
    left, or the op's partials cannot be cut at run time (argmax)."""
    name, d = ctx.op.name, shape.dim
    if symbol is not None:
        chain = replace(chain, cases=tuple(
            c for c in chain.cases if not ((symbol.max is not None and c.lo is not None and
                                            c.lo > symbol.max) or
                                           (c.hi is not None and c.hi < symbol.min))))
    if shape.symbol is None:
        raise PlanningError(f"op {name!r}: the {by} split-K resolver returned a select chain, "
                            f"but reduction dim {d!r} has a static size {shape.k}; return an int")
    if not ctx.splittable(d) and any(f > 1 for f in chain.factors):
        raise PlanningError(f"op {name!r}: the {by} select chain splits reduction dim {d!r}, "
                            f"whose last stick is padded; target {ctx.target.name!r} cannot "
                            "split it")
    over = [f for f in chain.factors if f > ctx.target.cores]
    if over:
        raise PlanningError(f"op {name!r}: the {by} select chain for {shape.symbol!r} gives "
                            f"{over[0]} slices, more than the target's {ctx.target.cores} cores")
    factor = chain.evaluate(shape.k)
    if _divides(ctx, d, factor) is not None:
        raise PlanningError(f"op {name!r}: the {by} select chain gives {factor} slices of "
                            f"reduction dim {d!r} at its planning size {shape.k}: "
                            f"{_divides(ctx, d, factor)}")
    cases = list(chain.cases)
    while cases and cases[-1].factor == chain.default:  # cases that change nothing
        cases.pop()
    if not cases or not _partials_combine(ctx):
        # one choice whatever the size, or a split inside the op (argmax): a static split
        return SplitK((d,), factor, by)
    return SplitK((d,), factor, by, replace(chain, cases=tuple(cases)))


def _divides(ctx: OpContext, d: str, factor: int) -> str | None:
    """Why ``factor`` slices of dim ``d`` are not whole planning units (None: they are)."""
    size, per = ctx.sizes[d], ctx.per[d]
    if factor > 1 and (size % factor or (size // factor) % per):
        return f"{size} is not {factor} slices of whole {per}-element units"
    return None


def _pinned(ctx: OpContext, shape: ReductionShape | None, factor: int) -> SplitK:
    name = ctx.op.name
    if shape is None:
        raise PlanningError(f"op {name!r}: split_k pins {factor} slices, but a "
                            f"{ctx.op.category} op has no reduction dim to split")
    d = shape.dim
    if factor > 1 and not ctx.splittable(d):
        raise PlanningError(f"op {name!r}: split_k {factor} of reduction dim {d!r}: its last "
                            f"stick is padded and target {ctx.target.name!r} cannot split it")
    if factor > ctx.units[d] or factor > ctx.target.cores:
        unit = "sticks" if d in ctx.layout.stick_dims else "elements"
        raise PlanningError(f"op {name!r}: split_k {factor} of reduction dim {d!r} exceeds its "
                            f"{ctx.units[d]} {unit} or the target's {ctx.target.cores} cores")
    return SplitK((d,), factor, "pinned")


def with_split_k(ctxs: Mapping[str, OpContext], decisions: SplitKDecisions
                 ) -> dict[str, OpContext]:
    """The contexts with each decision fixed (``OpContext.fixed``)."""
    out = {}
    for name, ctx in ctxs.items():
        d = decisions.by_op.get(name)
        out[name] = ctx if d is None else replace(
            ctx, fixed=tuple((dim, d.factor) for dim in d.dims))
    return out


def partial_name(op: str) -> str:
    return f"{op}.partial"


def combine_name(op: str) -> str:
    return f"{op}.combine"


def _partials_combine(ctx: OpContext) -> bool:
    """Whether the op's slices can be separate partial results combined by a second op: not
    argmax's value-index pairs, and not an integer mean (a mean of truncated slice means is not
    the truncated mean)."""
    reducer = ctx.op.kind.reducer
    if reducer is None or reducer.pairs:
        return False
    out = ctx.program.tensor(ctx.op.out.tensor).dtype
    return not (ctx.op.fn == "mean" and out not in FLOAT_DTYPES)


def _rewritable(ctx: OpContext, decision: SplitK | None, grouped: bool) -> bool:
    """A decided split of one reduction dim into whole-stick slices of an op outside loops,
    whose partials are plain arrays (not argmax's value-index pairs)."""
    if decision is None or grouped or len(decision.dims) != 1:
        return False
    if decision.factor <= 1 and decision.select is None:  # a chain's slices vary: always cut
        return False
    if not _partials_combine(ctx):
        return False
    d, f = decision.dims[0], decision.factor
    size, per = ctx.sizes[d], ctx.per[d]
    return f == 1 or (size % f == 0 and (size // f) % per == 0)


def _split(e: AffineExpr, d: str, s: str, k: str, step: int) -> AffineExpr:
    """``e`` with dim ``d`` replaced by ``step * s + k`` (slice ``s``, offset ``k`` in it)."""
    c = e.coeff(d)
    if not c:
        return e
    terms = [(x, cx) for x, cx in e.terms if x != d] + [(s, c * step), (k, c)]
    return AffineExpr(tuple(terms), e.const)


def _fresh(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def partials(program: Program, ctxs: Mapping[str, OpContext], decisions: SplitKDecisions,
             grouped: frozenset[str]) -> tuple[Program, dict[str, SplitK]]:
    """``program`` with every split-K op rewritten as a partial op and a combine op.

    The partial op computes each slice's partial result into ``[slices, ...output dims]``
    (its slice dim indexes the reduction dim as ``K/f * s + k``) in the reducer's accumulator
    dtype; the combine op reduces the slice dim with the kind's reducer (a matmul's sums) into
    the original output. Returns the program and, per partial op, the split that fixes its slice
    dim across cores. Ops in loop groups, argmax and uneven slices keep the split inside the op.
    """
    new_ops: list[Op] = []
    new_tensors = list(program.tensors)
    fixed: dict[str, SplitK] = {}
    pins: dict[str, dict[str, int]] = {}  # the work_division pins of the new ops
    for op in program.ops:
        ctx, decision = ctxs[op.name], decisions.by_op.get(op.name)
        if not _rewritable(ctx, decision, op.name in grouped):
            new_ops.append(op)
            continue
        assert decision is not None and op.kind.reducer is not None
        d, f = decision.dims[0], decision.factor
        step = ctx.sizes[d] // f
        letters = set(op.dim_names)
        s, k = _fresh(f"{d}_slice", letters), _fresh(f"{d}_in", letters)

        out_t = program.tensor(op.out.tensor)
        acc_dtype = op.kind.reducer.accumulator_dtype(out_t.dtype)
        names = {t.name for t in new_tensors}
        partial_t = _fresh(f"{op.out.tensor}.partials", names)
        # a scalar's partials get a trailing size-1 axis: the slice axis innermost would be
        # the stick dim, and slices of whole sticks cannot hand each core one slice
        tail = (AffineExpr.constant(0),) if not op.out.index else ()
        partial_index = (AffineExpr.dim(s), *op.out.index, *tail)
        sizes = {**op.sizes, s: f, k: step}
        sizes.pop(d)
        partial = Op.build(partial_name(op.name), op.fn, Access(partial_t, partial_index),
                           tuple(Access(a.tensor, tuple(_split(e, d, s, k, step)
                                                        for e in a.index))
                                 for a in op.ins), sizes, dict(op.attrs))
        new_tensors.append(TensorType(partial_t, (f, *out_t.shape, *(1,) * len(tail)),
                                      acc_dtype))
        combine_fn = "sum" if op.category is Category.MATMUL else op.fn
        combine = Op.build(combine_name(op.name), combine_fn, op.out,
                           (Access(partial_t, partial_index),),
                           {x: n for x, n in sizes.items() if x in {s, *op.out.dims}})
        new_ops += [partial, combine]
        fixed[partial.name] = SplitK((s,), f, decision.by, decision.select)
        held = program.pins.get(op.name)
        if held:
            # the op's pins follow it into both ops (they never name the split dim: the pass
            # leaves such an op to work distribution); the slices keep their fixed count
            pins[partial.name] = {x: n for x, n in held.items() if x in partial.sizes}
            pins[combine.name] = {x: n for x, n in held.items() if x in combine.sizes}
    if not fixed:
        return program, {}
    cut = {name.removesuffix(".partial") for name in fixed}
    split_k = tuple((n, f) for n, f in program.split_k if n not in cut)
    work = tuple((n, p) for n, p in program.work_division if n not in cut)
    work += tuple((n, tuple(p.items())) for n, p in pins.items() if p)
    return replace(program, tensors=tuple(new_tensors), ops=tuple(new_ops),
                   split_k=split_k, work_division=work), fixed


def rewrite_as_planned(program: Program, target: Target,
                       split: Mapping[str, SplitK]) -> Program:
    """``program`` rewritten as the pipeline rewrites it (its relayout ops, see pass
    ``relayout``) and into partial and combine ops as a plan records it (``split``: the split-K
    of each partial op, by its name), so that a plan read back meets its program."""
    program, _ = relayout(program, target)
    asked = {name.removesuffix(".partial"): s for name, s in split.items()
             if name.endswith(".partial")}
    if not asked:
        return program
    lay = layouts(program, target)
    tiling = coarse_tile(program, lay.ops, target.max_loop_count)
    ctxs = contexts(program, target, lay, {op.name: tiling.sizes(op) for op in program.ops})
    grouped = frozenset(n for g in tiling.groups for n in g.ops)
    rewritten, _ = partials(program, ctxs, SplitKDecisions(
        {n: asked.get(n) for n in ctxs}), grouped)
    return rewritten
