"""The threaded torch executor: a plan run core slice by core slice with torch kernels.

``run_torch(planned, inputs, threads)`` runs a plan's schedule (``schedule.lower``: the one
lowered form, symbolic loop counts bound): every launch's boxes at every iteration of its loops
(``Launch.boxes_at``, the boxes the reference executor computes), checked by
``reference.check_cover`` to cover the op's iteration space once, computed by torch kernels on
torch views of the operands; host steps whole. It reads nothing of the plan itself. The boxes
of one op run concurrently on a pool of ``threads`` threads; ops run in program order.
It gives the reference executor's numbers within the dtype tolerances
(``reference.TOLERANCES``).

How an op runs:

- An operand over a box is a view, never a gather: an access is affine (``q[t, 128*h+d]``,
  ``x[2*i, j]``, ``x[o+k, c]``), so its elements over a box are ``Tensor.as_strided`` of the
  stored tensor, with one stride per op dim (0 for dims the access does not read). A core
  writes its piece of the output through the same kind of view, in place: the cores of an op
  write disjoint elements. An output written through a merge of dims (``y[t, 64*h+d]``) is
  written through its split view (``Op.split_out``: ``y[t, h, d]`` of the output viewed as
  ``Op.split_shape``, a view of the contiguous output, as the reference's ``split_view``), so
  a core's piece, its partials and their combination are in that layout, whatever the box
  cuts of the merged axis.
- Matmul and convolution: ``torch.matmul`` where the op is ``(batch, m, k) @ (batch, k, n)``
  (each operand read in that dim order, each group of dims merged), else ``torch.einsum``
  over the views; BLAS either way. How each kind runs is one table, ``kernels.KERNELS``.
  Pointwise and layout kinds: their registry semantics
  (``ir.kinds``, written against an array namespace) run with torch as the namespace
  (``XP``), or one fused torch kernel where a formula would take several (``silu``,
  ``sigmoid``, ...; same math); copies and casts are one ``copy_``. Reductions ``sum``,
  ``mean``, ``max``, ``min``, ``prod``, ``any`` and ``argmax`` (value and global index pairs,
  as the reference) in torch. A split reduction's partials are combined in
  box order with the kind's reducer (``combine`` and ``finish`` run on ``XP``).
- Compute dtypes: float16, bfloat16 and bool operands compute in float32, float32 ones in
  float64 as the reference does (but in matmuls, which compute in float32 as eager PyTorch
  does, within the float32 tolerance, and in the pointwise kinds whose float32 result is the
  float64 one rounded, bit for bit: ``kernels.ROUNDED_ONCE``, add, mul, where, ...; sums and
  means still accumulate in float64); integer (and bool) value operands compute in int64,
  exactly and wrapping on overflow, where the kind has integer semantics
  (``kernels.integer_semantics``), else in float64, as the reference executor does; condition
  operands are read as bools. Results are cast once, to the output's dtype (bfloat16 is
  stored as torch's bfloat16).
- Whole-tensor fallbacks ``gather`` (embeddings), ``reshape``, ``concat``, ``full`` and
  ``arange`` run in torch on one core (``full`` and ``arange``, which read nothing, once per
  executor: a constant); ``cumsum`` and ``flip`` too where they compute in float64 or int64
  (``kernels.SCANS``: numpy's numbers exactly); the other fallbacks (``sort``, ``topk``, a
  float32-computed ``cumsum``, and ``uniform``/``normal``, whose numbers are numpy's
  generator's) run through the reference executor, converting their operands to numpy and
  back.
- Loop nests: an op in a loop group runs all its iterations' boxes (in loop order) before the
  next op starts, rather than op by op inside each iteration: no op reads another's output
  before it is whole either way, so the numbers are the same. A reduction tiled by a loop
  combines each iteration's cores, then the iterations in loop order, as an accumulator does.
  Where tensors live (device memory, scratchpads, tile buffers) does not change a number, so
  the simulated memory of ``loops.run_tiled``, which checks the plan's buffers, is not
  repeated here. Symbolic loop counts come from ``params``.

Batched boxes: where an op's boxes form a lattice (``_lattices``: equal boxes whose every
operand view is the first box's moved by a fixed offset per moving loop level and per worker
axis, as an even split gives), the op runs as one kernel call on strided views with one leading
axis per lattice axis, each box a batch element, so each box is still computed from its own
views alone but the Python work is paid once per op rather than once per box (a Llama forward
at 32 cores has about 3,300 boxes). An uneven split (10 over 4: 3, 3, 2, 2) is one lattice per
box size; an op on one core a lattice of one box. A matmul lattice is one GEMM
(``_Gemm``): the axes that move both operands are its batch, those that move only the left
one stack their boxes as rows, only the right one as columns (a GEMM computes every row and
column of its result from that row and column alone; a batched GEMM whose right operand
repeats along a batch axis would copy it per batch element). Where one lattice writes the
whole output in row-major order, its result (cast) is the output, not copied; it is kept in
the lattice's shape, which strided views read alike (``_shaped`` gives a whole-tensor reader
and the caller the tensor's own shape). Split reductions run box by box, as do the boxes of no
lattice (``loose``) and every op given to the pool.

Threads: with ``threads`` > 1 each op's boxes are dealt to ``threads`` pool tasks (box ``i`` to
task ``i mod threads``), but for ops with fewer than ``grain`` iteration points per core
(default ``GRAIN``, 2**20; 0: every op): their boxes run one after another on the calling
thread, same boxes, same numbers. Each box holds the GIL for its Python
work (views, dispatch) and releases it inside torch's kernels, so a small box spends its time
passing the GIL between threads: the tiny Llama's ops run 2x slower on two threads than on one
without the grain. A worker sets torch's intra-op threads to 1 (``torch.set_num_threads``)
because the pool *is* the parallelism: ``threads`` workers each starting an OpenMP team of
``torch.get_num_threads()`` would put threads x intra-op threads on ``threads`` cores, where
OpenMP's spinning teams slow each other down. The setting is process-wide in torch (new threads
take it), so a run restores the caller's count when it ends; with ``threads`` = 1 the boxes run
on the calling thread, also with one intra-op thread. Two runs in two threads at once would
race on that setting.

torch is imported with this module; ``import apportion`` and ``apportion.runtime`` do not
import it.

>>> import apportion as ap
>>> from apportion.runtime.reference import compare, random_inputs, run_unplanned
>>> planned = ap.plan(ap.load("examples/attention.json"), ap.targets.spyre(cores=8))
>>> xs = random_inputs(planned.program)
>>> ys = run_torch(planned, xs, threads=2)
>>> got = {name: from_torch_storage(y) for name, y in ys.items()}
>>> all(c.ok for c in compare(run_unplanned(planned.program, xs), got, planned.program))
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from apportion.backends.torch.kernels import (
    ROUNDED_ONCE,
    SCANS,
    WHOLE,
    XP,
    direct,
    kernel,
    reduce,
    require_torch,
    torch,
)
from apportion.errors import ExecutionError
from apportion.ir.kinds import FLOATS, INTEGERS, Category, OpKind, Partial, Reducer
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.plans.plan import Plan
from apportion.runtime import kernels
from apportion.runtime.reference import Box, check_cover, evaluate_op, run_op_boxes
from apportion.runtime.torch_xp import saturate
from apportion.schedule.lower import lower
from apportion.schedule.values import Host, Launch, Schedule
from apportion.target.target import Target

__all__ = ["GRAIN", "TORCH_DTYPES", "XP", "TorchExecutor", "from_torch_storage", "run_torch",
           "to_torch_storage"]


class PlannedLike(Protocol):
    """What ``run_torch`` needs of a ``PlannedProgram``."""

    @property
    def program(self) -> Program: ...

    @property
    def plan(self) -> Plan: ...


#: tensor dtype -> torch dtype of the tensor that holds it
TORCH_DTYPES: dict[str, str] = {
    "float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "int8": "int8",
    "int32": "int32", "int64": "int64", "bool": "bool",
}


def _dtype(dtype: str) -> Any:
    try:
        return getattr(torch, TORCH_DTYPES[dtype])
    except KeyError:
        raise ExecutionError(f"no torch dtype for {dtype!r}; valid: "
                             f"{', '.join(TORCH_DTYPES)}") from None


def _cast(t: Any, dtype: str) -> Any:
    """A computed tensor as ``dtype``'s storage, as ``kernels.to_storage`` casts: floats to
    ints saturate (``torch_xp.saturate``), anything to bool is ``!= 0``."""
    if dtype == "bool":
        return t if t.dtype == torch.bool else t != 0
    target = _dtype(dtype)
    if dtype in INTEGERS and t.is_floating_point():
        return saturate(t, target)
    return t.to(target)


def to_torch_storage(a: Any, dtype: str) -> Any:
    """A numpy array (or tensor) as the contiguous torch tensor that stores ``dtype``."""
    require_torch()
    if not isinstance(a, torch.Tensor):
        a = np.asarray(a)
        # a copy where numpy's strides are not row-major (ascontiguousarray makes 0-d 1-d)
        # torch takes no negative stride, which a C-contiguous array of size-1 axes may have
        plain = a.flags.c_contiguous and min(a.strides, default=0) >= 0
        a = torch.from_numpy(a if plain else a.copy(order="C"))
    return _cast(a.detach(), dtype).contiguous()


def from_torch_storage(t: Any) -> np.ndarray:
    """A tensor as the reference executor's storage array (bfloat16 as float32, exact)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


# --- the schedule: every box's strided views, computed once ------------------------------------

#: a strided view of a stored tensor: sizes, strides, offset in elements from its first element
View = tuple[tuple[int, ...], tuple[int, ...], int]


def _row_major(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return strides[::-1]


def _view(acc: Access, shape: Sequence[int], dims: Sequence[str], box: Box,
          squeeze: bool = False) -> View:
    """The elements ``acc`` reads over ``box`` in a contiguous tensor of ``shape``, one axis per
    dim of ``dims`` (in that order; size 1, stride 0 where the access does not read the dim, or
    no axis with ``squeeze``). Affine indices are strides: a sum of dims (``128*h+d``) is a
    stride per dim, a constant an offset, a dim on two axes (a diagonal) the sum of theirs."""
    offset = 0
    coef: dict[str, int] = {}
    for e, s in zip(acc.index, _row_major(shape), strict=True):
        offset += e.const * s
        for d, c in e.terms:
            coef[d] = coef.get(d, 0) + c * s
    size, stride = [], []
    for d in dims:
        if d in coef:
            lo, hi = box[d]
            offset += coef[d] * lo
            size.append(hi - lo)
            stride.append(coef[d])
        elif not squeeze:
            size.append(1)
            stride.append(0)
    return tuple(size), tuple(stride), offset


def _strided(t: Any, v: View) -> Any:
    return t.as_strided(v[0], v[1], t.storage_offset() + v[2])


def _shaped(t: Any, shape: tuple[int, ...]) -> Any:
    """A stored tensor in its own shape: a step's result may be held in the shape it was
    computed in (a lattice's), row-major like the tensor, which every strided view reads
    alike."""
    return t if t.shape == shape else t.view(shape)


@dataclass(frozen=True)
class _Gemm:
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
class _Lattice:
    """Boxes of one step that form a lattice (``_lattices``): equal boxes whose every view is
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
    gemm: _Gemm | None = None
    #: each read as (tensor, sizes, strides, offset, the dtype it converts to or None, and
    #: whether the view is row-major from the tensor's first element: then a stored tensor
    #: already of those sizes is the view itself, the result of a step split alike; and
    #: whether the tensor holds one element: it is cast before it is broadcast, so that the
    #: cast converts one number and the kernel sees a scalar operand, not a copy per box)
    operands: tuple[tuple[str, tuple[int, ...], tuple[int, ...], int, Any, bool, bool], ...
                    ] = ()


@dataclass(frozen=True)
class _Step:
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
    #: the boxes batched (``_lattices``): one lattice per set of equal boxes forming one, and
    #: the boxes in none (``loose``), run one by one; no lattices where boxes combine
    lattices: tuple[_Lattice, ...] = ()
    loose: tuple[int, ...] = ()

    def box(self, env: Mapping[str, Any], out: Any, i: int) -> Partial | None:
        """Compute box ``i``: write it when it is alone in its output slice (None), else
        return its partial."""
        xs = [_strided(env[n], v) for n, v in zip(self.reads, self.box_reads[i], strict=True)]
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
                return value  # a new tensor laid out as the output: the output (``_shaped``)
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

    def _lattice(self, env: Mapping[str, Any], lat: _Lattice, out: Any) -> Any:
        """Compute the boxes of ``lat`` and write them into ``out``; with ``out`` None (a
        whole lattice), return the result as the output."""
        if lat.gemm is not None:
            return self._gemm(env, lat, out)
        xs = [_strided(env[n], v) for n, v in zip(self.reads, lat.reads, strict=True)]
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
            # ``_shaped`` gives it the output's shape where a whole tensor is read)
            if value.shape == lat.write[0] and value.is_contiguous() and \
                    not value._is_view() and all(value is not x for x in xs):
                return value
            out = torch.empty(self.out_shape, dtype=self.out_torch)
        self.write(out, lat.write, value)
        return out

    def _gemm(self, env: Mapping[str, Any], lat: _Lattice, out: Any) -> Any:
        """A matmul lattice as one ``torch.matmul`` (``_Gemm``)."""
        g = lat.gemm
        assert g is not None
        a, b = (_strided(env[n], v) for n, v in zip(self.reads, (g.a, g.b), strict=True))
        if self.casts[0] is not None:
            a = a.to(self.casts[0])
        if self.casts[1] is not None:
            b = b.to(self.casts[1])
        part = torch.matmul(a.reshape(g.shape_a), b.reshape(g.shape_b))
        scale = self.box_scales[lat.box]
        if scale != 1:  # the same product once per point of a reduction dim no input reads
            part = part * scale
        part = self.stored(part)
        if out is None:  # the output, in the product's shape (``_shaped``)
            return part
        _strided(out, g.write).copy_(part.view(g.write[0]))
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
        self.store(_strided(out, view), value)

    def stored(self, value: Any) -> Any:
        """``value`` in the output's dtype, cast as ``kernels.to_storage`` casts: floats to
        integers saturate (``torch_xp.saturate``), anything to bool is ``!= 0``."""
        if value.dtype == self.out_torch:
            return value
        if self.out_dtype == "bool":
            return value != 0
        if self.out_dtype in INTEGERS and value.is_floating_point():
            return saturate(value, self.out_torch)
        return value.to(self.out_torch)

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


#: where a box sits in its launch's grid: its index along each loop level that moves the
#: launch (more than one iteration), then along each worker axis of more than one worker
Position = tuple[int, ...]


def _boxes(launch: Launch, counts: Sequence[int]) -> tuple[list[Box], list[int], list[Position]]:
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


def _step(item: Launch | Host, boxed: tuple[list[Box], list[int]], program: Program) -> _Step:
    """How the torch backend runs one launch or host step of a schedule; ``boxed``: a
    launch's boxes and the loop iteration of each (``_boxes``)."""
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
              "out_torch": _dtype(out_t.dtype), "in_shapes": tuple(t.shape for t in in_types),
              "casts": tuple(None if _dtype(t.dtype) == want else want
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
        return _Step(mode=how, boxes=whole, groups=((0,),), solo=(True,), iters=(0,),
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
        return _Step(mode="mm", counts=counts,
                     box_reads=tuple((_view(op.ins[0], in_types[0].shape, order_a, b, True),
                                      _view(op.ins[1], in_types[1].shape, order_b, b, True))
                                     for b in boxes),
                     box_writes=tuple(_view(written, written_shape, order_out, b)
                                      for b in boxes),
                     box_scales=tuple(math.prod(b[d][1] - b[d][0] for d in red if d not in read)
                                      for b in boxes), **common)
    box_reads = tuple(tuple(_view(a, t.shape, dims, b, squeeze=matmul)
                            for a, t in zip(op.ins, in_types, strict=True)) for b in boxes)
    box_writes = tuple(_view(written, written_shape, par, b) for b in boxes)
    common |= {"box_reads": box_reads, "box_writes": box_writes}
    if how == "copy":  # elements moved, maybe cast: one copy_
        return _Step(mode="copy", **common)
    if how == "elementwise":
        return _Step(mode="elementwise", fn=_elementwise(op), **common)
    if how == "matmul":
        if len(dims) > len(string.ascii_letters):
            raise ExecutionError(f"op {op.name!r}: {len(dims)} dims exceed einsum's letters")
        letter = dict(zip(dims, string.ascii_letters, strict=False))
        read = {d for a in op.ins for d in a.dims}
        subs = ["".join(letter[d] for d in dims if d in a.dims) for a in op.ins]
        equation = ",".join(subs) + "->" + "".join(letter[d] for d in par if d in read)
        return _Step(mode="matmul", equation=equation,
                     box_shapes=tuple(tuple(b[d][1] - b[d][0] if d in read else 1 for d in par)
                                      for b in boxes),
                     box_scales=tuple(math.prod(b[d][1] - b[d][0] for d in red if d not in read)
                                      for b in boxes), **common)
    if how == "numpy":
        return _Step(mode="numpy", **common)
    if how != "reduce" or kind.reducer is None:
        raise ExecutionError(f"op {op.name!r}: a launch of kind {kind.name!r}, which the torch "
                             f"backend runs as {how!r}")
    return _Step(mode="reduce", axes=tuple(i for i, d in enumerate(dims) if d in red),
                 red_sizes=tuple(op.sizes[d] for d in red),
                 box_shapes=tuple(tuple(b[d][1] - b[d][0] for d in dims) for b in boxes),
                 box_starts=tuple(tuple(b[d][0] for d in red) for b in boxes), **common)


def _is_whole(view: View, shape: Sequence[int]) -> bool:
    """``view`` is every element of a contiguous tensor of ``shape``, in row-major order."""
    sizes, strides, offset = view
    step = 1
    for n, s in reversed([(n, s) for n, s in zip(sizes, strides, strict=True) if n != 1]):
        if s != step:
            return False
        step *= n
    return offset == 0 and step == math.prod(shape) and math.prod(sizes) == step


def _gemm_of(step: _Step, shape: Sequence[int], reads: Sequence[View], write: View
          ) -> _Gemm | None:
    """A matmul lattice as one GEMM (``_Gemm``); None where a lattice axis moves neither
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
    return _Gemm(a=view(reads[0], both, batch, rows, m, k),
                 shape_a=(*lead_shape, count(size_a, rows, m), count(size_a, k)),
                 b=view(reads[1], both, batch, kb, cols, n_b),
                 shape_b=(*lead_shape, count(size_b, kb), count(size_b, cols, n_b)),
                 write=view(write, both, batch, rows, m, cols, n_out))


def _sub_lattice(step: _Step, members: Sequence[int], where: Sequence[Position],
                 views: Sequence[Sequence[View]]) -> _Lattice | None:
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
    whole = _is_whole(write if gemm is None else gemm.write, step.out_shape)
    operands = tuple((n, *v, c, _is_whole(v, v[0]), math.prod(shape) == 1)
                     for n, v, c, shape in zip(step.reads, reads, step.casts, step.in_shapes,
                                               strict=True))
    return _Lattice(first, shape, reads, write, whole, gemm, operands)


def _lattices(step: _Step, where: Sequence[Position]) -> _Step:
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
    lattices: list[_Lattice] = []
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


def _schedule(schedule: Schedule) -> tuple[_Step, ...]:
    """The torch steps of a schedule: one per launch and host step, in order, each with the
    tensors no later step reads (the schedule's lifetimes) to free after it."""
    steps: list[_Step] = []
    for item, loops in schedule.walk():
        if isinstance(item, Host):
            steps.append(_step(item, ([], []), schedule.program))
        elif isinstance(item, Launch):
            boxes, iters, where = _boxes(item, [lp.count for lp in loops])
            steps.append(_lattices(_step(item, (boxes, iters), schedule.program), where))
    keep = set(schedule.program.inputs) | set(schedule.program.outputs)
    dead: dict[int, list[str]] = {}
    for life in schedule.lifetimes:
        if life.tensor not in keep:
            dead.setdefault(life.last, []).append(life.tensor)
    return tuple(dataclasses.replace(s, free=tuple(dead[i])) if i in dead else s
                 for i, s in enumerate(steps))


def _combine(step: _Step, reducer: Reducer, group: Sequence[int], parts: Mapping[int, Partial]
             ) -> Partial:
    """The partials of one output slice combined in box order: a loop iteration's cores
    first, then the iterations into the accumulation, as ``loops.run_tiled`` does (a fixed
    order of float sums)."""
    acc: Partial = None
    cur: Partial = None
    for n, i in enumerate(group):
        if n and step.iters[i] != step.iters[group[n - 1]]:
            acc = cur if acc is None else reducer.combine(XP, acc, cur)
            cur = None
        cur = parts[i] if cur is None else reducer.combine(XP, cur, parts[i])
    return cur if acc is None else reducer.combine(XP, acc, cur)


def _run_boxes(step: _Step, env: Mapping[str, Any], out: Any, indices: Sequence[int],
               one_thread: bool) -> list[tuple[int, Partial]]:
    """Compute ``indices``' boxes; returns the partials of boxes that combine with others."""
    if one_thread:
        torch.set_num_threads(1)
    pending = []
    with torch.no_grad():
        for i in indices:
            part = step.box(env, out, i)
            if part is not None:
                pending.append((i, part))
    return pending


# --- whole-tensor fallbacks --------------------------------------------------------------------

def _run_whole(step: _Step, env: Mapping[str, Any]) -> Any:
    op = step.op
    assert step.fn is not None
    try:
        res = step.fn(*(_shaped(env[n], s) for n, s in zip(step.reads, step.in_shapes,
                                                           strict=True)))
        res = res.reshape(step.out_shape)
    except (IndexError, RuntimeError, ValueError) as e:
        raise ExecutionError(f"op {op.name!r}: {op.kind.name} failed: {e}") from None
    return _cast(res, step.out_dtype).contiguous()


def _scan(op: Op, program: Program) -> _Step | None:
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
    return _Step(op=op, mode="scan", boxes=(whole,), groups=((0,),), solo=(True,), iters=(0,),
                 reads=(src.tensor,), casts=(None if _dtype(in_t.dtype) == compute else compute,),
                 box_reads=((_view(src, in_t.shape, dims, whole),),),
                 box_writes=(_view(op.split_out, op.split_shape(out_t.shape), dims, whole),),
                 out=op.out.tensor, out_dtype=out_t.dtype, out_shape=out_t.shape,
                 compute=compute, out_torch=_dtype(out_t.dtype), in_shapes=(in_t.shape,),
                 fn=SCANS[op.kind.name])


def _run_scan(step: _Step, env: Mapping[str, Any]) -> Any:
    assert step.fn is not None
    x = _shaped(env[step.reads[0]], step.in_shapes[0])
    res = step.fn(x if step.casts[0] is None else x.to(step.casts[0]))
    out = torch.empty(step.out_shape, dtype=step.out_torch)
    step.write(out, step.box_writes[0], _strided(res, step.box_reads[0][0]))
    return out


def _run_numpy(step: _Step, program: Program, env: Mapping[str, Any]) -> Any:
    """The op through the reference executor: its operands to numpy and the result back."""
    op = step.op
    arrays = {n: from_torch_storage(_shaped(env[n], s))
              for n, s in zip(step.reads, step.in_shapes, strict=True)}
    if op.kind.divisible:
        res = run_op_boxes(op, program, arrays, step.boxes)
    else:
        res = evaluate_op(op, program, arrays)
    return to_torch_storage(np.asarray(res), step.out_dtype)


# --- the executor ------------------------------------------------------------------------------

#: iteration points per core below which an op's cores run one after another on the calling
#: thread: handing a task to a pool thread and back, and passing the GIL between the threads,
#: costs more than a kernel this small saves (on a 2-core machine a matmul of 2**19 points per
#: core ran slower on two threads than on one, one of 2**23 1.7x faster)
GRAIN = 1 << 20


@contextlib.contextmanager
def _intra_op_threads(n: int) -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


class TorchExecutor:
    """A plan made ready to run with torch: the schedule (every op's boxes, checked to cover
    its iteration space once) is built once, and a pool of ``threads`` threads is kept for the
    runs (ops of fewer than ``grain`` points per core run on the calling thread). ``run(inputs)``
    returns the program's outputs; ``close()`` ends the pool (also on ``with``, and when the
    executor is collected).

    >>> import apportion as ap
    >>> from apportion.runtime.reference import random_inputs
    >>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
    >>> with TorchExecutor(planned.program, planned.plan, threads=2) as ex:
    ...     ys = ex.run(random_inputs(planned.program))
    >>> ys["y"].shape, ys["y"].dtype
    (torch.Size([256, 1024]), torch.float16)
    """

    def __init__(self, program: Program, plan: Plan | Schedule, threads: int = 1,
                 grain: int = GRAIN, target: Target | str | None = None,
                 batched: bool = True) -> None:
        require_torch()
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ExecutionError(f"threads must be an int >= 1, got {threads!r}")
        if isinstance(grain, bool) or not isinstance(grain, int) or grain < 0:
            raise ExecutionError(f"grain must be an int >= 0, got {grain!r}")
        self.program = program
        #: a schedule given already lowered (a device's segment of a mesh schedule, its loop
        #: counts bound): run as it is, never lowered again
        self.given = plan if isinstance(plan, Schedule) else None
        self.plan = plan
        #: the target, or its name: lowering a program with static shapes needs no more
        self.target = plan.target if target is None else target
        self.threads = threads
        self.grain = grain
        #: run an op whose boxes form a lattice (``_lattice``) as one batched kernel call
        #: where it runs on the calling thread; False: box by box, always
        self.batched = batched
        self._steps: dict[tuple[tuple[str, int], ...], tuple[_Step, ...]] = {}
        self._pool: ThreadPoolExecutor | None = None
        #: results of steps with no inputs (``full``, ``arange``), by tensor
        self._constants: dict[str, Any] = {}
        #: each input: name, shape and the torch dtype that stores it
        self._inputs = tuple((n, program.tensor(n).shape, _dtype(program.tensor(n).dtype))
                             for n in program.inputs)
        if isinstance(plan, Schedule) or \
                not any(isinstance(c, str) for g in plan.groups for c in g.counts):
            self.schedule()  # a plan that does not fit the program fails here, not at a run

    def __enter__(self) -> TorchExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)

    def bind(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The program's inputs checked (every one given, nothing else, right shapes) and held
        as contiguous torch tensors of their dtypes (numpy arrays are taken too)."""
        program = self.program
        extra = [n for n in inputs if n not in program.inputs]
        if extra:
            raise ExecutionError(f"{extra[0]!r} is not an input of program {program.name!r}; "
                                 f"inputs: {', '.join(program.inputs)}")
        env: dict[str, Any] = {}
        for name, shape, dtype in self._inputs:
            if name not in inputs:
                raise ExecutionError(f"input {name!r} of program {program.name!r} is missing")
            value = inputs[name]
            if tuple(value.shape) != shape:
                raise ExecutionError(f"input {name!r} has shape {tuple(value.shape)}, expected "
                                     f"{shape}")
            if isinstance(value, torch.Tensor) and value.dtype == dtype and \
                    value.is_contiguous():  # stored as the executor stores it: read as it is
                env[name] = value.detach() if value.requires_grad else value
            else:
                env[name] = to_torch_storage(value, program.tensor(name).dtype)
        return env

    def run(self, inputs: Mapping[str, Any], params: Mapping[str, int] | None = None
            ) -> dict[str, Any]:
        """Run the plan on ``inputs`` (torch tensors or numpy arrays by program input name);
        returns the program's outputs as torch tensors of their dtypes. ``params``: symbolic
        loop counts (plans with loop groups only)."""
        steps = self.schedule(params)
        env = self.bind(inputs)
        batched = self.batched
        with _intra_op_threads(1), torch.no_grad():
            for step in steps:
                if step.lattices and batched and self._pool_for(step) is None:
                    try:  # the common step, without _run_step's dispatch
                        env[step.out] = step.all_boxes(env)
                    except RuntimeError as e:  # a torch kernel refused (shapes, dtypes, bounds)
                        raise ExecutionError(f"op {step.op.name!r}: torch failed: {e}") from None
                else:
                    env[step.out] = self._run_step(step, env)
                for name in step.free:
                    env.pop(name, None)
        outs = {}
        for name in self.program.outputs:
            t = _shaped(env[name], self.program.tensor(name).shape)
            # a cached constant is the executor's: the caller gets a copy to keep
            outs[name] = t.clone() if any(t is c for c in self._constants.values()) else t
        return outs

    def lowered(self, params: Mapping[str, int] | None = None) -> Schedule:
        """The plan's schedule at these symbolic loop counts (``schedule.lower``); a schedule
        given lowered is itself (its counts are bound: ``params`` are refused)."""
        if self.given is not None:
            if params:
                raise ExecutionError(f"schedule of {self.program.name!r} given lowered, its loop "
                                     f"counts bound: params {sorted(params)} are refused")
            return self.given
        assert isinstance(self.plan, Plan)
        return lower(self.program, self.plan, self.target, params=params)

    def schedule(self, params: Mapping[str, int] | None = None) -> tuple[_Step, ...]:
        """The torch steps of the schedule at these symbolic loop counts (every op's boxes and
        views), built once per distinct ``params``."""
        key = tuple(sorted((params or {}).items()))
        if key not in self._steps:
            self._steps[key] = _schedule(self.lowered(params))
        return self._steps[key]

    def _pool_for(self, step: _Step) -> ThreadPoolExecutor | None:
        if self.threads == 1:
            return None
        boxes = len(step.boxes)
        if boxes == 1 or step.op.points < self.grain * boxes:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads,
                                            thread_name_prefix="apportion-core")
        return self._pool

    def _run_step(self, step: _Step, env: Mapping[str, Any]) -> Any:
        op = step.op
        if step.lattices and self.batched and self._pool_for(step) is None:
            try:
                return step.all_boxes(env)
            except RuntimeError as e:  # a torch kernel refused (shapes, dtypes, bounds)
                raise ExecutionError(f"op {op.name!r}: torch failed: {e}") from None
        if step.mode == "numpy":
            return _run_numpy(step, self.program, env)
        if step.mode == "scan":
            return _run_scan(step, env)
        if step.mode == "whole":
            if step.reads:
                return _run_whole(step, env)
            # a constant (full, arange): made once per executor, as a compiler folds it
            if step.out not in self._constants:
                self._constants[step.out] = _run_whole(step, env)
            return self._constants[step.out]
        pool = self._pool_for(step)
        out = torch.empty(step.out_shape, dtype=step.out_torch)
        n = len(step.boxes)
        try:
            if pool is None:
                pending = _run_boxes(step, env, out, range(n), False)
            else:  # one task per thread: boxes j, j + k, j + 2k, ...
                k = min(self.threads, n)
                runs = [range(j, n, k) for j in range(k)]
                futures = [pool.submit(_run_boxes, step, env, out, r, True) for r in runs]
                pending = [p for f in futures for p in f.result()]
        except RuntimeError as e:  # a torch kernel refused (shapes, dtypes, storage bounds)
            raise ExecutionError(f"op {op.name!r}: torch failed: {e}") from None
        if pending:
            parts = dict(pending)
            reducer = op.kind.reducer
            for g in step.groups:
                if len(g) == 1:
                    continue
                if reducer is None:
                    raise ExecutionError(f"op {op.name!r}: {len(g)} cores computed one slice "
                                         f"of a {op.category} op, which has nothing to combine")
                step.write(out, step.box_writes[g[0]],
                           step.finished(_combine(step, reducer, g, parts)))
        return out


def run_torch(planned: PlannedLike, inputs: Mapping[str, Any], threads: int = 1,
              params: Mapping[str, int] | None = None, grain: int = GRAIN) -> dict[str, Any]:
    """Run ``planned`` (a ``PlannedProgram``, or anything with its ``program`` and ``plan``)
    core slice by core slice with torch kernels, the cores of each op on ``threads`` threads
    (those of ops with fewer than ``grain`` iteration points per core on the calling thread);
    returns the program's outputs as torch tensors (see the module docstring)."""
    with TorchExecutor(planned.program, planned.plan, threads, grain) as ex:
        return ex.run(inputs, params)
