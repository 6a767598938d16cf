"""The builder's op functions: one per op kind of the registry with a builder name, and those
whose structure is in their accesses.

Every op kind of the registry (``apportion.ir.kinds``) with a builder name has a function here,
made from its entry (``OP_FUNCTIONS``; ``ap.exp``, ``ap.where``, ``ap.amax``, ...): an
elementwise function with broadcast (``UnaryOp``, ``BinaryOp``), a reduction over a dim
(``Reduction``) or a whole-tensor fallback. The others are written out: ``cast``, ``merge`` (an
output written through a merge of dims), ``fill`` (a constant), ``conv``, ``max_pool`` and
``avg_pool`` (index sums), ``topk`` and ``gather``. Each adds its op through the builder's op
interface (``builder.start_op``, ``ProgramBuilder.add_op``).

>>> from apportion.frontend.builder import dim, program
>>> with program("r") as p:
...     x = p.input("x", [dim("T", 4), dim("D", 8)], "float32")
...     y = OP_FUNCTIONS["sum"](x, 1) / cast(x, "float32")
>>> [o.fn for o in p.program.ops]
['sum', 'copy', 'div']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

from apportion.errors import ProgramError
from apportion.frontend.builder import (
    Dim,
    Tensor,
    active_builder,
    anonymous_dim,
    as_tuple,
    broadcast_op,
    common_dim,
    dims_text,
    index_of,
    same_dtype,
    start_op,
    unary_op,
)
from apportion.frontend.json_format import number_attr
from apportion.ir.affine import AffineExpr
from apportion.ir.dtypes import check_dtype
from apportion.ir.kinds import Category, OpKind, builder_kinds

__all__ = [
    "OP_FUNCTIONS", "BinaryOp", "Reduction", "UnaryOp",
    "avg_pool", "cast", "conv", "fill", "gather", "max_pool", "merge", "topk",
    *(k.builder for k in builder_kinds() if k.builder),
]


def _reduce(fn: str, base: str, x: Tensor, over: Dim | int, keepdim: bool,
            name: str | None) -> Tensor:
    b, op_name = start_op(base, name, x)
    where, x_rank = f"op {op_name!r}", len(x.dims)
    if not isinstance(keepdim, bool):
        raise ProgramError(f"{where}: keepdim must be True or False, got "
                           f"{type(keepdim).__name__} {keepdim!r}"[:200])
    if isinstance(over, Dim):
        b.register(over, where)
        axes = [j for j, d in enumerate(x.dims) if d == over]
        if not axes:
            raise ProgramError(f"{where}: tensor {x.name!r} {dims_text(x.dims)} has no dim "
                               f"{over.name!r} to reduce over")
        if len(axes) > 1:
            raise ProgramError(f"{where}: tensor {x.name!r} has dim {over.name!r} at axes "
                               f"{axes}; pass the axis index to reduce over")
        axis = axes[0]
    elif isinstance(over, int) and not isinstance(over, bool) and -x_rank <= over < x_rank:
        axis = over % x_rank
    else:
        raise ProgramError(f"{where}: cannot reduce tensor {x.name!r} {dims_text(x.dims)} over "
                           f"{over!r}; give one of its dims or an axis index")
    letters = b.slot_letters([d if d.size > 1 or j == axis else None
                              for j, d in enumerate(x.dims)])
    sizes = {lt: d.size for lt, d in zip(letters, x.dims, strict=True) if lt}
    index = [index_of(lt) for lt in letters]
    out_index = [index_of(None) if j == axis else e for j, e in enumerate(index)
                 if keepdim or j != axis]
    out_dims = tuple(anonymous_dim(1) if j == axis else d for j, d in enumerate(x.dims)
                     if keepdim or j != axis)
    return b.add_op(op_name, fn, out_dims, out_index, [(x, index)], sizes)


class UnaryOp(Protocol):
    """An elementwise function of one tensor: ``ap.exp(x)``, ``ap.exp(x, name="e")``."""

    def __call__(self, x: Tensor, *, name: str | None = None) -> Tensor: ...


class BinaryOp(Protocol):
    """An elementwise function of two tensors with broadcast: ``ap.maximum(x, y)``."""

    def __call__(self, x: Tensor, y: Tensor, *, name: str | None = None) -> Tensor: ...


class Reduction(Protocol):
    """A reduction over a Dim of ``x`` (or an axis index): ``ap.sum(x, B)``.

    ``keepdim=True`` (the default, as softmax wants) keeps the dim as size 1 so the result
    broadcasts back against ``x``; ``keepdim=False`` drops it.
    """

    def __call__(self, x: Tensor, dim: Dim | int, *, keepdim: bool = True,
                 name: str | None = None) -> Tensor: ...


def _number_attrs(k: OpKind, where: str, attrs: dict[str, object]) -> dict[str, str]:
    out = {}
    for key, value in attrs.items():
        if key not in k.attrs:
            valid = ", ".join(k.attrs) or "none"
            raise ProgramError(f"{where}: {k.name} takes no attribute {key!r}; attributes: {valid}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProgramError(f"{where}: attribute {key!r} must be a number, got {value!r}")
        out[key] = number_attr(value)
    return out


def _kind_function(k: OpKind) -> Callable[..., Tensor]:
    """The builder function of one registry kind (its ``builder`` name)."""
    base = k.builder or k.name
    if k.category is Category.REDUCTION:
        def reduction(x: Tensor, dim: Dim | int, *, keepdim: bool = True,
                      name: str | None = None) -> Tensor:
            return _reduce(k.name, base, x, dim, keepdim, name)
        fn: Callable[..., Tensor] = reduction
        doc = (f"{k.doc[0].upper()}{k.doc[1:]}: ``ap.{base}(x, B)``. ``keepdim=True`` (default) "
               "keeps ``dim`` as size 1.")
    elif k.category is Category.FALLBACK:
        def whole(x: Tensor, *, name: str | None = None) -> Tensor:
            return unary_op(k.name, base, x, name)
        fn = whole
        doc = f"{k.doc[0].upper()}{k.doc[1:]}, on one core (a fallback): ``ap.{base}(x)``."
    else:
        def elementwise(*xs: Tensor, name: str | None = None, **attrs: object) -> Tensor:
            if len(xs) != k.arity:
                raise ProgramError(f"ap.{base} takes {k.arity} tensor"
                                   f"{'s' if k.arity != 1 else ''}, got {len(xs)}")
            return broadcast_op(k, base, xs, name, _number_attrs(k, f"ap.{base}", attrs))
        fn = elementwise
        doc = f"Elementwise {k.doc}, with broadcast."
    fn.__name__ = fn.__qualname__ = base
    fn.__doc__ = doc
    return fn


#: builder name -> function, one per registry kind that has a builder name
OP_FUNCTIONS: dict[str, Callable[..., Tensor]] = {k.builder: _kind_function(k)
                                                  for k in builder_kinds() if k.builder}


def __getattr__(name: str) -> Callable[..., Tensor]:
    # module attributes, not globals: ``sum``, ``any``, ``abs`` must not shadow the builtins here
    try:
        return OP_FUNCTIONS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def cast(x: Tensor, dtype: str, *, name: str | None = None) -> Tensor:
    """A copy of ``x`` with element type ``dtype``: ``ap.cast(x, "float32")``."""
    return unary_op("copy", "cast", x, name, {"dtype": check_dtype(dtype, "ap.cast")})


def merge(x: Tensor, dims: Sequence[Dim], into: Dim | None = None, *,
          name: str | None = None) -> Tensor:
    """A copy of ``x`` with the consecutive ``dims`` merged into one (``into``, or an anonymous
    dim of their product), the first outermost: heads side by side, ``ap.merge(o, (H, D))``
    writes ``y[t, 64*h+d] = o[t, h, d]``, an output written through a merge of dims.

    >>> from apportion.frontend.builder import dim, program
    >>> T, H, D = dim("T", 4), dim("H", 2), dim("D", 64)
    >>> with program("m") as p:
    ...     y = merge(p.input("o", [T, H, D], "float16"), (H, D))
    ...     p.output(y)
    >>> str(p.program.ops[0])
    'merge0: merge0_out[T, 64*H+D] = copy(o[T, H, D])'
    """
    b, op_name = start_op("merge", name, x)
    where = f"op {op_name!r}"
    dims = as_tuple(dims, f"{where}: dims", "a tuple of dims to merge")
    if into is not None and not isinstance(into, Dim):
        raise ProgramError(f"{where}: into must be a Dim made with ap.dim, or None; got "
                           f"{type(into).__name__} {into!r}"[:200])
    names = [d.name for d in x.dims]
    if len(dims) < 2 or any(not isinstance(d, Dim) for d in dims):
        raise ProgramError(f"{where}: merge needs two or more dims of {x.name!r} "
                           f"{dims_text(x.dims)}, got {dims!r}")
    first = next((i for i, d in enumerate(x.dims) if d == dims[0]), None)
    if first is None or tuple(x.dims[first:first + len(dims)]) != dims:
        raise ProgramError(f"{where}: dims {dims_text(dims)} are not consecutive dims of "
                           f"{x.name!r} {dims_text(x.dims)} ({', '.join(names)})")
    size = math.prod(d.size for d in dims)
    merged = into if into is not None else anonymous_dim(size)
    if merged.size != size:
        raise ProgramError(f"{where}: merging {dims_text(dims)} gives {size} elements, but "
                           f"dim {merged} has {merged.size}")
    letters = b.slot_letters([d if d.size > 1 else None for d in x.dims])
    sizes = {lt: d.size for lt, d in zip(letters, x.dims, strict=True) if lt}
    stride, terms = 1, []
    for lt, d in reversed(list(zip(letters[first:first + len(dims)], dims, strict=True))):
        if lt is not None:
            terms.append((lt, stride))
        stride *= d.size
    out_index = [index_of(lt) for lt in letters[:first]]
    out_index.append(AffineExpr(tuple(reversed(terms))) if terms else index_of(None))
    out_index += [index_of(lt) for lt in letters[first + len(dims):]]
    out_dims = (*x.dims[:first], merged, *x.dims[first + len(dims):])
    return b.add_op(op_name, "copy", out_dims, out_index,
                    [(x, [index_of(lt) for lt in letters])], sizes)



def _window(x: Tensor, axes: Sequence[Dim | int], what: str) -> list[int]:
    """Axis indices of ``x`` named by dims or indices."""
    out = []
    for a in as_tuple(axes, f"{what}: axes", "a list of dims or axis indices"):
        if isinstance(a, Dim):
            hits = [j for j, d in enumerate(x.dims) if d == a]
            if len(hits) != 1:
                raise ProgramError(f"{what}: tensor {x.name!r} {dims_text(x.dims)} has "
                                   f"{'no' if not hits else 'more than one'} dim {a.name!r}")
            out.append(hits[0])
        elif isinstance(a, int) and not isinstance(a, bool) and -len(x.dims) <= a < len(x.dims):
            out.append(a % len(x.dims))
        else:
            raise ProgramError(f"{what}: {a!r} is not a dim or an axis of tensor {x.name!r}")
    return out


def _sum(*parts: tuple[int, str | None]) -> AffineExpr:
    """``coeff * letter + ...`` (a None letter: a size-1 dim, index 0)."""
    terms = tuple((lt, c) for c, lt in parts if lt is not None)
    return AffineExpr(terms, 0)


def fill(dims: Sequence[Dim | int], value: float, dtype: str = "float32", *,
         name: str | None = None) -> Tensor:
    """A constant tensor: ``ap.fill([A, B], 0.0, "float16")``, divided over cores like any
    pointwise op (kind ``fill``)."""
    b = active_builder("ap.fill")
    op_name = b.op_name("fill", name)
    b.check_open(f"op {op_name!r}")
    where = f"op {op_name!r}"
    dims = as_tuple(dims, f"{where}: dims", "a list of Dims or positive ints")
    for axis, d in enumerate(dims):
        if not isinstance(d, Dim) and (isinstance(d, bool) or not isinstance(d, int) or d <= 0):
            raise ProgramError(f"{where}: axis {axis} must be a Dim or a positive int, got {d!r}")
    full = tuple(d if isinstance(d, Dim) else anonymous_dim(d) for d in dims)
    for d in full:
        b.register(d, where)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProgramError(f"{where}: value must be a number, got {value!r}")
    letters = b.slot_letters([d if d.size > 1 else None for d in full])
    sizes = {lt: d.size for lt, d in zip(letters, full, strict=True) if lt}
    return b.add_op(op_name, "fill", full, [index_of(lt) for lt in letters], [], sizes,
                    {"value": number_attr(value), "dtype": check_dtype(dtype, where)})


def conv(x: Tensor, w: Tensor, *, stride: int = 1, name: str | None = None) -> Tensor:
    """A convolution without padding, as a matmul over index sums (kind ``conv``).

    ``x`` is ``[*spatial, C]`` and ``w`` ``[*window, C, F]`` with one window dim per spatial dim
    (1-D or 2-D); the result is ``[*out, F]`` with ``out = (size - window) // stride + 1``:
    ``y[o, f] = sum over k, c of x[stride*o + k, c] * w[k, c, f]``.
    """
    b, op_name = start_op("conv", name, x, w)
    where = f"op {op_name!r}"
    same_dtype(op_name, x, w)
    n = len(x.dims) - 1
    if n < 1 or len(w.dims) != n + 2:
        raise ProgramError(f"{where}: conv takes x [*spatial, C] and w [*window, C, F] with one "
                           f"window dim per spatial dim; got {x.name!r} {dims_text(x.dims)} "
                           f"and {w.name!r} {dims_text(w.dims)}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ProgramError(f"{where}: stride must be a positive int, got {stride!r}")
    c = common_dim(x.dims[-1], w.dims[n])
    if c is None:
        raise ProgramError(f"{where}: channels differ: {x.dims[-1]} of {x.name!r} vs "
                           f"{w.dims[n]} of {w.name!r}")
    out_sizes = [(x.dims[i].size - w.dims[i].size) // stride + 1 for i in range(n)]
    if any(s < 1 for s in out_sizes):
        raise ProgramError(f"{where}: window {dims_text(w.dims[:n])} is larger than the input "
                           f"{dims_text(x.dims[:n])}")
    out_dims = (*(anonymous_dim(s) for s in out_sizes), w.dims[-1])
    window = w.dims[:n]
    letters = b.slot_letters([d if d.size > 1 else None for d in (*out_dims, *window, c)])
    outs, fl = letters[:n], letters[n]
    ks, cl = letters[n + 1:2 * n + 1], letters[2 * n + 1]
    sizes = {lt: d.size for lt, d in zip(letters, (*out_dims, *window, c), strict=True) if lt}
    x_index = [_sum((stride, o), (1, k)) for o, k in zip(outs, ks, strict=True)] + [index_of(cl)]
    w_index = [*(index_of(k) for k in ks), index_of(cl), index_of(fl)]
    return b.add_op(op_name, "conv", out_dims, [*(index_of(o) for o in outs), index_of(fl)],
                    [(x, x_index), (w, w_index)], sizes)


def _pool(fn: str, x: Tensor, axes: Sequence[Dim | int], window: int | Sequence[int],
          stride: int | Sequence[int] | None, name: str | None) -> Tensor:
    b, op_name = start_op(fn, name, x)
    where = f"op {op_name!r}"
    pooled = _window(x, axes, where)
    if not isinstance(window, int | list | tuple) or not isinstance(stride,
                                                                   int | list | tuple | None):
        raise ProgramError(f"{where}: window and stride must be ints or lists of ints, got "
                           f"window {window!r}, stride {stride!r}"[:200])
    wins = [window] * len(pooled) if isinstance(window, int) else list(window)
    steps = wins if stride is None else ([stride] * len(pooled) if isinstance(stride, int)
                                         else list(stride))
    if len(wins) != len(pooled) or len(steps) != len(pooled) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (*wins, *steps)):
        raise ProgramError(f"{where}: give one positive window (and stride) per pooled axis, "
                           f"got window {window!r}, stride {stride!r}")
    out_dims = list(x.dims)
    for j, k, s in zip(pooled, wins, steps, strict=True):
        size = (x.dims[j].size - k) // s + 1
        if size < 1:
            raise ProgramError(f"{where}: window {k} is larger than axis {j} of {x.name!r}")
        out_dims[j] = anonymous_dim(size)
    windows = [anonymous_dim(k) for k in wins]
    letters = b.slot_letters([d if d.size > 1 else None for d in (*out_dims, *windows)])
    outs, ks = letters[:len(out_dims)], letters[len(out_dims):]
    sizes = {lt: d.size for lt, d in zip(letters, (*out_dims, *windows), strict=True) if lt}
    x_index = [index_of(lt) for lt in outs]
    for (j, s), k in zip(zip(pooled, steps, strict=True), ks, strict=True):
        x_index[j] = _sum((s, outs[j]), (1, k))
    return b.add_op(op_name, fn, tuple(out_dims), [index_of(lt) for lt in outs],
                    [(x, x_index)], sizes)


def max_pool(x: Tensor, axes: Sequence[Dim | int], window: int | Sequence[int],
             stride: int | Sequence[int] | None = None, *, name: str | None = None) -> Tensor:
    """Max pooling without padding over ``axes`` of ``x`` (stride defaults to the window):
    ``y[o, c] = max over k of x[stride*o + k, c]`` (kind ``max_pool``, a reduction)."""
    return _pool("max_pool", x, axes, window, stride, name)


def avg_pool(x: Tensor, axes: Sequence[Dim | int], window: int | Sequence[int],
             stride: int | Sequence[int] | None = None, *, name: str | None = None) -> Tensor:
    """Average pooling without padding: ``y[o, c] = mean over k of x[stride*o + k, c]``."""
    return _pool("avg_pool", x, axes, window, stride, name)


def topk(x: Tensor, k: int, *, name: str | None = None) -> Tensor:
    """The ``k`` largest along the last axis, largest first: a fallback, whole, on one core."""
    b, op_name = start_op("topk", name, x)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= x.dims[-1].size:
        raise ProgramError(f"op {op_name!r}: k must be an int in 1..{x.dims[-1].size}, got {k!r}")
    out_dims = (*x.dims[:-1], anonymous_dim(k))
    letters = b.slot_letters([*x.dims, out_dims[-1]])
    sizes = {lt: d.size for lt, d in zip(letters, (*x.dims, out_dims[-1]), strict=True) if lt}
    out_index = [*(index_of(lt) for lt in letters[:-2]), index_of(letters[-1])]
    return b.add_op(op_name, "topk", out_dims, out_index,
                    [(x, [index_of(lt) for lt in letters[:-1]])], sizes)


def gather(table: Tensor, ids: Tensor, *, name: str | None = None) -> Tensor:
    """Rows of ``table`` picked by the integer ``ids`` (an embedding): the result is
    ``ids.dims + table.dims[1:]``; a fallback, whole, on one core (kind ``gather``)."""
    b, op_name = start_op("gather", name, table, ids)
    out_dims = (*ids.dims, *table.dims[1:])
    letters = b.slot_letters([*table.dims, *ids.dims])
    t_l, i_l = letters[:len(table.dims)], letters[len(table.dims):]
    sizes = {lt: d.size for lt, d in zip(letters, (*table.dims, *ids.dims), strict=True)}
    out_index = [*(index_of(lt) for lt in i_l), *(index_of(lt) for lt in t_l[1:])]
    return b.add_op(op_name, "gather", out_dims, out_index,
                    [(table, [index_of(lt) for lt in t_l]), (ids, [index_of(lt) for lt in i_l])],
                    sizes)


#: builder functions whose structure is their accesses, exported with the registry's ones
OP_FUNCTIONS.update({"fill": fill, "conv": conv, "max_pool": max_pool, "avg_pool": avg_pool,
                     "topk": topk, "gather": gather, "merge": merge})
