"""Planning geometry shared by the passes: divisors, core slices, spans, and per-op context.

Not a pass: the splitting passes (span reduction, work distribution, group distribution), auto-tile
and the pipeline all measure a split assignment the same way, so the measure lives here, below
them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any

from apportion.cost.model import largest_slice, op_cost
from apportion.errors import PlanningError
from apportion.ir.affine import AffineExpr
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.passes.layouts import Layouts, OpLayout
from apportion.plans.plan import LoopInfo, OpPlan
from apportion.target.layout import DeviceLayout
from apportion.target.target import Target


def box_steps(sizes: Mapping[str, int], per: Mapping[str, int], loop: LoopInfo | None
              ) -> dict[str, int]:
    """Per dim, a step every start of a core's box along it is a multiple of: its planning
    unit (core slices hold whole units), and inside a loop that tiles it, also its tile (each
    iteration moves the box by one tile, which may hold part of a stick of a dim the op only
    reads).

    >>> box_steps({"m": 8, "n": 48}, {"m": 1, "n": 64}, LoopInfo((0,), (2,), (("n",),)))
    {'m': 1, 'n': 16}
    """
    steps = {d: per.get(d, 1) for d in sizes}
    for count, dims in zip(loop.count if loop else (), loop.tiled_dims if loop else (),
                           strict=True):
        for d in dims:
            if count != 1 and d in steps:
                steps[d] = math.gcd(steps[d], sizes[d])
    return steps


def stick_offset(expr: AffineExpr, eps: int, steps: Mapping[str, int]) -> int:
    """How far into a stick of ``eps`` elements the first index ``expr`` reaches over a box
    may lie, at most, when each dim's box starts at a multiple of its ``steps``.

    The start is ``const + sum(c * k * step)``: modulo ``eps`` it is ``const`` plus a multiple
    of ``g = gcd(eps, c * step ...)``, so the furthest is ``const % g + eps - g`` (``const %
    eps`` where every step keeps whole sticks).

    >>> from apportion.ir.affine import AffineExpr
    >>> stick_offset(AffineExpr.parse("18+f"), 32, {"f": 32})   # x[a, 18+f]: always 18 in
    18
    >>> stick_offset(AffineExpr.parse("f"), 32, {"f": 1733})    # tiles of 1733: any offset
    31
    """
    g = eps
    for d, c in expr.terms:
        g = math.gcd(g, c * steps.get(d, 1))
    return expr.const % g + eps - g


@dataclass(frozen=True)
class Reach:
    """Where one op's accesses of one tensor reach in it, from one box of the op.

    Per tensor dim: the expression of least constant of accesses that differ only in their
    constants (``x[a, f]`` and ``x[a, 64+f]``: one box reaches from the first's first index to
    the second's last) and how far the others' constants lie beyond it (``spread``), or None
    where the accesses index the dim through different dims (the box may then reach any of
    its ``bound`` indices). ``offset`` is how far into a stick the box's first innermost index
    may lie (``stick_offset``).
    """

    tensor: str
    layout: DeviceLayout
    dims: tuple[tuple[AffineExpr, int] | None, ...]
    bound: tuple[int, ...]
    offset: int

    def extents(self, largest: Mapping[str, int]) -> tuple[int, ...]:
        """Index values per tensor dim, first to last, the largest box of ``largest``
        elements per op dim reaches."""
        return tuple(b if d is None else min(d[0].extent(largest) + d[1], b)
                     for d, b in zip(self.dims, self.bound, strict=True))

    def span(self, largest: Mapping[str, int]) -> int:
        """Bytes of device memory one box of ``largest`` elements per op dim spans."""
        return self.layout.span_bytes(self.extents(largest), self.offset)


def reaches(op: Op, program: Program, tlayouts: Mapping[str, DeviceLayout],
            steps: Mapping[str, int]) -> tuple[Reach, ...]:
    """The ``Reach`` of each operand tensor of ``op`` (distinct tensors, in order of first use),
    its boxes starting at multiples of ``steps`` (``box_steps``)."""
    out = []
    for t in dict.fromkeys(a.tensor for a in op.operands):
        accs = [a for a in op.operands if a.tensor == t]
        layout = tlayouts[t]
        shape = program.tensor(t).shape
        dims: list[tuple[AffineExpr, int] | None] = []
        for k in range(len(shape)):
            exprs = {a.index[k] for a in accs}
            if len({tuple(sorted(e.terms)) for e in exprs}) > 1:
                dims.append(None)
                continue
            first = min(exprs, key=lambda e: e.const)
            dims.append((first, max(e.const for e in exprs) - first.const))
        offset = 0
        if dims and dims[-1] is not None:
            offset = stick_offset(dims[-1][0], layout.elems_per_stick, steps)
        out.append(Reach(t, layout, tuple(dims), tuple(shape), offset))
    return tuple(out)


def divisors(n: int, limit: int) -> list[int]:
    """The divisors of ``n`` that are at most ``limit``, in increasing order.

    Trial division by ``1 .. min(n, limit)`` only, so the work grows with the bound (a core
    count, a loop count limit) and not with ``n``: a dim of 2**100 elements costs what a small
    one does. Every caller needs only counts it can use, which the bound caps.

    >>> divisors(12, 32), divisors(4096, 24), divisors(2**100, 10), divisors(7, 0)
    ([1, 2, 3, 4, 6, 12], [1, 2, 4, 8, 16], [1, 2, 4, 8], [])
    """
    if n < 1:
        raise ValueError(f"divisors of {n}: n must be positive")
    return [i for i in range(1, min(n, limit) + 1) if n % i == 0]


#: elements per dim of the largest core slice (whole planning units, ceil division)
slice_sizes = largest_slice


@dataclass(frozen=True)
class SpanCheck:
    """Spans of every operand under a split assignment, and the worst offender."""

    spans: dict[str, int]
    limit: int

    @property
    def worst(self) -> tuple[str, int] | None:
        over = [(t, s) for t, s in self.spans.items() if s > self.limit]
        return max(over, key=lambda x: x[1]) if over else None


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


class Signature:
    """An op's ``OpContext.signature``: a tuple, hashed once (caches are keyed by it)."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Signature) and self._hash == other._hash
                                 and self.value == other.value)

    def __repr__(self) -> str:
        return f"Signature({self.value!r})"


@dataclass(frozen=True)
class OpContext:
    """What the strategies need to know of one op: sizes, units, layouts and target."""

    op: Op
    program: Program
    target: Target
    layout: OpLayout
    tlayouts: Mapping[str, DeviceLayout]
    sizes: dict[str, int]
    #: the op's place in a loop nest (None outside loops); part of its ``signature``
    loop: LoopInfo | None = None
    #: splits decided before work distribution (the split-K resolver's): dim -> slices
    fixed: tuple[tuple[str, int], ...] = ()

    @cached_property
    def fixed_map(self) -> dict[str, int]:
        return dict(self.fixed)

    def options(self, d: str, low: int, high: int) -> tuple[int, int]:
        """The range of slice counts dim ``d`` may take: its fixed count where the split-K
        resolver set one (the op's other reduction dims then stay whole), else ``low..high``
        (``low`` alone where the target cannot split it)."""
        fixed = self.fixed_map
        if d in fixed:
            return fixed[d], fixed[d]
        if not self.splittable(d) or (fixed and d in self.op.reduction_dims):
            return low, low
        return low, high

    @cached_property
    def slots(self) -> tuple[str, ...]:
        """The op's distinct operand tensors, inputs then the output, in order of first use."""
        return tuple(dict.fromkeys(a.tensor for a in self.op.operands))

    @cached_property
    def signature(self) -> Signature:
        """What planning the op depends on, with the names of the op and its tensors left out.

        Its kind (fn and attributes), its dims and per-iteration sizes, every operand's index
        expressions, tensor shape and dtype and which operands are one tensor (``x * x``), its
        pinned splits, and its loop context (counts and tiled dims, not the group's path). Two
        ops of one program (or of programs with the same target) whose signatures are equal get
        the same splits, predicted times, spans and scratchpad boxes, their tensors renamed
        (``slots`` pairs them); ``PlanCache`` plans one of them and reuses it for the others.
        """
        op, program = self.op, self.program
        slot = {t: i for i, t in enumerate(self.slots)}
        operands = tuple((slot[a.tensor], tuple(e.to_source() for e in a.index),
                          program.tensor(a.tensor).shape, program.tensor(a.tensor).dtype)
                         for a in op.operands)
        pins = program.pins.get(op.name)
        loop = None if self.loop is None else (self.loop.count, self.loop.tiled_dims)
        return Signature((op.fn, op.attrs, op.dims, tuple(self.sizes.items()), operands,
                          None if pins is None else tuple(sorted(pins.items())), loop,
                          self.fixed))

    @property
    def units(self) -> dict[str, int]:
        return self.layout.units(self.sizes)

    @property
    def per(self) -> dict[str, int]:
        return dict(self.layout.unit_elems)

    @cached_property
    def reaches(self) -> tuple[Reach, ...]:
        """Where the op's boxes reach in each operand tensor (their spans' measure)."""
        return reaches(self.op, self.program, self.tlayouts,
                       box_steps(self.sizes, self.per, self.loop))

    def slice_spans(self, largest: Mapping[str, int]) -> dict[str, int]:
        """Every operand tensor's span from one box of ``largest`` elements per dim."""
        return {r.tensor: r.span(largest) for r in self.reaches}

    def span_check(self, splits: Mapping[str, int]) -> SpanCheck:
        """Every operand tensor's span under ``splits``, counted from the first stick a core's
        box touches to the last (``Reach``)."""
        return SpanCheck(self.slice_spans(slice_sizes(self.sizes, self.per, dict(splits))),
                         self.target.span_limit)

    def feasible(self, splits: dict[str, int]) -> bool:
        return self.span_check(splits).worst is None

    def time_us(self, splits: Mapping[str, int], resident: frozenset[str] = frozenset()
                ) -> float:
        """Predicted time under ``splits``; ``resident`` tensors live in the scratchpad."""
        return op_cost(self.op, self.program, self.target, self.sizes, splits, self.per,
                       resident).time_us

    def splittable(self, d: str) -> bool:
        """False for a reduction dim whose last stick is padded on a target that cannot split
        one (the backend cannot mask padding spread over cores)."""
        per = self.per[d]
        return (self.target.split_padded_reduction or d not in self.op.reduction_dims
                or per == 1 or self.sizes[d] % per == 0)

    def valid(self, splits: dict[str, int]) -> bool:
        """True when ``splits`` is one of the assignments ``balanced`` searches and is feasible."""
        units, cores = self.units, self.target.cores
        if any(not 1 <= splits[d] <= min(units[d], cores) for d in self.sizes):
            return False
        if any(splits[d] > 1 and not self.splittable(d) for d in self.sizes):
            return False
        if any(not lo <= splits[d] <= hi for d in self.sizes
               for lo, hi in [self.options(d, 1, splits[d])]):
            return False
        if math.prod(splits.values()) > cores:
            return False
        if sum(splits[d] > 1 for d in self.op.reduction_dims) > 1:
            return False
        return self.feasible(splits)

    def utilization(self, splits: dict[str, int]) -> float:
        largest = slice_sizes(self.sizes, self.per, splits)
        return math.prod(self.sizes.values()) / (self.target.cores * math.prod(largest.values()))

    def op_plan(self, minimum: Mapping[str, int], splits: Mapping[str, int],
                loop: LoopInfo | None) -> OpPlan:
        """The plan of the op under ``splits`` (``minimum``: the span reduction's splits)."""
        op = self.op
        return OpPlan(
            name=op.name, op=op.fn, kind=op.category.value,
            iteration_space=tuple(self.sizes.items()),
            reduction_dims=op.reduction_dims,
            stick_dims=self.layout.stick_dims,
            unit_elems=self.layout.unit_elems,
            splits=tuple((d, splits[d]) for d in self.sizes),
            utilization=round(self.utilization(dict(splits)), 6),
            predicted_time_us=round(self.time_us(dict(splits)), 4),
            span_bytes=tuple(self.span_check(splits).spans.items()),
            loop=loop,
            span_splits=tuple(minimum.items()),
        )


def contexts(program: Program, target: Target, lay: Layouts,
             sizes: Mapping[str, dict[str, int]],
             loops: Mapping[str, LoopInfo | None] | None = None) -> dict[str, OpContext]:
    """The OpContext of every op over ``sizes``, its per-iteration iteration space (and its
    place in a loop nest from ``loops``, when given)."""
    where = loops or {}
    return {op.name: OpContext(op, program, target, lay.ops[op.name], lay.tensors,
                               dict(sizes[op.name]), where.get(op.name))
            for op in program.ops}


class PlanCache:
    """Identical ops planned once: results kept by op ``signature`` for the ops that follow.

    One cache serves one target (a plan call, with the programs auto-tiling tries). Each entry
    is what one op's planning computed from its signature alone (its splits, its best few
    assignments, a predicted time, its ``OpPlan``), so an op with an equal signature takes it
    instead of computing it again and gets exactly what it would have computed: names in an
    entry are mapped to the op's own through ``OpContext.slots``. Failures are never kept (their
    messages name the op). ``enabled=False`` computes everything afresh, as if each op were
    the only one of its kind.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._memo: dict[Hashable, Any] = {}

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The entry for ``key``, computed (and kept) on first use. Entries are shared: keep
        them immutable (tuples), or copy them before changing."""
        if not self.enabled:
            return compute()
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = compute()
            return value

    def time_us(self, ctx: OpContext, splits: Mapping[str, int],
                resident: frozenset[str] = frozenset()) -> float:
        """``ctx.time_us(splits, resident)``, kept by signature (``resident`` by slot)."""
        if not self.enabled:
            return ctx.time_us(splits, resident)
        mine = tuple(i for i, t in enumerate(ctx.slots) if t in resident)
        key = ("time", ctx.signature, tuple(splits.items()), mine)
        return self.get(key, lambda: ctx.time_us(splits, resident))

    def op_plan(self, ctx: OpContext, minimum: Mapping[str, int], splits: Mapping[str, int],
                loop: LoopInfo | None) -> OpPlan:
        """``ctx.op_plan(minimum, splits, loop)``; an identical op's plan renamed when kept."""
        if not self.enabled:
            return ctx.op_plan(minimum, splits, loop)
        key = ("op_plan", ctx.signature, tuple(minimum.items()), tuple(splits.items()))
        slots, first = self.get(key, lambda: (ctx.slots, ctx.op_plan(minimum, splits, loop)))
        if first.name == ctx.op.name and slots == ctx.slots:
            return first if first.loop == loop else replace(first, loop=loop)
        name = dict(zip(slots, ctx.slots, strict=True))
        return replace(first, name=ctx.op.name, loop=loop,
                       span_bytes=tuple((name[t], b) for t, b in first.span_bytes))


@dataclass(frozen=True)
class Splits:
    """Per op, the slices of each dim: what work and group distribution decide."""

    by_op: Mapping[str, Mapping[str, int]]

    def __post_init__(self) -> None:
        frozen = {op: MappingProxyType(dict(s)) for op, s in self.by_op.items()}
        object.__setattr__(self, "by_op", MappingProxyType(frozen))

    def __getitem__(self, op: str) -> dict[str, int]:
        return dict(self.by_op[op])

    def replace(self, changed: Mapping[str, Mapping[str, int]]) -> Splits:
        """A new value with the splits of the ops in ``changed`` replaced."""
        return Splits({**self.by_op, **changed})


def group_time(ops: tuple[str, ...], ctxs: Mapping[str, OpContext],
               splits: Mapping[str, Mapping[str, int]], resident: frozenset[str]) -> float:
    """Predicted time of one iteration of a group's ops with ``resident`` tensors on chip."""
    return sum(ctxs[n].time_us(dict(splits[n]), resident) for n in ops)
