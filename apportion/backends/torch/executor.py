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
  (``XP``), or one fused torch kernel where a formula would take several (``silu``, ``gelu``,
  ``sigmoid``, ...; same math); copies and casts are one ``copy_``. Reductions ``sum``,
  ``mean``, ``max``, ``min``, ``prod``, ``any`` and ``argmax`` (value and global index pairs,
  as the reference) in torch. A split reduction's partials are combined in
  box order with the kind's reducer (``combine`` and ``finish`` run on ``XP``).
- Compute dtypes: float16, bfloat16 and bool operands compute in float32, float32 ones in
  float64 as the reference does (but in matmuls, which compute in float32 as eager PyTorch
  does, within the float32 tolerance); integer (and bool) value operands compute in int64,
  exactly and wrapping on overflow, where the kind has integer semantics
  (``kernels.integer_semantics``), else in float64, as the reference executor does; condition
  operands are read as bools. Results are cast once, to the output's dtype (bfloat16 is
  stored as torch's bfloat16).
- Whole-tensor fallbacks ``gather`` (embeddings), ``reshape``, ``concat``, ``full`` and
  ``arange`` run in torch on one core; the other fallbacks (``sort``, ``cumsum``, ``flip``,
  ``topk``, and ``uniform``/``normal``, whose numbers are numpy's generator's) run through the
  reference executor, converting their operands to numpy and back.
- Loop nests: an op in a loop group runs all its iterations' boxes (in loop order) before the
  next op starts, rather than op by op inside each iteration: no op reads another's output
  before it is whole either way, so the numbers are the same. A reduction tiled by a loop
  combines each iteration's cores, then the iterations in loop order, as an accumulator does.
  Where tensors live (device memory, scratchpads, tile buffers) does not change a number, so
  the simulated memory of ``loops.run_tiled``, which checks the plan's buffers, is not
  repeated here. Symbolic loop counts come from ``params``.

Batched boxes: where an op's boxes form a lattice (``_lattice``: equal boxes whose every
operand view is box 0's moved by a fixed offset per moving loop level and per worker axis, as
an even split gives), the op runs as one kernel call on strided views with one leading axis per
lattice axis, each box a batch element, so each box is still computed from its own views alone
but the Python work is paid once per op rather than once per box (a Llama forward at 32 cores
has about 3,300 boxes). A matmul lattice is one GEMM per index of the axes that move its right
operand, the boxes of the axes moving only the left operand stacked as rows (a batched GEMM
would copy the right operand once per batch element). Uneven splits, split reductions and tiles
smaller than planned run box by box; so does every op given to the pool.

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
import itertools
import math
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from apportion.backends.torch.kernels import WHOLE, XP, kernel, reduce, require_torch, torch
from apportion.errors import ExecutionError
from apportion.ir.kinds import INTEGERS, Category, OpKind, Partial, Reducer
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.plans.plan import Plan
from apportion.runtime import kernels
from apportion.runtime.reference import Box, check_cover, evaluate_op, run_op_boxes
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
    ints truncate toward zero, anything to bool is ``!= 0``."""
    if dtype == "bool":
        return t if t.dtype == torch.bool else t != 0
    target = _dtype(dtype)
    if dtype in INTEGERS and t.is_floating_point():
        t = torch.trunc(t)
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


@dataclass(frozen=True)
class _Step:
    """One op of the schedule: how it runs (``mode``), its boxes with every operand's view,
    which boxes combine (a split reduction), and the tensors no later op reads (``free``)."""

    op: Op
    mode: str  # copy, elementwise, mm, matmul, reduce, whole, numpy
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
    fn: Callable[..., Any] | None = None  # elementwise: the kind's function, attributes bound
    equation: str = ""  # matmul: the einsum
    counts: tuple[int, int, int, int] = (0, 0, 0, 0)  # mm: batch, m, k and n dims
    box_shapes: tuple[tuple[int, ...], ...] = ()  # matmul: result shape; reduce: the box's
    box_scales: tuple[int, ...] = ()  # matmul: points of reduction dims no input reads
    box_starts: tuple[tuple[int, ...], ...] = ()  # reduce: where the box starts in them
    axes: tuple[int, ...] = ()  # reduce: the reduced axes
    red_sizes: tuple[int, ...] = ()  # reduce: full sizes of the reduction dims
    free: tuple[str, ...] = ()
    #: every box at once (``_lattice``): the grid of boxes (loop iterations, then workers),
    #: each operand's view over the whole grid and the output's; empty where the boxes differ
    lattice: tuple[int, ...] = ()
    lattice_reads: tuple[View, ...] = ()
    lattice_write: View = ((), (), 0)

    def box(self, env: Mapping[str, Any], out: Any, i: int) -> Partial | None:
        """Compute box ``i``: write it when it is alone in its output slice (None), else
        return its partial."""
        xs = [_strided(env[n], v) for n, v in zip(self.reads, self.box_reads[i], strict=True)]
        return self._compute(xs, out, i, self.box_writes[i], (), self.solo[i])

    def all_boxes(self, env: Mapping[str, Any], out: Any) -> None:
        """Compute every box in one kernel call, each box a batch element of the lattice's
        views (so each is still computed on its own), and write them: only for a step whose
        boxes are all alone in their output slices (``lattice`` non-empty). A matmul runs
        as ``_mm_lattice`` does."""
        xs = [_strided(env[n], v) for n, v in zip(self.reads, self.lattice_reads, strict=True)]
        if self.mode == "mm":
            self._mm_lattice(xs, out)
            return
        self._compute(xs, out, 0, self.lattice_write, self.lattice, True)

    def _mm_lattice(self, xs: list[Any], out: Any) -> None:
        """A matmul's lattice of boxes: one GEMM per index of the lattice axes along which the
        right operand moves, holding the boxes of the axes that move only the left operand as
        one block of rows (a batched GEMM whose right operand repeats along a batch axis is
        a copy of it per batch element, and runs slower than the boxes one by one)."""
        a, b = (x if c is None else x.to(c) for x, c in zip(xs, self.casts, strict=True))
        lat = self.lattice
        nl = len(lat)
        nb, nm, nk, nn = self.counts
        rows_only = [i for i in range(nl) if b.stride(i) == 0 and a.stride(i) != 0]
        rest = [i for i in range(nl) if i not in rows_only]
        nr = len(rows_only)
        dest = _strided(out, self.lattice_write)
        for idx in itertools.product(*(range(lat[i]) for i in rest)):
            at: list[Any] = [slice(None)] * nl
            for i, k in zip(rest, idx, strict=True):
                at[i] = k
            on_b = [0 if i in rows_only else at[i] for i in range(nl)]
            left = a[tuple(at)]  # [rows-only axes.., batch.., m.., k..]
            right = b[tuple(on_b)]  # [batch.., k.., n..]
            shape = left.shape
            batch, lead, ms = shape[nr:nr + nb], shape[:nr], shape[nr + nb:nr + nb + nm]
            # batch dims first, then the rows of every box: one [rows, k] @ [k, n] per batch
            left = left.permute(*range(nr, nr + nb), *range(nr), *range(nr + nb, left.ndim))
            flat_b = [math.prod(batch)] if nb else []
            left = left.reshape(*flat_b, -1, math.prod(shape[nr + nb + nm:]))
            right = right.reshape(*flat_b, math.prod(right.shape[nb:nb + nk]), -1)
            part = torch.matmul(left, right)
            if self.box_scales[0] != 1:
                part = part * self.box_scales[0]
            ns = dest.shape[nl + nb + nm:]
            part = part.reshape(*batch, *lead, *ms, *ns)
            part = part.permute(*range(nb, nb + nr), *range(nb), *range(nb + nr, part.ndim))
            self.store(dest[tuple(at)], self.finished(part))

    def _compute(self, xs: list[Any], out: Any, i: int, write: View, lead: tuple[int, ...],
                 solo: bool) -> Partial | None:
        """The kernel of box ``i`` (with ``lead`` leading batch axes: every box of the
        lattice, all the size of box ``i``) on the operand views ``xs``; writes the result
        through ``write`` when ``solo``, else returns the partial."""
        if self.mode == "copy":  # a copy or cast: one copy_
            self.write(out, write, xs[0])
            return None
        xs = [x if c is None else x.to(c) for x, c in zip(xs, self.casts, strict=True)]
        nl = len(lead)
        if self.mode == "elementwise":
            assert self.fn is not None
            part = self.fn(*xs)
        elif self.mode == "mm":  # (batch, m.., k..) @ (batch, k.., n..): BLAS without einsum
            nb, nm, nk, nn = (c + nl if j == 0 else c for j, c in enumerate(self.counts))
            a = xs[0].flatten(nb + nm, nb + nm + nk - 1).flatten(nb, nb + nm - 1)
            b = xs[1].flatten(nb + nk, nb + nk + nn - 1).flatten(nb, nb + nk - 1)
            part = torch.matmul(a, b)
            if self.box_scales[i] != 1:
                part = part * self.box_scales[i]
            part = part.reshape(write[0])
        elif self.mode == "matmul":
            equation = self.equation
            if nl:  # the lattice's axes lead every operand and the result
                lhs, rhs = equation.split("->")
                equation = ",".join("..." + s for s in lhs.split(",")) + "->..." + rhs
            part = torch.einsum(equation, *xs)
            if self.box_scales[i] != 1:  # the same product once per point of an unread dim
                part = part * self.box_scales[i]
            part = part.reshape((*lead, *self.box_shapes[i]))
        else:
            reducer = self.op.kind.reducer
            assert reducer is not None
            part = reduce(reducer, xs[0].expand((*lead, *self.box_shapes[i])),
                          tuple(a + nl for a in self.axes), self.box_starts[i], self.red_sizes)
        if not solo:
            return part
        self.write(out, write, self.finished(part))
        return None

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

    def store(self, dest: Any, value: Any) -> None:
        """``value`` copied into the view ``dest`` of the output, cast as
        ``kernels.to_storage`` casts."""
        if self.out_dtype == "bool" and value.dtype != torch.bool:
            value = value != 0
        elif self.out_dtype in INTEGERS and value.is_floating_point():
            value = torch.trunc(value)
        dest.copy_(value)


def _compute_dtype(dtypes: Sequence[str], kind: OpKind) -> Any:
    """The torch dtype an op of ``kind`` computes in, from its value operands' ``dtypes``:
    int64 for integers (and bools) where the kind has integer semantics, as the reference
    (``kernels.compute_dtype``); float64 for other integer operands and, outside matmuls,
    float32 ones (as the reference: chains of exp and sin computed in float32 drift past the
    float32 tolerance); float32 otherwise."""
    if kernels.compute_dtype(dtypes, kind) == np.int64:
        return torch.int64
    matmul = kind.category is Category.MATMUL
    wide = any(d in INTEGERS or (d == "float32" and not matmul) for d in dtypes)
    return torch.float64 if wide else torch.float32


def _elementwise(op: Op) -> Callable[..., Any]:
    kind = op.kind
    attrs = kind.numeric_attrs(dict(op.attrs))
    fused = kernel(kind).fn
    if fused is not None:
        return lambda *xs: fused(*xs, **attrs)
    compute = kind.compute
    assert compute is not None, f"op kind {kind.name!r} has no semantics"
    return lambda *xs: compute(XP, *xs, **attrs)


def _boxes(launch: Launch, counts: Sequence[int]) -> tuple[list[Box], list[int]]:
    """Every worker's box of a launch over every iteration of its enclosing loops (of
    ``counts``), in loop order, and the iteration of each: the schedule's boxes at each loop
    index. A level that moves none of the launch's boxes recomputes the same tile each
    iteration: the same numbers once."""
    once = [c if level in launch.moving else 1 for level, c in enumerate(counts)]
    boxes, iters = [], []
    for k, index in enumerate(itertools.product(*(range(c) for c in once))):
        for b in launch.boxes_at(index):
            if b is not None:  # a core with nothing of a tile smaller than planned
                boxes.append(b)
                iters.append(k)
    return boxes, iters


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


def _step(item: Launch | Host, counts: Sequence[int], program: Program) -> _Step:
    """How the torch backend runs one launch or host step of a schedule (inside loops of
    ``counts``)."""
    op = program.op(item.op)
    how = kernel(op.kind).how
    kind = op.kind
    out_t = program.tensor(op.out.tensor)
    in_types = [program.tensor(a.tensor) for a in op.ins]
    # the output as written: a merged axis split into one axis per dim (a view of the
    # contiguous output; the same strides as the merge's terms)
    written, written_shape = op.split_out, op.split_shape(out_t.shape)
    values = kind.value_inputs(len(in_types))
    compute = _compute_dtype([in_types[i].dtype for i in values], kind)
    # conditions are read as bools (a float condition of 0.5 is true in an int64 op too)
    wants = [compute if i in values else torch.bool for i in range(len(in_types))]
    common = {"op": op, "reads": tuple(a.tensor for a in op.ins), "out": op.out.tensor,
              "out_dtype": out_t.dtype, "out_shape": out_t.shape, "compute": compute,
              "casts": tuple(None if _dtype(t.dtype) == want else want
                             for t, want in zip(in_types, wants, strict=True))}
    if isinstance(item, Host):
        if how not in ("whole", "numpy"):
            raise ExecutionError(f"op {op.name!r}: a host step of kind {kind.name!r}, which "
                                 f"the torch backend runs as {how!r}")
        # whole, in a loop nest too: a fallback works on whole rows, so its tiles' results
        # are the whole op's
        whole = ({d: (0, n) for d, n in op.dims},)
        return _Step(mode=how, boxes=whole, groups=((0,),), solo=(True,), iters=(0,),
                     box_reads=(), box_writes=(), **common)
    listed, iters = _boxes(item, counts)
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


def _lattice(step: _Step, launch: Launch, counts: Sequence[int]) -> _Step:
    """``step`` with its boxes as one lattice where they form one: every box alone in its
    output slice and as large as the others, and every operand's and the output's view of box
    ``j`` the view of box 0 moved by a fixed offset per lattice axis (the loop levels that
    move the launch, then its worker axes: the order ``_boxes`` lists them in). An even split
    does; an uneven one (10 over 4: 3, 3, 2, 2), a tile smaller than planned, or a split
    reduction does not, and keeps running box by box."""
    modes = ("copy", "elementwise", "mm", "matmul", "reduce")
    if step.mode not in modes or len(step.boxes) < 2 or not all(step.solo):
        return step
    shape = [c for level, c in enumerate(counts) if level in launch.moving and c > 1]
    shape += [a.size for a in launch.axes if a.size > 1]
    if math.prod(shape) != len(step.boxes):
        return step  # a worker with nothing to do
    per_box = [step.box_shapes, step.box_scales, step.box_starts]
    if any(len(set(v)) > 1 for v in per_box if v):
        return step
    views = [*zip(*step.box_reads, strict=True), step.box_writes] if step.box_reads else [
        step.box_writes]
    if any(len({(v[0], v[1]) for v in vs}) > 1 for vs in views):
        return step
    unit = [math.prod(shape[a + 1:]) for a in range(len(shape))]
    index = list(itertools.product(*(range(n) for n in shape)))
    moved: list[View] = []
    for vs in views:
        base = vs[0][2]
        strides = [vs[u][2] - base for u in unit]
        if any(v[2] != base + sum(i * s for i, s in zip(ix, strides, strict=True))
               for v, ix in zip(vs, index, strict=True)):
            return step
        moved.append(((*shape, *vs[0][0]), (*strides, *vs[0][1]), base))
    reads = tuple(moved[:-1]) if step.box_reads else ()
    return dataclasses.replace(step, lattice=tuple(shape), lattice_reads=reads,
                               lattice_write=moved[-1])


def _schedule(schedule: Schedule) -> tuple[_Step, ...]:
    """The torch steps of a schedule: one per launch and host step, in order, each with the
    tensors no later step reads (the schedule's lifetimes) to free after it."""
    steps: list[_Step] = []
    for item, loops in schedule.walk():
        if isinstance(item, Launch | Host):
            counts = [lp.count for lp in loops]
            step = _step(item, counts, schedule.program)
            steps.append(_lattice(step, item, counts) if isinstance(item, Launch) else step)
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
    attrs = op.kind.numeric_attrs(dict(op.attrs))
    try:
        res = WHOLE[op.kind.name](*(env[n] for n in step.reads), shape=step.out_shape,
                                   **attrs)
        res = res.reshape(step.out_shape)
    except (IndexError, RuntimeError, ValueError) as e:
        raise ExecutionError(f"op {op.name!r}: {op.kind.name} failed: {e}") from None
    return _cast(res, step.out_dtype).contiguous()


def _run_numpy(step: _Step, program: Program, env: Mapping[str, Any]) -> Any:
    """The op through the reference executor: its operands to numpy and the result back."""
    op = step.op
    arrays = {n: from_torch_storage(env[n]) for n in step.reads}
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
        for name in program.inputs:
            t = program.tensor(name)
            if name not in inputs:
                raise ExecutionError(f"input {name!r} of program {program.name!r} is missing")
            value = inputs[name]
            if tuple(value.shape) != t.shape:
                raise ExecutionError(f"input {name!r} has shape {tuple(value.shape)}, expected "
                                     f"{t.shape}")
            env[name] = to_torch_storage(value, t.dtype)
        return env

    def run(self, inputs: Mapping[str, Any], params: Mapping[str, int] | None = None
            ) -> dict[str, Any]:
        """Run the plan on ``inputs`` (torch tensors or numpy arrays by program input name);
        returns the program's outputs as torch tensors of their dtypes. ``params``: symbolic
        loop counts (plans with loop groups only)."""
        steps = self.schedule(params)
        env = self.bind(inputs)
        with _intra_op_threads(1), torch.no_grad():
            for step in steps:
                env[step.out] = self._run_step(step, env)
                for name in step.free:
                    env.pop(name, None)
        return {name: env[name] for name in self.program.outputs}

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
        boxes = len(step.boxes)
        if self.threads == 1 or boxes == 1 or step.op.points < self.grain * boxes:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads,
                                            thread_name_prefix="apportion-core")
        return self._pool

    def _run_step(self, step: _Step, env: Mapping[str, Any]) -> Any:
        op = step.op
        if step.mode == "numpy":
            return _run_numpy(step, self.program, env)
        if step.mode == "whole":
            return _run_whole(step, env)
        out = torch.empty(step.out_shape, dtype=_dtype(step.out_dtype))
        n = len(step.boxes)
        pool = self._pool_for(step)
        try:
            if pool is None and step.lattice and self.batched:
                step.all_boxes(env, out)
                return out
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
