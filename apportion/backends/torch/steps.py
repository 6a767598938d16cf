"""How one op of a schedule runs in torch: a ``Step``, built once per launch or host step
(``make_step``) with every box's operand and output views (``tensors.view``).

- Matmul and convolution: ``torch.matmul`` where the op is ``(batch, m, k) @ (batch, k, n)``
  (each operand read in that dim order, each group of dims merged: ``_mm_orders``), else
  ``torch.einsum`` over the views; BLAS either way. How each kind runs is one table,
  ``kernels.KERNELS``. Pointwise and layout kinds: their registry semantics (``ir.kinds``,
  written against an array namespace) run with torch as the namespace (``XP``), or one fused
  torch kernel where a formula would take several (``silu``, ``sigmoid``, ...; same math);
  copies and casts are one ``copy_``. Reductions ``sum``, ``mean``, ``max``, ``min``,
  ``prod``, ``any`` and ``argmax`` (value and global index pairs, as the reference) in torch.
  A box alone in its output slice is written at once; the partials of a split reduction are
  returned for the executor to combine in box order with the kind's reducer (``combine`` and
  ``finish`` run on ``XP``). A core's piece, its partials and their combination are in the
  layout of the output's split view, whatever the box cuts of a merged axis.
- Compute dtypes (``_compute_dtype``): float16, bfloat16 and bool operands compute in float32,
  float32 ones in float64 as the reference does (but in matmuls, which compute in float32 as
  eager PyTorch does, within the float32 tolerance, and in the pointwise kinds whose float32
  result is the float64 one rounded, bit for bit: ``kernels.ROUNDED_ONCE``, add, mul, where,
  ...; sums and means still accumulate in float64); integer (and bool) value operands compute
  in int64, exactly and wrapping on overflow, where the kind has integer semantics
  (``kernels.integer_semantics``), else in float64, as the reference executor does; condition
  operands are read as bools. Results are cast once, to the output's dtype (bfloat16 is
  stored as torch's bfloat16).
- Whole-tensor steps: a host step runs whole (``mode`` ``whole``, ``numpy``, or ``scan``: a
  ``cumsum`` or ``flip`` computed in float64 or int64 in torch, ``kernels.SCANS``); the
  executor runs those.
- Batched boxes: a step whose boxes form lattices (``batching.batched``) computes each lattice
  in one kernel call (``Step.all_boxes``), a matmul lattice as one GEMM (``Gemm``).

>>> import apportion as ap
>>> from apportion.schedule.lower import lower
>>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
>>> s = lower(planned.program, planned.plan, planned.target)
>>> launch = next(item for item, _ in s.walk())
>>> step = make_step(launch, (list(launch.boxes_at(())), [0] * 8), s.program)
>>> step.op.name, step.mode, len(step.boxes)
('gate', 'mm', 8)
"""

from __future__ import annotations

import functools
import math
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.backends.torch.kernels import (
    ROUNDED_ONCE,
    SCANS,
    WHOLE,
    XP,
    direct,
    kernel,
    reduce,
    torch,
)
from apportion.backends.torch.tensors import View, cast, strided, torch_dtype, view
from apportion.errors import ExecutionError
from apportion.ir.kinds import FLOATS, INTEGERS, Category, OpKind, Partial
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.plans.tiles import Box
from apportion.runtime import kernels
from apportion.runtime.reference import check_cover
from apportion.runtime.torch_xp import saturate
from apportion.schedule.values import Host, Launch

__all__ = ["Gemm", "Lattice", "Step", "make_step"]


@dataclass(frozen=True)
class Gemm:
    """A matmul lattice as one ``torch.matmul``: the lattice axes that move both operands
    join the batch, those that move only the left operand stack their boxes as rows, those
    that move only the right one as columns (a GEMM computes every row and column of its
    result on its own, from that row and column alone, so each box is still computed from its
    own views). ``a`` and ``b`` are the operands' views over the lattice with their axes in
    that order (batch, rows, k; batch, k, columns), reshaped to ``shape_a`` and ``shape_b``;
    the product, split back into ``write``'s sizes, goes through ``write``, the output's view
    in the same order."""

    a: View
    shape_a: tuple[int, ...]
    b: View
    shape_b: tuple[int, ...]
    write: View


@dataclass(frozen=True)
class Lattice:
    """Boxes of one step that form a lattice (``batching.batched``): equal boxes whose every view is
    the first one's moved by a fixed offset per lattice axis. ``box`` is that first box (its
    sizes, scale and starts are every box's), ``shape`` the lattice's axes, ``reads`` and
    ``write`` each operand's and the output's view over the lattice (its axes first).
    ``whole``: the write view is the whole output in row-major order, so the result, cast,
    is the output itself (no copy)."""

    box: int
    shape: tuple[int, ...]
    reads: tuple[View, ...]
    write: View
    whole: bool = False
    gemm: Gemm | None = None
    #: each read as (tensor, sizes, strides, offset, the dtype it converts to or None, and
    #: whether the view is row-major from the tensor's first element: then a stored tensor
    #: already of those sizes is the view itself, the result of a step split alike; and
    #: whether the tensor holds one element: it is cast before it is broadcast, so that the
    #: cast converts one number and the kernel sees a scalar operand, not a copy per box)
    operands: tuple[tuple[str, tuple[int, ...], tuple[int, ...], int, Any, bool, bool], ...
                    ] = ()


@dataclass(frozen=True)
class Step:
    """One op of the schedule: how it runs (``mode``), its boxes with every operand's view,
    which boxes combine (a split reduction), and the tensors no later op reads (``free``)."""

    op: Op
    mode: str  # copy, elementwise, mm, matmul, reduce, whole, scan, numpy
    boxes: tuple[Box, ...]
    groups: tuple[tuple[int, ...], ...]  # box indices per output slice, in box order
    solo: tuple[bool, ...]  # the box is alone in its output slice
    iters: tuple[int, ...]  # the loop iteration of each box (0 outside loops)
    reads: tuple[str, ...]
    casts: tuple[Any, ...]  # the torch dtype each input converts to (None: as stored)
    box_reads: tuple[tuple[View, ...], ...]
    box_writes: tuple[View, ...]
    out: str
    out_dtype: str
    out_shape: tuple[int, ...]
    compute: Any  # torch dtype of the computation
    out_torch: Any = None  # torch dtype of the output
    in_shapes: tuple[tuple[int, ...], ...] = ()  # each input's shape
    fn: Callable[..., Any] | None = None  # elementwise and whole: the function, attrs bound
    equation: str = ""  # matmul: the einsum
    counts: tuple[int, int, int, int] = (0, 0, 0, 0)  # mm: batch, m, k and n dims
    box_shapes: tuple[tuple[int, ...], ...] = ()  # matmul: result shape; reduce: the box's
    box_scales: tuple[int, ...] = ()  # matmul: points of reduction dims no input reads
    box_starts: tuple[tuple[int, ...], ...] = ()  # reduce: where the box starts in them
    axes: tuple[int, ...] = ()  # reduce: the reduced axes
    red_sizes: tuple[int, ...] = ()  # reduce: full sizes of the reduction dims
    free: tuple[str, ...] = ()
    #: the boxes batched (``batching.batched``): one lattice per set of equal boxes forming one, and
    #: the boxes in none (``loose``), run one by one; no lattices where boxes combine
    lattices: tuple[Lattice, ...] = ()
    loose: tuple[int, ...] = ()

    def box(self, env: Mapping[str, Any], out: Any, i: int) -> Partial | None:
        """Compute box ``i``: write it when it is alone in its output slice (None), else
        return its partial."""
        xs = [strided(env[n], v) for n, v in zip(self.reads, self.box_reads[i], strict=True)]
        if self.mode == "copy":  # a copy or cast: one copy_
            self.write(out, self.box_writes[i], xs[0])
            return None
        part = self._part(xs, i, (), self.box_writes[i][0])
        if not self.solo[i]:
            return part
        self.write(out, self.box_writes[i], self.finished(part))
        return None

    def all_boxes(self, env: Mapping[str, Any]) -> Any:
        """The output, every lattice computed in one kernel call (each box a batch element of
        the lattice's views, so each is still computed on its own), the loose boxes one by
        one: only for a step whose boxes are all alone in their output slices (``lattices``
        non-empty). One lattice writing the whole output row-major gives the output itself."""
        lat = self.lattices[0]
        if lat.whole and self.mode == "elementwise":  # the most common step, in one place
            xs = []
            for name, size, stride, offset, cast, plain, one in lat.operands:
                t = env[name]  # contiguous, as every stored tensor
                if one and cast is not None:
                    t = t.to(cast)
                    cast = None
                x = t if plain and t.shape == size else \
                    t.as_strided(size, stride, t.storage_offset() + offset)
                xs.append(x if cast is None else x.to(cast))
            value = self.fn(*xs)  # type: ignore[misc]
            if value.dtype != self.out_torch:
                value = self.stored(value)
            if value.shape == lat.write[0] and value.is_contiguous() and \
                    not value._is_view() and all(value is not x for x in xs):
                return value  # a new tensor laid out as the output: the output (``shaped``)
            out = torch.empty(self.out_shape, dtype=self.out_torch)
            self.write(out, lat.write, value)
            return out
        if lat.whole and self.mode == "reduce" and self.axes and \
                self.op.kind.reducer.name in ("sum", "mean"):  # type: ignore[union-attr]
            # a sum or mean (a norm's): summed in its compute dtype by torch.sum itself (the
            # same sum of the same widened numbers, without a widened copy of the input)
            name, size, stride, offset, cast, plain, _ = lat.operands[0]
            t = env[name]
            x = t if plain and t.shape == size else \
                t.as_strided(size, stride, t.storage_offset() + offset)
            box = (*lat.shape, *self.box_shapes[lat.box])
            if x.shape != box:  # a dim the input does not read: summed over all the same
                x = x.expand(box)
            nl = len(lat.shape)
            part = torch.sum(x, dim=tuple(a + nl for a in self.axes),
                             dtype=self.compute if cast is not None else None)
            value = self.stored(self.finished(part))
            if value.shape == lat.write[0] and value.is_contiguous() and not value._is_view():
                return value
            out = torch.empty(self.out_shape, dtype=self.out_torch)
            self.write(out, lat.write, value)
            return out
        if lat.whole:
            return self._lattice(env, lat, None)
        out = torch.empty(self.out_shape, dtype=self.out_torch)
        for lat in self.lattices:
            self._lattice(env, lat, out)
        for i in self.loose:
            self.box(env, out, i)
        return out

    def _lattice(self, env: Mapping[str, Any], lat: Lattice, out: Any) -> Any:
        """Compute the boxes of ``lat`` and write them into ``out``; with ``out`` None (a
        whole lattice), return the result as the output."""
        if lat.gemm is not None:
            return self._gemm(env, lat, out)
        xs = [strided(env[n], v) for n, v in zip(self.reads, lat.reads, strict=True)]
        if self.mode == "copy":
            if out is None:
                out = torch.empty(self.out_shape, dtype=self.out_torch)
            self.write(out, lat.write, xs[0])
            return out
        value = self.finished(self._part(xs, lat.box, lat.shape, lat.write[0]))
        if out is None:
            value = self.stored(value)
            # the result itself, where it is a new tensor laid out as the output (kept in
            # the lattice's shape: every read is a strided view of the storage, and
            # ``shaped`` gives it the output's shape where a whole tensor is read)
            if value.shape == lat.write[0] and value.is_contiguous() and \
                    not value._is_view() and all(value is not x for x in xs):
                return value
            out = torch.empty(self.out_shape, dtype=self.out_torch)
        self.write(out, lat.write, value)
        return out

    def _gemm(self, env: Mapping[str, Any], lat: Lattice, out: Any) -> Any:
        """A matmul lattice as one ``torch.matmul`` (``Gemm``)."""
        g = lat.gemm
        assert g is not None
        a, b = (strided(env[n], v) for n, v in zip(self.reads, (g.a, g.b), strict=True))
        if self.casts[0] is not None:
            a = a.to(self.casts[0])
        if self.casts[1] is not None:
            b = b.to(self.casts[1])
        part = torch.matmul(a.reshape(g.shape_a), b.reshape(g.shape_b))
        scale = self.box_scales[lat.box]
        if scale != 1:  # the same product once per point of a reduction dim no input reads
            part = part * scale
        part = self.stored(part)
        if out is None:  # the output, in the product's shape (``shaped``)
            return part
        strided(out, g.write).copy_(part.view(g.write[0]))
        return out

    def _part(self, xs: list[Any], i: int, lead: tuple[int, ...], shape: tuple[int, ...]
              ) -> Partial:
        """The partial of box ``i`` (with ``lead`` leading batch axes: every box of a
        lattice, all the size of box ``i``) from the operand views ``xs``; ``shape``: the
        output view's (a matmul's product is reshaped to it)."""
        xs = [x if c is None else x.to(c) for x, c in zip(xs, self.casts, strict=True)]
        nl = len(lead)
        if self.mode == "elementwise":
            assert self.fn is not None
            return self.fn(*xs)
        if self.mode == "mm":  # (batch, m.., k..) @ (batch, k.., n..): BLAS without einsum
            nb, nm, nk, nn = (c + nl if j == 0 else c for j, c in enumerate(self.counts))
            a = xs[0].flatten(nb + nm, nb + nm + nk - 1).flatten(nb, nb + nm - 1)
            b = xs[1].flatten(nb + nk, nb + nk + nn - 1).flatten(nb, nb + nk - 1)
            part = torch.matmul(a, b)
            if self.box_scales[i] != 1:
                part = part * self.box_scales[i]
            return part.reshape(shape)
        if self.mode == "matmul":
            equation = self.equation
            if nl:  # the lattice's axes lead every operand and the result
                lhs, rhs = equation.split("->")
                equation = ",".join("..." + s for s in lhs.split(",")) + "->..." + rhs
            part = torch.einsum(equation, *xs)
            if self.box_scales[i] != 1:  # the same product once per point of an unread dim
                part = part * self.box_scales[i]
            return part.reshape((*lead, *self.box_shapes[i]))
        reducer = self.op.kind.reducer
        assert reducer is not None
        return reduce(reducer, xs[0].expand((*lead, *self.box_shapes[i])),
                      tuple(a + nl for a in self.axes), self.box_starts[i], self.red_sizes)

    def finished(self, part: Partial) -> Any:
        reducer = self.op.kind.reducer
        if reducer is None:
            return part
        if reducer.finish is not None and not reducer.pairs and not part.is_floating_point():
            # an integer mean: the exact sum divided in float64, as the reference (torch's
            # integer / int would give its default float32)
            part = part.to(torch.float64)
        return reducer.value(XP, part, math.prod(self.red_sizes))

    def write(self, out: Any, view: View, value: Any) -> None:
        """``value`` (over the parallel dims, broadcastable) into the piece ``view`` of
        ``out``, cast as ``kernels.to_storage`` casts."""
        self.store(strided(out, view), value)

    def stored(self, value: Any) -> Any:
        """``value`` in the output's dtype, cast as ``kernels.to_storage`` casts
        (``tensors.cast``)."""
        return value if value.dtype == self.out_torch else cast(value, self.out_dtype)

    def store(self, dest: Any, value: Any) -> None:
        """``value`` copied into the view ``dest`` of the output, cast as
        ``kernels.to_storage`` casts."""
        if self.out_dtype == "bool" and value.dtype != torch.bool:
            value = value != 0
        elif self.out_dtype in INTEGERS and value.is_floating_point():
            value = saturate(value, self.out_torch)
        dest.copy_(value)


def _compute_dtype(dtypes: Sequence[str], kind: OpKind, out_dtype: str) -> Any:
    """The torch dtype an op of ``kind`` computes in, from its value operands' ``dtypes``:
    int64 for integers (and bools) where the kind has integer semantics, as the reference
    (``kernels.compute_dtype``); float32 for float operands of a kind whose float32 result is
    the reference's exactly (``kernels.ROUNDED_ONCE``: one correctly rounded operation, as
    eager PyTorch computes it) into a float or bool output; float64 for other integer operands
    and, outside matmuls, float32 ones (as the reference: chains of exp and sin computed in
    float32 drift past the float32 tolerance); float32 otherwise."""
    if kernels.compute_dtype(dtypes, kind) == np.int64:
        return torch.int64
    if kind.category is Category.POINTWISE and kind.name in ROUNDED_ONCE and \
            out_dtype not in INTEGERS and all(d in FLOATS for d in dtypes):
        return torch.float32
    matmul = kind.category is Category.MATMUL
    wide = any(d in INTEGERS or (d == "float32" and not matmul) for d in dtypes)
    return torch.float64 if wide else torch.float32


def _elementwise(op: Op) -> Callable[..., Any]:
    kind = op.kind
    attrs = kind.numeric_attrs(dict(op.attrs))
    fast = direct(kind.name)
    if fast is not None and not attrs:
        return fast
    fused = kernel(kind).fn
    if fused is not None:
        return functools.partial(fused, **attrs) if attrs else fused
    compute = kind.compute
    assert compute is not None, f"op kind {kind.name!r} has no semantics"
    return functools.partial(compute, XP, **attrs)


def _mm_orders(op: Op) -> tuple[list[str], list[str], list[str], tuple[int, int, int, int]
                                 ] | None:
    """Dim orders that make a matmul op one ``torch.matmul``: ``(batch, m, k) @ (batch, k, n)
    -> (batch, m, n)``, each group of dims in op order and merged into one (None where the
    op has no such form: a dim only one input reads and no output, a parallel dim no input
    reads, no k).

    >>> from apportion.frontend.json_format import loads
    >>> p = loads('{"tensors": {"q": {"shape": [8, 256], "dtype": "float32"}, '
    ...           '"k": {"shape": [16, 256], "dtype": "float32"}}, "inputs": ["q", "k"], '
    ...           '"outputs": ["s"], "ops": [{"op": "matmul", "out": "s[h,t,c]", '
    ...           '"ins": ["q[t,128*h+d]", "k[c,128*h+d]"], "dims": {"h": 2, "d": 128}}]}')
    >>> _mm_orders(p.ops[0])
    (['h', 't', 'd'], ['h', 'd', 'c'], ['h', 't', 'c'], (1, 1, 1, 1))
    """
    if len(op.ins) != 2:
        return None
    a, b = (set(x.dims) for x in op.ins)
    out = set(op.parallel_dims)
    dims = op.dim_names
    batch = [d for d in dims if d in a and d in b and d in out]
    m = [d for d in dims if d in a and d in out and d not in b]
    n = [d for d in dims if d in b and d in out and d not in a]
    k = [d for d in dims if d in a and d in b and d not in out]
    if not (m and n and k) or a != {*batch, *m, *k} or b != {*batch, *k, *n} or \
            out != {*batch, *m, *n}:
        return None
    return [*batch, *m, *k], [*batch, *k, *n], [*batch, *m, *n], \
        (len(batch), len(m), len(k), len(n))


def make_step(item: Launch | Host, boxed: tuple[list[Box], list[int]], program: Program) -> Step:
    """How the torch backend runs one launch or host step of a schedule; ``boxed``: a
    launch's boxes and the loop iteration of each (``batching.launch_boxes``)."""
    op = program.op(item.op)
    how = kernel(op.kind).how
    kind = op.kind
    out_t = program.tensor(op.out.tensor)
    in_types = [program.tensor(a.tensor) for a in op.ins]
    # the output as written: a merged axis split into one axis per dim (a view of the
    # contiguous output; the same strides as the merge's terms)
    written, written_shape = op.split_out, op.split_shape(out_t.shape)
    values = kind.value_inputs(len(in_types))
    compute = _compute_dtype([in_types[i].dtype for i in values], kind, out_t.dtype)
    # conditions are read as bools (a float condition of 0.5 is true in an int64 op too)
    wants = [compute if i in values else torch.bool for i in range(len(in_types))]
    common = {"op": op, "reads": tuple(a.tensor for a in op.ins), "out": op.out.tensor,
              "out_dtype": out_t.dtype, "out_shape": out_t.shape, "compute": compute,
              "out_torch": torch_dtype(out_t.dtype), "in_shapes": tuple(t.shape for t in in_types),
              "casts": tuple(None if torch_dtype(t.dtype) == want else want
                             for t, want in zip(in_types, wants, strict=True))}
    if isinstance(item, Host):
        if how not in ("whole", "numpy"):
            raise ExecutionError(f"op {op.name!r}: a host step of kind {kind.name!r}, which "
                                 f"the torch backend runs as {how!r}")
        # whole, in a loop nest too: a fallback works on whole rows, so its tiles' results
        # are the whole op's
        whole = ({d: (0, n) for d, n in op.dims},)
        fn = None
        if how == "whole":  # its attributes and shape bound once
            fn = functools.partial(WHOLE[kind.name], shape=out_t.shape,
                                   **kind.numeric_attrs(dict(op.attrs)))
        scan = _scan(op, program)
        if scan is not None:
            return scan
        return Step(mode=how, boxes=whole, groups=((0,),), solo=(True,), iters=(0,),
                     box_reads=(), box_writes=(), fn=fn, **common)
    listed, iters = boxed
    boxes = tuple(listed)
    check_cover(op, boxes)
    dims, par = op.dim_names, op.parallel_dims
    by_slice: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for i, b in enumerate(boxes):
        by_slice.setdefault(tuple(b[d] for d in par), []).append(i)
    groups = tuple(tuple(g) for g in by_slice.values())
    solo = tuple(len(by_slice[tuple(b[d] for d in par)]) == 1 for b in boxes)
    matmul = kind.category is Category.MATMUL
    red = op.reduction_dims
    common |= {"boxes": boxes, "groups": groups, "solo": solo, "iters": tuple(iters)}
    mm = _mm_orders(op) if matmul else None
    if mm is not None:  # each operand read in the order torch.matmul takes, no einsum
        order_a, order_b, order_out, counts = mm
        read = {d for a in op.ins for d in a.dims}
        return Step(mode="mm", counts=counts,
                     box_reads=tuple((view(op.ins[0], in_types[0].shape, order_a, b, True),
                                      view(op.ins[1], in_types[1].shape, order_b, b, True))
                                     for b in boxes),
                     box_writes=tuple(view(written, written_shape, order_out, b)
                                      for b in boxes),
                     box_scales=tuple(math.prod(b[d][1] - b[d][0] for d in red if d not in read)
                                      for b in boxes), **common)
    box_reads = tuple(tuple(view(a, t.shape, dims, b, squeeze=matmul)
                            for a, t in zip(op.ins, in_types, strict=True)) for b in boxes)
    box_writes = tuple(view(written, written_shape, par, b) for b in boxes)
    common |= {"box_reads": box_reads, "box_writes": box_writes}
    if how == "copy":  # elements moved, maybe cast: one copy_
        return Step(mode="copy", **common)
    if how == "elementwise":
        return Step(mode="elementwise", fn=_elementwise(op), **common)
    if how == "matmul":
        if len(dims) > len(string.ascii_letters):
            raise ExecutionError(f"op {op.name!r}: {len(dims)} dims exceed einsum's letters")
        letter = dict(zip(dims, string.ascii_letters, strict=False))
        read = {d for a in op.ins for d in a.dims}
        subs = ["".join(letter[d] for d in dims if d in a.dims) for a in op.ins]
        equation = ",".join(subs) + "->" + "".join(letter[d] for d in par if d in read)
        return Step(mode="matmul", equation=equation,
                     box_shapes=tuple(tuple(b[d][1] - b[d][0] if d in read else 1 for d in par)
                                      for b in boxes),
                     box_scales=tuple(math.prod(b[d][1] - b[d][0] for d in red if d not in read)
                                      for b in boxes), **common)
    if how == "numpy":
        return Step(mode="numpy", **common)
    if how != "reduce" or kind.reducer is None:
        raise ExecutionError(f"op {op.name!r}: a launch of kind {kind.name!r}, which the torch "
                             f"backend runs as {how!r}")
    return Step(mode="reduce", axes=tuple(i for i, d in enumerate(dims) if d in red),
                 red_sizes=tuple(op.sizes[d] for d in red),
                 box_shapes=tuple(tuple(b[d][1] - b[d][0] for d in dims) for b in boxes),
                 box_starts=tuple(tuple(b[d][0] for d in red) for b in boxes), **common)


def _scan(op: Op, program: Program) -> Step | None:
    """A fallback scan (``kernels.SCANS``) run in torch where it computes in float64 or int64
    (as the reference: the whole stored input along its last axis, the result read through
    the input's access over the whole space and written through the output's), else None."""
    if op.kind.name not in SCANS or len(op.ins) != 1 or op.reduction_dims:
        return None
    src = op.ins[0]
    in_t, out_t = program.tensor(src.tensor), program.tensor(op.out.tensor)
    compute = {np.float64: torch.float64, np.int64: torch.int64}.get(
        kernels.compute_dtype([in_t.dtype], op.kind))
    if compute is None:
        return None
    whole = {d: (0, n) for d, n in op.dims}
    dims = op.dim_names
    return Step(op=op, mode="scan", boxes=(whole,), groups=((0,),), solo=(True,), iters=(0,),
                 reads=(src.tensor,),
                 casts=(None if torch_dtype(in_t.dtype) == compute else compute,),
                 box_reads=((view(src, in_t.shape, dims, whole),),),
                 box_writes=(view(op.split_out, op.split_shape(out_t.shape), dims, whole),),
                 out=op.out.tensor, out_dtype=out_t.dtype, out_shape=out_t.shape,
                 compute=compute, out_torch=torch_dtype(out_t.dtype), in_shapes=(in_t.shape,),
                 fn=SCANS[op.kind.name])

