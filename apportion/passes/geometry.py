"""Planning geometry shared by the passes: divisors, core slices, spans, and per-op context.

Not a pass: the splitting passes (span reduction, work distribution, group distribution), auto-tile
and the pipeline all measure a split assignment the same way, so the measure lives here, below
them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from apportion.cost.model import largest_slice, op_cost
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.passes.layouts import Layouts, OpLayout
from apportion.plans.plan import LoopInfo, OpPlan
from apportion.target.layout import DeviceLayout
from apportion.target.target import Target


def operand_extents(op: Op, slice_sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Per operand tensor, the index extent of each tensor dim touched by one slice of the op."""
    out: dict[str, tuple[int, ...]] = {}
    for acc in op.operands:
        ext = tuple(e.extent(slice_sizes) for e in acc.index)
        prev = out.get(acc.tensor)
        out[acc.tensor] = ext if prev is None else tuple(map(max, prev, ext))
    return out


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


def check_spans(op: Op, sizes: dict[str, int], layout: OpLayout, splits: dict[str, int],
                tlayouts: Mapping[str, DeviceLayout], target: Target) -> SpanCheck:
    ext = operand_extents(op, slice_sizes(sizes, dict(layout.unit_elems), splits))
    return SpanCheck({t: tlayouts[t].span_bytes(e) for t, e in ext.items()}, target.span_limit)


@dataclass(frozen=True)
class OpContext:
    """What the strategies need to know of one op: sizes, units, layouts and target."""

    op: Op
    program: Program
    target: Target
    layout: OpLayout
    tlayouts: Mapping[str, DeviceLayout]
    sizes: dict[str, int]

    @property
    def units(self) -> dict[str, int]:
        return self.layout.units(self.sizes)

    @property
    def per(self) -> dict[str, int]:
        return dict(self.layout.unit_elems)

    def span_check(self, splits: Mapping[str, int]) -> SpanCheck:
        """Every operand's span under ``splits``."""
        return check_spans(self.op, self.sizes, self.layout, dict(splits), self.tlayouts,
                           self.target)

    def feasible(self, splits: dict[str, int]) -> bool:
        return check_spans(self.op, self.sizes, self.layout, splits, self.tlayouts,
                           self.target).worst is None

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
             sizes: Mapping[str, dict[str, int]]) -> dict[str, OpContext]:
    """The OpContext of every op over ``sizes``, its per-iteration iteration space."""
    return {op.name: OpContext(op, program, target, lay.ops[op.name], lay.tensors,
                               dict(sizes[op.name])) for op in program.ops}


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
