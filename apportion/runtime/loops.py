"""Executor of loop nests: runs a planned program tile by tile, core by core, in simulated memory.

Device memory is one byte array and every core's scratchpad another, and every tensor lives at
the address its plan buffer gives (``Plan.buffers``), so two buffers the plan overlaps while both
are live corrupt each other and the comparison with the unplanned run fails. Elements are stored
packed in row-major order of what a buffer holds (a whole tensor, one tile, or one core's part of
a tile in the scratchpad); bfloat16 as its 16 bits.

Ops outside loops run core slice by core slice (``reference.run_op_boxes``). A loop group runs
its iterations outermost level first; in each, the accumulator inits due at that point, then
every op over its tile: each core's box (the op plan's slices of the tile) is computed by
``reference.partial_result`` from the buffers, split reductions are combined across cores, and
the result is finished into its buffer or combined into its accumulator; copies follow their op,
and finish steps (accumulator to result) the whole nest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np

from apportion.errors import ApportionError, ExecutionError
from apportion.ir.dtypes import dtype_bytes
from apportion.ir.kinds import REDUCERS
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.plans.memory import Buffer, GroupPlan
from apportion.plans.plan import OpPlan, Plan
from apportion.plans.tiles import (
    Box,
    Region,
    core_boxes,
    inside,
    iterations,
    region,
    resolve_counts,
    tile_box,
)
from apportion.plans.views import core_slices
from apportion.runtime import kernels
from apportion.runtime.reference import (
    _combine,
    bind_inputs,
    evaluate_op,
    partial_result,
    run_op_boxes,
)

#: tensor dtype -> numpy dtype of its bytes in simulated memory (bfloat16: the high 16 bits)
RAW: dict[str, type[np.generic]] = {**kernels.STORAGE, "bfloat16": np.uint16}


def encode(a: np.ndarray, dtype: str) -> np.ndarray:
    """A computed array as the bytes ``dtype`` stores: cast, bfloat16 cut to 16 bits (exact)."""
    s = kernels.to_storage(np.asarray(a), dtype)
    if dtype == "bfloat16":
        return (np.ascontiguousarray(s, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return s


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored bytes back as the storage array (``kernels.STORAGE``) of ``dtype``."""
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw


class Memory:
    """Device memory and one scratchpad per core, as bytes (filled with 0xFF: NaN for floats)."""

    def __init__(self, plan: Plan, cores: int):
        hbm_end = max((b.end for b in plan.buffers if b.space == "hbm"), default=0)
        self.hbm = np.full(hbm_end, 0xFF, dtype=np.uint8)
        lx = [g.capacity for g in plan.groups if g.lx_tensors]
        self.lx = [np.full(max(lx), 0xFF, dtype=np.uint8) for _ in range(cores)] if lx else []

    def view(self, buf: Buffer, shape: tuple[int, ...], dtype: str, core: int = 0) -> np.ndarray:
        """The packed array of ``shape`` at the start of ``buf`` (in ``core``'s scratchpad)."""
        n = math.prod(shape) * dtype_bytes(dtype)
        if n > buf.nbytes:
            raise ExecutionError(f"tensor {buf.tensor!r}: {list(shape)} {dtype} takes {n} bytes, "
                                 f"its {buf.kind} buffer has {buf.nbytes}")
        mem = self.lx[core] if buf.space == "lx" else self.hbm
        if buf.offset + n > mem.size:
            raise ExecutionError(f"tensor {buf.tensor!r}: bytes {buf.offset}..{buf.offset + n} "
                                 f"are outside the {buf.space} memory of {mem.size} bytes")
        return mem[buf.offset:buf.offset + n].view(RAW[dtype]).reshape(shape)


def _slices(reg: Region, origin: Region | None = None) -> tuple[slice, ...]:
    base = [lo for lo, _ in origin] if origin else [0] * len(reg)
    # the trailing Ellipsis keeps a rank-0 index a view (a[()] would be a scalar copy)
    return (*(slice(lo - b, hi - b) for (lo, hi), b in zip(reg, base, strict=True)), ...)


def _extent(reg: Region) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in reg)


def _identity(value: float, dtype: str) -> float | int | bool:
    if dtype == "bool":
        return value > 0
    if dtype in ("int8", "int32", "int64"):
        info = np.iinfo(kernels.storage_dtype(dtype))
        return int(min(max(value, info.min), info.max))
    return value


class _Run:
    """One execution: the program, its plan, memory, run-time counts and a thread pool."""

    def __init__(self, program: Program, plan: Plan, pool: Executor | None,
                 params: Mapping[str, int] | None):
        self.program, self.plan, self.pool, self.params = program, plan, pool, params
        self.mem = Memory(plan, plan.cores)

    def buffer(self, tensor: str, kind: str) -> Buffer | None:
        return next((b for b in self.plan.buffers_of(tensor) if b.kind == kind), None)

    def full(self, tensor: str) -> np.ndarray:
        buf = self.buffer(tensor, "full") or self.buffer(tensor, "accumulator")
        if buf is None:
            raise ExecutionError(f"tensor {tensor!r} has no full buffer in the plan; plan the "
                                 "program with the pipeline (pass scratchpad assigns buffers)")
        t = self.program.tensor(tensor)
        return self.mem.view(buf, t.shape, t.dtype)

    def accumulator(self, tensor: str) -> tuple[np.ndarray, str]:
        """The accumulator of ``tensor`` and the dtype it holds."""
        buf = self.buffer(tensor, "accumulator")
        if buf is None:
            raise ExecutionError(f"tensor {tensor!r} is combined in a loop but has no "
                                 "accumulator buffer in the plan")
        t = self.program.tensor(tensor)
        dtype = buf.dtype or t.dtype
        return self.mem.view(buf, t.shape, dtype), dtype

    def op_plan(self, op: Op) -> OpPlan:
        try:
            return self.plan.op(op.name)
        except ApportionError as e:
            raise ExecutionError(f"op {op.name!r}: {e}") from None

    # --- ops outside loops -----------------------------------------------------------------

    def run_whole(self, op: Op) -> None:
        op_plan = self.op_plan(op)
        if op_plan.sizes != op.sizes:
            raise ExecutionError(f"op {op.name!r}: plan's iteration space {op_plan.sizes} "
                                 f"differs from the op's {op.sizes}")
        env = {a.tensor: decode(self.full(a.tensor), self.program.tensor(a.tensor).dtype)
               for a in op.ins}
        if not op.kind.divisible:
            out = evaluate_op(op, self.program, env)
        else:
            out = run_op_boxes(op, self.program, env, core_slices(op_plan), self.pool)
        self.full(op.out.tensor)[...] = encode(out, self.program.tensor(op.out.tensor).dtype)

    # --- loop groups -----------------------------------------------------------------------

    def run_group(self, group: GroupPlan) -> None:
        counts = resolve_counts(group.counts, self.params)
        ops = [self.program.op(n) for n in group.ops]
        for op in ops:
            loop = self.op_plan(op).loop
            if loop is None or loop.group != group.path or loop.count != group.counts:
                raise ExecutionError(f"op {op.name!r}: plan's loop {loop} is not group "
                                     f"{list(group.path)} with counts {list(group.counts)}")
        for index in iterations(counts):
            for init in group.inits:
                if all(i == 0 for i in index[init.level:]):
                    op = self.program.op(init.op)
                    box = tile_box(op.sizes, self.op_plan(op).loop, index[:init.level], counts,
                                   op.name)
                    acc, dtype = self.accumulator(init.tensor)
                    view = acc[_slices(region(op.out, box))]
                    view[...] = encode(np.full(view.shape, _identity(init.identity, dtype)),
                                       dtype)
            written: dict[tuple[str, int], Region] = {}
            for op in ops:
                self.run_tile(op, group, index, counts, written)
        for fin in group.finishes:
            acc, dtype = self.accumulator(fin.tensor)
            value = kernels.finish(REDUCERS[fin.fn], decode(acc, dtype), fin.count)
            self.full(fin.tensor)[...] = encode(value, self.program.tensor(fin.tensor).dtype)

    def run_tile(self, op: Op, group: GroupPlan, index: tuple[int, ...],
                 counts: tuple[int, ...], written: dict[tuple[str, int], Region]) -> None:
        op_plan = self.op_plan(op)
        tile = tile_box(op.sizes, op_plan.loop, index, counts, op.name)
        boxes = core_boxes(op_plan, tile)
        shared: dict[str, np.ndarray] = {}
        lx_inputs = []
        for t in dict.fromkeys(a.tensor for a in op.ins):
            dtype = self.program.tensor(t).dtype
            tile_buf = self.buffer(t, "tile")
            if tile_buf is None or tile_buf.group != group.path:
                shared[t] = decode(self.full(t), dtype)
            elif tile_buf.space == "lx":
                lx_inputs.append((t, tile_buf))
            else:
                shared[t] = self._staged_tile(op, t, tile_buf, index, counts, boxes)

        def compute(core: int) -> object:
            box = boxes[core]
            assert box is not None
            env = dict(shared)
            for t, buf in lx_inputs:
                env[t] = self._staged_lx(op, t, buf, core, box, written)
            return partial_result(op, self.program, env, box)

        live = [c for c, b in enumerate(boxes) if b is not None]
        parts = list(self.pool.map(compute, live) if self.pool else map(compute, live))
        self._store(op, group, tile, {c: boxes[c] for c in live}, dict(zip(live, parts,
                                                                             strict=True)),
                    written)

    def _staged_tile(self, op: Op, t: str, buf: Buffer, index: tuple[int, ...],
                     counts: tuple[int, ...], boxes: list[Box | None]) -> np.ndarray:
        """A whole-tensor array holding the current tile of ``t`` from its device tile buffer."""
        producer = self.program.producer(t)
        assert producer is not None
        reg = region(producer.out, tile_box(producer.sizes, self.op_plan(producer).loop, index,
                                            counts, producer.name))
        reads = [a for a in op.ins if a.tensor == t]
        for box in boxes:
            if box is not None and not all(inside(region(a, box), reg) for a in reads):
                raise ExecutionError(f"op {op.name!r} reads {t!r} outside the tile {reg} its "
                                     "tile buffer holds this iteration")
        tt = self.program.tensor(t)
        staged = np.empty(tt.shape, dtype=kernels.storage_dtype(tt.dtype))
        staged[_slices(reg)] = decode(self.mem.view(buf, _extent(reg), tt.dtype), tt.dtype)
        return staged

    def _staged_lx(self, op: Op, t: str, buf: Buffer, core: int, box: Box,
                   written: dict[tuple[str, int], Region]) -> np.ndarray:
        """A whole-tensor array holding what ``core`` wrote of ``t`` in its scratchpad."""
        reg = written.get((t, core))
        reads = [region(a, box) for a in op.ins if a.tensor == t]
        if reg is None or not all(inside(r, reg) for r in reads):
            raise ExecutionError(f"op {op.name!r} core {core} reads {t!r} at {reads[0]}, but that "
                                 f"core's scratchpad holds {reg or 'nothing of it'} this "
                                 "iteration; only what a core wrote is in its scratchpad")
        tt = self.program.tensor(t)
        staged = np.empty(tt.shape, dtype=kernels.storage_dtype(tt.dtype))
        staged[_slices(reg)] = decode(self.mem.view(buf, _extent(reg), tt.dtype, core),
                                      tt.dtype)
        return staged

    def _store(self, op: Op, group: GroupPlan, tile: Box, boxes: dict[int, Box],
               parts: dict[int, object], written: dict[tuple[str, int], Region]) -> None:
        t = op.out.tensor
        dtype = self.program.tensor(t).dtype
        by_key: dict[tuple, list[int]] = {}
        for c, box in boxes.items():
            by_key.setdefault(tuple(box[d] for d in op.parallel_dims), []).append(c)
        acc = next((x for x in group.combines if x.op == op.name), None)
        tile_buf = self.buffer(t, "tile")
        tile_reg = region(op.out, tile)
        for cores in by_key.values():
            part = _combine(op, [parts[c] for c in cores])  # type: ignore[arg-type]
            reg = region(op.out, boxes[cores[0]])
            if acc is not None:
                whole, acc_dtype = self.accumulator(t)
                view = whole[_slices(reg)]
                both = [decode(view, acc_dtype).astype(np.asarray(part).dtype), part]
                view[...] = encode(kernels.combine_partials(REDUCERS[acc.fn], both),
                                   acc_dtype)
                continue
            value = encode(_finish_value(op, part), dtype)
            if tile_buf is None:
                self.full(t)[_slices(reg)] = value
            elif tile_buf.space == "hbm":
                self.mem.view(tile_buf, _extent(tile_reg), dtype)[_slices(reg, tile_reg)] = value
            else:
                if len(cores) > 1:
                    raise ExecutionError(f"op {op.name!r}: cores {cores} combine partials of "
                                         f"{t!r}, which the plan puts in their scratchpads")
                self.mem.view(tile_buf, _extent(reg), dtype, cores[0])[...] = value
                written[(t, cores[0])] = reg
        for copy in group.copies:
            if copy.op != op.name or tile_buf is None:
                continue
            full = self.full(t)
            if tile_buf.space == "hbm":
                full[_slices(tile_reg)] = self.mem.view(tile_buf, _extent(tile_reg), dtype)
            else:
                for c in boxes:
                    reg = written[(t, c)]
                    full[_slices(reg)] = self.mem.view(tile_buf, _extent(reg), dtype, c)


def _finish_value(op: Op, part: object) -> np.ndarray:
    if op.kind.reducer is None:
        return np.asarray(part)
    count = math.prod(op.sizes[d] for d in op.reduction_dims)
    return kernels.finish(op.kind.reducer, part, count)


def run_tiled(program: Program, plan: Plan, inputs: Mapping[str, np.ndarray],
              threads: int | None = None, params: Mapping[str, int] | None = None
              ) -> dict[str, np.ndarray]:
    """Run ``program`` as ``plan`` tiles, places and divides it; returns its whole tensors.

    The result holds the inputs and every tensor with a full or accumulator buffer (tensors
    that only ever exist one tile at a time are not in it). ``params`` gives the values of
    symbolic loop counts; ``threads`` > 1 runs an op's cores concurrently (same numbers).

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.pipeline import plan
    >>> from apportion.runtime.reference import compare, random_inputs, run_unplanned
    >>> from apportion.target import spyre
    >>> p = load("examples/fused.json")
    >>> xs = random_inputs(p)
    >>> all(c.ok for c in compare(run_unplanned(p, xs), run_tiled(p, plan(p, spyre()), xs), p))
    True
    """
    pool = ThreadPoolExecutor(max_workers=threads) if threads and threads > 1 else None
    try:
        run = _Run(program, plan, pool, params)
        for name, a in bind_inputs(program, inputs).items():
            run.full(name)[...] = encode(a, program.tensor(name).dtype)
        i = 0
        while i < len(program.ops):
            op = program.ops[i]
            loop = run.op_plan(op).loop
            if loop is None:
                run.run_whole(op)
                i += 1
                continue
            group = run.plan.group(loop.group)
            names = tuple(o.name for o in program.ops[i:i + len(group.ops)])
            if names != group.ops:
                raise ExecutionError(f"loop group {list(group.path)} runs ops "
                                     f"{list(group.ops)}, but the program has {list(names)} there")
            run.run_group(group)
            i += len(group.ops)
        out = {}
        for t in program.tensors:
            if run.buffer(t.name, "full") or run.buffer(t.name, "accumulator"):
                out[t.name] = decode(run.full(t.name), t.dtype).copy()
        return out
    finally:
        if pool is not None:
            pool.shutdown()
