"""Batched boxes: the boxes of a launch at every iteration of its loops, and the lattices they
form, so that an op runs as one kernel call per lattice rather than one per box.

``schedule_steps`` turns a lowered schedule into the torch backend's steps
(``steps.make_step``), one per launch and host step, each launch's boxes listed with their
positions in the launch's grid (``launch_boxes``) and batched (``batched``).

Where an op's boxes form a lattice (equal boxes whose every operand view is the first box's
moved by a fixed offset per moving loop level and per worker axis, as an even split gives), the
op runs as one kernel call on strided views with one leading axis per lattice axis, each box a
batch element, so each box is still computed from its own views alone but the Python work is
paid once per op rather than once per box (a Llama forward at 32 cores has about 3,300 boxes).
An uneven split (10 over 4: 3, 3, 2, 2) is one lattice per box size; an op on one core a
lattice of one box. A matmul lattice is one GEMM (``steps.Gemm``, ``_gemm_of``): the axes that
move both operands are its batch, those that move only the left one stack their boxes as rows,
only the right one as columns (a GEMM computes every row and column of its result from that
row and column alone; a batched GEMM whose right operand repeats along a batch axis would copy
it per batch element). Where one lattice writes the whole output in row-major order, its
result (cast) is the output, not copied; it is kept in the lattice's shape, which strided views
read alike (``tensors.shaped`` gives a whole-tensor reader and the caller the tensor's own
shape). Split reductions run box by box, as do the boxes of no lattice (``loose``) and every op
given to the pool.

>>> import apportion as ap
>>> from apportion.schedule.lower import lower
>>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
>>> steps = schedule_steps(lower(planned.program, planned.plan, planned.target))
>>> [(s.op.name, len(s.boxes), [lat.shape for lat in s.lattices]) for s in steps][:2]
[('gate', 8, [(2, 4)]), ('up', 8, [(2, 4)])]
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

from apportion.backends.torch.steps import Gemm, Lattice, Step, make_step
from apportion.backends.torch.tensors import View, is_whole
from apportion.plans.tiles import Box
from apportion.schedule.values import Host, Launch, Schedule

__all__ = ["Position", "batched", "launch_boxes", "schedule_steps"]

#: where a box sits in its launch's grid: its index along each loop level that moves the
#: launch (more than one iteration), then along each worker axis of more than one worker
Position = tuple[int, ...]


def launch_boxes(launch: Launch, counts: Sequence[int]
                 ) -> tuple[list[Box], list[int], list[Position]]:
    """Every worker's box of a launch over every iteration of its enclosing loops (of
    ``counts``), in loop order, the iteration of each and its position in the grid: the
    schedule's boxes at each loop index. A level that moves none of the launch's boxes
    recomputes the same tile each iteration: the same numbers once."""
    once = [c if level in launch.moving else 1 for level, c in enumerate(counts)]
    levels = [level for level, c in enumerate(once) if c > 1]
    sizes = [a.size for a in launch.axes]
    split = [j for j, n in enumerate(sizes) if n > 1]
    boxes, iters, where = [], [], []
    for k, index in enumerate(itertools.product(*(range(c) for c in once))):
        for w, b in enumerate(launch.boxes_at(index)):
            if b is None:  # a core with nothing of a tile smaller than planned
                continue
            worker, rest = [0] * len(sizes), w
            for j in reversed(range(len(sizes))):  # row-major, the last axis fastest
                rest, worker[j] = divmod(rest, sizes[j])
            boxes.append(b)
            iters.append(k)
            where.append((*(index[level] for level in levels), *(worker[j] for j in split)))
    return boxes, iters, where


def _gemm_of(step: Step, shape: Sequence[int], reads: Sequence[View], write: View
             ) -> Gemm | None:
    """A matmul lattice as one GEMM (``Gemm``); None where a lattice axis moves neither
    operand."""
    nl = len(shape)
    nb, nm, nk, nn = step.counts
    (size_a, stride_a, _), (size_b, stride_b, _) = reads
    both = [i for i in range(nl) if stride_a[i] and stride_b[i]]
    rows = [i for i in range(nl) if stride_a[i] and not stride_b[i]]
    cols = [i for i in range(nl) if stride_b[i] and not stride_a[i]]
    if len(both) + len(rows) + len(cols) != nl:
        return None
    batch = list(range(nl, nl + nb))
    m = list(range(nl + nb, nl + nb + nm))  # in the left operand and the output
    k = list(range(nl + nb + nm, nl + nb + nm + nk))  # in the left operand
    kb = list(range(nl + nb, nl + nb + nk))  # in the right operand
    n_b = list(range(nl + nb + nk, nl + nb + nk + nn))  # in the right operand
    n_out = list(range(nl + nb + nm, nl + nb + nm + nn))  # in the output

    def count(sizes: Sequence[int], *groups: list[int]) -> int:
        return math.prod(sizes[j] for g in groups for j in g)

    def view(v: View, *groups: list[int]) -> View:
        order = [j for g in groups for j in g]
        return tuple(v[0][j] for j in order), tuple(v[1][j] for j in order), v[2]

    lead = count(size_a, both, batch)
    lead_shape = () if lead == 1 else (lead,)
    return Gemm(a=view(reads[0], both, batch, rows, m, k),
                 shape_a=(*lead_shape, count(size_a, rows, m), count(size_a, k)),
                 b=view(reads[1], both, batch, kb, cols, n_b),
                 shape_b=(*lead_shape, count(size_b, kb), count(size_b, cols, n_b)),
                 write=view(write, both, batch, rows, m, cols, n_out))


def _sub_lattice(step: Step, members: Sequence[int], where: Sequence[Position],
                 views: Sequence[Sequence[View]]) -> Lattice | None:
    """The lattice the boxes ``members`` (equal boxes) form, or None: their positions fill
    a block of the grid, and every view of each is the first box's moved by a fixed offset
    per grid axis along which the block is more than one box long."""
    pos = [where[i] for i in members]
    if len(set(pos)) != len(pos):
        return None
    nd = len(pos[0])
    lo = [min(p[a] for p in pos) for a in range(nd)]
    ext = [max(p[a] for p in pos) - lo[a] + 1 for a in range(nd)]
    if math.prod(ext) != len(members):
        return None
    at = dict(zip(pos, members, strict=True))
    axes = [a for a in range(nd) if ext[a] > 1]
    first = at[tuple(lo)]
    nexts = [at[tuple(lo[b] + (b == a) for b in range(nd))] for a in axes]
    moved: list[View] = []
    for v, view in enumerate(views[first]):
        base = view[2]
        strides = [views[j][v][2] - base for j in nexts]
        if any(s < 0 for s in strides):
            return None  # torch takes no negative stride
        for i, p in zip(members, pos, strict=True):
            if views[i][v][2] != base + sum((p[a] - lo[a]) * s
                                            for a, s in zip(axes, strides, strict=True)):
                return None
        moved.append(((*(ext[a] for a in axes), *view[0]), (*strides, *view[1]), base))
    shape = tuple(ext[a] for a in axes)
    reads, write = tuple(moved[:-1]), moved[-1]
    gemm = _gemm_of(step, shape, reads, write) if step.mode == "mm" else None
    whole = is_whole(write if gemm is None else gemm.write, step.out_shape)
    operands = tuple((n, *v, c, is_whole(v, v[0]), math.prod(shape) == 1)
                     for n, v, c, shape in zip(step.reads, reads, step.casts, step.in_shapes,
                                               strict=True))
    return Lattice(first, shape, reads, write, whole, gemm, operands)


def batched(step: Step, where: Sequence[Position]) -> Step:
    """``step`` with its boxes batched where they form lattices: the boxes grouped by their
    sizes (and scale and starts), each group a lattice where its positions fill a block of
    the grid and every view moves by a fixed offset per grid axis (``_sub_lattice``). An even
    split is one lattice; an uneven one (10 over 4: 3, 3, 2, 2) one per size; boxes in none
    run one by one (``loose``). A split reduction's boxes combine and run box by box."""
    modes = ("copy", "elementwise", "mm", "matmul", "reduce")
    if step.mode not in modes or not step.boxes or not all(step.solo):
        return step
    views = [(*r, w) for r, w in zip(step.box_reads, step.box_writes, strict=True)]
    groups: dict[Any, list[int]] = {}
    for i, vs in enumerate(views):
        key = (tuple(v[:2] for v in vs),
               *(per[i] for per in (step.box_shapes, step.box_scales, step.box_starts) if per))
        groups.setdefault(key, []).append(i)
    lattices: list[Lattice] = []
    loose: list[int] = []
    for members in groups.values():
        lat = _sub_lattice(step, members, where, views)
        if lat is None:
            loose += members
        else:
            lattices.append(lat)
    if not lattices:
        return step
    if len(lattices) > 1 or loose:
        lattices = [dataclasses.replace(lat, whole=False) for lat in lattices]
    return dataclasses.replace(step, lattices=tuple(lattices), loose=tuple(sorted(loose)))


def schedule_steps(schedule: Schedule) -> tuple[Step, ...]:
    """The torch steps of a schedule: one per launch and host step, in order, each with the
    tensors no later step reads (the schedule's lifetimes) to free after it."""
    steps: list[Step] = []
    for item, loops in schedule.walk():
        if isinstance(item, Host):
            steps.append(make_step(item, ([], []), schedule.program))
        elif isinstance(item, Launch):
            boxes, iters, where = launch_boxes(item, [lp.count for lp in loops])
            steps.append(batched(make_step(item, (boxes, iters), schedule.program), where))
    keep = set(schedule.program.inputs) | set(schedule.program.outputs)
    dead: dict[int, list[str]] = {}
    for life in schedule.lifetimes:
        if life.tensor not in keep:
            dead.setdefault(life.last, []).append(life.tensor)
    return tuple(dataclasses.replace(s, free=tuple(dead[i])) if i in dead else s
                 for i, s in enumerate(steps))

