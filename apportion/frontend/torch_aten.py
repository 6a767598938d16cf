"""ATen lowerings of the PyTorch frontend: one function per ATen op (overload), by target name.

``LOWERINGS`` maps a node target as ``str(node.target)`` prints it (``"aten.mm.default"``) to a
function ``(cx, *args, **kwargs)`` that receives the node's arguments with every input node
replaced by its ``Value`` (torch_lower) and returns the node's value: a ``Value``, a tuple of
them, or a Python number. ``DROPPED`` are no-op asserts. What each op lowers to:

- pointwise: unary and binary kinds with torch's broadcasting and type promotion (operands are
  cast to the computing dtype by ``copy`` ops); a Python scalar operand is a rank-0 constant
  input; ``where``, comparisons, logical ops, casts (``copy`` with a dtype);
- reductions: ``sum``, ``mean``, ``amax``/``amin``, ``prod``, ``any``/``all``, ``argmax``/
  ``argmin``, ``max.dim``/``min.dim``, ``var``/``std``; ``_softmax``/``_log_softmax`` and
  ``native_layer_norm`` as reductions and pointwise ops;
- ``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``linear``, ``matmul``: matmul ops;
- layout: views, permutes, expands, slices, splits, ``repeat_interleave``: index maps only;
  ``cat``: ``where`` ops over a chunk dim, each reading one chunk (a ``concat`` fallback past
  ``CAT_CHUNKS`` chunks);
- fallbacks: ``embedding``, ``index``, ``index_select``, ``gather`` (``gather``), ``cumsum``,
  ``flip``,
  constants (``full``, ``arange``) and random numbers (``uniform``, ``normal``).

This module imports torch only inside the functions that need it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.errors import ProgramError
from apportion.frontend.torch_conv import LOWERINGS as CONV_LOWERINGS
from apportion.frontend.torch_lower import (
    Lowering,
    Value,
    broadcast_shapes,
    dim_index,
    expand,
    permute,
    slice_bounds,
    slice_dim,
    squeeze,
    unsqueeze,
    view,
)
from apportion.ir.dtypes import DTYPE_BYTES, FLOAT_DTYPES

#: most chunks ``cat`` selects among with ``where`` ops before it falls back to ``concat``
CAT_CHUNKS = 32

#: node targets that check something at export time and compute nothing
DROPPED = frozenset({
    "aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
    "aten._assert_async.default", "aten._assert_async.msg",
    "aten._functional_assert_async.msg", "aten._functional_assert_scalar.default",
    "aten.sym_constrain_range.default", "aten.sym_constrain_range_for_size.default",
})


def torch_dtype(dt: Any, what: str = "dtype") -> str:
    """An apportion dtype for a torch dtype (``torch.float32`` -> ``"float32"``)."""
    name = str(dt).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ProgramError(f"{what} {name} is not supported; apportion has "
                           f"{', '.join(DTYPE_BYTES)}")
    return name


def static_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    """A torch shape of plain ints; a symbolic size is refused."""
    if not all(isinstance(n, int) for n in shape):
        raise ProgramError(f"shape {list(shape)} has a symbolic size; symbolic sizes are not "
                           "supported yet")
    return tuple(shape)


@dataclass
class Ctx:
    """What a lowering function sees: the program being built and the node being lowered."""

    lw: Lowering
    node: Any  # torch.fx.Node

    @property
    def val(self) -> Any:
        v = self.node.meta.get("val")
        return v[0] if isinstance(v, list | tuple) else v

    def dtype(self) -> str:
        return torch_dtype(self.val.dtype, "result dtype")

    def shape(self) -> tuple[int, ...]:
        return static_shape(self.val.shape)

    def promoted(self) -> str:
        """torch's promoted dtype of the node's first two arguments (tensors or numbers): the
        dtype a comparison compares in."""
        import torch

        args = []
        for a in self.node.args[:2]:
            meta = getattr(a, "meta", None)
            if meta is not None:  # a tensor, or a zero-dim one, which promotes like a number
                v = meta["val"]
                args.append(torch.empty((0,) if v.dim() else (), dtype=v.dtype))
            else:
                args.append(a)
        return torch_dtype(torch.result_type(*args))

    def operand(self, x: Value | float | int | bool, dtype: str) -> Value:
        """A tensor operand in ``dtype``: a cast, or a rank-0 constant for a Python number."""
        if isinstance(x, Value):
            return self.lw.cast(x, dtype)
        if not isinstance(x, int | float | bool):
            raise ProgramError(f"operand {x!r} is neither a tensor nor a number")
        return self.lw.scalar(x, dtype)


Lower = Callable[..., Any]
LOWERINGS: dict[str, Lower] = {}


def aten(*names: str) -> Callable[[Lower], Lower]:
    """Register a lowering for ``aten.<name>`` targets (``"mm.default"``)."""
    def register(fn: Lower) -> Lower:
        for n in names:
            LOWERINGS[f"aten.{n}"] = fn
        return fn
    return register


def _value(x: object, what: str) -> Value:
    if not isinstance(x, Value):
        raise ProgramError(f"{what} must be a tensor, got {x!r}")
    return x


# --- pointwise ---------------------------------------------------------------------------

def _arith(fn: str) -> Lower:
    def lower(cx: Ctx, a: Any, b: Any, alpha: Any = None) -> Value:
        dt = cx.dtype()
        if alpha is not None and alpha != 1:
            b = b * alpha if not isinstance(b, Value) else \
                cx.lw.elementwise("mul", [cx.operand(b, dt), cx.operand(alpha, dt)],
                                  part="alpha")
        return cx.lw.elementwise(fn, [cx.operand(a, dt), cx.operand(b, dt)])
    return lower


for _fn, _names in {"add": ("add.Tensor", "add.Scalar"), "sub": ("sub.Tensor", "sub.Scalar"),
                    "mul": ("mul.Tensor", "mul.Scalar"),
                    "div": ("div.Tensor", "div.Scalar"),
                    "max": ("maximum.default",), "min": ("minimum.default",),
                    "pow": ("pow.Tensor_Tensor", "pow.Scalar"),
                    "remainder": ("remainder.Tensor", "remainder.Scalar"),
                    "floor_div": ("floor_divide.default",)}.items():
    aten(*_names)(_arith(_fn))


@aten("rsub.Tensor", "rsub.Scalar")
def _rsub(cx: Ctx, a: Any, b: Any, alpha: Any = 1) -> Value:
    return _arith("sub")(cx, b, a, alpha)


@aten("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(cx: Ctx, a: Any, b: Any, rounding_mode: str | None = None) -> Value:
    if rounding_mode is None:
        return _arith("div")(cx, a, b)
    if rounding_mode == "floor" and cx.dtype() not in FLOAT_DTYPES:
        return _arith("floor_div")(cx, a, b)
    raise ProgramError(f"division with rounding_mode={rounding_mode!r} of {cx.dtype()} has no "
                       "op kind (only integer floor division has)")


@aten("pow.Tensor_Scalar")
def _pow_scalar(cx: Ctx, x: Value, e: float | int) -> Value:
    dt = cx.dtype()
    x = cx.operand(x, dt)
    special = {2: "square", 0.5: "sqrt", -1: "reciprocal", -0.5: "rsqrt"}
    if e == 1:
        return x
    if e in special and (dt in FLOAT_DTYPES or e == 2):
        return cx.lw.elementwise(special[e], [x])
    return cx.lw.elementwise("pow", [x, cx.lw.scalar(e, dt)])


def _compare(fn: str) -> Lower:
    def lower(cx: Ctx, a: Any, b: Any) -> Value:
        dt = cx.promoted()
        return cx.lw.elementwise(fn, [cx.operand(a, dt), cx.operand(b, dt)])
    return lower


for _fn in ("eq", "ne", "lt", "le", "gt", "ge"):
    aten(f"{_fn}.Tensor", f"{_fn}.Scalar")(_compare(_fn))


def _truth(cx: Ctx, x: Any) -> Value:
    return x if isinstance(x, Value) else cx.lw.scalar(bool(x), "bool")


def _logical(fn: str, bitwise: bool = False) -> Lower:
    def lower(cx: Ctx, a: Any, b: Any) -> Value:
        if bitwise and any(isinstance(x, Value) and x.dtype != "bool" for x in (a, b)):
            raise ProgramError("bitwise ops on integers have no op kind (only on bool)")
        if fn == "ne":  # logical_xor: truth values that differ
            a, b = (cx.lw.cast(_truth(cx, x), "bool") for x in (a, b))
        return cx.lw.elementwise(fn, [_truth(cx, a), _truth(cx, b)])
    return lower


aten("logical_and.default")(_logical("logical_and"))
aten("logical_or.default")(_logical("logical_or"))
aten("logical_xor.default")(_logical("ne"))
aten("bitwise_and.Tensor", "bitwise_and.Scalar")(_logical("logical_and", True))
aten("bitwise_or.Tensor", "bitwise_or.Scalar")(_logical("logical_or", True))
aten("bitwise_xor.Tensor", "bitwise_xor.Scalar")(_logical("ne", True))


@aten("logical_not.default")
def _logical_not(cx: Ctx, x: Value) -> Value:
    return cx.lw.elementwise("logical_not", [x])


@aten("bitwise_not.default")
def _bitwise_not(cx: Ctx, x: Value) -> Value:
    if x.dtype != "bool":
        raise ProgramError("bitwise_not of integers has no op kind (only of bool)")
    return cx.lw.elementwise("logical_not", [x])


@aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(cx: Ctx, cond: Any, a: Any, b: Any) -> Value:
    dt = cx.dtype()
    return cx.lw.elementwise("where", [_truth(cx, cond), cx.operand(a, dt), cx.operand(b, dt)])


def _unary(fn: str) -> Lower:
    def lower(cx: Ctx, x: Value) -> Value:  # in the result's dtype (exp of an int is a float)
        return cx.lw.elementwise(fn, [cx.lw.cast(x, cx.dtype())])
    return lower


for _fn in ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "silu",
            "sin", "cos", "erf", "sign", "reciprocal"):
    aten(f"{_fn}.default")(_unary(_fn))


@aten("softplus.default")
def _softplus(cx: Ctx, x: Value, beta: float = 1, threshold: float = 20) -> Value:
    if beta != 1 or threshold != 20:
        raise ProgramError(f"softplus with beta={beta}, threshold={threshold}: the kind is "
                           "torch's default (beta 1, threshold 20)")
    return _unary("softplus")(cx, x)


@aten("gelu.default")
def _gelu(cx: Ctx, x: Value, approximate: str = "none") -> Value:
    lw, dt = cx.lw, cx.dtype()
    x = lw.cast(x, dt)
    if approximate == "tanh":
        return lw.elementwise("gelu", [x])
    # the erf form: x * 0.5 * (1 + erf(x / sqrt(2)))
    s = lw.elementwise("mul", [x, lw.scalar(math.sqrt(0.5), dt)], part="scale")
    e = lw.elementwise("erf", [s], part="erf")
    p = lw.elementwise("add", [e, lw.scalar(1.0, dt)], part="plus1")
    h = lw.elementwise("mul", [x, lw.scalar(0.5, dt)], part="half")
    return lw.elementwise("mul", [h, p])


@aten("expm1.default")
def _expm1(cx: Ctx, x: Value) -> Value:
    dt = cx.dtype()
    e = cx.lw.elementwise("exp", [cx.lw.cast(x, dt)], part="exp")
    return cx.lw.elementwise("sub", [e, cx.lw.scalar(1.0, dt)])


@aten("log1p.default")
def _log1p(cx: Ctx, x: Value) -> Value:
    dt = cx.dtype()
    p = cx.lw.elementwise("add", [cx.lw.cast(x, dt), cx.lw.scalar(1.0, dt)], part="plus1")
    return cx.lw.elementwise("log", [p])


@aten("clamp.default", "clamp_min.default", "clamp_max.default", "clamp.Tensor",
      "clamp_min.Tensor", "clamp_max.Tensor", "hardtanh.default")
def _clamp(cx: Ctx, x: Value, *bounds: Any, **kw: Any) -> Value:
    target = str(cx.node.target)
    lo, hi = (bounds + (None, None))[:2]
    lo = kw.get("min", kw.get("min_val", lo))
    hi = kw.get("max", kw.get("max_val", hi))
    if "clamp_max" in target:
        lo, hi = None, lo
    if "hardtanh" in target:
        lo, hi = (-1.0 if lo is None else lo), (1.0 if hi is None else hi)
    dt = cx.dtype()
    x = cx.lw.cast(x, dt)
    if not isinstance(lo, Value) and not isinstance(hi, Value) and all(
            b is None or math.isfinite(b) for b in (lo, hi)):
        attrs = {k: repr(float(b)) for k, b in (("min", lo), ("max", hi)) if b is not None}
        return cx.lw.elementwise("clamp", [x], attrs) if attrs else x
    if lo is not None:
        x = cx.lw.elementwise("max", [x, cx.operand(lo, dt)],
                              part=None if hi is None else "lower")
    if hi is not None:
        x = cx.lw.elementwise("min", [x, cx.operand(hi, dt)])
    return x


@aten("leaky_relu.default")
def _leaky_relu(cx: Ctx, x: Value, slope: float = 0.01) -> Value:
    lw, dt = cx.lw, cx.dtype()
    x = lw.cast(x, dt)
    pos = lw.elementwise("gt", [x, lw.scalar(0.0, dt)], part="positive")
    neg = lw.elementwise("mul", [x, lw.scalar(slope, dt)], part="slope")
    return lw.elementwise("where", [pos, x, neg])


@aten("_to_copy.default", "to.dtype", "to.dtype_layout", "type_as.default")
def _to_copy(cx: Ctx, x: Value, *args: Any, **kw: Any) -> Value:
    return cx.lw.cast(x, cx.dtype())


LOWERINGS["prims.convert_element_type.default"] = lambda cx, x, dtype: cx.lw.cast(
    x, torch_dtype(dtype))


# --- reductions ----------------------------------------------------------------------------

def _dims(dim: Any) -> list[int] | None:
    if dim is None:
        return None
    return [int(d) for d in dim] if isinstance(dim, list | tuple) else [int(dim)]


def _reduction(fn: str, cast: bool) -> Lower:
    def lower(cx: Ctx, x: Value, dim: Any = None, keepdim: bool = False,
              dtype: Any = None) -> Value:
        if cast:
            x = cx.lw.cast(x, cx.dtype())
        return cx.lw.reduce(fn, x, _dims(dim), keepdim)
    return lower


aten("sum.dim_IntList", "sum.default")(_reduction("sum", True))
aten("mean.dim", "mean.default")(_reduction("mean", True))
aten("prod.dim_int", "prod.default")(_reduction("prod", True))
aten("amax.default")(_reduction("max", False))
aten("amin.default")(_reduction("min", False))
aten("any.dim", "any.dims", "any.default")(_reduction("any", False))


@aten("all.dim", "all.dims", "all.default")
def _all(cx: Ctx, x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    n = cx.lw.elementwise("logical_not", [x], part="not")
    a = cx.lw.reduce("any", n, _dims(dim), keepdim, part="any")
    return cx.lw.elementwise("logical_not", [a])


@aten("max.default", "min.default")
def _max_all(cx: Ctx, x: Value) -> Value:
    fn = "max" if str(cx.node.target).startswith("aten.max") else "min"
    return cx.lw.reduce(fn, x, None, False)


def _arg(cx: Ctx, x: Value, dim: int | None, keepdim: bool, smallest: bool,
         part: str | None = None) -> Value:
    if smallest:  # the first minimum is the first maximum of the negation
        x = cx.lw.elementwise("neg", [x], part="neg")
    if dim is None:  # over the flattened tensor
        r = cx.lw.reduce("argmax", x, None, True, part=part)
        return r if keepdim else squeeze(r)
    return cx.lw.reduce("argmax", x, [dim], keepdim, part=part)


@aten("argmax.default", "argmin.default")
def _argmax(cx: Ctx, x: Value, dim: int | None = None, keepdim: bool = False) -> Value:
    return _arg(cx, x, dim, keepdim, "argmin" in str(cx.node.target))


@aten("max.dim", "min.dim")
def _max_dim(cx: Ctx, x: Value, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
    fn = "max" if str(cx.node.target).startswith("aten.max") else "min"
    values = cx.lw.reduce(fn, x, [dim], keepdim, part="values")
    return values, _arg(cx, x, dim, keepdim, fn == "min", part="indices")


def _var(cx: Ctx, x: Value, dim: Any, correction: float | None, keepdim: bool
         ) -> tuple[Value, Value]:
    lw, dt = cx.lw, cx.dtype()
    x = lw.cast(x, dt)
    dims = _dims(dim) or list(range(x.rank))
    n = math.prod(x.shape[dim_index(d, x.rank)] for d in dims)
    mean = lw.reduce("mean", x, dims, True, part="mean")
    xc = lw.elementwise("sub", [x, mean], part="centered")
    sq = lw.elementwise("square", [xc], part="square")
    total = lw.reduce("sum", sq, dims, keepdim, part="sumsq")
    c = 1 if correction is None else correction
    scale = 1.0 / (n - c) if n > c else math.inf  # torch: inf, or NaN for a zero sum
    var = lw.elementwise("mul", [total, lw.scalar(scale, dt)], part="var")
    return var, mean if keepdim else squeeze(mean, dims)


@aten("var.correction", "var.dim")
def _var_lower(cx: Ctx, x: Value, dim: Any = None, *args: Any, correction: Any = None,
               keepdim: bool = False, unbiased: bool | None = None) -> Value:
    if args:  # var.dim(x, dim, unbiased, keepdim)
        unbiased, keepdim = (list(args) + [keepdim])[:2]
    if unbiased is not None:
        correction = 1 if unbiased else 0
    return _var(cx, x, dim, correction, keepdim)[0]


@aten("var_mean.correction")
def _var_mean(cx: Ctx, x: Value, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple[Value, Value]:
    return _var(cx, x, dim, correction, keepdim)


@aten("std.correction")
def _std(cx: Ctx, x: Value, dim: Any = None, *, correction: Any = None,
         keepdim: bool = False) -> Value:
    var = _var(cx, x, dim, correction, keepdim)[0]
    return cx.lw.elementwise("sqrt", [var])


@aten("_softmax.default", "_log_softmax.default", "softmax.int", "log_softmax.int")
def _softmax(cx: Ctx, x: Value, dim: int, half_to_float: Any = False) -> Value:
    lw = cx.lw
    x = lw.cast(x, cx.dtype())
    m = lw.reduce("max", x, [dim], True, part="max")
    s = lw.elementwise("sub", [x, m], part="sub")
    e = lw.elementwise("exp", [s], part="exp")
    t = lw.reduce("sum", e, [dim], True, part="sum")
    if "log_softmax" in str(cx.node.target):
        lt = lw.elementwise("log", [t], part="log")
        return lw.elementwise("sub", [s, lt])
    return lw.elementwise("div", [e, t])


@aten("native_layer_norm.default")
def _layer_norm(cx: Ctx, x: Value, shape: Sequence[int], weight: Value | None,
                bias: Value | None, eps: float) -> tuple[Value, Value, Value]:
    lw, dt = cx.lw, torch_dtype(cx.node.meta["val"][0].dtype)
    x = lw.cast(x, dt)
    dims = list(range(x.rank - len(shape), x.rank))
    mean = lw.reduce("mean", x, dims, True, part="mean")
    xc = lw.elementwise("sub", [x, mean], part="centered")
    sq = lw.elementwise("square", [xc], part="square")
    var = lw.reduce("mean", sq, dims, True, part="var")
    ve = lw.elementwise("add", [var, lw.scalar(eps, dt)], part="eps")
    rstd = lw.elementwise("rsqrt", [ve], part="rstd")
    affine = weight is not None or bias is not None
    y = lw.elementwise("mul", [xc, rstd], part="norm" if affine else None)
    if weight is not None:
        y = lw.elementwise("mul", [y, weight], part="weight" if bias is not None else None)
    if bias is not None:
        y = lw.elementwise("add", [y, bias])
    return y, mean, rstd


# --- matmul ----------------------------------------------------------------------------------

def _matmul_nd(cx: Ctx, a: Value, b: Value, part: str | None = None) -> Value:
    """``a @ b`` for ranks >= 2 with broadcast batch dims."""
    batch = broadcast_shapes([a.shape[:-2], b.shape[:-2]])
    nb = len(batch)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if b.shape[-2] != k:
        raise ProgramError(f"matmul of {list(a.shape)} and {list(b.shape)}: inner sizes differ")
    sizes = [*batch, m, n, k]
    a_map = [*range(nb - (a.rank - 2), nb), nb, nb + 2]
    b_map = [*range(nb - (b.rank - 2), nb), nb + 2, nb + 1]
    return cx.lw.op("matmul", sizes, list(range(nb + 2)), [(a, a_map), (b, b_map)], part=part)


@aten("mm.default", "bmm.default")
def _mm(cx: Ctx, a: Value, b: Value) -> Value:
    return _matmul_nd(cx, a, b)


@aten("matmul.default")
def _matmul(cx: Ctx, a: Value, b: Value) -> Value:
    va = unsqueeze(a, 0) if a.rank == 1 else a
    vb = unsqueeze(b, 1) if b.rank == 1 else b
    r = _matmul_nd(cx, va, vb)
    if b.rank == 1:
        r = squeeze(r, [-1])
    if a.rank == 1:
        r = squeeze(r, [-2 if b.rank > 1 else -1])
    return r


def _scaled_sum(cx: Ctx, prod: Value, bias: Any, beta: Any, alpha: Any) -> Value:
    lw, dt = cx.lw, cx.dtype()
    if alpha != 1:
        prod = lw.elementwise("mul", [prod, lw.scalar(alpha, dt)], part="alpha")
    if beta == 0:
        return prod
    bias = cx.operand(bias, dt)
    if beta != 1:
        bias = lw.elementwise("mul", [bias, lw.scalar(beta, dt)], part="beta")
    return lw.elementwise("add", [prod, bias])


@aten("addmm.default", "baddbmm.default")
def _addmm(cx: Ctx, bias: Any, a: Value, b: Value, *, beta: Any = 1, alpha: Any = 1) -> Value:
    return _scaled_sum(cx, _matmul_nd(cx, a, b, part="mm"), bias, beta, alpha)


@aten("linear.default")
def _linear(cx: Ctx, x: Value, w: Value, b: Value | None = None) -> Value:
    r = x.rank
    sizes = [*x.shape[:-1], w.shape[0], x.shape[-1]]
    prod = cx.lw.op("matmul", sizes, list(range(r)),
                    [(x, [*range(r - 1), r]), (w, [r - 1, r])],
                    part=None if b is None else "mm")
    return prod if b is None else cx.lw.elementwise("add", [prod, b])


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
    return squeeze(x, _dims(dim))


def _slice(cx: Ctx, x: Value, dim: int, start: int, length: int, step: int = 1) -> Value:
    found = slice_dim(x, dim, start, length, step)
    if found is None:
        found = slice_dim(cx.lw.plain(x), dim, start, length, step)
    assert found is not None, "a plain value slices along any dim"
    return found


@aten("slice.Tensor", "slice_copy.Tensor")
def _slice_tensor(cx: Ctx, x: Value, dim: int = 0, start: int | None = None,
                  end: int | None = None, step: int = 1) -> Value:
    d = dim_index(dim, x.rank)
    lo, length = slice_bounds(x.shape[d], start, end, step)
    return _slice(cx, x, d, lo, length, step)


@aten("narrow.default")
def _narrow(cx: Ctx, x: Value, dim: int, start: int, length: int) -> Value:
    d = dim_index(dim, x.rank)
    lo, n = slice_bounds(x.shape[d], start, start + length if start >= 0 else start + length
                         + x.shape[d])
    return _slice(cx, x, d, lo, n)


@aten("select.int", "select_copy.int")
def _select(cx: Ctx, x: Value, dim: int, index: int) -> Value:
    d = dim_index(dim, x.rank)
    i = index + x.shape[d] if index < 0 else index
    return squeeze(_slice(cx, x, d, i, 1), [d])


def _pieces(cx: Ctx, x: Value, sizes: Sequence[int], dim: int) -> tuple[Value, ...]:
    d = dim_index(dim, x.rank)
    out, start = [], 0
    for n in sizes:
        out.append(_slice(cx, x, d, start, n))
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
    from apportion.frontend.torch_lower import fresh

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
    from apportion.frontend.torch_lower import fresh

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
    lw, dt = cx.lw, cx.dtype()
    shape = cx.shape()
    vals = [lw.cast(v, dt) for v in (_value(t, "a cat input") for t in tensors)
            if math.prod(v.shape) > 0]
    d = dim_index(dim, len(shape))
    if len(vals) == 1:
        return vals[0]
    sizes = [v.shape[d] for v in vals]
    g = math.gcd(*sizes)
    chunks = [(v, k) for v, n in zip(vals, sizes, strict=True) for k in range(n // g)]
    if len(chunks) > CAT_CHUNKS:  # one concat fallback per input after the first
        acc = lw.plain(vals[0])
        for i, v in enumerate(vals[1:]):
            last = i == len(vals) - 2
            acc = lw.whole("concat", [acc, lw.plain(v)],
                           acc.shape[:d] + (acc.shape[d] + v.shape[d],) + acc.shape[d + 1:],
                           attrs={"axis": d}, part=None if last else "concat")
        return acc
    # out[..., c, r, ...] = chunk c at r: a where per chunk but the last, selecting by a
    # constant one-hot row; each chunk is a slice of its input, read through its index map
    n_chunks = len(chunks)
    eye = lw.constant(f"{cx.node.name}.select", np.eye(n_chunks, dtype=bool), "bool")
    sizes_ax = [*shape[:d], n_chunks, g, *shape[d + 1:]]
    piece_map = [*range(d), d + 1, *range(d + 2, len(shape) + 1)]
    full_map = list(range(len(shape) + 1))
    acc = None
    for c in range(n_chunks - 1, -1, -1):
        v, k = chunks[c]
        piece = _slice(cx, v, d, k * g, g)
        if acc is None:
            acc = (piece, piece_map)
            continue
        sel = squeeze(_slice(cx, eye, 0, c, 1), [0])
        out = lw.op("where", sizes_ax, full_map, [(sel, [d]), (piece, piece_map), acc],
                    part=None if c == 0 else f"chunk{c}")
        acc = (out, full_map)
    assert acc is not None
    merged = view(acc[0], shape)
    assert merged is not None, "merging the chunk dim is a view"
    return merged


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


# --- constants and random numbers ------------------------------------------------------------

def _fill(cx: Ctx, value: float | int | bool) -> Value:
    return cx.lw.fill(cx.shape(), cx.dtype(), float(value))


aten("full.default", "full_like.default", "new_full.default")(
    lambda cx, *args, **kw: _fill(cx, args[-1] if "like" in str(cx.node.target)
                                  or "new_full" in str(cx.node.target) else args[1]))
aten("scalar_tensor.default")(lambda cx, value, **kw: _fill(cx, value))
aten("zeros.default", "zeros_like.default", "new_zeros.default", "empty.memory_format",
     "empty_like.default", "new_empty.default", "empty_strided.default", "empty.default",
     "new_empty_strided.default")(lambda cx, *args, **kw: _fill(cx, 0))
aten("ones.default", "ones_like.default", "new_ones.default")(
    lambda cx, *args, **kw: _fill(cx, 1))


@aten("arange.default", "arange.start", "arange.start_step")
def _arange(cx: Ctx, *args: Any, **kw: Any) -> Value:
    nums = [a for a in args if isinstance(a, int | float)]
    start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)
    return cx.lw.whole("arange", [], cx.shape(), cx.dtype(), {"start": start, "step": step})


@aten("rand.default", "rand_like.default", "randn.default", "randn_like.default")
def _random(cx: Ctx, *args: Any, **kw: Any) -> Value:
    fn = "normal" if "randn" in str(cx.node.target) else "uniform"
    return cx.lw.whole(fn, [], cx.shape(), cx.dtype(), {"seed": cx.lw.seed()})


@aten("bernoulli.p", "bernoulli.default")
def _bernoulli(cx: Ctx, x: Value, p: Any = None, **kw: Any) -> Value:
    lw, dt = cx.lw, cx.dtype()
    u = lw.whole("uniform", [], x.shape, "float32", {"seed": lw.seed()}, part="uniform")
    prob = lw.scalar(float(p), "float32") if p is not None else lw.cast(x, "float32")
    hit = lw.elementwise("lt", [u, prob], part=None if dt == "bool" else "lt")
    return lw.cast(hit, dt)


@aten("native_dropout.default")
def _dropout(cx: Ctx, x: Value, p: float, train: bool | None) -> tuple[Value, Value]:
    lw, dt = cx.lw, x.dtype
    if not train:
        return x, lw.whole("full", [], x.shape, "bool", {"value": 1}, part="mask")
    u = lw.whole("uniform", [], x.shape, "float32", {"seed": lw.seed()}, part="uniform")
    keep = lw.elementwise("ge", [u, lw.scalar(float(p), "float32")], part="mask")
    scaled = lw.elementwise("mul", [x, lw.scalar(1.0 / (1.0 - p), dt)], part="scale")
    return lw.elementwise("where", [keep, scaled, lw.scalar(0.0, dt)]), keep


# convolutions, batch norm, pooling and padding: lowered in their own module, one table here
LOWERINGS.update(CONV_LOWERINGS)
