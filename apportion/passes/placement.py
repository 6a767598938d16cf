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
``target.scratchpad_capacity`` keeps a per-tile buffer in device memory. The working set of a
group is the scratchpad that placing all of them would need (alignment and reuse included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from apportion.ir.dtypes import dtype_bytes
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.passes.buffers import Steps, TensorRole
from apportion.passes.coarse_tile import GroupTiling
from apportion.plans.memory import GroupPlan
from apportion.plans.plan import OpPlan
from apportion.plans.tiles import inside, region
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
    return tuple(sizes[e.single_dim] if e.single_dim else n
                 for e, n in zip(op.out.index, shape, strict=True))


def lx_bytes(producer: Op, readers: list[Op], plans: dict[str, OpPlan], program: Program,
              target: Target, symbolic: bool) -> int | None:
    """Bytes per core of the producer's output in the scratchpad, or None when it cannot be."""
    pp = plans[producer.name]
    if not producer.kind.divisible or any(pp.split_map[d] > 1 for d in producer.reduction_dims):
        return None
    out = producer.out
    mine = [region(out, b) for b in core_slices(pp)]
    for r in readers:
        accs = [a for a in r.ins if a.tensor == out.tensor]
        if any(a.index != out.index for a in accs):
            return None
        rp = plans[r.name]
        if symbolic and not _same_cuts(producer, pp, r, rp):
            return None
        theirs = [region(out, b) for b in core_slices(rp)]
        if len(theirs) > len(mine) or not all(map(inside, theirs, mine)):
            return None
    t = program.tensor(out.tensor)
    eps = target.elems_per_stick(t.dtype)
    per_core = 0
    for reg in mine:
        ext = [hi - lo for lo, hi in reg]
        if ext:
            ext[-1] = -(-ext[-1] // eps) * eps  # whole sticks
        per_core = max(per_core, math.prod(ext) * dtype_bytes(t.dtype))
    return align(per_core, target.alignment)


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
    for pos, name in enumerate(group.ops):
        op = program.op(name)
        role = roles[op.out.tensor]
        if role.role != "tile":
            continue
        readers = [program.op(r) for r in role.inside]
        end = max([group.ops.index(r) for r in role.inside], default=pos)
        nbytes = lx_bytes(op, readers, plans, program, target, symbolic)
        if nbytes is None:
            continue
        region_bytes[op.out.tensor] = nbytes
        lx_inputs = tuple(t for t in inplace_inputs(op, program) if t in region_bytes
                          and same_boxes(program, t, op, plans))
        requests.append(Request(op.out.tensor, pos, end, nbytes, lx_inputs))
    everything = place(requests, None)
    working = max((everything[r.tensor] + r.nbytes for r in requests), default=0)
    fitted = place(requests, target.scratchpad_capacity)
    placed = {t: (off, region_bytes[t]) for t, off in fitted.items()}
    tiles = [program.op(n).out.tensor for n in group.ops
             if roles[program.op(n).out.tensor].role == "tile"]
    saved = 0
    for t in tiles:
        full = device_bytes(program.tensor(t).shape, program.tensor(t).dtype, target)
        used = full if roles[t].copy else 0
        if t not in placed:
            op = program.op(roles[t].producer or "")
            used += device_bytes(tile_shape(op, program, plans[op.name].sizes),
                                 program.tensor(t).dtype, target)
        saved += full - used
    inits, combines, copies, finishes = steps
    gp = GroupPlan(group.path, group.ops, group.counts, group.dims, working,
                   target.scratchpad_capacity, tuple(t for t in tiles if t in placed),
                   tuple(t for t in tiles if t not in placed), saved, inits, combines, copies,
                   finishes)
    return gp, placed


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
