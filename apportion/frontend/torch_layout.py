"""ATen lowerings that move data rather than compute it: views, slices, splits, repeats and
concatenation; flips and scans along a dim; gathers.

``LOWERINGS`` here has the form of ``torch_aten.LOWERINGS`` and ``torch_aten`` merges it into
its own table. What each op lowers to:

- views, permutes, expands, squeezes, slices, splits, ``repeat_interleave`` and ``repeat``:
  index maps only, no op (``torch_lower``); a view that cuts through digits is a ``reshape``
  fallback;
- ``cat``: ``where`` ops over a chunk dim, each reading one chunk (``torch_windows.concat``; a
  ``concat`` fallback past ``CAT_CHUNKS`` chunks);
- ``flip`` and ``cumsum``: fallbacks along the last axis, the input stored with the dim last;
- ``embedding``, ``index``, ``index_select``, ``gather``: ``gather`` fallbacks (multi-dim
  indices first made one flat index by pointwise ops).

>>> sorted(k for k in LOWERINGS if k.startswith("aten.split_with"))
['aten.split_with_sizes.default', 'aten.split_with_sizes_copy.default']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from apportion.errors import ProgramError
from apportion.frontend.torch_lower import (
    Value,
    broadcast_shapes,
    dim_index,
    expand,
    fresh,
    permute,
    slice_bounds,
    squeeze,
    unsqueeze,
    view,
)
from apportion.frontend.torch_table import Ctx, Lower, dim_list, registrar
from apportion.frontend.torch_windows import concat

#: target name (``"aten.cat.default"``) -> lowering, merged into ``torch_aten``'s table
LOWERINGS: dict[str, Lower] = {}
aten = registrar(LOWERINGS)


def _value(x: object, what: str) -> Value:
    if not isinstance(x, Value):
        raise ProgramError(f"{what} must be a tensor, got {x!r}")
    return x


# --- layout: index maps --------------------------------------------------------------------

def _view(cx: Ctx, x: Value, shape: Sequence[int]) -> Value:
    found = view(x, shape)
    if found is not None:
        return found
    p = cx.lw.plain(x)
    found = view(p, shape)
    if found is not None:
        return found
    return cx.lw.whole("reshape", [p], cx.shape())


aten("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")(_view)


@aten("permute.default", "permute_copy.default")
def _permute(cx: Ctx, x: Value, dims: Sequence[int]) -> Value:
    return permute(x, dims)


@aten("transpose.int", "transpose_copy.int")
def _transpose(cx: Ctx, x: Value, d0: int, d1: int) -> Value:
    perm = list(range(x.rank))
    i, j = dim_index(d0, x.rank), dim_index(d1, x.rank)
    perm[i], perm[j] = perm[j], perm[i]
    return permute(x, perm)


@aten("t.default", "numpy_T.default")
def _t(cx: Ctx, x: Value) -> Value:
    return permute(x, list(reversed(range(x.rank))))


@aten("expand.default", "expand_copy.default")
def _expand(cx: Ctx, x: Value, size: Sequence[int], implicit: bool = False) -> Value:
    return expand(x, size)


@aten("unsqueeze.default", "unsqueeze_copy.default")
def _unsqueeze(cx: Ctx, x: Value, dim: int) -> Value:
    return unsqueeze(x, dim)


@aten("squeeze.default", "squeeze.dim", "squeeze.dims", "squeeze_copy.dim",
      "squeeze_copy.dims")
def _squeeze(cx: Ctx, x: Value, dim: Any = None) -> Value:
    return squeeze(x, dim_list(dim))


@aten("slice.Tensor", "slice_copy.Tensor")
def _slice_tensor(cx: Ctx, x: Value, dim: int = 0, start: int | None = None,
                  end: int | None = None, step: int = 1) -> Value:
    d = dim_index(dim, x.rank)
    lo, length = slice_bounds(x.shape[d], start, end, step)
    return cx.lw.sliced(x, d, lo, length, step)


@aten("narrow.default")
def _narrow(cx: Ctx, x: Value, dim: int, start: int, length: int) -> Value:
    d = dim_index(dim, x.rank)
    lo, n = slice_bounds(x.shape[d], start, start + length if start >= 0 else start + length
                         + x.shape[d])
    return cx.lw.sliced(x, d, lo, n)


@aten("select.int", "select_copy.int")
def _select(cx: Ctx, x: Value, dim: int, index: int) -> Value:
    d = dim_index(dim, x.rank)
    i = index + x.shape[d] if index < 0 else index
    return squeeze(cx.lw.sliced(x, d, i, 1), [d])


def _pieces(cx: Ctx, x: Value, sizes: Sequence[int], dim: int) -> tuple[Value, ...]:
    d = dim_index(dim, x.rank)
    out, start = [], 0
    for n in sizes:
        out.append(cx.lw.sliced(x, d, start, n))
        start += n
    return tuple(out)


@aten("split.Tensor", "split_copy.Tensor")
def _split(cx: Ctx, x: Value, size: int, dim: int = 0) -> tuple[Value, ...]:
    n = x.shape[dim_index(dim, x.rank)]
    return _pieces(cx, x, [min(size, n - s) for s in range(0, n, size)], dim)


@aten("split_with_sizes.default", "split_with_sizes_copy.default")
def _split_sizes(cx: Ctx, x: Value, sizes: Sequence[int], dim: int = 0) -> tuple[Value, ...]:
    return _pieces(cx, x, sizes, dim)


@aten("chunk.default")
def _chunk(cx: Ctx, x: Value, chunks: int, dim: int = 0) -> tuple[Value, ...]:
    n = x.shape[dim_index(dim, x.rank)]
    return _split(cx, x, -(-n // chunks), dim)


@aten("unbind.int", "unbind_copy.int")
def _unbind(cx: Ctx, x: Value, dim: int = 0) -> tuple[Value, ...]:
    d = dim_index(dim, x.rank)
    return tuple(squeeze(p, [d]) for p in _pieces(cx, x, [1] * x.shape[d], d))


@aten("clone.default", "alias.default", "detach.default", "lift_fresh_copy.default",
      "contiguous.default", "alias_copy.default", "detach_copy.default")
def _same(cx: Ctx, x: Value, *args: Any, **kw: Any) -> Value:
    return x


@aten("repeat_interleave.self_int")
def _repeat_interleave(cx: Ctx, x: Value, repeats: int, dim: int | None = None,
                       output_size: int | None = None) -> Value:
    if dim is None:
        x, dim = _view(cx, x, [-1]), 0
    d = dim_index(dim, x.rank)
    if repeats == 1:
        return x
    digits = x.digits[d] + ((fresh(), repeats),)
    return Value(x.tensor, x.dtype, x.shape[:d] + (x.shape[d] * repeats,) + x.shape[d + 1:],
                 x.digits[:d] + (digits,) + x.digits[d + 1:], x.index)


@aten("repeat.default")
def _repeat(cx: Ctx, x: Value, repeats: Sequence[int]) -> Value:
    lead = len(repeats) - x.rank
    if lead < 0:
        raise ProgramError(f"repeat {list(repeats)} has fewer sizes than rank {x.rank}")
    shape, digits = [], []
    for j, r in enumerate(repeats):
        n = x.shape[j - lead] if j >= lead else 1
        ds = x.digits[j - lead] if j >= lead else ()
        shape.append(n * r)
        digits.append((((fresh(), r),) if r > 1 else ()) + ds)
    return Value(x.tensor, x.dtype, tuple(shape), tuple(digits), x.index)


@aten("cat.default", "concat.default")
def _cat(cx: Ctx, tensors: Sequence[Value], dim: int = 0) -> Value:
    dt = cx.dtype()
    vals = [cx.lw.cast(v, dt) for v in (_value(t, "a cat input") for t in tensors)
            if math.prod(v.shape) > 0]
    return concat(cx.lw, vals, dim_index(dim, len(cx.shape())))


@aten("flip.default")
def _flip(cx: Ctx, x: Value, dims: Sequence[int]) -> Value:
    for i, d in enumerate(dims):
        x = _along_last(cx, "flip", x, d, part=None if i == len(dims) - 1 else f"flip{i}")
    return x


@aten("cumsum.default")
def _cumsum(cx: Ctx, x: Value, dim: int, dtype: Any = None) -> Value:
    return _along_last(cx, "cumsum", cx.lw.cast(x, cx.dtype()), dim)


def _along_last(cx: Ctx, fn: str, x: Value, dim: int, part: str | None = None) -> Value:
    """A fallback along dim ``dim``: the input stored with that dim last, the result read back
    in the original order."""
    d = dim_index(dim, x.rank)
    perm = [i for i in range(x.rank) if i != d] + [d]
    src = cx.lw.plain(permute(x, perm))
    return cx.lw.op(fn, src.shape, [perm.index(i) for i in range(x.rank)],
                    [(src, list(range(x.rank)))], part=part)


# --- gathers -----------------------------------------------------------------------------

@aten("embedding.default")
def _embedding(cx: Ctx, weight: Value, indices: Value, *args: Any) -> Value:
    return cx.lw.whole("gather", [weight, indices], indices.shape + weight.shape[1:])


@aten("index.Tensor")
def _index(cx: Ctx, x: Value, indices: Sequence[Value | None]) -> Value:
    lw = cx.lw
    pos = [i for i, t in enumerate(indices) if t is not None]
    idx = [_value(indices[i], "an index") for i in pos]
    if any(t.dtype == "bool" for t in idx):
        raise ProgramError("indexing with a boolean mask gives a shape that depends on the "
                           "data; it has no static lowering")
    batch = broadcast_shapes([t.shape for t in idx])
    flat, stride = None, 1
    for i in reversed(pos):  # the row-major flat index over the indexed dims
        n = x.shape[i]
        if n > 1:
            t = lw.cast(indices[i], "int64")  # type: ignore[arg-type]
            term = lw.elementwise("remainder", [t, lw.scalar(n, "int64")], part="wrap")
            if stride != 1:
                term = lw.elementwise("mul", [term, lw.scalar(stride, "int64")], part="stride")
            flat = term if flat is None else lw.elementwise("add", [term, flat], part="flat")
        stride *= n
    if flat is None:
        flat = lw.whole("full", [], batch, "int64", {"value": 0}, part="zero")
    flat = expand(flat, batch)
    others = [i for i in range(x.rank) if i not in pos]
    out = lw.whole("gather", [permute(x, pos + others), flat],
                   (*batch, *(x.shape[i] for i in others)))
    nb = len(batch)
    if pos == list(range(pos[0], pos[0] + len(pos))) and pos[0] > 0:
        p0 = pos[0]  # adjacent indexed dims: the batch dims go where they were
        return permute(out, [*range(nb, nb + p0), *range(nb), *range(nb + p0, out.rank)])
    return out


@aten("index_select.default")
def _index_select(cx: Ctx, x: Value, dim: int, index: Value) -> Value:
    d = dim_index(dim, x.rank)
    others = [i for i in range(x.rank) if i != d]
    out = cx.lw.whole("gather", [permute(x, [d, *others]), index],
                      (*index.shape, *(x.shape[i] for i in others)))
    return permute(out, [*range(1, d + 1), 0, *range(d + 1, out.rank)]) if index.rank == 1 \
        else out


@aten("gather.default")
def _gather_along(cx: Ctx, x: Value, dim: int, index: Value, *args: Any) -> Value:
    """``out[.., j, ..] = x[.., index[.., j, ..], ..]`` along ``dim``: the flat row-major index
    into ``x`` (``index`` times the dim's stride plus each other dim's position times its
    stride, positions from ``arange``) picks single elements with a ``gather``."""
    d = dim_index(dim, x.rank)
    if index.rank != x.rank or any(index.shape[e] > x.shape[e]
                                   for e in range(x.rank) if e != d):
        raise ProgramError(f"gather along dim {d}: index of shape {list(index.shape)} does not "
                           f"fit input of shape {list(x.shape)}")
    lw = cx.lw
    strides = [math.prod(x.shape[e + 1:]) for e in range(x.rank)]
    flat = lw.cast(index, "int64")
    if strides[d] != 1:
        flat = lw.elementwise("mul", [flat, lw.scalar(strides[d], "int64")], part="stride")
    for e in range(x.rank):
        n = index.shape[e]
        if e == d or n == 1:
            continue
        pos = lw.whole("arange", [], (n,), "int64", {"start": 0.0, "step": 1.0}, part="pos")
        pos = view(pos, [n if k == e else 1 for k in range(x.rank)])
        assert pos is not None, "adding size-1 dims is always a view"
        if strides[e] != 1:
            pos = lw.elementwise("mul", [pos, lw.scalar(strides[e], "int64")], part="offset")
        flat = lw.elementwise("add", [flat, pos], part="flat")
    return lw.whole("gather", [x, flat], index.shape)
