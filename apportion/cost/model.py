"""The cost model: predicted time of an op under a split assignment, from named terms.

Every coefficient is a ``Target`` field, so a TOML target (or ``apportion calibrate``) can set
any of them. The terms, for one op whose cores each compute at most the largest slice:

* **compute**: the largest slice's iteration points times the kind's work per point, over the
  rate of the unit that runs it: the matrix unit (``mac_rate`` MACs per microsecond per core,
  two operations per MAC) for ``matmul``; the elementwise unit (``sfp_rate`` elements per
  microsecond per core) for pointwise, layout and fallback ops; the reduction rate
  (``reduce_rate``) for reductions. A matmul's matrix unit streams its rows (the output dims
  only the first input has) in passes of ``pt_rows``; with fewer than ``pt_full_passes`` passes
  per core it cannot hide its start-up and runs at ``(passes / pt_full_passes) **
  pt_exponent`` of its rate.
* **memory**: every operand slice not resident in the scratchpad is fetched from device memory
  once per *cohort*, the cores that differ only in split dims the operand is not indexed by, and
  broadcast to them over the on-chip ring; a cohort larger than ``broadcast_cohort`` contends,
  multiplying its bytes by ``(cohort / broadcast_cohort) ** broadcast_exponent``. Output slices
  are written once per group of reduction-splitting cores. The bytes fetched in all move at
  ``mem_bandwidth``, and never faster than one core's own bytes through its port
  (``core_bandwidth``).
* **overlap**: compute and memory overlap imperfectly: the op takes the longer of the two plus
  ``overlap`` times the shorter (0: a perfect roofline, 1: no overlap at all).
* **batch split**: splitting a matmul's batch dims (output dims both inputs have) over ``b``
  cores multiplies that by ``batch_split_factor ** log2(b)``: iterating a batch within a core
  keeps the weights of consecutive batches streaming, splitting it does not.
* **batch drain**: a core iterating the batch elements of a batched matmul writes each
  element's output slice back before the next one starts (the next element's partial sums need
  its space), through its own port and hidden behind nothing: ``batch_drain_us_per_byte`` per
  byte of the core's output slice over every element it iterates. A matmul without batch dims
  keeps its output streaming and pays none.
* **element overflow**: a batched matmul whose core slice of one batch element (its rows by K
  of the first input, K by its columns of the second, and its output slice) fits the
  scratchpad is loaded whole, each operand byte fetched once, and the next element's operands
  load behind its compute only if two elements fit. In between (one fits, two do not: the
  large-K bmm 8x512x4096x512 on 32 cores, 1.5 MB against 1.6 MB) the core waits for each
  element's operands and then computes: compute and memory do not overlap at all (``overlap``
  is 1 for that op). An element larger than the scratchpad streams tile by tile, as a matmul
  without batch dims does, and keeps the fitted overlap. From the target's own scratchpad
  capacity; no coefficient.
* **core sync**: every core an op uses beyond the first costs ``core_sync_us`` to start and
  join (a host thread on the CPU; zero on a device whose cores run one program in lock step),
  so a small op can be fastest on one core.
* **core scaling**: ``c`` cores compute as fast as ``1 + (c - 1) * core_scaling`` cores
  (1: every core is a whole one; on a host, cores that share execution units, caches or the
  machine with other work add less), which stretches the compute term by ``c / (1 + (c - 1)
  * core_scaling)``.
* **combine**: a reduction split ``k`` ways sends partial results around the ring, one hop per
  extra slice: ``(k - 1)`` times a core's output elements times ``ring_us_per_element``.
* **stick split**: cutting a tensor's stick dim (its innermost) ``s`` ways makes every byte of
  it a strided gather, ``stick_split_us_per_byte`` per byte the op touches per halving
  (``log2(s)``).
* **a target's own terms** (``Target.cost_terms``, ``target/terms.py``): each term object's
  microseconds, added; how a new device adds a component without touching this module.

Tensors a loop group keeps in the scratchpad (``resident``) cost no device-memory traffic.
Where each figure comes from is documented at the preset (``target/presets.py``).

>>> from apportion.frontend.json_format import load
>>> from apportion.target import spyre
>>> p = load("examples/mlp.json")
>>> c = op_cost(p.op("gate"), p, spyre(), p.op("gate").sizes, {"m": 2, "n": 16, "k": 1},
...             {"m": 1, "n": 64, "k": 64})
>>> round(c.compute_us, 1), round(c.memory_us, 1), c.combine_us
(16.4, 42.7, 0.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from apportion.errors import TargetError
from apportion.ir.dtypes import dtype_bytes
from apportion.ir.kinds import Category
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.target.target import Target


@dataclass(frozen=True)
class OpCost:
    """Predicted time of one op in microseconds, with its terms."""

    compute_us: float
    memory_us: float
    combine_us: float = 0.0
    stick_us: float = 0.0
    batch_factor: float = 1.0
    overlap: float = 0.0
    batch_us: float = 0.0  # output slices drained between the batch elements a core iterates
    sync_us: float = 0.0  # starting and joining the cores beyond the first
    extra_us: float = 0.0  # the target's own terms (``Target.cost_terms``)

    @property
    def time_us(self) -> float:
        busy = max(self.compute_us, self.memory_us) + \
            self.overlap * min(self.compute_us, self.memory_us)
        return busy * self.batch_factor + self.combine_us + self.stick_us + self.batch_us + \
            self.sync_us + self.extra_us


def largest_slice(sizes: Mapping[str, int], unit_elems: Mapping[str, int],
                  splits: Mapping[str, int]) -> dict[str, int]:
    """Elements per dim of the largest core slice (whole planning units, ceil division)."""
    out = {}
    for d, n in sizes.items():
        per = unit_elems.get(d, 1)
        units = -(-n // per)
        out[d] = min(-(-units // splits.get(d, 1)) * per, n)
    return out


def slice_bytes(access: Access, program: Program, target: Target,
                largest: Mapping[str, int], shape: tuple[int, ...] | None = None) -> int:
    """Device-memory bytes of one core's slice of an operand, its innermost dim in whole sticks
    (``shape``: the tensor's shape as ``access`` indexes it, e.g. an output's split view)."""
    t = program.tensor(access.tensor)
    eps = target.elems_per_stick(t.dtype)
    shape = t.shape if shape is None else shape
    n = 1
    for axis, (e, size) in enumerate(zip(access.index, shape, strict=True)):
        ext = min(e.extent(largest), size)
        if axis == len(shape) - 1:
            ext = -(-ext // eps) * eps
        n *= ext
    return n * dtype_bytes(t.dtype)


def op_cost(op: Op, program: Program, target: Target, sizes: Mapping[str, int],
            splits: Mapping[str, int], unit_elems: Mapping[str, int],
            resident: frozenset[str] = frozenset()) -> OpCost:
    """Cost of ``op`` over ``sizes`` cut by ``splits`` (in units of ``unit_elems``), with the
    tensors in ``resident`` read from or written to the scratchpad."""
    largest = largest_slice(sizes, unit_elems, splits)
    cores = math.prod(splits.get(d, 1) for d in sizes)
    red_split = math.prod(splits.get(d, 1) for d in op.reduction_dims)
    scaling = cores / (1 + (cores - 1) * target.core_scaling)
    return OpCost(
        compute_us=_compute_us(op, target, largest) * scaling,
        memory_us=_memory_us(op, program, target, largest, splits, cores, red_split, resident),
        combine_us=_combine_us(op, target, largest, red_split),
        stick_us=_stick_us(op, program, target, sizes, splits),
        batch_factor=_batch_factor(op, target, splits),
        overlap=1.0 if _element_overflows(op, program, target, largest) else target.overlap,
        batch_us=_batch_us(op, program, target, largest),
        sync_us=(cores - 1) * target.core_sync_us,
        extra_us=_extra_us(op, program, target, sizes, splits, largest),
    )


def _extra_us(op: Op, program: Program, target: Target, sizes: Mapping[str, int],
              splits: Mapping[str, int], largest: Mapping[str, int]) -> float:
    total = 0.0
    for term in target.cost_terms:
        us = term.us(op, program, target, sizes, splits, largest)
        # the search's lower bound counts on every term being a time >= 0 (target/terms.py)
        if isinstance(us, bool) or not isinstance(us, int | float) or not us >= 0 or \
                not math.isfinite(us):
            raise TargetError(f"target {target.name!r}: cost term {term.name} gave {us!r} for "
                              f"op {op.name!r}; a term must be a finite time >= 0 (us)")
        total += us
    return total


def matmul_rows(op: Op) -> tuple[str, ...]:
    """The dims a matmul streams through the matrix unit as rows: output dims only its first
    input has (``m`` of ``x[m,k] @ w[k,n]``)."""
    if op.category is not Category.MATMUL:
        return ()
    first, second = set(op.ins[0].dims), set(op.ins[1].dims)
    return tuple(d for d in op.out.dims if d in first and d not in second)


def batch_dims(op: Op) -> tuple[str, ...]:
    """A matmul's batch dims: output dims both inputs have."""
    if op.category is not Category.MATMUL:
        return ()
    first, second = set(op.ins[0].dims), set(op.ins[1].dims)
    return tuple(d for d in op.out.dims if d in first and d in second)


def _compute_us(op: Op, target: Target, largest: Mapping[str, int]) -> float:
    # a whole-tensor fallback (a gather, a constant) names each operand's dims apart: its work
    # is its output's elements, not the product of every operand's
    dims = op.out.dims if op.kind.whole else tuple(largest)
    points = math.prod(largest[d] for d in dims)
    work = points * op.kind.work_per_point
    category = op.category
    if category is Category.MATMUL:
        rows = math.prod(largest[d] for d in matmul_rows(op))
        passes = -(-rows // target.pt_rows)
        efficiency = min(1.0, (passes / target.pt_full_passes) ** target.pt_exponent)
        return work / (2 * target.mac_rate * efficiency)
    if category is Category.REDUCTION:
        return work / target.reduce_rate
    return work / target.sfp_rate


def _memory_us(op: Op, program: Program, target: Target, largest: Mapping[str, int],
               splits: Mapping[str, int], cores: int, red_split: int,
               resident: frozenset[str]) -> float:
    fetched = 0.0
    per_core = 0
    seen = set(resident)
    for acc in (*op.ins, op.out):
        if acc.tensor in seen:
            continue
        seen.add(acc.tensor)
        if acc is op.out and op.merges_output:  # the points it writes, runs of its inner dim
            nbytes = slice_bytes(op.split_out, program, target, largest,
                                 op.split_shape(program.tensor(acc.tensor).shape))
        else:
            nbytes = slice_bytes(acc, program, target, largest)
        per_core += nbytes
        if acc is op.out:
            fetched += nbytes * (cores // red_split)
            continue
        used = set(acc.dims)
        cohort = math.prod(n for d, n in splits.items() if d not in used)
        contention = max(1.0, (cohort / target.broadcast_cohort) ** target.broadcast_exponent)
        fetched += nbytes * (cores // cohort) * contention
    # bandwidths are bytes per second; times are microseconds
    return max(fetched / target.mem_bandwidth, per_core / target.core_bandwidth) * 1e6


def _combine_us(op: Op, target: Target, largest: Mapping[str, int], red_split: int) -> float:
    if red_split <= 1:
        return 0.0
    out_elems = math.prod(largest[d] for d in op.out.dims)
    return (red_split - 1) * out_elems * target.ring_us_per_element


def _stick_us(op: Op, program: Program, target: Target, sizes: Mapping[str, int],
              splits: Mapping[str, int]) -> float:
    # the bytes the op touches over its (per-iteration) space, not the whole tensor's
    total = 0.0
    seen: set[str] = set()
    for acc in (*op.ins, op.out):
        if acc.tensor in seen or not acc.index:
            continue
        seen.add(acc.tensor)
        cuts = math.prod(splits.get(d, 1) for d in acc.index[-1].dims)
        if cuts > 1:
            total += slice_bytes(acc, program, target, sizes) * math.log2(cuts)
    return total * target.stick_split_us_per_byte


def _batch_factor(op: Op, target: Target, splits: Mapping[str, int]) -> float:
    b = math.prod(splits.get(d, 1) for d in batch_dims(op))
    return target.batch_split_factor ** math.log2(b) if b > 1 else 1.0


def _batch_us(op: Op, program: Program, target: Target, largest: Mapping[str, int]) -> float:
    if not batch_dims(op) or target.batch_drain_us_per_byte == 0:
        return 0.0
    # the slice over the core's batch elements: every element it iterates drains its own
    drained = slice_bytes(op.out, program, target, largest)
    return drained * target.batch_drain_us_per_byte


def _element_overflows(op: Op, program: Program, target: Target,
                       largest: Mapping[str, int]) -> bool:
    dims = batch_dims(op)
    if not dims:
        return False
    # one batch element of the core's slice: every batch dim cut to a single element; it is
    # held whole but not double-buffered when it fits the scratchpad once and not twice
    element = {d: (1 if d in dims else n) for d, n in largest.items()}
    seen: set[str] = set()
    working = 0
    for acc in (*op.ins, op.out):
        if acc.tensor not in seen:
            seen.add(acc.tensor)
            working += slice_bytes(acc, program, target, element)
    return working <= target.scratchpad_capacity < 2 * working
