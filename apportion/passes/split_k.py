"""Pass `split_k`: how each op's reduction dims are split across cores, decided by the target.

For every op with a reducer (reductions and matmul) the pass asks, in order: the program's pin,
then the resolver the planner was given (a Python callable), then the target's resolver
(``Target.split_k``: ``cost``, ``gpu``, ``table`` or ``none``; see ``apportion.target.split_k``).
A pin is a slice count of the op's widest reduction dim (``"split_k": {"mm": 8}``), ``"?"``
(the target's resolver decides, the user resolver is not asked), a tile size (``{"tile":
512}``: slices of 512 elements of that dim) or slices or tile sizes per reduction dim
(``{"slices": {"c": 4, "kh": 3}}``, ``{"tile": {"c": 64}}``). A decision fixes the split of
the dims it names (the op's other reduction dims stay whole) before span reduction and work
distribution, which then divide the remaining cores among the other dims; ``cost`` (Spyre's)
decides nothing here and leaves the reduction split to work distribution's search by predicted
time.

The ``gpu`` resolver sorts the op into IREE's families (``family``: outer reduction,
convolution, matmul-like, arg-compare; inner reductions ask the matmul-like rule) from its
iteration space and indexing maps, and may cut more than one reduction dim (a convolution's C,
KH and KW). Its factor is IREE's: it is not clamped to the core count, since the partial op's
slice dims are divided over the cores there are (2000 slices on 304 cores: 250 cores run 8
slices each). The other resolvers' factors are capped at what the op and target allow (the
dim's planning units, the cores an op's ``work_division`` pins leave); a pin may exceed the
cores where the op becomes partial and combine ops. A run-time K's select chain keeps the
static resolver's factors (its cases may exceed the cores: a run cuts the chosen slices over the
cores the partial op's slice dim was spread over). Of several reduction dims, a run-time one
is never cut by a target's resolver (a static count cuts it into whole slices only at its
multiples): the gpu rules leave it whole, one slice count cuts a static dim, and a table
leaves an op whose reduction dims are all run-time sizes to the cost model. A pin that cannot
be honoured is an error naming op, dims and factor. A ``work_division`` pin naming a
reduction dim is the user's split of it: the resolvers are not asked. Other pins are checked
against the op as written and follow it into its partial and combine ops.

The pipeline then rewrites each decided split into two ops (``partials``): a partial op over
``[slices..., ...output dims]`` (one slice dim per cut dim) reading each cut dim as
``K/f * s + k``, its slice dims fixed across the cores, and a combine op reducing the slices
with the kind's reducer. Argmax (its partials are value-index pairs), slices that are not whole
sticks and ops in loop groups keep the decided split inside the op instead: one dim, at most
the cores (a resolver's split is cut to its largest dim and the cores; a pin asking more is
refused).
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
from apportion.ir.program import SPLIT_K_AUTO, Program, SplitKPin, Symbol, TensorType
from apportion.passes.coarse_tile import coarse_tile
from apportion.passes.geometry import OpContext, check_pins, contexts
from apportion.passes.layouts import layouts
from apportion.passes.relayout import relayout
from apportion.plans.plan import SplitK
from apportion.target.split_k import ReductionShape, Resolver, SelectChain
from apportion.target.target import Target


@dataclass(frozen=True)
class SplitKDecisions:
    """The split-K pass's result: per op, its ``SplitK`` or None (left to work distribution)."""

    by_op: Mapping[str, SplitK | None]

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_op", MappingProxyType(dict(self.by_op)))


@dataclass(frozen=True)
class ConvDims:
    """A convolution's dims as IREE's ``inferConvolutionDims`` sorts them: the filter loops
    (reduction dims read in a window pair ``h+kh``), the output image dims of those pairs, the
    output channels (only the filter and output index them), the batch (only the image and
    output; none where the frontend folded a batch of 1) and depth dims (all three)."""

    filter: tuple[str, ...]
    image: tuple[str, ...]
    channels: tuple[str, ...]
    batch: tuple[str, ...]
    depth: tuple[str, ...]
    #: the batch is the output's outermost dim (NCHW, NHWC), not a weight-gradient layout
    batch_first: bool


def conv_dims(op: Op) -> ConvDims | None:
    """The convolution dims of a matmul-like op whose first input reads a window pair, or None.

    >>> from apportion.ir.op import Access
    >>> op = Op.build("c", "matmul", Access.parse("y[n,h,f]"),
    ...               (Access.parse("x[n,h+r,c]"), Access.parse("w[r,c,f]")),
    ...               {"n": 2, "h": 8, "f": 4, "r": 3, "c": 16})
    >>> conv_dims(op).filter, conv_dims(op).channels, conv_dims(op).batch_first
    (('r',), ('f',), True)
    """
    if op.category is not Category.MATMUL or len(op.ins) != 2:
        return None
    x, w = op.ins
    red, out = set(op.reduction_dims), set(op.out.dims)
    windows = [e for e in x.index if len(e.dims) >= 2]
    filt = tuple(d for d in op.reduction_dims if any(d in e.dims for e in windows))
    image = tuple(d for d in op.out.dims if any(d in e.dims for e in windows))
    if not filt or not image or not all(d in w.dims for d in filt) or not red:
        return None
    xd, wd = set(x.dims), set(w.dims)
    channels = tuple(d for d in op.out.dims if d in wd and d not in xd)
    batch = tuple(d for d in op.out.dims if d in xd and d not in wd and d not in image)
    depth = tuple(d for d in op.out.dims if d in xd and d in wd and d not in image)
    if not channels or not out:
        return None
    first = next((i for i, e in enumerate(op.out.index) if e.dims), 0)
    batch_first = not batch or any(d in batch for d in op.out.index[first].dims)
    return ConvDims(filt, image, channels, batch, depth, batch_first)


def family(op: Op) -> str:
    """The split-K family of an op with a reducer (``apportion.target.split_k.FAMILIES``): arg-
    compare for argmax/argmin, convolution for a matmul reading a window pair, matmul-like for
    another matmul with two or more parallel dims, outer reduction where the first input's
    outermost indexed dim is a reduction dim, else an inner reduction.

    >>> from apportion.ir.op import Access
    >>> def red(fn, x, y):
    ...     return Op.build("r", fn, Access.parse(y), (Access.parse(x),), {"k": 64, "n": 8})
    >>> family(red("sum", "x[k,n]", "y[n]")), family(red("sum", "x[n,k]", "y[n]"))
    ('outer_reduction', 'inner_reduction')
    >>> family(red("argmax", "x[n,k]", "y[n]"))
    'arg_compare'
    """
    reducer = op.kind.reducer
    if reducer is not None and reducer.pairs:
        return "arg_compare"
    if op.category is Category.MATMUL:
        if conv_dims(op) is not None:
            return "convolution"
        return "matmul_like" if len(op.parallel_dims) >= 2 else "inner_reduction"
    outer = next((e for e in op.ins[0].index if e.dims), None) if op.ins else None
    if outer is not None and any(d in op.reduction_dims for d in outer.dims):
        return "outer_reduction"
    return "inner_reduction"


def reduction_shape(ctx: OpContext, symbols: Mapping[str, Symbol] | None = None
                    ) -> ReductionShape | None:
    """The op's reduction problem as resolvers see it, or None for ops without a reducer.
    ``symbols`` maps the op's dims to the symbols naming their run-time sizes."""
    op = ctx.op
    if op.kind.reducer is None or not op.kind.divisible or not op.reduction_dims:
        return None
    sizes = ctx.sizes
    runtime = tuple(d for d in op.reduction_dims if d in (symbols or {}))
    # the dim one slice count cuts: a static one where there is one (a static count cuts a
    # run-time size into whole slices only at its multiples), then the widest
    dim = max(op.reduction_dims, key=lambda d: (d not in runtime, ctx.units[d],
                                                -op.reduction_dims.index(d)))
    k = math.prod(sizes[d] for d in op.reduction_dims)
    dtype = ctx.program.tensor(op.ins[0].tensor).dtype
    # a run-time K only when the split dim is the op's one reduction dim (else K is a product)
    sym = (symbols or {}).get(dim) if len(op.reduction_dims) == 1 else None
    symbol = None if sym is None else sym.name
    fam = family(op)
    extra: dict[str, object] = {
        "family": fam, "reduction": tuple((d, sizes[d]) for d in op.reduction_dims),
        "runtime": runtime}
    conv = conv_dims(op) if fam == "convolution" else None
    if conv is not None:
        size = lambda dims: math.prod(sizes[d] for d in dims)  # noqa: E731
        extra.update(channels=size(conv.channels), image=size(conv.image),
                     depth=size(conv.depth), conv_batch=size(conv.batch),
                     batch_first=conv.batch_first)
    if op.category is Category.MATMUL:
        rows, batch = matmul_rows(op), batch_dims(op)
        second = set(op.ins[1].dims)
        cols = tuple(d for d in op.out.dims if d in second and d not in batch)
        return ReductionShape(math.prod(sizes[d] for d in batch),
                              math.prod(sizes[d] for d in rows),
                              math.prod(sizes[d] for d in cols), k, dim, dtype, op.name, symbol,
                              **extra)  # type: ignore[arg-type]
    return ReductionShape(1, math.prod(sizes[d] for d in op.out.dims), 1, k, dim, dtype, op.name,
                          symbol, **extra)  # type: ignore[arg-type]


def _target_slices(ctx: OpContext, shape: ReductionShape
                   ) -> tuple[int | dict[str, int] | SelectChain | None, str]:
    """The target's resolver asked (``Target.split_k.decide``), within the cores the op's
    pins leave."""
    target = ctx.target
    held = ctx.program.pins.get(ctx.op.name, {})
    budget = target.cores // math.prod(held.values()) if held else target.cores
    return target.split_k.decide(shape, target, budget, ctx.per[shape.dim])


def split_k(ctxs: Mapping[str, OpContext], pins: Mapping[str, int | str | SplitKPin],
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
    SplitK(dims=('k',), factor=4, by='pinned', select=None, factors=())
    >>> split_k(ctxs, {"down": SplitKPin(tiles=(("", 256),))}).by_op["down"].factor  # 2816
    11
    >>> split_k(ctxs, {}).by_op["down"] is None   # spyre: left to the cost model's search
    True
    """
    out: dict[str, SplitK | None] = {}
    for name, ctx in ctxs.items():
        shape = reduction_shape(ctx, (symbols or {}).get(name))
        held = ctx.program.pins.get(name, {})
        pin = pins.get(name)
        if pin is not None and pin != SPLIT_K_AUTO:
            out[name] = _pinned(ctx, shape, pin)
            continue
        if pin is not None and shape is None:
            raise PlanningError(f"op {name!r}: split_k pins \"?\", but a {ctx.op.category} op "
                                "has no reduction dim to split")
        if shape is None or any(d in held for d in ctx.op.reduction_dims):
            # a work_division pin naming a reduction dim is the user's split of it
            out[name] = None
            continue
        if held:
            # the pins follow the op into its partial and combine ops: a fault names the op
            # and dim the user pinned, not theirs
            check_pins(ctx, held)
        # "?": the target decides, whatever resolver the planner was given
        slices: int | dict[str, int] | SelectChain | None = None
        by = "cost"
        if user is not None and pin is None:
            slices, by = user(shape), "user"
        if slices is None:
            slices, by = _target_slices(ctx, shape)
        if slices is None:
            out[name] = None
            continue
        # the cores the op's pinned dims leave (work distribution keeps the pins)
        budget = ctx.target.cores // math.prod(held.values()) if held else ctx.target.cores
        if isinstance(slices, SelectChain):
            out[name] = _chosen(ctx, shape, slices, by, (symbols or {}).get(name, {}).get(
                shape.dim), budget)
            continue
        if isinstance(slices, dict):  # the gpu resolver: slices per dim, not clamped
            out[name] = _resolved(ctx, shape, slices, by, budget, clamp=False)
            continue
        if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
            raise PlanningError(f"op {name!r}: the {by} split-K resolver returned {slices!r}; "
                                "it must return a positive int (slices), a SelectChain (for a "
                                "run-time K) or None")
        out[name] = _resolved(ctx, shape, {shape.dim: slices}, by, budget, clamp=True)
    return SplitKDecisions(out)


def _resolved(ctx: OpContext, shape: ReductionShape, per_dim: Mapping[str, int], by: str,
              budget: int, clamp: bool) -> SplitK:
    """A resolver's decision: as asked where the op becomes partial and combine ops (``clamp``:
    at most the cores), else one dim inside the op, at most its units and the cores."""
    cut = {d: f for d, f in per_dim.items() if f > 1}
    if not cut:
        return SplitK((shape.dim,), 1, by)
    if clamp:  # one dim (an int from a resolver): at most the cores
        cut = {d: min(f, budget) for d, f in cut.items()}
    if _spreads(ctx, cut) is None:
        return _decision(ctx, cut, by)
    # the dims that can be cut into partials alone (a dim whose slices are not whole sticks
    # cannot), else the split stays inside the op
    ok = {d: f for d, f in cut.items() if _spreads(ctx, {d: f}) is None}
    if ok and _spreads(ctx, ok) is None:
        return _decision(ctx, ok, by)
    # the split stays inside the op: its widest cut dim, within its units and the cores
    d = max(cut, key=lambda x: (cut[x], -ctx.op.reduction_dims.index(x)))
    cap = min(ctx.units[d], budget) if ctx.splittable(d) else 1
    return SplitK((d,), min(cut[d], cap), by)


def _decision(ctx: OpContext, cut: Mapping[str, int], by: str) -> SplitK:
    """The SplitK of ``cut`` (dim -> slices), its dims in the op's order."""
    dims = tuple(d for d in ctx.op.reduction_dims if d in cut)
    factors = tuple(cut[d] for d in dims)
    return SplitK(dims, math.prod(factors), by,
                  factors=factors if len(dims) > 1 else ())


def _spreads(ctx: OpContext, cut: Mapping[str, int]) -> str | None:
    """Why ``cut`` cannot become partial and combine ops (None: it can; their slices are then
    divided over the cores there are, however many)."""
    if ctx.loop is not None:
        return "the op is in a loop group"
    if not _partials_combine(ctx):
        return ("argmax's partials are value-index pairs" if ctx.op.kind.reducer is not None
                and ctx.op.kind.reducer.pairs else "an integer mean's slice means truncate")
    for d, f in cut.items():
        if not ctx.splittable(d):
            return f"dim {d!r} has a padded last stick"
        why = _divides(ctx, d, f, ctx.target.split_padded_reduction)
        if why is not None:
            return f"dim {d!r}: {why}"
    return None


def _chosen(ctx: OpContext, shape: ReductionShape, chain: SelectChain, by: str,
            symbol: Symbol | None, budget: int) -> SplitK:
    """A select chain's decision: its choice at the planning size, carrying the chain without
    the cases the symbol's bounds rule out; a static choice where K is static, one choice is
    left, or the op's partials cannot be cut at run time (argmax: a split inside the op, at
    most its units and the ``budget`` of cores, as a static resolver's). A case may give more
    slices than cores: the partial op's slice dim is divided over the cores (``with_split_k``)
    and a run cuts the chosen slices into that many parts, several slices a core."""
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
    factor = chain.evaluate(shape.k)
    if _divides(ctx, d, factor) is not None:
        raise PlanningError(f"op {name!r}: the {by} select chain gives {factor} slices of "
                            f"reduction dim {d!r} at its planning size {shape.k}: "
                            f"{_divides(ctx, d, factor)}")
    cases = list(chain.cases)
    while cases and cases[-1].factor == chain.default:  # cases that change nothing
        cases.pop()
    if not _partials_combine(ctx):
        # a split inside the op (argmax): static, within its units and the cores
        return SplitK((d,), min(factor, ctx.units[d], budget), by)
    if not cases:  # one choice whatever the size: a static split
        return SplitK((d,), factor, by)
    return SplitK((d,), factor, by, replace(chain, cases=tuple(cases)))


def _divides(ctx: OpContext, d: str, factor: int, padded: bool = False) -> str | None:
    """Why ``factor`` slices of dim ``d`` are not whole planning units (None: they are);
    ``padded``: a slice may end in a part of a unit (the target pads a split stick)."""
    size, per = ctx.sizes[d], ctx.per[d]
    if factor > 1 and (size % factor or (not padded and (size // factor) % per)):
        return f"{size} is not {factor} slices of whole {per}-element units"
    return None


def _pinned(ctx: OpContext, shape: ReductionShape | None, pin: int | SplitKPin) -> SplitK:
    name = ctx.op.name
    if shape is None:
        raise PlanningError(f"op {name!r}: split_k pins {_show_pin(pin)}, but a "
                            f"{ctx.op.category} op has no reduction dim to split")
    cut = _pin_slices(ctx, shape, pin)
    for d, factor in cut.items():
        if factor > 1 and not ctx.splittable(d):
            raise PlanningError(f"op {name!r}: split_k {factor} of reduction dim {d!r}: its "
                                f"last stick is padded and target {ctx.target.name!r} cannot "
                                "split it")
        if factor > ctx.units[d]:
            unit = "sticks" if d in ctx.layout.stick_dims else "elements"
            raise PlanningError(f"op {name!r}: split_k {factor} of reduction dim {d!r} exceeds "
                                f"its {ctx.units[d]} {unit}")
    cut = {d: f for d, f in cut.items() if f > 1} or {shape.dim: 1}
    why = _spreads(ctx, cut)
    if len(cut) > 1 and why is not None:
        raise PlanningError(f"op {name!r}: split_k of reduction dims "
                            f"{', '.join(repr(d) for d in cut)}: more than one dim is cut only "
                            f"into partial and combine ops, and {why}")
    (d, factor), = cut.items() if len(cut) == 1 else ((None, 0),)
    if d is not None and why is not None and factor > ctx.target.cores:
        raise PlanningError(f"op {name!r}: split_k {factor} of reduction dim {d!r} exceeds the "
                            f"target's {ctx.target.cores} cores; more slices than cores need "
                            f"partial and combine ops, and {why}")
    return replace(_decision(ctx, cut, "pinned"), dims=tuple(
        x for x in ctx.op.reduction_dims if x in cut))


def _show_pin(pin: int | SplitKPin) -> str:
    return str(pin) if isinstance(pin, int) else str(pin.to_doc())


def _pin_slices(ctx: OpContext, shape: ReductionShape, pin: int | SplitKPin
                ) -> dict[str, int]:
    """A pin's slices per reduction dim (a tile size must divide its dim)."""
    if isinstance(pin, int):
        return {shape.dim: pin}
    out = {}
    for d, n in pin.tiles:
        d = d or shape.dim
        size = ctx.sizes[d]
        if n > size or size % n:
            raise PlanningError(f"op {ctx.op.name!r}: split_k tile {n} of reduction dim {d!r} "
                                f"does not divide its {size} elements")
        out[d] = size // n
    for d, n in pin.slices:
        out[d or shape.dim] = n
    return out


def with_split_k(ctxs: Mapping[str, OpContext], decisions: SplitKDecisions
                 ) -> dict[str, OpContext]:
    """The contexts with each decision fixed (``OpContext.fixed``). A partial op's slice dims
    (its parallel dims) are divided over the cores there are: each takes the largest divisor of
    its slices within the cores the op's pins and the earlier slice dims leave, so a core runs
    several slices where there are more slices than cores."""
    out = {}
    for name, ctx in ctxs.items():
        d = decisions.by_op.get(name)
        if d is None:
            out[name] = ctx
            continue
        per = d.per_dim
        if all(x in ctx.op.parallel_dims for x in per):
            held = ctx.program.pins.get(name, {})
            left = ctx.target.cores // math.prod(held.values()) if held else ctx.target.cores
            spread = {}
            for x, f in per.items():
                # whole planning units of the slice dim (slices narrower than a stick share
                # one: a core then takes a stick's worth of them)
                units = ctx.units[x]
                spread[x] = max(c for c in range(1, min(f, units, max(left, 1)) + 1)
                                if f % c == 0 and units % c == 0)
                left //= spread[x]
            per = spread
        out[name] = replace(ctx, fixed=tuple(per.items()))
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
    """A decided split into whole-stick slices of an op outside loops, whose partials are plain
    arrays (not argmax's value-index pairs)."""
    if decision is None or grouped:
        return False
    if decision.factor <= 1 and decision.select is None:  # a chain's slices vary: always cut
        return False
    if not _partials_combine(ctx):
        return False
    if decision.select is not None:
        return True
    padded = ctx.target.split_padded_reduction
    return all(f == 1 or _divides(ctx, d, f, padded) is None
               for d, f in decision.per_dim.items())


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

    The partial op computes each slice's partial result into ``[slices..., ...output dims]``
    (a slice dim per cut dim, indexing it as ``K/f * s + k``) in the reducer's accumulator
    dtype; the combine op reduces the slice dims with the kind's reducer (a matmul's sums) into
    the original output. Returns the program and, per partial op, the split that fixes its slice
    dims across cores. Ops in loop groups, argmax and uneven slices keep the split inside the
    op.
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
        letters = set(op.dim_names)
        sizes = dict(op.sizes)
        ins = [a.index for a in op.ins]
        cuts: list[tuple[str, int]] = []  # (slice dim, slices)
        for d, f in decision.per_dim.items():
            step = ctx.sizes[d] // f
            s, k = _fresh(f"{d}_slice", letters), _fresh(f"{d}_in", letters)
            ins = [tuple(_split(e, d, s, k, step) for e in index) for index in ins]
            sizes.pop(d)
            sizes.update({s: f, k: step})
            cuts.append((s, f))
        slice_dims = tuple(s for s, _ in cuts)

        out_t = program.tensor(op.out.tensor)
        acc_dtype = op.kind.reducer.accumulator_dtype(out_t.dtype)
        names = {t.name for t in new_tensors}
        partial_t = _fresh(f"{op.out.tensor}.partials", names)
        # a scalar's partials get a trailing size-1 axis: the slice axis innermost would be
        # the stick dim, and slices of whole sticks cannot hand each core one slice
        tail = (AffineExpr.constant(0),) if not op.out.index else ()
        partial_index = (*(AffineExpr.dim(s) for s in slice_dims), *op.out.index, *tail)
        reads = tuple(Access(a.tensor, index) for a, index in zip(op.ins, ins, strict=True))
        partial = Op.build(partial_name(op.name), op.fn, Access(partial_t, partial_index),
                           reads, sizes, dict(op.attrs))
        new_tensors.append(TensorType(partial_t, (*(f for _, f in cuts), *out_t.shape,
                                                  *(1,) * len(tail)), acc_dtype))
        combine_fn = "sum" if op.category is Category.MATMUL else op.fn
        combine = Op.build(combine_name(op.name), combine_fn, op.out,
                           (Access(partial_t, partial_index),),
                           {x: n for x, n in sizes.items() if x in {*slice_dims, *op.out.dims}})
        new_ops += [partial, combine]
        factors = tuple(f for _, f in cuts)
        fixed[partial.name] = SplitK(slice_dims, math.prod(factors), decision.by,
                                     decision.select, factors if len(cuts) > 1 else ())
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
