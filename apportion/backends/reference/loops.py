"""Executor of loop nests: runs a schedule tile by tile, core by core, in simulated memory.

It walks the plan's schedule (``schedule.lower``: every launch's tile and cores' boxes at every
loop index, host steps, accumulator inits and finishes, tile copies, the plan's buffers) and
derives no box of its own. Device memory is one byte array and every core's scratchpad
another, and every tensor lives at the address its buffer gives (``Schedule.buffers``), so two
buffers the plan overlaps while both are live corrupt each other and the comparison with the
unplanned run fails. Elements are stored packed in row-major order of what a buffer holds (a
whole tensor, one tile, or one core's part of a tile in the scratchpad); bfloat16 as its 16
bits.

A launch outside loops runs box by box (``reference.run_op_boxes``). A loop runs its
iterations in order; in a body every launch runs over its tile: each core's box
(``Launch.boxes_at``) is computed by ``reference.partial_result`` from the buffers (a host step
on one core over its tile, ``Host.tile_at``, whole along the axis it works on), split
reductions are combined across cores, and the result is finished into its buffer (a tile buffer
holds the tile of the loops it lives in, ``values.outer_tile``: a producer deeper than it
writes its part) or, for a launch that accumulates, combined into its accumulator (set to its
identity by the ``Init`` before the loop tiling the reduction, finished into the tensor's
buffers by the ``Finish`` after it); a ``Copy`` writes a tile into the tensor's full buffer.

An op outside loops may write its output through a merge of dims (``y[t, 64*h+d]``): it writes
through the output's split view (``reference.split_view``), and a core's part kept in its
scratchpad is stored in the part's bounding region of the tensor (``region``), each element
where the merge puts it. Ops in a loop nest write one dim per axis (tiles, accumulators and
tile buffers are boxes of tensor axes): a merged write found in a loop nest is refused with an
``ExecutionError``, as is a step the executor cannot run (a launch over the devices of a mesh),
named.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np

from apportion.errors import ExecutionError
from apportion.ir.dtypes import dtype_bytes
from apportion.ir.kinds import REDUCERS
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.plans.memory import Buffer
from apportion.plans.tiles import Box, Region, inside, region
from apportion.runtime import kernels
from apportion.runtime.reference import (
    _combine,
    _operand,
    _out_slice,
    _to_out_layout,
    bind_inputs,
    check_cover,
    evaluate_op,
    partial_result,
    run_op_boxes,
    split_view,
)
from apportion.schedule.values import (
    Copy,
    Finish,
    Host,
    Init,
    Launch,
    Loop,
    Schedule,
    Step,
    moved,
    outer_tile,
)

#: tensor dtype -> numpy dtype of its bytes in simulated memory (bfloat16: the high 16 bits)
RAW: dict[str, type[np.generic]] = {**kernels.STORAGE, "bfloat16": np.uint16}


def encode(a: np.ndarray, dtype: str) -> np.ndarray:
    """A computed array as the bytes ``dtype`` stores: cast, bfloat16 cut to 16 bits (exact)."""
    s = kernels.to_storage(np.asarray(a), dtype)
    if dtype == "bfloat16":
        # ascontiguousarray makes a 0-d array 1-d: give the bits the value's shape back
        bits = np.ascontiguousarray(s, dtype=np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).reshape(np.shape(s))
    return s


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored bytes back as the storage array (``kernels.STORAGE``) of ``dtype``."""
    if dtype == "bfloat16":
        # asarray: a shift of a 0-d array gives a scalar, and callers index the result
        return np.asarray(raw.astype(np.uint32) << 16).view(np.float32)
    return raw


class Memory:
    """Device memory and one scratchpad per core, as bytes (filled with 0xFF: NaN for floats)."""

    def __init__(self, buffers: Sequence[Buffer], cores: int):
        hbm_end = max((b.end for b in buffers if b.space == "hbm"), default=0)
        self.hbm = np.full(hbm_end, 0xFF, dtype=np.uint8)
        lx = [b.end for b in buffers if b.space == "lx"]
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


def _within(step: Step) -> Iterator[Step]:
    """``step`` and, for a loop, every step of its body at any depth, in order."""
    yield step
    if isinstance(step, Loop):
        for s in step.body:
            yield from _within(s)


def _full_box(op: Op) -> Box:
    return {d: (0, n) for d, n in op.dims}


class _Run:
    """One execution of a schedule: its program, memory, a thread pool, and what the walk
    learns once (every op's step, the nest it runs in, every accumulator's init)."""

    def __init__(self, schedule: Schedule, pool: Executor | None):
        self.schedule, self.program, self.pool = schedule, schedule.program, pool
        self.mem = Memory(schedule.buffers, schedule.cores)
        #: op -> its launch or host step
        self.steps: dict[str, Launch | Host] = {}
        #: op -> the position in ``schedule.steps`` of the step (a loop nest) it runs in
        self.nest: dict[str, int] = {}
        #: accumulating op -> the init of its accumulator (its reset level: the init's loops)
        self.inits: dict[str, Init] = {}
        for k, top in enumerate(schedule.steps):
            for step in _within(top):
                if isinstance(step, Launch | Host):
                    self.steps[step.op], self.nest[step.op] = step, k
                elif isinstance(step, Init):
                    self.inits[step.op] = step
        #: (tensor, core) -> the region that core last wrote of a tensor in its scratchpad
        self.written: dict[tuple[str, int], Region] = {}
        #: (tensor, kind) -> its buffer of that kind (the first, as the plan lists them)
        self.buffers: dict[tuple[str, str], Buffer] = {}
        for b in schedule.buffers:
            self.buffers.setdefault((b.tensor, b.kind), b)

    def buffer(self, tensor: str, kind: str) -> Buffer | None:
        return self.buffers.get((tensor, kind))

    def whole(self, tensor: str) -> Buffer | None:
        """The buffer holding ``tensor`` whole: its full one, or an accumulator of the whole
        tensor in device memory that needs no finish step."""
        buf = self.buffer(tensor, "full")
        if buf is not None and buf.space == "lx":
            return None  # each core holds its part on chip
        if buf is None:
            acc = self.buffer(tensor, "accumulator")
            t = self.program.tensor(tensor)
            if acc is not None and acc.space == "hbm" and acc.shape == t.shape:
                buf = acc
        return buf

    def full(self, tensor: str) -> np.ndarray:
        buf = self.whole(tensor)
        if buf is None:
            raise ExecutionError(f"tensor {tensor!r} has no full buffer in the plan; plan the "
                                 "program with the pipeline (pass scratchpad assigns buffers)")
        t = self.program.tensor(tensor)
        return self.mem.view(buf, t.shape, t.dtype)

    def accumulator(self, tensor: str) -> tuple[Buffer, str]:
        """The accumulator buffer of ``tensor`` and the dtype it holds."""
        buf = self.buffer(tensor, "accumulator")
        if buf is None:
            raise ExecutionError(f"tensor {tensor!r} is combined in a loop but has no "
                                 "accumulator buffer in the plan")
        return buf, buf.dtype or self.program.tensor(tensor).dtype

    def init_of(self, op: Op) -> Init:
        init = self.inits.get(op.name)
        if init is None:
            raise ExecutionError(f"op {op.name!r} accumulates into {op.out.tensor!r}, but the "
                                 "schedule sets no accumulator of it to its identity")
        return init

    def acc_region(self, op: Op, index: tuple[int, ...], held: bool = False) -> Region:
        """The region of ``op``'s output its accumulator resets and finishes at loop ``index``
        (the init's region: the tile of the loops outside the one tiling its reduction;
        ``held``: the region its buffer holds, the whole tensor for a whole-tensor accumulator
        in device memory)."""
        if held:
            buf, _ = self.accumulator(op.out.tensor)
            if buf.space == "hbm" and buf.shape == self.program.tensor(op.out.tensor).shape:
                return region(op.out, _full_box(op))
        init = self.init_of(op)
        return init.at(index[:len(init.steps)])

    def acc_view(self, op: Op, reg: Region, index: tuple[int, ...], core: int
                 ) -> tuple[np.ndarray, str]:
        """The accumulator elements of region ``reg`` (in the scratchpad: ``core``'s part,
        which is all of ``reg``) and the dtype they hold."""
        buf, dtype = self.accumulator(op.out.tensor)
        if buf.space == "lx":
            return self.mem.view(buf, _extent(reg), dtype, core), dtype
        held = self.acc_region(op, index, held=True)
        return self.mem.view(buf, _extent(held), dtype)[_slices(reg, held)], dtype

    def acc_parts(self, op: Op, index: tuple[int, ...]) -> list[tuple[int, Region]]:
        """(core, region) of each part of ``op``'s accumulator at ``index``: every core's own in
        the scratchpad (what it writes at the first iteration of the loops inside), the whole
        tile (as core 0's) in device memory."""
        buf, _ = self.accumulator(op.out.tensor)
        if buf.space != "lx":
            return [(0, self.acc_region(op, index))]
        launch = self.steps[op.name]
        if not isinstance(launch, Launch):
            raise ExecutionError(f"op {op.name!r}: a host step has no accumulator")
        first = (*index, *(0,) * (launch.depth - len(index)))
        return [(c, r) for c, r in enumerate(launch.write.at(first)) if r is not None]

    # --- the walk ----------------------------------------------------------------------------

    def run(self, steps: Sequence[Step], index: tuple[int, ...]) -> None:
        """Run the steps of a body at loop ``index`` (outside loops: ``()``)."""
        for step in steps:
            if isinstance(step, Loop):
                for i in range(step.count):
                    self.run(step.body, (*index, i))
            elif isinstance(step, Launch | Host):
                if index:
                    self.run_tile(step, index)
                else:
                    self.run_whole(step)
            elif isinstance(step, Init):
                self._init(self.program.op(step.op), step.identity, index)
            elif isinstance(step, Finish):
                self._finish(self.program.op(step.op), step.fn, step.count, index)
            elif isinstance(step, Copy):
                self._copy(step, index)
            else:
                raise ExecutionError(f"the reference backend cannot run schedule step "
                                     f"{type(step).__name__}: {step}")

    def check(self) -> None:
        """Refuse, before anything runs, what the walk cannot run: a launch over the devices
        of a mesh, a merged write in a loop nest, a step of no kind it knows."""
        for step, loops in self.schedule.walk():
            if not isinstance(step, Launch | Host | Loop | Init | Finish | Copy):
                raise ExecutionError(f"the reference backend cannot run schedule step "
                                     f"{type(step).__name__}: {step}")
            if isinstance(step, Launch) and any(a.level != "core" for a in step.axes):
                over = ", ".join(f"{a} ({a.level})" for a in step.axes if a.level != "core")
                raise ExecutionError(f"launch of op {step.op!r} over {over}: the reference "
                                     "backend runs one device's schedule over its cores")
            if isinstance(step, Launch | Host) and loops:
                op = self.program.op(step.op)
                if op.merges_output:  # tiles, accumulators and buffers are boxes of the output
                    raise ExecutionError(
                        f"op {op.name!r} writes {op.out} through a merge of dims, but the plan "
                        f"runs it in loop group over {', '.join(loops[0].dims) or '-'}; an op "
                        "writing through a merge runs outside loop nests")

    # --- ops outside loops -------------------------------------------------------------------

    def on_chip(self, tensor: str) -> Buffer | None:
        """The scratchpad buffer holding an untiled op's output whole (each core its part)."""
        buf = self.buffer(tensor, "full")
        return buf if buf is not None and buf.space == "lx" else None

    def run_whole(self, step: Launch | Host) -> None:
        op = self.program.op(step.op)
        boxes = ([_full_box(op)] if isinstance(step, Host) else
                 [b for b in step.boxes_at(()) if b is not None])
        if self.on_chip(op.out.tensor) or any(self.on_chip(a.tensor) for a in op.ins):
            self._run_cores(op, boxes)
            return
        env = {a.tensor: decode(self.full(a.tensor), self.program.tensor(a.tensor).dtype)
               for a in op.ins}
        if isinstance(step, Host):
            out = evaluate_op(op, self.program, env)
        else:
            out = run_op_boxes(op, self.program, env, boxes, self.pool)
        self.full(op.out.tensor)[...] = encode(out, self.program.tensor(op.out.tensor).dtype)

    def _run_cores(self, op: Op, boxes: list[Box]) -> None:
        """An op outside loops core by core, its scratchpad operands each core's own part."""
        if op.kind.divisible:
            check_cover(op, boxes)
        shared: dict[str, np.ndarray] = {}
        on_chip = []
        for t in dict.fromkeys(a.tensor for a in op.ins):
            buf = self.on_chip(t)
            if buf is None:
                shared[t] = decode(self.full(t), self.program.tensor(t).dtype)
            else:
                on_chip.append((t, buf))

        def compute(core: int) -> object:
            env = dict(shared)
            for t, buf in on_chip:
                env[t] = self._staged_lx(op, t, buf, core, boxes[core])
            if not op.kind.divisible:
                return evaluate_op(op, self.program, env)
            return partial_result(op, self.program, env, boxes[core])

        cores = list(range(len(boxes)))
        parts = list(self.pool.map(compute, cores) if self.pool else map(compute, cores))
        t = op.out.tensor
        dtype = self.program.tensor(t).dtype
        out_buf = self.on_chip(t)
        by_key: dict[tuple, list[int]] = {}
        for c, box in enumerate(boxes):
            by_key.setdefault(tuple(box[d] for d in op.parallel_dims), []).append(c)
        for group in by_key.values():
            part = parts[group[0]] if not op.kind.divisible else _combine(
                op, [parts[c] for c in group])  # type: ignore[arg-type]
            # in the layout of the output as written: a merged axis split (``Op.split_out``)
            value = encode(part if not op.kind.divisible else _finish_value(op, part), dtype)
            box = boxes[group[0]]
            if out_buf is None:
                split_view(op, self.full(t))[_out_slice(op, box)] = value
                continue
            if len(group) > 1:
                raise ExecutionError(f"op {op.name!r}: cores {group} combine partials of "
                                     f"{t!r}, which the plan keeps in their scratchpads")
            reg = region(op.out, box)
            part_view = self.mem.view(out_buf, _extent(reg), dtype, group[0])
            _written_part(op, part_view, box)[...] = value
            self.written[(t, group[0])] = reg

    # --- loop bodies -------------------------------------------------------------------------

    def _init(self, op: Op, identity: float, index: tuple[int, ...]) -> None:
        """Set ``op``'s accumulator (the tile the loops outside the reset select) to the
        reduction's identity."""
        for core, reg in self.acc_parts(op, index):
            view, dtype = self.acc_view(op, reg, index, core)
            view[...] = encode(np.full(view.shape, _identity(identity, dtype)), dtype)

    def _finish(self, op: Op, fn: str, count: int, index: tuple[int, ...]) -> None:
        """Copy ``op``'s accumulator out, finished (cast, a mean divided), into the tensor's
        full buffer and its tile buffer, whichever it has."""
        t = op.out.tensor
        dtype = self.program.tensor(t).dtype
        full = self.buffer(t, "full")
        tile_buf = self.buffer(t, "tile")
        tile_reg = None if tile_buf is None else self._buffer_region(t, tile_buf, index)
        for core, reg in self.acc_parts(op, index):
            view, acc_dtype = self.acc_view(op, reg, index, core)
            value = encode(kernels.finish(REDUCERS[fn], decode(view, acc_dtype), count), dtype)
            if full is not None:
                self.full(t)[_slices(reg)] = value
            if tile_buf is not None and tile_reg is not None:
                self.mem.view(tile_buf, _extent(tile_reg), dtype)[_slices(reg, tile_reg)] = value

    def _buffer_region(self, t: str, buf: Buffer, index: tuple[int, ...]) -> Region:
        """The region of ``t`` its tile buffer holds at loop ``index``: its producer's tile of
        the loops the buffer lives in (``len(buf.group)`` outermost)."""
        producer = self.program.producer(t)
        assert producer is not None
        step = self.steps[producer.name]
        depth = min(len(buf.group), len(index))
        tile, steps = outer_tile(step.tile, step.steps, tuple(_full_box(producer).values()),
                                 depth)
        return region(producer.out, dict(zip(producer.dim_names,
                                             moved(tile, steps, index[:depth]), strict=True)))

    def run_tile(self, step: Launch | Host, index: tuple[int, ...]) -> None:
        op = self.program.op(step.op)
        if isinstance(step, Launch):
            tile = step.tile_at(index)
            boxes = list(step.boxes_at(index))
        else:  # a fallback, on one core over its tile
            tile = dict(zip(op.dim_names, step.tile_at(index), strict=True))
            boxes = [tile]
        shared: dict[str, np.ndarray] = {}
        lx_inputs = []
        for t in dict.fromkeys(a.tensor for a in op.ins):
            dtype = self.program.tensor(t).dtype
            tile_buf = self.buffer(t, "tile")
            producer = self.program.producer(t)
            if tile_buf is None or producer is None or \
                    self.nest.get(producer.name) != self.nest[op.name]:
                on_chip = self.on_chip(t)  # an untiled op's output, each core its part
                if on_chip is not None:
                    lx_inputs.append((t, on_chip))
                else:
                    shared[t] = decode(self.full(t), dtype)
            elif tile_buf.space == "lx":
                lx_inputs.append((t, tile_buf))
            else:
                shared[t] = self._staged_tile(op, t, tile_buf, index, boxes)

        def compute(core: int) -> object:
            box = boxes[core]
            assert box is not None
            env = dict(shared)
            for t, buf in lx_inputs:
                env[t] = self._staged_lx(op, t, buf, core, box)
            if not op.kind.divisible:
                return _fallback_tile(op, self.program, env, box)
            return partial_result(op, self.program, env, box)

        live = [c for c, b in enumerate(boxes) if b is not None]
        parts = list(self.pool.map(compute, live) if self.pool else map(compute, live))
        mode = step.mode if isinstance(step, Launch) else "write"
        self._store(op, mode, tile, {c: b for c in live if (b := boxes[c]) is not None},
                    dict(zip(live, parts, strict=True)), index)

    def _staged_tile(self, op: Op, t: str, buf: Buffer, index: tuple[int, ...],
                     boxes: Sequence[Box | None]) -> np.ndarray:
        """A whole-tensor array holding the current tile of ``t`` from its device tile buffer."""
        reg = self._buffer_region(t, buf, index)
        reads = [a for a in op.ins if a.tensor == t]
        for box in boxes:
            if box is not None and not all(inside(region(a, box), reg) for a in reads):
                raise ExecutionError(f"op {op.name!r} reads {t!r} outside the tile {reg} its "
                                     "tile buffer holds this iteration")
        tt = self.program.tensor(t)
        staged = np.empty(tt.shape, dtype=kernels.storage_dtype(tt.dtype))
        staged[_slices(reg)] = decode(self.mem.view(buf, _extent(reg), tt.dtype), tt.dtype)
        return staged

    def _staged_lx(self, op: Op, t: str, buf: Buffer, core: int, box: Box) -> np.ndarray:
        """A whole-tensor array holding what ``core`` wrote of ``t`` in its scratchpad."""
        reg = self.written.get((t, core))
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

    def _store(self, op: Op, mode: str, tile: Box, boxes: dict[int, Box],
               parts: dict[int, object], index: tuple[int, ...]) -> None:
        t = op.out.tensor
        dtype = self.program.tensor(t).dtype
        by_key: dict[tuple, list[int]] = {}
        for c, box in boxes.items():
            by_key.setdefault(tuple(box[d] for d in op.parallel_dims), []).append(c)
        fn = self.init_of(op).fn if mode == "accumulate" else None
        tile_buf = self.buffer(t, "tile")
        buf_reg = region(op.out, tile) if tile_buf is None else \
            self._buffer_region(t, tile_buf, index)
        for cores in by_key.values():
            part = _combine(op, [parts[c] for c in cores])  # type: ignore[arg-type]
            reg = region(op.out, boxes[cores[0]])
            if fn is not None:
                view, acc_dtype = self.acc_view(op, reg, index, cores[0])
                both = [decode(view, acc_dtype).astype(np.asarray(part).dtype), part]
                view[...] = encode(kernels.combine_partials(REDUCERS[fn], both), acc_dtype)
                continue
            value = encode(_finish_value(op, part), dtype)
            if tile_buf is None:
                self.full(t)[_slices(reg)] = value
            elif tile_buf.space == "hbm":
                self.mem.view(tile_buf, _extent(buf_reg), dtype)[_slices(reg, buf_reg)] = value
            else:
                if len(cores) > 1:
                    raise ExecutionError(f"op {op.name!r}: cores {cores} combine partials of "
                                         f"{t!r}, which the plan puts in their scratchpads")
                self.mem.view(tile_buf, _extent(reg), dtype, cores[0])[...] = value
                self.written[(t, cores[0])] = reg

    def _copy(self, copy: Copy, index: tuple[int, ...]) -> None:
        """Copy the tile of ``copy.tensor`` its op just wrote into the tensor's full buffer."""
        t = copy.tensor
        tile_buf = self.buffer(t, "tile")
        if tile_buf is None:
            return  # written into its full buffer directly
        dtype = self.program.tensor(t).dtype
        full = self.full(t)
        if tile_buf.space == "hbm":
            tile_reg = copy.at(index)
            buf_reg = self._buffer_region(t, tile_buf, index)
            whole_tile = self.mem.view(tile_buf, _extent(buf_reg), dtype)
            full[_slices(tile_reg)] = whole_tile[_slices(tile_reg, buf_reg)]
            return
        step = self.steps[copy.op]
        cores = ([0] if isinstance(step, Host) else
                 [c for c, b in enumerate(step.boxes_at(index)) if b is not None])
        for c in cores:
            reg = self.written[(t, c)]
            full[_slices(reg)] = self.mem.view(tile_buf, _extent(reg), dtype, c)


def _written_part(op: Op, held: np.ndarray, box: Box) -> np.ndarray:
    """The elements ``op`` writes over ``box`` within ``held``, a packed array of the box's
    bounding region of the output (``region(op.out, box)``), in the layout of the output as
    written (``Op.split_out``): ``held`` itself, but for a merged write a strided view (a
    merged axis is a stride per dim, ``64*h+d``: 64 rows and 1; where an inner dim is split,
    the part leaves gaps in its bounding region, which hold other cores' elements).

    >>> from apportion.ir.op import Access
    >>> op = Op.build("m", "copy", Access.parse("y[t,4*h+d]"), (Access.parse("x[t,h,d]"),),
    ...               {"t": 2, "h": 3, "d": 4})
    >>> held = np.arange(2 * 7).reshape(2, 7)  # y[0:2, 1:8]: h in 0..1, d in 1..3
    >>> _written_part(op, held, {"t": (0, 2), "h": (0, 2), "d": (1, 4)})[1].tolist()
    [[7, 8, 9], [11, 12, 13]]
    """
    if not op.merges_output:
        return held
    assert held.flags.c_contiguous, "a scratchpad part is packed"
    shape, strides = [], []
    for e, ds, step in zip(op.out.index, op.out_digits, _row_strides(held), strict=True):
        if not ds:  # a literal 0: one element
            shape.append(1)
            strides.append(0)
        for d in ds:
            shape.append(box[d][1] - box[d][0])
            strides.append(e.coeff(d) * step)
    return np.lib.stride_tricks.as_strided(held, tuple(shape), tuple(strides))


def _row_strides(a: np.ndarray) -> list[int]:
    """Row-major strides in bytes of a packed array's shape (numpy's own may differ on size-1
    axes)."""
    out, step = [], a.itemsize
    for n in reversed(a.shape):
        out.append(step)
        step *= n
    return out[::-1]


def _fallback_tile(op: Op, program: Program, env: Mapping[str, np.ndarray], box: Box
                   ) -> np.ndarray:
    """A fallback op over ``box`` of its iteration space (whole along the axis it works on),
    in its output's layout."""
    if op.kind.whole:
        return evaluate_op(op, program, env)
    src = op.ins[0]
    dtype = kernels.compute_dtype([program.tensor(src.tensor).dtype], op.kind)
    res = kernels.fallback(op.kind, env[src.tensor].astype(dtype))
    by_dim = _operand(op, src, res, box, dtype)
    shape = [box[d][1] - box[d][0] for d in op.dim_names]
    return _to_out_layout(op, by_dim.reshape(shape))


def _finish_value(op: Op, part: object) -> np.ndarray:
    if op.kind.reducer is None:
        return np.asarray(part)
    count = math.prod(op.sizes[d] for d in op.reduction_dims)
    return kernels.finish(op.kind.reducer, part, count)


def run_schedule(schedule: Schedule, inputs: Mapping[str, np.ndarray],
                 threads: int | None = None) -> dict[str, np.ndarray]:
    """Run ``schedule`` (``schedule.lower``) in simulated memory at its buffers' addresses;
    returns its program's whole tensors.

    The result holds the inputs and every tensor with a full or accumulator buffer (tensors
    that only ever exist one tile at a time are not in it). ``threads`` > 1 runs an op's cores
    concurrently (same numbers).

    >>> import apportion as ap
    >>> from apportion.runtime.reference import compare, random_inputs, run_unplanned
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre())
    >>> xs = random_inputs(planned.program)
    >>> got = run_schedule(planned.lowered, xs)
    >>> all(c.ok for c in compare(run_unplanned(planned.program, xs), got, planned.program))
    True
    """
    program = schedule.program
    pool = ThreadPoolExecutor(max_workers=threads) if threads and threads > 1 else None
    try:
        run = _Run(schedule, pool)
        run.check()
        for name, a in bind_inputs(program, inputs).items():
            run.full(name)[...] = encode(a, program.tensor(name).dtype)
        run.run(schedule.steps, ())
        out = {}
        for t in program.tensors:
            if run.whole(t.name) is not None:
                out[t.name] = decode(run.full(t.name), t.dtype).copy()
        return out
    finally:
        if pool is not None:
            pool.shutdown()
