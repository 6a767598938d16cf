"""ATen lowerings of the PyTorch frontend: one function per ATen op (overload), by target name.

``LOWERINGS`` maps a node target as ``str(node.target)`` prints it (``"aten.mm.default"``) to a
function ``(cx, *args, **kwargs)`` that receives the node's arguments with every input node
replaced by its ``Value`` (torch_lower) and returns the node's value: a ``Value``, a tuple of
them, or a Python number (``torch_table``: ``Ctx``, ``registrar``; ``DROPPED`` are the no-op
asserts). It is the one table: the lowerings here, and those of ``torch_layout`` (views,
slices, concatenation, gathers), ``torch_conv`` (convolutional models) and ``torch_moe``
(``topk``, ``scatter``) merged into it. What the ops here lower to:

- pointwise: unary and binary kinds with torch's broadcasting and type promotion (operands are
  cast to the computing dtype by ``copy`` ops); a Python scalar operand is a rank-0 constant
  input; ``where``, comparisons, logical ops, casts (``copy`` with a dtype);
- reductions: ``sum``, ``mean``, ``amax``/``amin``, ``prod``, ``any``/``all``, ``argmax``/
  ``argmin``, ``max.dim``/``min.dim``, ``var``/``std``; ``_softmax``/``_log_softmax`` and
  ``native_layer_norm`` as reductions and pointwise ops;
- ``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``linear``, ``matmul``: matmul ops;
- constants (``full``, ``arange``: fallbacks, or planned ``fill`` ops) and random numbers
  (``uniform``, ``normal``).

This module imports torch only inside the functions that need it.

>>> LOWERINGS["aten.mm.default"].__name__, LOWERINGS["aten.cat.default"].__name__
('_mm', '_cat')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from apportion.errors import ProgramError
from apportion.frontend.torch_conv import LOWERINGS as CONV_LOWERINGS
from apportion.frontend.torch_layout import LOWERINGS as LAYOUT_LOWERINGS
from apportion.frontend.torch_lower import (
    Value,
    broadcast_shapes,
    dim_index,
    squeeze,
    unsqueeze,
)
from apportion.frontend.torch_moe import LOWERINGS as MOE_LOWERINGS
from apportion.frontend.torch_table import Ctx, Lower, dim_list, registrar, torch_dtype
from apportion.ir.dtypes import FLOAT_DTYPES

#: target name -> lowering: every lowering of the frontend
LOWERINGS: dict[str, Lower] = {}
aten = registrar(LOWERINGS)


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

def _reduction(fn: str, cast: bool) -> Lower:
    def lower(cx: Ctx, x: Value, dim: Any = None, keepdim: bool = False,
              dtype: Any = None) -> Value:
        if cast:
            x = cx.lw.cast(x, cx.dtype())
        return cx.lw.reduce(fn, x, dim_list(dim), keepdim)
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
    a = cx.lw.reduce("any", n, dim_list(dim), keepdim, part="any")
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
    dims = dim_list(dim) or list(range(x.rank))
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


# views, slices, concatenation and gathers; convolutions, batch norm, pooling and padding;
# top-k and scatter: in their own modules, one table here
LOWERINGS.update(LAYOUT_LOWERINGS)
LOWERINGS.update(CONV_LOWERINGS)
LOWERINGS.update(MOE_LOWERINGS)
