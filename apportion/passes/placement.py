"""Scratchpad placement of one loop group: which per-iteration tiles stay on chip, and where.

Not a pass: the scratchpad pass places every group with it, and group distribution and auto-tile
ask it what a trial would keep on chip, so it lives below them.

In one loop body every op of a group runs once, in program order (copies right after their
producer). A per-tile tensor lives from the op that writes it to the last op of the body that
reads it; it can sit in the scratchpad when every core reads only what the same core wrote:

* its producer does not split a reduction dim over cores (those partials meet in device memory),
* every reader in the group reads it with the producer's own index, and each reader core's box
  lies inside the producer core's box (with a symbolic count: the same splits on its dims and
  none elsewhere, so that this holds for any count).

Such tensors are placed in program order at 128-byte aligned offsets (``target.alignment``):
space is freed after a tensor's last read; an elementwise op whose input dies at it writes its
output in place over that input when the two cover the same elements; otherwise the smallest free
gap that fits is taken (best fit, lowest offset on ties). A tensor that fits nowhere in
``target.scratchpad_capacity`` keeps a per-tile buffer in device memory. A tile buffer that
lives in fewer loops than its producer or a reader (see pass ``buffers``) is live through those
deeper loops; one written by a producer deeper than it stays in device memory.

Accumulators copied out by a finish step are placed next, around the tiles (group distribution
weighs the tiles only, so theirs stays the placement it measured): each lives through the loop
tiling its reduction and may sit in the scratchpad when every core combines into its own part
on every iteration of that loop. One left in device memory that needs no cast, division or tile
for readers in the group becomes the tensor itself (its finish is dropped). The working set of a
group is the scratchpad that placing all of them would need (alignment and reuse included).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from apportion.ir.dtypes import dtype_bytes
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.passes.buffers import Steps, TensorRole, accumulator_dtype, needs_finish
from apportion.passes.coarse_tile import GroupTiling, Tiling
from apportion.plans.memory import FinishOp, GroupPlan
from apportion.plans.plan import LoopInfo, OpPlan
from apportion.plans.tiles import Region, core_boxes, inside, region, tile_box
from apportion.plans.views import core_slices
from apportion.target.layout import device_layout
from apportion.target.target import Target


@dataclass(frozen=True)
class Request:
    """A tensor asking for scratchpad: its body positions, bytes per core, in-place candidates."""

    tensor: str
    start: int
    end: int
    nbytes: int
    inplace: tuple[str, ...] = ()


def align(n: int, alignment: int) -> int:
    """``n`` rounded up to a multiple of ``alignment``.

    >>> align(130, 128)
    256
    """
    return -(-n // alignment) * alignment


def place(requests: list[Request], capacity: int | None) -> dict[str, int]:
    """Offsets of the requests that fit (in request order; sizes already aligned).

    >>> place([Request("a", 0, 1, 256), Request("b", 1, 2, 128), Request("c", 2, 2, 128)], None)
    {'a': 0, 'b': 256, 'c': 0}
    """
    live: dict[str, tuple[int, int]] = {}  # tensor -> (offset, nbytes)
    ends = {r.tensor: r.end for r in requests}
    out: dict[str, int] = {}
    for r in sorted(requests, key=lambda q: q.start):
        for t in [t for t in live if ends[t] < r.start]:
            del live[t]
        reuse = next((t for t in r.inplace if t in live and ends[t] == r.start
                      and live[t][1] >= r.nbytes), None)
        if reuse is not None:  # the input dies at this op: write the output over it
            out[r.tensor] = live.pop(reuse)[0]
            live[r.tensor] = (out[r.tensor], r.nbytes)
            continue
        spans = sorted(live.values())
        gaps, at = [], 0
        for off, n in spans:
            if off > at:
                gaps.append((off - at, at))
            at = max(at, off + n)
        tail = math.inf if capacity is None else capacity - at
        fitting = [(size, off) for size, off in gaps if size >= r.nbytes]
        if fitting:
            out[r.tensor] = min(fitting)[1]
        elif tail >= r.nbytes:
            out[r.tensor] = at
        else:
            continue
        live[r.tensor] = (out[r.tensor], r.nbytes)
    return out


def tile_shape(op: Op, program: Program, sizes: dict[str, int]) -> tuple[int, ...]:
    """Elements of ``op``'s output one iteration writes (whole axes where not indexed by a dim)."""
    shape = program.tensor(op.out.tensor).shape
    return tuple(e.extent(sizes) if e.terms else n
                 for e, n in zip(op.out.index, shape, strict=True))


#: the most inner iterations of a reader whose core boxes a placement checks one by one
MAX_CHECKED = 4096


def op_counts(group: GroupTiling, loop: LoopInfo) -> tuple[int, ...]:
    """An op's loop counts, each symbolic one at the value the group's tiles were planned at."""
    planned = {n: v for n, _lo, _hi, v in group.symbolic}
    return tuple(c if isinstance(c, int) else planned.get(c, 1) for c in loop.count)


def buffer_box(op: Op, group: GroupTiling, depth: int) -> dict[str, tuple[int, int]]:
    """The box of ``op``'s iteration space that a tile buffer at ``depth`` holds (at loop
    index 0: every iteration's has the same extents)."""
    loop = group.tile(op.name).loop
    return tile_box(op.sizes, loop, (0,) * depth, op_counts(group, loop), op.name)


def buffer_shape(op: Op, program: Program, group: GroupTiling, depth: int) -> tuple[int, ...]:
    """Elements of ``op``'s output a tile buffer at ``depth`` holds."""
    box = buffer_box(op, group, depth)
    return tile_shape(op, program, {d: hi - lo for d, (lo, hi) in box.items()})


def lifetime(group: GroupTiling, roles: Mapping[str, TensorRole], tensor: str
             ) -> tuple[int, int]:
    """Body positions (indices in ``group.ops``) from the first write of a tile buffer to its
    last read. A buffer lives through whole loops: written in a loop deeper than it, it is live
    from that loop's first op; read in one, to its last op (every iteration reads it)."""
    role = roles[tensor]
    pos = group.positions
    c = role.depth

    def loop_span(path: tuple[int, ...], at: int) -> tuple[int, int]:
        if len(path) == c:
            return at, at
        return group.extent(path, c + 1)

    p = pos[role.producer or ""]
    start, end = loop_span(group.tile(role.producer or "").loop.group, p)
    for r in role.inside:
        end = max(end, loop_span(group.tile(r).loop.group, pos[r])[1])
    return start, end


def lx_bytes(producer: Op, readers: list[Op], plans: dict[str, OpPlan], program: Program,
              target: Target, symbolic: bool, group: GroupTiling | None = None,
              depth: int | None = None) -> int | None:
    """Bytes per core of the producer's output in the scratchpad, or None when it cannot be.

    With ``group`` and the buffer's ``depth``, the readers' boxes are checked at every
    iteration of their loops deeper than the buffer (a producer writing its tiles one by one
    into a coarser buffer cannot keep it on chip)."""
    pp = plans[producer.name]
    if not producer.kind.divisible or any(pp.split_map[d] > 1 for d in producer.reduction_dims):
        return None
    out = producer.out
    if group is None:
        mine: list = [region(out, b) for b in core_slices(pp)]
    else:
        ploop = group.tile(producer.name).loop
        if depth is not None and depth < len(ploop.count):
            return None
        depth = len(ploop.count)
        mine = [None if b is None else region(out, b)
                for b in core_boxes(pp, buffer_box(producer, group, depth))]
    for r in readers:
        accs = [a for a in r.ins if a.tensor == out.tensor]
        if any(a.index != out.index for a in accs):
            return None
        rp = plans[r.name]
        if symbolic and not _same_cuts(producer, pp, r, rp):
            return None
        for theirs in _reader_regions(r, rp, out, group, depth):
            if theirs is None or len(theirs) > len(mine) or not all(
                    t is None or (m is not None and inside(t, m))
                    for t, m in zip(theirs, mine, strict=False)):
                return None
    t = program.tensor(out.tensor)
    eps = target.elems_per_stick(t.dtype)
    per_core = 0
    for reg in mine:
        if reg is None:
            continue
        ext = [hi - lo for lo, hi in reg]
        if ext:
            ext[-1] = -(-ext[-1] // eps) * eps  # whole sticks
        per_core = max(per_core, math.prod(ext) * dtype_bytes(t.dtype))
    return align(per_core, target.alignment)


def _reader_regions(r: Op, rp: OpPlan, out: Access, group: GroupTiling | None,
                    depth: int | None) -> Iterator[list | None]:
    """Per iteration of the reader's loops deeper than the buffer, its cores' regions of the
    buffer's tensor (None for a core with nothing; a None list where they cannot be known)."""
    if group is None or depth is None:
        yield [region(out, b) for b in core_slices(rp)]
        return
    loop = group.tile(r.name).loop
    inner = loop.count[depth:]
    counts = op_counts(group, loop)
    if any(isinstance(c, str) for c in inner) or math.prod(counts[depth:]) > MAX_CHECKED:
        yield None
        return
    for j in itertools.product(*(range(c) for c in counts[depth:])):
        box = tile_box(r.sizes, loop, (0,) * depth + j, counts, r.name)
        yield [None if b is None else region(out, b) for b in core_boxes(rp, box)]


def _same_cuts(p: Op, pp: OpPlan, r: Op, rp: OpPlan) -> bool:
    # Equal cuts of the tensor's dims and none elsewhere give equal core boxes for any tile.
    dims = set(p.out.dims)
    for plan in (pp, rp):
        if any(n > 1 for d, n in plan.splits if d not in dims):
            return False
    cut_p = [(d, pp.split_map[d], dict(pp.unit_elems)[d]) for d in p.dim_names
             if d in dims and pp.split_map[d] > 1]
    cut_r = [(d, rp.split_map[d], dict(rp.unit_elems)[d]) for d in r.dim_names
             if d in dims and rp.split_map[d] > 1]
    return cut_p == cut_r


def inplace_inputs(op: Op, program: Program) -> tuple[str, ...]:
    """Inputs ``op`` may overwrite with its output: pointwise, same index, dtype size and boxes."""
    if not op.kind.elementwise:
        return ()
    out_t = program.tensor(op.out.tensor)
    cands = []
    for a in op.ins:
        t = program.tensor(a.tensor)
        if a.index == op.out.index and t.shape == out_t.shape and \
                dtype_bytes(t.dtype) == dtype_bytes(out_t.dtype):
            cands.append(a.tensor)
    return tuple(cands)


def plan_group(program: Program, target: Target, group: GroupTiling,
               roles: Mapping[str, TensorRole], plans: dict[str, OpPlan],
               steps: Steps = ((), (), (), ())) -> tuple[GroupPlan, dict[str, tuple[int, int]]]:
    """The group's scratchpad plan and its placements ``tensor -> (offset, bytes per core)``."""
    symbolic = any(isinstance(c, str) for c in group.counts)
    requests, region_bytes = [], {}
    for name in group.ops:
        op = program.op(name)
        role = roles[op.out.tensor]
        if role.role != "tile":
            continue
        readers = [program.op(r) for r in role.inside]
        start, end = lifetime(group, roles, op.out.tensor)
        nbytes = lx_bytes(op, readers, plans, program, target, symbolic, group, role.depth)
        if nbytes is None:
            continue
        region_bytes[op.out.tensor] = nbytes
        lx_inputs = tuple(t for t in inplace_inputs(op, program) if t in region_bytes
                          and same_boxes(program, t, op, plans)
                          and same_loop(group, roles, t, op))
        requests.append(Request(op.out.tensor, start, end, nbytes, lx_inputs))
    inits, combines, copies, finishes = steps
    # accumulators copied out by a finish step, in the space the tiles leave (group
    # distribution weighs the tiles alone, so theirs is the placement it measured)
    accs = []
    for fin in finishes:
        op = program.op(fin.op)
        nbytes = acc_lx_bytes(op, plans[op.name], program, group, fin.level, target)
        if nbytes is not None:
            region_bytes[fin.tensor] = nbytes
            accs.append(Request(fin.tensor, *loop_span(group, op.name, fin.level), nbytes))
    everything = place(requests, None)
    everything.update(place_around(requests, everything, accs, None))
    working = max((everything[r.tensor] + r.nbytes for r in (*requests, *accs)), default=0)
    fitted = place(requests, target.scratchpad_capacity)
    fitted.update(place_around(requests, fitted, accs, target.scratchpad_capacity))
    placed = {t: (off, region_bytes[t]) for t, off in fitted.items()}
    # an accumulator left in device memory that needs no cast, division or tile for readers in
    # the group is better the tensor itself: it accumulates in place, with no copy-out
    finishes = tuple(f for f in finishes if f.tensor in placed or roles[f.tensor].inside
                     or needs_finish(program.op(f.op), program))
    tiles = [program.op(n).out.tensor for n in group.ops
             if roles[program.op(n).out.tensor].role == "tile"]
    saved = 0
    for t in tiles:
        full = device_bytes(program.tensor(t).shape, program.tensor(t).dtype, target)
        used = full if roles[t].copy else 0
        if t not in placed:
            op = program.op(roles[t].producer or "")
            used += device_bytes(buffer_shape(op, program, group, roles[t].depth),
                                 program.tensor(t).dtype, target)
        saved += full - used
    for fin in finishes:  # against a whole-tensor accumulator in device memory
        op = program.op(fin.op)
        acc = accumulator_dtype(op, program)
        full = device_bytes(program.tensor(fin.tensor).shape, acc, target)
        used = 0 if fin.tensor in placed else device_bytes(
            buffer_shape(op, program, group, fin.level), acc, target)
        saved += full - used
    lx = [t for t in (*tiles, *(f.tensor for f in finishes)) if t in placed]
    gp = GroupPlan(group.path, group.ops, group.counts, group.dims, working,
                   target.scratchpad_capacity, tuple(lx),
                   tuple(t for t in tiles if t not in placed), saved, inits, combines, copies,
                   finishes, symbolic=group.symbolic)
    return gp, placed


class CoreRegions:
    """Per-core regions of accesses under op plans, memoized by value for one placement.

    A region list depends only on the access's index and the plan's iteration space, units and
    splits, never on names; identical ops planned alike (a chain of pointwise ops, a model's
    repeated layers) then share one computation instead of cutting 32 boxes per tensor each.
    """

    def __init__(self) -> None:
        self._regions: dict[tuple[object, ...], list[Region]] = {}
        self._contained: dict[tuple[object, ...], bool] = {}
        self._bytes: dict[tuple[object, ...], int] = {}

    @staticmethod
    def _key(access: Access, plan: OpPlan) -> tuple[object, ...]:
        return access.index, plan.iteration_space, plan.unit_elems, plan.splits

    def regions(self, access: Access, plan: OpPlan) -> list[Region]:
        """``region(access, b)`` of every core's box ``b`` of ``plan`` (``core_slices``)."""
        key = self._key(access, plan)
        found = self._regions.get(key)
        if found is None:
            found = self._regions[key] = [region(access, b) for b in core_slices(plan)]
        return found

    def contained(self, access: Access, reader: OpPlan, owner: OpPlan) -> bool:
        """True when every core of ``reader`` reads through ``access`` only within what the
        same core of ``owner`` covers through it."""
        key = (self._key(access, reader), self._key(access, owner)[1:])
        found = self._contained.get(key)
        if found is None:
            theirs, owned = self.regions(access, reader), self.regions(access, owner)
            found = self._contained[key] = len(theirs) <= len(owned) and all(
                inside(t, m) for t, m in zip(theirs, owned, strict=False))
        return found

    def lx_bytes(self, access: Access, plan: OpPlan, dtype: str, target: Target) -> int:
        """Bytes per core of ``plan``'s output written through ``access`` kept in the
        scratchpad: the largest core's region in whole sticks, aligned."""
        key = (self._key(access, plan), dtype, target.elems_per_stick(dtype), target.alignment)
        found = self._bytes.get(key)
        if found is None:
            eps = target.elems_per_stick(dtype)
            per_core = 0
            for reg in self.regions(access, plan):
                ext = [hi - lo for lo, hi in reg]
                if ext:
                    ext[-1] = -(-ext[-1] // eps) * eps  # whole sticks
                per_core = max(per_core, math.prod(ext) * dtype_bytes(dtype))
            found = self._bytes[key] = align(per_core, target.alignment)
        return found


def untiled_lx_bytes(producer: Op, readers: list[Op], plans: Mapping[str, OpPlan],
                     program: Program, target: Target, tiling: Tiling,
                     memo: CoreRegions | None = None) -> int | None:
    """Bytes per core of an untiled op's output in the scratchpad, or None when it cannot be:
    every core of every reader (outside loops, or in a loop group at every iteration) reads only
    what the same core of the producer wrote. ``memo`` shares region lists across calls."""
    memo = memo or CoreRegions()
    pp = plans[producer.name]
    if not producer.kind.divisible or any(pp.split_map[d] > 1 for d in producer.reduction_dims):
        return None
    out = producer.out
    # readers read ``out`` through the producer's own index, so containment is checked in the
    # split view (``Op.split_out``), where a core's part is a box; in the tensor's axes a part
    # of a merged axis with an inner dim split has gaps, and its bounding box (what the
    # scratchpad holds) may hold another core's elements
    seen = producer.split_out
    for r in readers:
        if any(a.index != out.index for a in r.ins if a.tensor == out.tensor):
            return None
        rp = plans[r.name]
        group = tiling.group_of(r.name)
        if group is None:
            if not memo.contained(seen, rp, pp):
                return None
            continue
        owned = memo.regions(seen, pp)
        for theirs in _reader_regions(r, rp, seen, group, 0):
            if theirs is None or len(theirs) > len(owned) or not all(
                    t is None or inside(t, m) for t, m in zip(theirs, owned, strict=False)):
                return None
    return memo.lx_bytes(out, pp, program.tensor(out.tensor).dtype, target)


def plan_program(program: Program, target: Target, tiling: Tiling,
                 roles: Mapping[str, TensorRole], plans: Mapping[str, OpPlan],
                 groups: Mapping[int, tuple[GroupPlan, Mapping[str, tuple[int, int]]]]
                 ) -> dict[str, tuple[int, int]]:
    """The scratchpad of the whole program: the outputs of ops outside loop groups placed
    around what the groups keep (``groups``: each group's plan and placements), by lifetimes in
    program order; ``tensor -> (offset, bytes per core)`` of those that fit.

    A tensor lives from its producer to its last reader; a reader in a loop group keeps it
    until the group's end. Program outputs stay in device memory, and so does a tensor some
    reader core would read another core's part of.
    """
    pos = program.op_positions
    placed: list[Request] = []
    offsets: dict[str, int] = {}
    for g in tiling.groups:
        gp, where = groups[g.index]
        s0 = pos[g.ops[0]]
        finishes: dict[str, FinishOp] = {}
        for f in gp.finishes:
            finishes.setdefault(f.tensor, f)
        for t, (off, n) in where.items():
            producer = roles[t].producer or ""
            fin = finishes.get(t)
            start, end = loop_span(g, producer, fin.level) if fin else lifetime(g, roles, t)
            placed.append(Request(t, s0 + start, s0 + end, n))
            offsets[t] = off
    requests, sizes = [], {}
    memo = CoreRegions()
    for op in program.ops:
        t = op.out.tensor
        if tiling.group_of(op.name) is not None or t in program.output_set:
            continue
        readers = list(program.consumers(t))
        if not readers:
            continue
        nbytes = untiled_lx_bytes(op, readers, plans, program, target, tiling, memo)
        if nbytes is None:
            continue
        end = 0
        for r in readers:
            g = tiling.group_of(r.name)
            end = max(end, pos[r.name] if g is None else pos[g.ops[-1]])
        requests.append(Request(t, pos[op.name], end, nbytes))
        sizes[t] = nbytes
    fitted = place_around(placed, offsets, requests, target.scratchpad_capacity)
    return {t: (off, sizes[t]) for t, off in fitted.items()}


def loop_span(group: GroupTiling, op: str, depth: int) -> tuple[int, int]:
    """Body positions of the loop at ``depth`` holding ``op`` (depth 0: the whole nest)."""
    return group.extent(group.tile(op).loop.group, depth + 1)


def acc_lx_bytes(op: Op, plan: OpPlan, program: Program, group: GroupTiling, level: int,
                 target: Target) -> int | None:
    """Bytes per core of ``op``'s accumulator in the scratchpad, or None when it cannot be:
    every core must combine into the same part of it on every iteration of the loop at
    ``level`` (no reduction dim split over cores, no output dim tiled inside that loop)."""
    if any(plan.split_map[d] > 1 for d in op.reduction_dims):
        return None
    loop = group.tile(op.name).loop
    red = set(op.reduction_dims)
    counts = op_counts(group, loop)
    if any(set(dims) - red for dims, c in zip(loop.tiled_dims[level:], counts[level:],
                                              strict=True) if c != 1):
        return None
    box = tile_box(op.sizes, loop, (0,) * len(counts), counts, op.name)
    dtype = accumulator_dtype(op, program)
    eps = target.elems_per_stick(dtype)
    per_core = 0
    for b in core_boxes(plan, box):
        if b is None:
            continue
        ext = [hi - lo for lo, hi in region(op.out, b)]
        if ext:
            ext[-1] = -(-ext[-1] // eps) * eps  # whole sticks
        per_core = max(per_core, math.prod(ext) * dtype_bytes(dtype))
    return align(per_core, target.alignment)


def best_fit(busy: Iterable[tuple[int, int]], nbytes: int, capacity: int | None) -> int | None:
    """The offset of ``nbytes`` among the ``busy`` (offset, bytes) ranges: the smallest gap
    that holds it (lowest offset on ties), else the end of the last range if ``capacity``
    allows; None when it fits nowhere.

    >>> best_fit([(0, 64), (128, 64)], 32, 256), best_fit([(0, 64)], 256, 256)
    (64, None)
    """
    gaps, at = [], 0
    for off, n in sorted(busy):
        if off > at:
            gaps.append((off - at, at))
        at = max(at, off + n)
    fitting = [(size, off) for size, off in gaps if size >= nbytes]
    if fitting:
        return min(fitting)[1]
    if capacity is None or capacity - at >= nbytes:
        return at
    return None


def place_around(placed: list[Request], offsets: Mapping[str, int], requests: list[Request],
                 capacity: int | None) -> dict[str, int]:
    """Offsets for ``requests`` around the already ``placed`` ones (at ``offsets``): each in
    the smallest gap free over its lifetime (lowest offset on ties), in order of start.

    >>> a = Request("a", 0, 3, 256)
    >>> place_around([a], {"a": 0}, [Request("x", 1, 2, 128), Request("y", 4, 5, 128)], 512)
    {'x': 256, 'y': 0}
    """
    # Requests come in order of start, so a buffer that ended before one request's start is
    # free for every later one: ``live`` holds the started buffers (dropped by end, from a
    # heap) and ``ahead`` the placed ones not yet started, sorted by start. Each request then
    # looks only at the buffers overlapping it, never at everything placed so far, which
    # made a long program's placement quadratic.
    ahead = sorted((r.start, r.end, offsets[r.tensor], r.nbytes) for r in placed
                   if r.tensor in offsets)
    starts = [s for s, _, _, _ in ahead]
    live: dict[int, tuple[int, int]] = {}  # key -> (offset, bytes)
    ends: list[tuple[int, int]] = []  # heap of (end, key) over ``live``
    key = 0
    nxt = 0  # the first entry of ``ahead`` not yet started
    out: dict[str, int] = {}
    for r in sorted(requests, key=lambda q: q.start):
        while nxt < len(ahead) and ahead[nxt][0] <= r.start:
            _, e, off, n = ahead[nxt]
            nxt += 1
            live[key] = (off, n)
            heapq.heappush(ends, (e, key))
            key += 1
        while ends and ends[0][0] < r.start:
            del live[heapq.heappop(ends)[1]]
        later = (ahead[i] for i in range(nxt, bisect.bisect_right(starts, r.end, lo=nxt)))
        busy = [*live.values(), *((off, n) for _, e, off, n in later if e >= r.start)]
        at = best_fit(busy, r.nbytes, capacity)
        if at is None:
            continue
        out[r.tensor] = at
        live[key] = (at, r.nbytes)
        heapq.heappush(ends, (r.end, key))
        key += 1
    return out


def same_loop(group: GroupTiling, roles: Mapping[str, TensorRole], tensor: str, op: Op
              ) -> bool:
    """True when ``op`` and the producer of ``tensor`` run in the same loop, each writing its
    whole tile buffer there (so ``op`` may write its output over ``tensor``)."""
    producer = roles[tensor].producer
    if producer is None or producer not in group.positions:
        return False
    a, b = group.tile(producer).loop, group.tile(op.name).loop
    return a.group == b.group and roles[tensor].depth == len(a.group) == \
        roles[op.out.tensor].depth


def same_boxes(program: Program, tensor: str, op: Op, plans: dict[str, OpPlan]) -> bool:
    producer = program.producer(tensor)
    if producer is None:
        return False
    a = [region(producer.out, b) for b in core_slices(plans[producer.name])]
    b = [region(op.out, x) for x in core_slices(plans[op.name])]
    return a == b


def device_bytes(shape: tuple[int, ...], dtype: str, target: Target) -> int:
    """Bytes a tensor of ``shape`` takes in device memory (its device layout, sticks padded)."""
    return device_layout(shape, dtype, target).nbytes
