"""Planning geometry shared by the passes: divisors, core slices, spans, and per-op context.

Not a pass: the splitting passes (span reduction, work distribution, group distribution), auto-tile
and the pipeline all measure a split assignment the same way, so the measure lives here, below
them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apportion.cost.model import op_cost
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.passes.layouts import OpLayout
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


def divisors(n: int) -> list[int]:
    """All divisors of ``n`` in increasing order."""
    small = [i for i in range(1, math.isqrt(n) + 1) if n % i == 0]
    return sorted({*small, *(n // i for i in small)})


def slice_sizes(sizes: dict[str, int], per: dict[str, int], splits: dict[str, int]
                ) -> dict[str, int]:
    """Elements per dim of the largest core slice (whole units, ceil division)."""
    out = {}
    for d, n in sizes.items():
        units = -(-n // per[d])
        out[d] = min(-(-units // splits.get(d, 1)) * per[d], n)
    return out


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
                tlayouts: dict[str, DeviceLayout], target: Target) -> SpanCheck:
    ext = operand_extents(op, slice_sizes(sizes, dict(layout.unit_elems), splits))
    return SpanCheck({t: tlayouts[t].span_bytes(e) for t, e in ext.items()}, target.span_limit)


@dataclass(frozen=True)
class OpContext:
    """What the strategies need to know of one op: sizes, units, layouts and target."""

    op: Op
    program: Program
    target: Target
    layout: OpLayout
    tlayouts: dict[str, DeviceLayout]
    sizes: dict[str, int]

    @property
    def units(self) -> dict[str, int]:
        return self.layout.units(self.sizes)

    @property
    def per(self) -> dict[str, int]:
        return dict(self.layout.unit_elems)

    def feasible(self, splits: dict[str, int]) -> bool:
        return check_spans(self.op, self.sizes, self.layout, splits, self.tlayouts,
                           self.target).worst is None

    def time_us(self, splits: dict[str, int], resident: frozenset[str] = frozenset()) -> float:
        """Predicted time under ``splits``; ``resident`` tensors live in the scratchpad."""
        red = max((splits[d] for d in self.op.reduction_dims), default=1)
        largest = slice_sizes(self.sizes, self.per, splits)
        return op_cost(self.op, self.program, self.target, self.sizes, largest, red,
                       resident).time_us

    def valid(self, splits: dict[str, int]) -> bool:
        """True when ``splits`` is one of the assignments ``balanced`` searches and is feasible."""
        units, cores = self.units, self.target.cores
        if any(not 1 <= splits[d] <= min(units[d], cores) for d in self.sizes):
            return False
        if math.prod(splits.values()) > cores:
            return False
        if sum(splits[d] > 1 for d in self.op.reduction_dims) > 1:
            return False
        return self.feasible(splits)

    def utilization(self, splits: dict[str, int]) -> float:
        largest = slice_sizes(self.sizes, self.per, splits)
        return math.prod(self.sizes.values()) / (self.target.cores * math.prod(largest.values()))
