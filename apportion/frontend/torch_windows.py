"""Windowed reads for the convolutional lowerings (``torch_conv``), and the padding and
concatenation they and ``cat`` build.

- Index sums: an op whose operands are read at affine forms of its dims (a convolution's
  ``x[n, c, s*o + d*k]``): ``Space`` names the op's dims, ``form`` writes one index, ``read_at``
  reads a value through its index map at those forms (``single_digits`` first copies a merged
  dim, read by one dim, to a plain tensor), and ``emit`` adds the op, its output written one
  tensor axis per dim in torch's row-major order.
- Padding (of a convolution, a pooling window, ``constant_pad_nd``): the IR has neither a pad
  op nor a guarded read (index constants are never negative), so each padded dim of size ``n``
  is one ``where`` op writing blocks of ``n`` (the fill, the input, the fill) through a merged
  axis, read back at an offset (``_pad_blocks``); a selection is exact for every value, inf
  and NaN included. A padding wider than its dim is a concatenation. Only the padding a window
  actually reads is made (``window_pads``).
- Concatenation (``concat``, also ``cat``'s lowering): ``where`` ops over a chunk dim of the
  pieces' gcd size, each selecting one chunk by a constant one-hot row, or ``concat``
  fallbacks past ``CAT_CHUNKS`` chunks.
- torch's window arithmetic: int-list arguments (``int_list``) and output sizes
  (``out_size``).

>>> from apportion.frontend.torch_lower import Origin
>>> lw = Lowering("demo")
>>> x = lw.input("x", "float32", (4, 6))
>>> lw.at(Origin("pad_1", "aten.constant_pad_nd.default"))
>>> pad(lw, x, [(1, 1)], 0.0).shape, out_size(6, 3, 2, 1, 1, False), int_list(2, 3, "stride")
((4, 8), 3, [2, 2, 2])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from apportion.errors import ProgramError
from apportion.frontend.torch_lower import (
    Digit,
    Lin,
    Lowering,
    Value,
    expand,
    fresh,
    slice_dim,
    squeeze,
    view,
)
from apportion.ir.affine import AffineExpr
from apportion.ir.op import Access, Op

__all__ = ["CAT_CHUNKS", "PAD_CHUNKS", "Form", "Space", "concat", "emit", "filled", "form",
           "int_list", "out_size", "pad", "read_at", "single_digits", "window_pads"]

#: most chunks a concatenation (``cat``, the interleaving of adaptive pooling's residues)
#: selects among with ``where`` ops before it takes ``concat`` fallbacks
CAT_CHUNKS = 32

#: most chunks a padding wider than its dim (which ``_pad_blocks`` cannot take) selects among
#: with ``where`` ops before it takes ``concat`` fallbacks: each ``where`` op of such a chain
#: writes the whole padded tensor, so the chain costs about as many passes as chunks
PAD_CHUNKS = 4

#: an index of one torch dim in an op's dims: {dim name: coefficient}, constant
Form = tuple[dict[str, int], int]


# --- reading a value through index sums --------------------------------------------------------

def single_digits(lw: Lowering, v: Value) -> Value:
    """``v`` with at most one digit per torch dim, so each dim's index can be any affine form of
    the op's dims (a merged dim, ``64*h+d``, is copied to a plain tensor first)."""
    return v if all(len(ds) <= 1 for ds in v.digits) else lw.plain(v)


def read_at(v: Value, forms: Sequence[Form | None],
            by: dict[int, Form] | None = None) -> Access:
    """The access reading torch dim ``j`` of ``v`` at ``forms[j]`` (None: a size-1 dim, or a
    dim whose digits ``by`` already maps), through ``v``'s index map. A dim read at a form has
    one digit (``single_digits``); ``by`` maps further digits to forms."""
    by = dict(by or {})
    for j, (ds, form) in enumerate(zip(v.digits, forms, strict=True)):
        if not ds or form is None:
            continue
        assert len(ds) == 1, f"dim {j}: one digit, read at a form"
        by[ds[0][0]] = form
    index = []
    for e in v.index:
        acc: dict[str, int] = {}
        const = e.const
        for d, c in e.terms:
            terms, k = by[d]
            const += c * k
            for name, c2 in terms.items():
                acc[name] = acc.get(name, 0) + c * c2
        index.append(AffineExpr(tuple(acc.items()), const))
    return Access(v.tensor, tuple(index))


def form(*parts: tuple[str | None, int], const: int = 0) -> Form:
    """``sum(coeff * dim) + const``; a None dim (a size-1 dim of the op) adds nothing."""
    return {d: c for d, c in parts if d is not None}, const


class Space:
    """An op's dims, output first: ``dim(name, size)`` names a dim (None for size 1, which the
    op does not iterate)."""

    def __init__(self) -> None:
        self.dims: list[tuple[str, int]] = []

    def dim(self, name: str, size: int) -> str | None:
        if size == 1:
            return None
        self.dims.append((name, size))
        return name


def emit(lw: Lowering, fn: str, space: Space, out: Sequence[tuple[str | None, int]],
         groups: Sequence[int], ins: Sequence[Access], part: str | None) -> Value:
    """An op of kind ``fn`` writing one tensor axis per entry of ``out`` (a dim, or None for a
    size-1 axis), grouped into torch dims by ``groups`` (how many entries each torch dim has,
    outermost digit first): the torch value it writes, in torch's row-major order."""
    base = lw.origin.node if part is None else f"{lw.origin.node}.{part}"
    name = lw.fresh_name(base)
    index = tuple(AffineExpr.dim(d) if d is not None else AffineExpr.constant(0)
                  for d, _ in out)
    op = Op(name, fn, Access(name, index), tuple(ins), tuple(space.dims))
    dtype = lw.add_op(op, tuple(n if d is not None else 1 for d, n in out))
    digits: list[tuple[Digit, ...]] = []
    lins: list[Lin] = []
    shape: list[int] = []
    pos = 0
    for count in groups:
        ds: list[Digit] = []
        size = 1
        for d, n in out[pos:pos + count]:
            size *= n
            if d is None:
                lins.append(Lin())
                continue
            i = fresh()
            ds.append((i, n))
            lins.append(Lin(((i, 1),)))
        digits.append(tuple(ds))
        shape.append(size)
        pos += count
    return Value(name, dtype, tuple(shape), tuple(digits), tuple(lins))


# --- concatenation and padding -----------------------------------------------------------------

def filled(lw: Lowering, value: float, dtype: str, shape: Sequence[int]) -> Value:
    """A constant of ``shape``: a rank-0 constant read by no dim (no op, no data)."""
    return expand(lw.scalar(value, dtype), list(shape))


def concat(lw: Lowering, vals: Sequence[Value], d: int, part: str | None = None,
           limit: int = CAT_CHUNKS) -> Value:
    """``vals`` (one dtype) concatenated along dim ``d``: ``where`` ops over a chunk dim of the
    pieces' gcd size, one per chunk but the last, each selecting one chunk by a constant one-hot
    row (each chunk a slice of its piece, read through its index map), or one ``concat``
    fallback per piece after the first past ``limit`` chunks. With ``part`` None the
    concatenation is the node's value (``cat``): its last op takes the node's name; else every
    op is named after ``part``.

    >>> lw = Lowering("demo")
    >>> x = lw.input("x", "float32", (2, 3))
    >>> z = filled(lw, 0.0, "float32", (2, 1))
    >>> concat(lw, [z, x, z], 1, "pad").shape
    (2, 5)
    """
    vals = [v for v in vals if v.shape[d] > 0]
    assert vals, "a concatenation of at least one non-empty piece"
    if len(vals) == 1:
        return vals[0]

    def named(name: str) -> str:
        return name if part is None else f"{part}.{name}"

    shape = list(vals[0].shape)
    shape[d] = sum(v.shape[d] for v in vals)
    sizes = [v.shape[d] for v in vals]
    g = math.gcd(*sizes)
    chunks = [(v, k) for v, n in zip(vals, sizes, strict=True) for k in range(n // g)]
    if len(chunks) > limit:  # one concat fallback per piece after the first
        acc = lw.plain(vals[0])
        for i, v in enumerate(vals[1:]):
            last = part is None and i == len(vals) - 2
            grown = (*acc.shape[:d], acc.shape[d] + v.shape[d], *acc.shape[d + 1:])
            acc = lw.whole("concat", [acc, lw.plain(v)], grown, attrs={"axis": d},
                           part=None if last else named("concat"))
        return acc
    # out[..., c, r, ...] = chunk c at r
    n_chunks = len(chunks)
    eye = lw.constant(f"{lw.origin.node}.{named('select')}", np.eye(n_chunks, dtype=bool),
                      "bool")
    sizes_ax = [*shape[:d], n_chunks, g, *shape[d + 1:]]
    piece_map = [*range(d), d + 1, *range(d + 2, len(shape) + 1)]
    full_map = list(range(len(shape) + 1))
    acc: tuple[Value, list[int]] | None = None
    for c in range(n_chunks - 1, -1, -1):
        v, k = chunks[c]
        piece = lw.sliced(v, d, k * g, g)
        if acc is None:
            acc = (piece, piece_map)
            continue
        sel = squeeze(lw.sliced(eye, 0, c, 1), [0])
        out = lw.op("where", sizes_ax, full_map, [(sel, [d]), (piece, piece_map), acc],
                    part=None if part is None and c == 0 else named(f"chunk{c}"))
        acc = (out, full_map)
    assert acc is not None
    merged = view(acc[0], shape)
    assert merged is not None, "merging the chunk dim is a view"
    return merged


def pad(lw: Lowering, x: Value, pads: Sequence[tuple[int, int]], value: float,
        part: str = "pad") -> Value:
    """``x`` with ``pads[j] = (before, after)`` elements of ``value`` around its last
    ``len(pads)`` dims (both >= 0): one ``where`` op per padded dim (``_pad_blocks``), or a
    concatenation where a padding is wider than the dim.

    >>> from apportion.frontend.torch_lower import Origin
    >>> lw = Lowering("demo")
    >>> x = lw.input("x", "float32", (4, 6))
    >>> lw.at(Origin("pad_1", "aten.constant_pad_nd.default"))
    >>> y = pad(lw, x, [(1, 2)], 0.0)   # blocks [0, x, 0] of 6; y is [5, 15) of them
    >>> y.shape, str(lw.ops[0].out), str(lw.ops[0].ins[1])
    ((4, 9), 'pad_1.pad0[b0, 6*c+r]', 'x[b0, r]')
    >>> y.index[1]
    Lin(terms=((..., 1),), const=5)
    """
    first = x.rank - len(pads)
    for j, (lo, hi) in enumerate(pads):
        if lo == hi == 0:
            continue
        d = first + j
        if max(lo, hi) <= x.shape[d]:
            x = _pad_blocks(lw, x, d, lo, hi, value, f"{part}{j}")
            continue
        pieces = []
        for n in (lo, None, hi):
            if n is None:
                pieces.append(x)
            elif n > 0:
                pieces.append(filled(lw, value, x.dtype, (*x.shape[:d], n, *x.shape[d + 1:])))
        x = concat(lw, pieces, d, f"{part}{j}", PAD_CHUNKS)
    return x


def _pad_blocks(lw: Lowering, x: Value, d: int, lo: int, hi: int, value: float,
                part: str) -> Value:
    """Dim ``d`` of ``x`` (size ``n``, ``lo, hi <= n``) padded by one ``where`` op: blocks of
    ``n`` along the dim, ``[value] x [value]`` (a block only for a side that is padded), each
    element selected by its block, ``where(sel[c], x[.., r, ..], value)``, written through the
    merge ``n*c + r``; the padded value is the slice ``[n - lo, 2n + hi)`` of it, an offset in
    its readers' index maps. A read of ``x`` only by ``r`` never leaves ``x``, which is why the
    padding cannot be written at an offset: the IR's index constants are never negative.

    One divisible pass over at most three times the dim, where a concatenation takes a chain
    of selects (one per chunk of the pieces' gcd) or whole-tensor fallbacks: the small CNN of
    ``torch_cnn_demo`` is predicted 13 us on 32 Spyre cores this way, 26 us with ``concat``
    fallbacks and 89 us with chains of selects."""
    n = x.shape[d]
    blocks = [b for b, on in (("lo", lo > 0), ("x", True), ("hi", hi > 0)) if on]
    if len(x.digits[d]) > 1:  # the padded dim is read by one dim
        x = lw.plain(x)
    sel = lw.constant(f"{lw.origin.node}.{part}.select",
                      np.asarray([b == "x" for b in blocks]), "bool")
    fill = lw.scalar(value, x.dtype)
    space = Space()
    by: dict[int, Form] = {}
    out_index: list[AffineExpr] = []
    shape: list[int] = []
    digits: list[tuple[Digit, ...]] = []
    lins: list[Lin] = []
    cd = rd = None
    for j, dig in enumerate(x.digits):
        if j == d:
            cd = space.dim("c", len(blocks))
            rd = space.dim("r", n)
            out_index.append(AffineExpr(tuple((name, coeff) for name, coeff
                                              in ((cd, n), (rd, 1)) if name is not None)))
            shape.append(len(blocks) * n)
            i = fresh()
            digits.append(((i, len(blocks) * n),))
            lins.append(Lin(((i, 1),)))
            if dig:
                by[dig[0][0]] = form((rd, 1))
            continue
        ds: list[Digit] = []
        for t, (u, size) in enumerate(dig):  # one op dim per digit
            name = space.dim(f"b{j}" if len(dig) == 1 else f"b{j}_{t}", size)
            by[u] = form((name, 1))
            out_index.append(AffineExpr.dim(name))  # type: ignore[arg-type]
            shape.append(size)
            i = fresh()
            ds.append((i, size))
            lins.append(Lin(((i, 1),)))
        if not dig:
            out_index.append(AffineExpr.constant(0))
            shape.append(1)
            lins.append(Lin())
        digits.append(tuple(ds))
    name = lw.fresh_name(f"{lw.origin.node}.{part}")
    ins = (read_at(sel, [form((cd, 1))]), read_at(x, [None] * x.rank, by), Access(fill.tensor, ()))
    op = Op(name, "where", Access(name, tuple(out_index)), ins, tuple(space.dims))
    dtype = lw.add_op(op, tuple(shape))
    torch_shape = [*x.shape[:d], len(blocks) * n, *x.shape[d + 1:]]
    blocked = Value(name, dtype, tuple(torch_shape), tuple(digits), tuple(lins))
    padded = slice_dim(blocked, d, n - lo if lo else 0, n + lo + hi)
    assert padded is not None, "a dim of one digit slices"
    return padded


# --- windows ---------------------------------------------------------------------------------

def int_list(value: Any, n: int, what: str, default: int | None = None) -> list[int]:
    """A torch int-list argument for ``n`` spatial dims (one int repeats; an empty list takes
    ``default``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * n
    values = [int(v) for v in value]
    if not values and default is not None:
        return [default] * n
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise ProgramError(f"{what} {values} for {n} spatial dims")
    return values


def out_size(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """torch's pooling/convolution output size (ceil mode: a last window must start inside the
    input or its left padding)."""
    span = size + 2 * p - d * (k - 1) - 1
    if span < 0:
        raise ProgramError(f"a window of {k} (dilation {d}) is larger than the input of "
                           f"{size} padded by {p}")
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def window_pads(sizes: Sequence[int], outs: Sequence[int], ks: Sequence[int],
                ss: Sequence[int], ps: Sequence[int], ds: Sequence[int]
                ) -> list[tuple[int, int]]:
    """The padding each spatial dim's windows read: ``p`` before, and after only as far as
    the last window reaches."""
    pads = []
    for n, o, k, s, p, d in zip(sizes, outs, ks, ss, ps, ds, strict=True):
        reach = (o - 1) * s + d * (k - 1) + 1
        pads.append((p, max(0, reach - n - p)))
    return pads
