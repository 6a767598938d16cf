"""Outputs written through a merge of dims in the parallel IR (``mlir.forall``).

An op that writes ``y[t, 64*h+d]`` runs as the op that writes ``y[t, h, d]`` (``written``: one
dim per digit, outermost first, as ``Op.out_digits`` lists them) into a ``tensor.expand_shape``
of its destination into the split shape (``Op.split_shape``: the row-major reshape of the
tensor); a ``tensor.collapse_shape`` of the result gives the tensor back in its own shape. The
thread boxes, slices, partials of a split reduction and accumulators are then those of an op
that writes one dim per axis.

A destination whose merged axis is only a part of that axis (a loop iteration's tile) cannot be
split so: a loop iteration's fresh tile of such an op is made in the split shape instead and
collapsed where its digits lie contiguously in the merged axis (every inner digit whole where an
outer one spans several values); elsewhere the tile is no box of the tensor and ``EmitError``
names the op, the tensor and the digits.
"""

from __future__ import annotations

import dataclasses
import math

from apportion.errors import EmitError
from apportion.ir.affine import AffineExpr
from apportion.ir.op import Access, Op
from apportion.limits import cite
from apportion.mlir.builder import Block, symbol_name
from apportion.mlir.forall.tensors import TensorVal
from apportion.mlir.index import Ix


def merges(op: Op) -> bool:
    """True when an output axis of ``op`` is written through anything but one dim or a literal:
    a merge of dims (``64*h+d``), or a size-1 dim with a coefficient (``3*u``)."""
    return any(e.terms and e.single_dim is None for e in op.out.index)


def written(op: Op) -> Op:
    """``op`` writing its output as split: one dim per digit of each merged axis.

    >>> op = Op.build("m", "exp", Access.parse("y[t,64*h+d]"), (Access.parse("x[t,h,d]"),),
    ...               {"t": 8, "h": 4, "d": 64})
    >>> str(written(op).out), reassociation(op)
    ('y[t, h, d]', [[0], [1, 2]])
    """
    if not merges(op):
        return op
    index: list[AffineExpr] = []
    for e, ds in zip(op.out.index, op.out_digits, strict=True):
        if ds:
            index.extend(AffineExpr.dim(d) for d in ds)
        else:
            index.append(e)
    return dataclasses.replace(op, out=Access(op.out.tensor, tuple(index)))


def reassociation(op: Op) -> list[list[int]]:
    """Per output axis, the axes of the split view it is made of (``tensor.expand_shape``)."""
    groups: list[list[int]] = []
    at = 0
    for ds in op.out_digits:
        n = max(1, len(ds))
        groups.append(list(range(at, at + n)))
        at += n
    return groups


def _merged_axis(op: Op, axis: int) -> str:
    return f"axis {axis} ({op.out.index[axis].to_source()})"


def _collapsed(blk: Block, op: Op, view: TensorVal, shape: tuple[Ix, ...], origin: tuple[Ix, ...]
               ) -> TensorVal:
    """``view`` collapsed back into the output's axes (``shape``, with ``origin``)."""
    out = TensorVal(blk.fresh(symbol_name(op.out.tensor)), shape, view.elt, origin)
    blk.emit(f"{out.ssa} = tensor.collapse_shape {view.ssa} {reassociation(op)} : {view.type} "
             f"into {out.type}")
    return out


def split_view(blk: Block, op: Op, dest: TensorVal) -> TensorVal:
    """``dest`` (the whole of every merged axis) expanded into the split shape."""
    groups = reassociation(op)
    if all(len(g) == 1 for g in groups):
        return dest
    shape: list[Ix] = []
    origin: list[Ix] = []
    for axis, (ds, g) in enumerate(zip(op.out_digits, groups, strict=True)):
        if len(g) == 1:
            shape.append(dest.shape[axis])
            origin.append(dest.origin[axis])
            continue
        n = math.prod(op.sizes[d] for d in ds)
        if dest.shape[axis] != Ix(n) or dest.origin[axis] != Ix(0):
            raise EmitError(
                f"op {op.name!r} writes tensor {op.out.tensor!r} through a merge of dims "
                f"on {_merged_axis(op, axis)}, but its destination holds only a part of "
                f"that axis ({dest.shape[axis]} elements from {dest.origin[axis]}); the "
                "parallel IR splits only a whole merged axis "
                f"{cite('iree-merged-write-destination')}")
        shape += [Ix(op.sizes[d]) for d in ds]
        origin += [Ix(0)] * len(ds)
    view = TensorVal(blk.fresh(f"{symbol_name(op.out.tensor)}_split"), tuple(shape),
                     dest.elt, tuple(origin))
    blk.emit(f"{view.ssa} = tensor.expand_shape {dest.ssa} {groups} output_shape "
             f"[{blk.operands(shape)}] : {dest.type} into {view.type}")
    return view


def merge_view(blk: Block, op: Op, view: TensorVal, like: TensorVal) -> TensorVal:
    """``view`` (as ``split_view`` made it from ``like``) collapsed into ``like``'s shape."""
    groups = reassociation(op)
    if all(len(g) == 1 for g in groups):
        return like.renamed(view.ssa)
    return _collapsed(blk, op, view, like.shape, like.origin)


def merged_tile(blk: Block, op: Op, view: TensorVal) -> TensorVal:
    """A tile made in the split shape (static bounds per digit, an origin per digit) as a
    tile of the tensor's own axes: each merged axis one contiguous run of elements."""
    groups = reassociation(op)
    if all(len(g) == 1 for g in groups):
        return view
    shape: list[Ix] = []
    origin: list[Ix] = []
    for axis, (ds, g) in enumerate(zip(op.out_digits, groups, strict=True)):
        if len(g) == 1:
            shape.append(view.shape[g[0]])
            origin.append(view.origin[g[0]])
            continue
        whole, held, start = 1, 1, Ix(0)
        spans: list[str] = []
        for d, i in reversed(list(zip(ds, g, strict=True))):
            b = view.shape[i]
            if not b.is_const:
                raise EmitError(f"op {op.name!r}: the tile of tensor {op.out.tensor!r} has a "
                                f"run-time extent along dim {d!r} of the merge on "
                                f"{_merged_axis(op, axis)} "
                                f"{cite('iree-merged-write-destination')}")
            if b.value > 1 and held != whole:
                raise EmitError(
                    f"op {op.name!r} writes tensor {op.out.tensor!r} through a merge of dims "
                    f"on {_merged_axis(op, axis)}, but its loop tile takes {b.value} "
                    f"values of dim {d!r} and only part of dim {spans[-1]!r}: that tile is "
                    "no contiguous part of the axis, as a tile in the parallel IR must be "
                    "(tile the outer dims of the merge only) "
                    f"{cite('iree-merged-write-destination')}")
            start = start + view.origin[i] * whole
            if b.value < op.sizes[d]:
                spans.append(d)
            whole *= op.sizes[d]
            held *= b.value
        shape.append(Ix(held))
        origin.append(start)
    return _collapsed(blk, op, view, tuple(shape), tuple(origin))
