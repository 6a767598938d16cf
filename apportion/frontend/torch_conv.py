"""ATen lowerings of convolutional models: convolutions, batch norm in eval, pooling, padding.

``LOWERINGS`` here has the form of ``torch_aten.LOWERINGS`` (target name -> function of the
node's context and arguments) and ``torch_aten`` merges it into its own table: this module
imports nothing of ``torch_aten``, so the frontend's modules stay free of import cycles. Windows
are read through index sums and padding is made of ``where`` ops (``torch_windows``: one per
padded dim, only the padding a window reads). What each op lowers to:

- ``convolution`` (1-D, 2-D and more spatial dims; stride, padding, dilation, groups, bias): one
  ``conv`` op, a matmul over index sums ``x[n, Cg*g+c, s*o+d*k] * w[Fg*g+f, c, k]`` whose output
  is written ``[n, g, f, o]`` (the channel ``Fg*g+f`` as two digits, so the group and the filter
  within it split over cores like any output dim) and whose reduction is the input channels of
  the group times the kernel window; the bias is a broadcast ``add``;
- ``constant_pad_nd``: a slice for a negative pad, ``torch_windows.pad`` for the rest;
- ``_native_batch_norm_legit_no_training`` / ``batch_norm`` in eval: the running statistics,
  weight and bias folded into a per-channel ``scale = weight * rsqrt(var + eps)`` and
  ``shift = bias - mean * scale`` (as torch's CPU kernel folds them: two constants computed at
  lowering when the statistics are the model's buffers, else small pointwise ops over the
  channels), then ``x * scale + shift``;
- ``max_pool*`` (padding with -inf, dilation, ceil mode): one ``max_pool`` op over the window;
  the indices, only where a node reads them, an ``argmax`` over the window turned into the flat
  index in the input's spatial dims by integer pointwise ops;
- ``avg_pool*``: one ``avg_pool`` op where every window divides by the kernel size, else a
  ``sum`` over the window divided by torch's per-position count (``count_include_pad``,
  ``ceil_mode`` windows clipped at the padded input, ``divisor_override``);
- ``_adaptive_avg_pool*``: an ``avg_pool`` op where the output size divides the input size;
  otherwise, per uneven axis, the outputs ``q*P + r`` of one residue ``r`` have windows of one
  length at a fixed stride, so each residue is one ``avg_pool`` op and the residues are
  interleaved by ``where`` ops (exact torch windows ``[floor(o*L/O), ceil((o+1)*L/O))``).

>>> import apportion as ap, torch                                     # doctest: +SKIP
>>> conv = torch.nn.Conv2d(3, 8, 3, padding=1).eval()                # doctest: +SKIP
>>> tp = ap.from_torch(conv, (torch.randn(1, 3, 8, 8),))              # doctest: +SKIP
>>> [op.fn for op in tp.program.ops]                                 # doctest: +SKIP
['where', 'where', 'conv', 'add']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from apportion.errors import ProgramError
from apportion.frontend.torch_lower import (
    Lowering,
    Value,
    expand,
    permute,
    squeeze,
    unsqueeze,
    view,
)
from apportion.frontend.torch_table import Ctx, Lower, registrar
from apportion.frontend.torch_windows import (
    Form,
    Space,
    concat,
    emit,
    form,
    int_list,
    out_size,
    pad,
    read_at,
    single_digits,
    window_pads,
)
from apportion.ir.dtypes import FLOAT_DTYPES

#: target name (``"aten.convolution.default"``) -> lowering, merged into ``torch_aten``'s table
LOWERINGS: dict[str, Lower] = {}
aten = registrar(LOWERINGS)


# --- convolution -------------------------------------------------------------------------------

@aten("convolution.default", "_convolution.default")
def _convolution(cx: Ctx, x: Value, w: Value, bias: Value | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int, *rest: Any) -> Value:
    if transposed:
        raise ProgramError("transposed convolution (conv_transpose) has no lowering: its input "
                           "index is a quotient of the output's, not an affine form")
    pairs = [(p, p) for p in int_list(padding, w.rank - 2, "padding")]
    return conv_nd(cx, x, w, bias, stride, pairs, dilation, groups)


@aten("conv1d.default", "conv2d.default", "conv3d.default", "conv1d.padding",
      "conv2d.padding", "conv3d.padding")
def _conv_nd(cx: Ctx, x: Value, w: Value, bias: Value | None = None, stride: Any = 1,
             padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Value:
    n = w.rank - 2
    dil = int_list(dilation, n, "dilation")
    pairs: list[tuple[int, int]]
    if padding == "valid":
        pairs = [(0, 0)] * n
    elif padding == "same":  # torch puts the odd element of the padding after
        totals = [d * (k - 1) for d, k in zip(dil, w.shape[2:], strict=True)]
        pairs = [(t // 2, t - t // 2) for t in totals]
    elif isinstance(padding, str):
        raise ProgramError(f"convolution padding {padding!r}: torch takes 'valid' or 'same'")
    else:
        pairs = [(p, p) for p in int_list(padding, n, "padding")]
    unbatched = x.rank == n + 1
    out = conv_nd(cx, unsqueeze(x, 0) if unbatched else x, w, bias, stride, pairs, dil, groups)
    return squeeze(out, [0]) if unbatched else out


def conv_nd(cx: Ctx, x: Value, w: Value, bias: Value | None, stride: Any,
            padding: Sequence[tuple[int, int]], dilation: Any, groups: int) -> Value:
    """``aten.convolution`` of ``x [N, C, *spatial]`` by ``w [F, C/groups, *window]`` with
    ``padding[i] = (before, after)`` around spatial dim ``i``: one ``conv`` op (see the module
    docstring), plus an ``add`` for the bias.

    >>> import apportion as ap, torch                                 # doctest: +SKIP
    >>> conv = torch.nn.Conv1d(4, 8, 3, stride=2).eval()              # doctest: +SKIP
    >>> tp = ap.from_torch(conv, (torch.randn(1, 4, 16),))            # doctest: +SKIP
    >>> op = tp.program.ops[0]                                        # doctest: +SKIP
    >>> str(op.out), [str(a) for a in op.ins]                         # doctest: +SKIP
    ('convolution.conv[0, 0, f, o0]', ['input[0, c, 2*o0+k0]', 'p_weight[f, c, k0]'])
    """
    lw = cx.lw
    n = w.rank - 2
    where = f"convolution of x {list(x.shape)} by weight {list(w.shape)}"
    if n < 1 or x.rank != n + 2:
        raise ProgramError(f"{where}: takes x [N, C, *spatial] and weight [F, C/groups, "
                           "*window] with one window dim per spatial dim")
    ss = int_list(stride, n, "stride")
    ds = int_list(dilation, n, "dilation")
    if min(ss) < 1 or min(ds) < 1 or min(min(p) for p in padding) < 0:
        raise ProgramError(f"{where}: stride {ss} and dilation {ds} must be >= 1, padding "
                           f"{list(padding)} >= 0")
    big_n, c_in, spatial = x.shape[0], x.shape[1], x.shape[2:]
    f_out, c_group, window = w.shape[0], w.shape[1], w.shape[2:]
    if groups < 1 or c_in % groups or f_out % groups or c_in // groups != c_group:
        raise ProgramError(f"{where}: {groups} groups need input channels {c_in} = groups x "
                           f"weight dim 1 ({c_group}) and output channels {f_out} divisible by "
                           "the groups")
    outs = []
    for i in range(n):
        span = spatial[i] + sum(padding[i]) - ds[i] * (window[i] - 1) - 1
        if span < 0:
            raise ProgramError(f"{where}: window {window[i]} (dilation {ds[i]}) of spatial dim "
                               f"{i} is larger than the input {spatial[i]} padded by "
                               f"{padding[i]}")
        outs.append(span // ss[i] + 1)
    pads = window_pads(spatial, outs, window, ss, [lo for lo, _ in padding], ds)
    dt = cx.dtype()
    xp = pad(lw, lw.cast(x, dt), pads, 0.0)
    by_group = [big_n, groups, c_group, *xp.shape[2:]]
    xv = single_digits(lw, view(xp, by_group) or view(lw.plain(xp), by_group))
    wv = single_digits(lw, view(lw.cast(w, dt), [groups, f_out // groups, c_group, *window]))
    space = Space()
    nd = space.dim("n", big_n)
    gd = space.dim("g", groups)
    fd = space.dim("f", f_out // groups)
    od = [space.dim(f"o{i}", outs[i]) for i in range(n)]
    cd = space.dim("c", c_group)
    kd = [space.dim(f"k{i}", window[i]) for i in range(n)]
    x_forms: list[Form | None] = [form((nd, 1)), form((gd, 1)), form((cd, 1))]
    x_forms += [form((od[i], ss[i]), (kd[i], ds[i])) for i in range(n)]
    w_forms: list[Form | None] = [form((gd, 1)), form((fd, 1)), form((cd, 1))]
    w_forms += [form((kd[i], 1)) for i in range(n)]
    out = [(nd, big_n), (gd, groups), (fd, f_out // groups),
           *((od[i], outs[i]) for i in range(n))]
    y = emit(lw, "conv", space, out, [1, 2, *([1] * n)],
             [read_at(xv, x_forms), read_at(wv, w_forms)], part=None if bias is None else "conv")
    if bias is None:
        return y
    b = lw.cast(bias, dt)
    for _ in range(n):
        b = unsqueeze(b, -1)
    return lw.elementwise("add", [y, b])


# --- batch norm (eval) -------------------------------------------------------------------------

def _batch_norm_eval(cx: Ctx, x: Value, weight: Value | None, bias: Value | None,
                     mean: Value, var: Value, eps: float) -> Value:
    """``x * scale + shift`` per channel (dim 1), ``scale = weight * rsqrt(var + eps)``,
    ``shift = bias - mean * scale`` in the statistics' dtype: two constants when the statistics,
    weight and bias are (a model's buffers and parameters), else small ops over the channels."""
    lw = cx.lw
    if x.rank < 2:
        raise ProgramError(f"batch norm of x {list(x.shape)}: needs [N, C, ...]")
    st = var.dtype if var.dtype in FLOAT_DTYPES else "float32"
    folded = _folded_scale_shift(lw, weight, bias, mean, var, eps, st)
    if folded is not None:
        scale, shift = folded
    else:
        var_e = lw.elementwise("add", [lw.cast(var, st), lw.scalar(float(eps), st)],
                               part="var_eps")
        scale = lw.elementwise("rsqrt", [var_e], part="invstd")
        if weight is not None:
            scale = lw.elementwise("mul", [scale, lw.cast(weight, st)], part="scale")
        moved = lw.elementwise("mul", [lw.cast(mean, st), scale], part="mean_scale")
        shift = (lw.elementwise("sub", [lw.cast(bias, st), moved], part="shift")
                 if bias is not None else lw.elementwise("neg", [moved], part="shift"))
    for _ in range(x.rank - 2):
        scale, shift = unsqueeze(scale, -1), unsqueeze(shift, -1)
    out = cx.dtype()
    y = lw.elementwise("mul", [lw.cast(x, st), scale], part="scaled")
    y = lw.elementwise("add", [y, shift], part=None if st == out else "shifted")
    return lw.cast(y, out)


def _folded_scale_shift(lw: Lowering, weight: Value | None, bias: Value | None, mean: Value,
                        var: Value, eps: float, dtype: str) -> tuple[Value, Value] | None:
    """The scale and shift as constants, computed in float32 the way torch's CPU kernel does
    (``invstd = 1 / sqrt(var + eps)``, ``alpha = invstd * weight``, ``beta = bias - mean *
    alpha``), when every operand is a constant the lowering holds whole; None otherwise."""
    vals = {}
    for key, v in (("weight", weight), ("bias", bias), ("mean", mean), ("var", var)):
        if v is None:
            continue
        if v.tensor not in lw.constants or not lw.is_plain(v):
            return None
        vals[key] = np.asarray(lw.constants[v.tensor], dtype=np.float32)
    f32 = np.float32
    scale = f32(1) / np.sqrt(vals["var"] + f32(eps))
    if "weight" in vals:
        scale = scale * vals["weight"]
    shift = -(vals["mean"] * scale)
    if "bias" in vals:
        shift = vals["bias"] - vals["mean"] * scale
    node = lw.origin.node
    return (lw.constant(f"{node}.scale", scale, dtype),
            lw.constant(f"{node}.shift", shift, dtype))


class _FirstOnly(tuple):  # type: ignore[type-arg]
    """A node's results of which only the first is lowered: reading another is refused."""

    what: str = ""

    def __getitem__(self, i: Any) -> Any:
        if i != 0:
            raise ProgramError(f"result {i} of {self.what} is not lowered (only the first is)")
        return super().__getitem__(i)


def _first_only(v: Value, what: str) -> _FirstOnly:
    out = _FirstOnly((v,))
    out.what = what
    return out


@aten("_native_batch_norm_legit_no_training.default")
def _bn_no_training(cx: Ctx, x: Value, weight: Value | None, bias: Value | None,
                    mean: Value, var: Value, momentum: float, eps: float) -> _FirstOnly:
    return _first_only(_batch_norm_eval(cx, x, weight, bias, mean, var, eps),
                       "batch norm (the saved mean and rstd of training)")


@aten("native_batch_norm.default", "_native_batch_norm_legit.default")
def _native_bn(cx: Ctx, x: Value, weight: Value | None, bias: Value | None,
               mean: Value | None, var: Value | None, training: bool, momentum: float,
               eps: float) -> _FirstOnly:
    if training or mean is None or var is None:
        raise ProgramError("batch norm in training mode (statistics of the batch, updated "
                           "running stats) is not lowered; export the model in eval mode")
    return _bn_no_training(cx, x, weight, bias, mean, var, momentum, eps)


@aten("batch_norm.default")
def _batch_norm(cx: Ctx, x: Value, weight: Value | None, bias: Value | None,
                mean: Value | None, var: Value | None, training: bool, momentum: float,
                eps: float, cudnn_enabled: bool = False) -> Value:
    return _native_bn(cx, x, weight, bias, mean, var, training, momentum, eps)[0]


# --- pooling -----------------------------------------------------------------------------------

def _pool_args(x: Value, n: int, kernel: Any, stride: Any, padding: Any, dilation: Any,
               ceil_mode: bool, what: str) -> tuple[list[int], ...]:
    if x.rank < n + 1:
        raise ProgramError(f"{what} of x {list(x.shape)}: needs at least {n + 1} dims")
    ks = int_list(kernel, n, "kernel")
    ss = int_list(stride, n, "stride", default=0) if stride is not None else [0] * n
    ss = [s or k for s, k in zip(ss, ks, strict=True)]  # no stride: the kernel's
    ps = int_list(padding, n, "padding")
    ds = int_list(dilation, n, "dilation")
    if any(p * 2 > k for p, k in zip(ps, ks, strict=True)):
        raise ProgramError(f"{what}: padding {ps} must be at most half the kernel {ks}")
    spatial = x.shape[-n:]
    outs = [out_size(spatial[i], ks[i], ss[i], ps[i], ds[i], ceil_mode) for i in range(n)]
    return ks, ss, ps, ds, outs


def _window_op(cx: Ctx, fn: str, x: Value, ks: Sequence[int], ss: Sequence[int],
               ds: Sequence[int], outs: Sequence[int], offsets: Sequence[int] | None = None,
               part: str | None = None) -> Value:
    """An op of kind ``fn`` over the windows of the last ``len(ks)`` dims of ``x`` (already
    padded): ``y[.., o] = fn over k of x[.., s*o + d*k + offset]``; a window of one element
    is a ``copy``."""
    lw = cx.lw
    n = len(ks)
    lead = x.rank - n
    if any(len(dg) > 1 for dg in x.digits[lead:]):  # a windowed dim is read through a sum
        x = lw.plain(x)
    space = Space()
    by: dict[int, Form] = {}
    out: list[tuple[str | None, int]] = []
    groups: list[int] = []
    for j, digits in enumerate(x.digits[:lead]):  # a dim per digit: no copy of merged dims
        for t, (u, size) in enumerate(digits):
            name = space.dim(f"b{j}" if len(digits) == 1 else f"b{j}_{t}", size)
            by[u] = form((name, 1))
            out.append((name, size))
        if not digits:
            out.append((None, 1))
        groups.append(max(len(digits), 1))
    od = [space.dim(f"o{i}", outs[i]) for i in range(n)]
    kd = [space.dim(f"k{i}", ks[i]) for i in range(n)]
    offs = offsets or [0] * n
    forms: list[Form | None] = [None] * lead
    forms += [form((od[i], ss[i]), (kd[i], ds[i]), const=offs[i]) for i in range(n)]
    out += [(od[i], outs[i]) for i in range(n)]
    kind = fn if any(k is not None for k in kd) else "copy"
    return emit(lw, kind, space, out, [*groups, *([1] * n)], [read_at(x, forms, by)], part)


def _max_pool(cx: Ctx, n: int, x: Value, kernel: Any, stride: Any = None, padding: Any = 0,
              dilation: Any = 1, ceil_mode: bool = False) -> tuple[Value, Callable[[], Value]]:
    """The values of a max pooling, and a function making its indices (``_argmax_indices``)
    from the same padded input."""
    ks, ss, ps, ds, outs = _pool_args(x, n, kernel, stride, padding, dilation, ceil_mode,
                                      f"max_pool{n}d")
    low = -math.inf if x.dtype in FLOAT_DTYPES else float(np.iinfo(x.dtype).min)
    x_p = pad(cx.lw, x, window_pads(x.shape[-n:], outs, ks, ss, ps, ds), low)
    values = _window_op(cx, "max_pool", x_p, ks, ss, ds, outs)
    origin = cx.lw.origin

    def indices() -> Value:
        at = cx.lw.origin  # made when a later node reads them: the ops are the pooling's
        cx.lw.at(origin)
        try:
            return _argmax_indices(cx, x_p, x.shape[-n:], ks, ss, ps, ds, outs)
        finally:
            cx.lw.at(at)

    return values, indices


@aten("max_pool1d.default", "max_pool2d.default", "max_pool3d.default")
def _max_pool_values(cx: Ctx, x: Value, kernel: Any, stride: Any = None, padding: Any = 0,
                     dilation: Any = 1, ceil_mode: bool = False) -> Value:
    n = int(str(cx.node.target).split("max_pool")[1][0])
    return _max_pool(cx, n, x, kernel, stride, padding, dilation, ceil_mode)[0]


@aten("max_pool1d_with_indices.default", "max_pool2d_with_indices.default",
      "max_pool3d_with_indices.default")
def _max_pool_indices(cx: Ctx, x: Value, kernel: Any, stride: Any = None, padding: Any = 0,
                      dilation: Any = 1, ceil_mode: bool = False) -> _Lazy:
    n = int(str(cx.node.target).split("max_pool")[1][0])
    return _Lazy(*_max_pool(cx, n, x, kernel, stride, padding, dilation, ceil_mode))


class _Lazy(tuple):  # type: ignore[type-arg]
    """A node's (values, indices) whose indices are lowered only when a node reads them."""

    def __new__(cls, values: Value, indices: Callable[[], Value]) -> _Lazy:
        out = super().__new__(cls, (values,))
        out.indices = indices  # type: ignore[attr-defined]
        out.made = None  # type: ignore[attr-defined]
        return out

    def __getitem__(self, i: Any) -> Any:
        if i == 1:
            if self.made is None:  # type: ignore[attr-defined]
                self.made = self.indices()  # type: ignore[attr-defined]
            return self.made  # type: ignore[attr-defined]
        return super().__getitem__(i)


def _argmax_indices(cx: Ctx, x_p: Value, spatial: Sequence[int], ks: Sequence[int],
                    ss: Sequence[int], ps: Sequence[int], ds: Sequence[int],
                    outs: Sequence[int]) -> Value:
    """torch's indices of a max pooling of ``x_p`` (its input padded): the flat index of each
    window's first maximum in the input's ``spatial`` dims (``h * W + w``). An ``argmax`` over
    the window gives the position in the window (row-major over its dims); each window dim's
    offset is taken from it by integer division and remainder, and the flat index is a
    constant per output position (where its window starts) plus the offsets times the
    dilation and the input's strides. Ties go to the first maximum, as torch's; two cases
    differ from torch's CPU kernel: a window with several NaN (torch: the last, here the first)
    and a padded window whose input elements are all -inf (torch: its first input element,
    here the padding before it)."""
    lw = cx.lw
    n = len(ks)
    strides = [math.prod(spatial[i + 1:]) for i in range(n)]
    grids = np.meshgrid(*(np.arange(o) for o in outs), indexing="ij")
    base = sum((ss[i] * grids[i] - ps[i]) * strides[i] for i in range(n))
    flat = lw.constant(f"{lw.origin.node}.start", np.asarray(base, dtype=np.int64), "int64")
    present = [i for i in range(n) if ks[i] > 1]
    if not present:  # windows of one element: where each starts
        return expand(flat, [*x_p.shape[:-n], *outs])
    pos = _window_op(cx, "argmax", x_p, ks, ss, ds, outs, part="argmax")
    inner = 1
    for i in reversed(present):  # the window position's digits, innermost first
        k = pos
        if inner > 1:
            k = lw.elementwise("floor_div", [k, lw.scalar(inner, "int64")], part=f"k{i}.div")
        if i != present[0]:
            k = lw.elementwise("remainder", [k, lw.scalar(ks[i], "int64")], part=f"k{i}.mod")
        if ds[i] * strides[i] != 1:
            k = lw.elementwise("mul", [k, lw.scalar(ds[i] * strides[i], "int64")],
                               part=f"k{i}.scale")
        flat = lw.elementwise("add", [k, flat],
                              part="indices" if i == present[0] else f"indices.k{i}")
        inner *= ks[i]
    return flat


def _avg_divisors(size: int, out: int, k: int, s: int, p: int, include_pad: bool
                  ) -> list[int]:
    """torch's per-output count along one dim: the window clipped at the padded input, and
    with ``count_include_pad=False`` at the input itself."""
    counts = []
    for o in range(out):
        lo = o * s - p
        hi = min(lo + k, size + p)
        if not include_pad:
            lo, hi = max(lo, 0), min(hi, size)
        counts.append(hi - lo)
    return counts


@aten("avg_pool1d.default", "avg_pool2d.default", "avg_pool3d.default")
def _avg_pool(cx: Ctx, x: Value, kernel: Any, stride: Any = None, padding: Any = 0,
              ceil_mode: bool = False, count_include_pad: bool = True,
              divisor_override: int | None = None) -> Value:
    lw = cx.lw
    n = int(str(cx.node.target).split("avg_pool")[1][0])
    ks, ss, ps, ds, outs = _pool_args(x, n, kernel, stride, padding, 1, ceil_mode,
                                      f"avg_pool{n}d")
    dt = cx.dtype()
    xp = pad(lw, lw.cast(x, dt), window_pads(x.shape[-n:], outs, ks, ss, ps, ds), 0.0)
    per_dim = [_avg_divisors(x.shape[-n + i], outs[i], ks[i], ss[i], ps[i], count_include_pad)
               for i in range(n)]
    counts = np.ones(outs, dtype=np.int64) * (divisor_override or 1)
    if divisor_override is None:
        for i, c in enumerate(per_dim):
            counts = counts * np.asarray(c).reshape([-1 if j == i else 1 for j in range(n)])
    if (counts == math.prod(ks)).all():  # every window divides by the kernel size: a mean
        return _window_op(cx, "avg_pool", xp, ks, ss, ds, outs)
    total = _window_op(cx, "sum", xp, ks, ss, ds, outs, part="sum")
    if (counts == counts.flat[0]).all():
        return lw.elementwise("div", [total, lw.scalar(float(counts.flat[0]), dt)])
    divisor = lw.constant(f"{cx.node.name}.count", counts.astype(np.float64), dt)
    return lw.elementwise("div", [total, divisor])


def _adaptive_axis(cx: Ctx, x: Value, d: int, size_out: int, last: bool) -> Value:
    """Adaptive average pooling of dim ``d`` to ``size_out``: torch's windows
    ``[floor(o*L/O), ceil((o+1)*L/O))``. With ``g = gcd(L, O)`` and ``P = O/g``, the outputs
    ``q*P + r`` of one residue ``r`` start at ``q*(L/g) + floor(r*L/O)`` with one length: one
    ``avg_pool`` op per residue, interleaved by ``concat`` along a new inner dim."""
    lw = cx.lw
    size = x.shape[d]
    if size == 1:  # every window is the one element: a broadcast, no op
        return expand(x, [*x.shape[:d], size_out, *x.shape[d + 1:]])
    g = math.gcd(size, size_out)
    period, step = size_out // g, size // g
    moved = [*range(d), *range(d + 1, x.rank), d]  # the pooled dim last
    xl = permute(x, moved)
    pieces = []
    for r in range(period):
        lo = r * size // size_out
        hi = -(-(r + 1) * size // size_out)
        part = None if period == 1 and last else \
            f"adaptive{d}" + (f".r{r}" if period > 1 else "")
        y = _window_op(cx, "avg_pool", xl, [hi - lo], [step], [1], [g], [lo], part=part)
        back = permute(y, [moved.index(j) for j in range(x.rank)])
        pieces.append(unsqueeze(back, d + 1))
    if period == 1:
        return squeeze(pieces[0], [d + 1])
    stacked = concat(lw, pieces, d + 1, f"adaptive{d}.interleave")
    merged = view(stacked, [*x.shape[:d], size_out, *x.shape[d + 1:]])
    assert merged is not None, "merging the residue dim is a view"
    return merged


@aten("_adaptive_avg_pool1d.default", "_adaptive_avg_pool2d.default",
      "_adaptive_avg_pool3d.default", "adaptive_avg_pool1d.default",
      "adaptive_avg_pool2d.default", "adaptive_avg_pool3d.default")
def _adaptive_avg_pool(cx: Ctx, x: Value, output_size: Any) -> Value:
    target = str(cx.node.target)
    n = int(target.split("avg_pool")[1][0])
    if x.rank < n + 1:
        raise ProgramError(f"adaptive_avg_pool{n}d of x {list(x.shape)}: needs at least "
                           f"{n + 1} dims")
    sizes = x.shape[-n:]
    outs = [s if o is None else int(o) for o, s in
            zip(_maybe_none(output_size, n), sizes, strict=True)]
    if min(outs) < 1:
        raise ProgramError(f"adaptive_avg_pool{n}d: output size {outs} must be positive")
    x = cx.lw.cast(x, cx.dtype())
    if all(s % o == 0 for s, o in zip(sizes, outs, strict=True)):  # even windows: one op
        ks = [s // o for s, o in zip(sizes, outs, strict=True)]
        if ks == [1] * n:
            return x
        return _window_op(cx, "avg_pool", x, ks, ks, [1] * n, outs)
    todo = [i for i in range(n) if sizes[i] != outs[i]]
    for i in todo:
        x = _adaptive_axis(cx, x, x.rank - n + i, outs[i], last=i == todo[-1])
    return x


def _maybe_none(value: Any, n: int) -> list[int | None]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * n
    values = list(value)
    return values * n if len(values) == 1 else values


# --- padding -----------------------------------------------------------------------------------

@aten("constant_pad_nd.default")
def _constant_pad(cx: Ctx, x: Value, pads: Sequence[int], value: float = 0) -> Value:
    """torch's ``F.pad`` (constant mode): ``pads`` pairs from the last dim backwards; a negative
    pad cuts (a slice)."""
    if len(pads) % 2 or len(pads) // 2 > x.rank:
        raise ProgramError(f"constant_pad_nd: pads {list(pads)} must be pairs, at most one per "
                           f"dim of x {list(x.shape)}")
    k = len(pads) // 2
    pairs = [(int(pads[2 * (k - 1 - j)]), int(pads[2 * (k - 1 - j) + 1])) for j in range(k)]
    for j, (lo, hi) in enumerate(pairs):  # cut first: negative pads
        d = x.rank - k + j
        start, end = max(0, -lo), x.shape[d] - max(0, -hi)
        if end <= start:
            raise ProgramError(f"constant_pad_nd: pads {list(pads)} leave dim {d} empty")
        if (start, end) != (0, x.shape[d]):
            x = cx.lw.sliced(x, d, start, end - start)
    dt = cx.dtype()
    return pad(cx.lw, cx.lw.cast(x, dt), [(max(lo, 0), max(hi, 0)) for lo, hi in pairs],
               float(value))
