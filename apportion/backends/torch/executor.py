"""The threaded torch executor: a plan run core slice by core slice with torch kernels.

``run_torch(planned, inputs, threads)`` runs every op of a plan as the plan divides it: each
core's box of the op's iteration space is exactly the reference executor's (outside loops
``plans.views.core_slices`` of the op plan; in a loop nest every iteration's core boxes of its
tile, ``plans.tiles``, as ``loops.run_tiled`` cuts them), checked by ``reference.check_cover``
to cover the space once, and computed by torch kernels on torch views of the operands. The
boxes of one op run concurrently on a pool of ``threads`` threads; ops run in program order.
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
  over the views; BLAS either way. Pointwise and layout kinds: their registry semantics
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
import math
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from apportion.backends.limits import cite
from apportion.errors import ApportionError, ExecutionError
from apportion.ir.kinds import INTEGERS, Category, OpKind, Partial, Reducer
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.plans.plan import Plan
from apportion.plans.tiles import core_boxes, iterations, resolve_counts, tile_box
from apportion.plans.views import core_slices
from apportion.runtime import kernels
from apportion.runtime.reference import Box, check_cover, evaluate_op, run_op_boxes

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the optional extra .[torch]; run_torch says so
    torch = None  # type: ignore[assignment]
    F = None  # type: ignore[assignment]

__all__ = ["GRAIN", "TORCH_DTYPES", "XP", "TorchExecutor", "from_torch_storage", "run_torch",
           "to_torch_storage"]


class PlannedLike(Protocol):
    """What ``run_torch`` needs of a ``PlannedProgram``."""

    @property
    def program(self) -> Program: ...

    @property
    def plan(self) -> Plan: ...


def _require_torch() -> None:
    if torch is None:
        raise ExecutionError("the torch executor needs PyTorch: pip install 'apportion[torch]' "
                             f"{cite('needs-pytorch')}")


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
    _require_torch()
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


# --- the array namespace -----------------------------------------------------------------------

def _scalar_aware(both: Callable[[Any, Any], Any], one: str) -> Callable[[Any, Any], Any]:
    # numpy's maximum(a, 0) takes a number; torch's maximum wants two tensors
    def fn(a: Any, b: Any) -> Any:
        if isinstance(b, torch.Tensor):
            return both(a, b)
        return getattr(torch, one)(a, b)
    return fn


def _asarray(value: Any, dtype: Any = None) -> Any:
    if isinstance(value, torch.Tensor):
        return value if dtype is None else value.to(dtype)
    if dtype is None and isinstance(value, float | int) and not isinstance(value, bool):
        dtype = torch.float64  # numpy's for a Python number
    return torch.as_tensor(value, dtype=dtype)


class _Torch:
    """The array namespace the registry's semantics run on here: torch under numpy's names
    (``equal`` is elementwise, ``maximum`` takes a number, ``power``, ``asarray``)."""

    def __getattr__(self, name: str) -> Any:
        _require_torch()
        renamed = {"equal": torch.eq, "not_equal": torch.ne, "less": torch.lt,
                   "less_equal": torch.le, "greater": torch.gt, "greater_equal": torch.ge,
                   "power": torch.pow, "asarray": _asarray,
                   "maximum": _scalar_aware(torch.maximum, "clamp_min"),
                   "minimum": _scalar_aware(torch.minimum, "clamp_max")}
        fn = renamed[name] if name in renamed else getattr(torch, name)
        setattr(self, name, fn)  # looked up once
        return fn


#: the namespace passed to the registry's semantics and reducers
XP = _Torch()


def _clamp(a: Any, min: float | None = None, max: float | None = None) -> Any:
    return torch.clamp(a, min=min, max=max)


#: kinds whose registry formula takes several torch kernels: one fused kernel, same math
_FUSED: dict[str, Callable[..., Any]] = {
    "silu": lambda a: F.silu(a),
    "sigmoid": lambda a: torch.sigmoid(a),
    "gelu": lambda a: F.gelu(a, approximate="tanh"),
    "relu": lambda a: torch.relu(a),
    "rsqrt": lambda a: torch.rsqrt(a),
    "softplus": lambda a: F.softplus(a, beta=1.0, threshold=20.0),
    "clamp": _clamp,
}


# --- reductions --------------------------------------------------------------------------------

def _flat(x: Any, axes: tuple[int, ...]) -> Any:
    """``x`` with the reduced axes moved last and merged into one."""
    keep = [i for i in range(x.ndim) if i not in axes]
    moved = x.permute(*keep, *axes)
    return moved.reshape(*moved.shape[:len(keep)], -1)


def _argmax(x: Any, axes: tuple[int, ...], starts: Sequence[int], sizes: Sequence[int]
            ) -> tuple[Any, Any]:
    """Max values and their flat indices, row-major over the full reduction dims (the
    reference's ``_argmax_partial``)."""
    flat = _flat(x, axes)
    local = torch.argmax(flat, dim=-1)  # the first maximum (NaN counts as the largest)
    values = flat.gather(-1, local.unsqueeze(-1)).squeeze(-1)
    box = [x.shape[a] for a in axes]
    index = torch.zeros_like(local)
    rest = local
    scale = 1
    for size, start, full in zip(reversed(box), reversed(starts), reversed(sizes), strict=True):
        index = index + (rest % size + start) * scale
        rest = torch.div(rest, size, rounding_mode="floor")
        scale *= full
    return values, index


def _reduce(reducer: Reducer, x: Any, axes: tuple[int, ...], starts: Sequence[int],
            sizes: Sequence[int]) -> Partial:
    """One box's partial of a reduction over ``axes`` of ``x`` (the box, every op dim)."""
    name = reducer.name
    if name == "argmax":
        return _argmax(x, axes, starts, sizes)
    if not axes:  # torch reads an empty dim list as "all dims"
        return (x != 0) if name == "any" else x
    if name in ("sum", "mean"):
        return torch.sum(x, dim=axes)
    if name == "max":
        return torch.amax(x, dim=axes)
    if name == "min":
        return torch.amin(x, dim=axes)
    if name == "prod":
        return torch.prod(_flat(x, axes), dim=-1)
    if name == "any":
        return torch.any(_flat(x, axes) != 0, dim=-1)
    raise ExecutionError(f"the torch executor has no partial for reducer {name!r}")


#: reducers with a torch partial; an op of another runs through the reference executor
_REDUCERS = frozenset({"sum", "mean", "max", "min", "prod", "any", "argmax"})


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

    def box(self, env: Mapping[str, Any], out: Any, i: int) -> Partial | None:
        """Compute box ``i``: write it when it is alone in its output slice (None), else
        return its partial."""
        xs = [_strided(env[n], v) for n, v in zip(self.reads, self.box_reads[i], strict=True)]
        if self.mode == "copy":  # a copy or cast: one copy_
            self.write(out, i, xs[0])
            return None
        xs = [x if c is None else x.to(c) for x, c in zip(xs, self.casts, strict=True)]
        if self.mode == "elementwise":
            assert self.fn is not None
            part = self.fn(*xs)
        elif self.mode == "mm":  # (batch, m.., k..) @ (batch, k.., n..): BLAS without einsum
            nb, nm, nk, nn = self.counts
            a = xs[0].flatten(nb + nm, nb + nm + nk - 1).flatten(nb, nb + nm - 1)
            b = xs[1].flatten(nb + nk, nb + nk + nn - 1).flatten(nb, nb + nk - 1)
            part = torch.matmul(a, b)
            if self.box_scales[i] != 1:
                part = part * self.box_scales[i]
            part = part.reshape(self.box_writes[i][0])
        elif self.mode == "matmul":
            part = torch.einsum(self.equation, *xs)
            if self.box_scales[i] != 1:  # the same product once per point of an unread dim
                part = part * self.box_scales[i]
            part = part.reshape(self.box_shapes[i])
        else:
            reducer = self.op.kind.reducer
            assert reducer is not None
            part = _reduce(reducer, xs[0].expand(self.box_shapes[i]), self.axes,
                           self.box_starts[i], self.red_sizes)
        if not self.solo[i]:
            return part
        self.write(out, i, self.finished(part))
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

    def write(self, out: Any, i: int, value: Any) -> None:
        """``value`` (over the parallel dims, broadcastable) into box ``i``'s piece of ``out``,
        cast as ``kernels.to_storage`` casts."""
        if self.out_dtype == "bool" and value.dtype != torch.bool:
            value = value != 0
        elif self.out_dtype in INTEGERS and value.is_floating_point():
            value = torch.trunc(value)
        _strided(out, self.box_writes[i]).copy_(value)


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
    fused = _FUSED.get(kind.name)
    if fused is not None:
        return lambda *xs: fused(*xs, **attrs)
    compute = kind.compute
    assert compute is not None, f"op kind {kind.name!r} has no semantics"
    return lambda *xs: compute(XP, *xs, **attrs)


def _boxes(op: Op, op_plan: Any, params: Mapping[str, int] | None
           ) -> tuple[list[Box], list[int]]:
    """Every core's box of the op's iteration space, and the loop iteration of each: outside
    loops the plan's core slices; in a loop nest every iteration's core boxes of its tile
    (``plans.tiles``, as ``loops.run_tiled`` cuts them), iterations in loop order."""
    loop = op_plan.loop
    if loop is None:
        if dict(op_plan.iteration_space) != op.sizes:
            raise ExecutionError(f"op {op.name!r}: plan's iteration space {op_plan.sizes} "
                                 f"differs from the op's {op.sizes}")
        boxes = core_slices(op_plan)
        return boxes, [0] * len(boxes)
    counts = resolve_counts(loop.count, params)
    # a level that tiles none of the op's dims recomputes the same tile each iteration: the
    # same numbers once
    once = tuple(c if dims else 1 for c, dims in zip(counts, loop.tiled_dims, strict=True))
    boxes, iters = [], []
    for k, index in enumerate(iterations(once)):
        for b in core_boxes(op_plan, tile_box(op.sizes, loop, index, counts, op.name)):
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


def _step(op: Op, program: Program, plan: Plan, params: Mapping[str, int] | None) -> _Step:
    try:
        op_plan = plan.op(op.name)
    except ApportionError as e:
        raise ExecutionError(f"op {op.name!r}: {e}") from None
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
    if not kind.divisible:
        if op_plan.cores != 1:
            raise ExecutionError(f"op {op.name!r}: fallback ops run on one core, plan gives "
                                 f"{op_plan.cores}")
        # whole, in a loop nest too: a fallback works on whole rows, so its tiles' results
        # are the whole op's
        whole = ({d: (0, n) for d, n in op.dims},)
        return _Step(mode="whole" if kind.name in _WHOLE else "numpy", boxes=whole,
                     groups=((0,),), solo=(True,), iters=(0,), box_reads=(), box_writes=(),
                     **common)
    listed, iters = _boxes(op, op_plan, params)
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
    if kind.name in ("copy", "relayout"):  # elements moved, maybe cast: one copy_
        return _Step(mode="copy", **common)
    if kind.elementwise:
        return _Step(mode="elementwise", fn=_elementwise(op), **common)
    if matmul:
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
    if kind.reducer is None or kind.reducer.name not in _REDUCERS:
        return _Step(mode="numpy", **common)
    return _Step(mode="reduce", axes=tuple(i for i, d in enumerate(dims) if d in red),
                 red_sizes=tuple(op.sizes[d] for d in red),
                 box_shapes=tuple(tuple(b[d][1] - b[d][0] for d in dims) for b in boxes),
                 box_starts=tuple(tuple(b[d][0] for d in red) for b in boxes), **common)


def _check_params(program: Program, plan: Plan, params: Mapping[str, int] | None) -> None:
    """Symbolic loop counts checked as ``loops.run_tiled`` checks them: each one given, within
    what its group was planned for; no other name."""
    needed = {c for g in plan.groups for c in g.counts if isinstance(c, str)}
    extra = sorted(set(params or {}) - needed)
    if extra:
        raise ExecutionError(f"params {extra} given, but plan of {program.name!r} has no such "
                             "symbolic loop count")
    for g in plan.groups:
        for name, value in zip(g.counts, resolve_counts(g.counts, params), strict=True):
            why = g.check_count(name, value) if isinstance(name, str) else None
            if why is not None:
                raise ExecutionError(why)


def _schedule(program: Program, plan: Plan, params: Mapping[str, int] | None
              ) -> tuple[_Step, ...]:
    _check_params(program, plan, params)
    steps = [_step(op, program, plan, params) for op in program.ops]
    # a tensor no later op reads and that is no output is dropped after its last reader
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        for name in s.reads:
            last[name] = i
    keep = set(program.outputs) | set(program.inputs)
    dead: dict[int, list[str]] = {}
    for name, i in last.items():
        if name not in keep:
            dead.setdefault(i, []).append(name)
    for i, s in enumerate(steps):
        unread = s.out not in last and s.out not in keep  # computed, never read
        free = dead.get(i, []) + ([s.out] if unread else [])
        if free:
            steps[i] = dataclasses.replace(s, free=tuple(free))
    return tuple(steps)


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

def _gather(table: Any, ids: Any, *, shape: tuple[int, ...]) -> Any:
    row = math.prod(shape) // max(ids.numel(), 1)
    rows = table.reshape(-1, row)
    flat = ids.reshape(-1).to(torch.int64)
    flat = torch.where(flat < 0, flat + rows.shape[0], flat)  # numpy's take wraps negatives
    return rows.index_select(0, flat).reshape(shape)


def _arange(*, shape: tuple[int, ...], start: float = 0.0, step: float = 1.0) -> Any:
    n = math.prod(shape)
    return (start + step * torch.arange(n, dtype=torch.float64)).reshape(shape)


#: whole-tensor fallbacks run in torch: inputs as stored, the output's shape
_WHOLE: dict[str, Callable[..., Any]] = {
    "gather": _gather,
    "reshape": lambda a, *, shape: a.reshape(shape).clone(),
    "concat": lambda a, b, *, shape, axis: torch.cat(
        [a, b.to(torch.promote_types(a.dtype, b.dtype))]
        if a.dtype != b.dtype else [a, b], dim=int(axis)),
    "full": lambda *, shape, value: torch.full(shape, value, dtype=torch.float64),
    "arange": _arange,
}


def _run_whole(step: _Step, env: Mapping[str, Any]) -> Any:
    op = step.op
    attrs = op.kind.numeric_attrs(dict(op.attrs))
    try:
        res = _WHOLE[op.kind.name](*(env[n] for n in step.reads), shape=step.out_shape,
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

    def __init__(self, program: Program, plan: Plan, threads: int = 1,
                 grain: int = GRAIN) -> None:
        _require_torch()
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ExecutionError(f"threads must be an int >= 1, got {threads!r}")
        if isinstance(grain, bool) or not isinstance(grain, int) or grain < 0:
            raise ExecutionError(f"grain must be an int >= 0, got {grain!r}")
        self.program = program
        self.plan = plan
        self.threads = threads
        self.grain = grain
        self._steps: dict[tuple[tuple[str, int], ...], tuple[_Step, ...]] = {}
        self._pool: ThreadPoolExecutor | None = None
        if not any(isinstance(c, str) for g in plan.groups for c in g.counts):
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

    def schedule(self, params: Mapping[str, int] | None = None) -> tuple[_Step, ...]:
        """Every op's boxes at these symbolic loop counts, built once per distinct ``params``."""
        key = tuple(sorted((params or {}).items()))
        if key not in self._steps:
            self._steps[key] = _schedule(self.program, self.plan, params)
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
                step.write(out, g[0], step.finished(_combine(step, reducer, g, parts)))
        return out


def run_torch(planned: PlannedLike, inputs: Mapping[str, Any], threads: int = 1,
              params: Mapping[str, int] | None = None, grain: int = GRAIN) -> dict[str, Any]:
    """Run ``planned`` (a ``PlannedProgram``, or anything with its ``program`` and ``plan``)
    core slice by core slice with torch kernels, the cores of each op on ``threads`` threads
    (those of ops with fewer than ``grain`` iteration points per core on the calling thread);
    returns the program's outputs as torch tensors (see the module docstring)."""
    with TorchExecutor(planned.program, planned.plan, threads, grain) as ex:
        return ex.run(inputs, params)
