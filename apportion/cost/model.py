"""The cost model: predicted time of an op under a split assignment.

Every core computes its slice at the target's peak rate and streams its operand slices through
its own port at ``core_bandwidth``; the op takes as long as its slowest core, whichever of
compute and memory binds. Splitting a reduction adds a combine: the partial outputs go through
device memory (written and read back at ``mem_bandwidth``) plus a fixed synchronisation latency.
Re-reads caused by a split (an operand not indexed by the split dim is read whole by every core)
count in each core's traffic. Tensors a loop group keeps in the scratchpad (``resident``) cost
no device-memory traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apportion.ir.dtypes import dtype_bytes
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.target.target import Target


@dataclass(frozen=True)
class OpCost:
    """Predicted time of one op in microseconds, with its parts."""

    compute_us: float
    memory_us: float
    combine_us: float

    @property
    def time_us(self) -> float:
        return max(self.compute_us, self.memory_us) + self.combine_us


def slice_bytes(op: Op, program: Program, target: Target, slice_sizes: dict[str, int],
                resident: frozenset[str] = frozenset()) -> int:
    """Device-memory bytes one core moves for a slice: each operand region not ``resident`` in
    the scratchpad, innermost dim padded to sticks."""
    total = 0
    seen: set[str] = set(resident)
    for acc in op.operands:
        if acc.tensor in seen:
            continue
        seen.add(acc.tensor)
        t = program.tensor(acc.tensor)
        eps = target.elems_per_stick(t.dtype)
        n = 1
        for axis, (e, size) in enumerate(zip(acc.index, t.shape, strict=True)):
            ext = min(e.extent(slice_sizes), size)
            if axis == t.rank - 1:
                ext = -(-ext // eps) * eps
            n *= ext
        total += n * dtype_bytes(t.dtype)
    return total


def op_cost(op: Op, program: Program, target: Target, sizes: dict[str, int],
            slice_sizes: dict[str, int], reduction_split: int = 1,
            resident: frozenset[str] = frozenset()) -> OpCost:
    """Cost of ``op`` over ``sizes`` when its largest core slice has ``slice_sizes`` elements
    and the tensors in ``resident`` are read from or written to the scratchpad."""
    points = math.prod(slice_sizes.values())
    compute = points * op.kind.work_per_point / target.peak_flops_per_core
    memory = slice_bytes(op, program, target, slice_sizes, resident) / target.core_bandwidth
    combine = 0.0
    if reduction_split > 1:
        out_bytes = math.prod(sizes[d] for d in op.out.dims) * dtype_bytes(
            program.tensor(op.out.tensor).dtype)
        combine = ((reduction_split + 1) * out_bytes / target.mem_bandwidth
                   + target.combine_latency_us * 1e-6)
    return OpCost(compute * 1e6, memory * 1e6, combine * 1e6)
