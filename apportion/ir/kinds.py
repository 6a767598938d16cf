"""The op-kind registry: everything apportion knows about an op kind, in one entry.

An entry says what category a kind is (pointwise, reduction, matmul, layout, fallback), how many
inputs it takes, what dtypes it accepts and gives, its numeric attributes, its semantics over
arrays, how partial results of a split or tiled reduction combine (identity, combine, accumulator
dtype, finish), its work per iteration point for the cost model, and whether it computes integers
exactly. What code a backend runs for a kind is the backend's own table (the iree backend's MLIR
bodies: ``mlir.bodies``); the registry holds no backend's text.
Passes, the builder, the executors and the cost model ask the entry; none compares kind names.

Semantics are written against an *array namespace* ``xp`` that the executor passes in (numpy
plus ``erf`` for the reference executor), so the IR imports no array library. What a namespace
must provide: numpy's names for the functions used below (``add``, ``where``, ``sum``,
``take_along_axis``, ...) and ``erf``.

Adding an op kind is one ``OpKind`` in ``KINDS``, its code in each backend's table (a backend
without it refuses the kind in one place, naming the kind and the backend) and its tests.

>>> kind("exp").category, kind("exp").arity
(<Category.POINTWISE: 'pointwise'>, 1)
>>> resolve("max", n_ins=1, reduces=True).reducer.identity
-inf
>>> kind("matmul").reducer.name, kind("argmax").reducer.pairs
('sum', True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from apportion.errors import ProgramError
from apportion.ir.dtypes import DTYPE_BYTES, FLOAT_DTYPES, check_dtype

ALL_DTYPES = frozenset(DTYPE_BYTES)
FLOATS = FLOAT_DTYPES
INTEGERS = frozenset({"int8", "int32", "int64"})


class Category(StrEnum):
    """What shape of computation a kind is; plans print it as the op's ``kind``."""

    POINTWISE = "pointwise"  # one output element from the same point of every input
    REDUCTION = "reduction"  # one input, combined over the dims the output does not index
    MATMUL = "matmul"  # sum over the reduction dims of a product of two inputs
    LAYOUT = "layout"  # moves elements unchanged (copies, casts, re-indexing)
    FALLBACK = "fallback"  # no iteration-space model: runs whole, on one core


Array = Any
Partial = Any  # an array, or (values, indices) for a value-index reducer




class SplitFinish(StrEnum):
    """What each device does last to its part of a reduction whose reduced dims split across
    devices, so that the parts combine by a plain elementwise reduce (``DeviceCombine``)."""

    SCALE = "scale"  # its local value times its share of the whole count: a mean, as a sum
    PACK = "pack"  # its (value, global flat index) as int64 keys ordered by value, then index


@dataclass(frozen=True)
class DeviceCombine:
    """How the parts of a reduction whose reduced dims split across devices combine there.

    Each device's part ends with ``finish`` (None: nothing to do), then waits as a partial
    ``waits_as`` (a reducer's name: its own, ``sum`` for a mean's scaled parts, ``argmax`` for
    packed keys), which a collective reduces elementwise by ``collective`` (``sum``, ``prod``,
    ``max`` or ``min``: what an all-reduce takes; ``any`` over 0/1 bytes and argmax keys by
    ``max``).

    >>> c = kind("argmax").reducer.across_devices
    >>> kind("mean").reducer.across_devices.waits_as, c.waits_as, c.collective, c.finish.value
    ('sum', 'argmax', 'max', 'pack')
    """

    waits_as: str
    collective: str
    finish: SplitFinish | None = None


@dataclass(frozen=True)
class Reducer:
    """How partial results of a reduction combine when its dim is split or tiled.

    ``partial(xp, a, axes, starts, sizes)`` reduces ``axes`` of one box of the input (``starts``
    and ``sizes``: where the box starts in each reduced dim and that dim's full size, which only
    value-index reducers need); ``combine(xp, p, q)`` merges two partials in order; ``finish(xp,
    p, count)`` turns the fully combined partial into the value (``count``: reduction points).
    ``identity`` is what a fresh accumulator holds. ``widen``: float results accumulate in
    float32, as the hardware does, so rounding happens once. ``pairs``: partials are (value,
    flat index) pairs. ``tileable``: an accumulator buffer across loop iterations can hold it.
    ``across_devices``: how its parts combine when its reduced dims split across devices
    (``DeviceCombine``; None: they do not, the reduced dims stay whole on each device).
    Every reducer combines integers exactly (in int64).
    """

    name: str
    identity: float
    partial: Callable[[Any, Array, tuple[int, ...], Sequence[int], Sequence[int]], Partial]
    combine: Callable[[Any, Partial, Partial], Partial]
    finish: Callable[[Any, Partial, int], Array] | None = None
    widen: bool = True
    pairs: bool = False
    tileable: bool = True
    across_devices: DeviceCombine | None = None

    def value(self, xp: Any, partial: Partial, count: int) -> Array:
        """The value of a fully combined partial over ``count`` reduction points."""
        return partial if self.finish is None else self.finish(xp, partial, count)

    def accumulator_dtype(self, result_dtype: str) -> str:
        """The dtype an accumulator of a ``result_dtype`` result holds.

        Float results widen to float32; an integer mean accumulates in int64, because it
        divides the whole sum (an int8 accumulator would wrap before the division; a sum or
        product wraps the same either way, so it keeps the result's dtype).

        >>> kind("sum").reducer.accumulator_dtype("float16")
        'float32'
        >>> [kind(k).reducer.accumulator_dtype("int8") for k in ("mean", "sum")]
        ['int64', 'int8']
        """
        if self.widen and result_dtype in FLOATS:
            return "float32"
        if self.finish is not None and not self.pairs and result_dtype in INTEGERS:
            return "int64"
        return result_dtype


@dataclass(frozen=True)
class OpKind:
    """One op kind (see the module docstring).

    ``result_dtype`` is a fixed dtype, or None for the dtype of the first value input (or the
    ``dtype`` attribute of a cast). ``conditions`` are input positions read as truth values (any
    dtype, non-zero is true); the other inputs are values and must have a dtype in ``accepts``.
    ``attrs`` are the numeric attributes the kind takes (at least one of them when
    ``attrs_required``). ``compute(xp, *inputs, **attrs)`` gives the result of a pointwise,
    layout or matmul point (matmul: the product its reducer sums) or, for a fallback, the
    whole result along the last axis of its input. ``builder`` names the Python builder's
    function (None: no generated one). ``work_per_point`` is the cost model's operations per
    iteration point. ``exact_integers``: integer operands compute exactly in int64 (False:
    through float64, as true division, powers, the transcendental functions and clamp's float
    bounds do); each backend's per-kind code follows it (the iree backend's bodies have an
    integer template exactly where it is True).

    ``whole`` marks a whole-tensor fallback (gathers, reshapes, constants, random numbers: the
    PyTorch frontend's kinds): ``compute(xp, *inputs, shape=..., **attrs)`` takes every input
    array as stored and the output's shape, and each access names its tensor whole. A kind with
    no inputs takes a ``dtype`` attribute (its result's; float32 without one).
    ``nonfinite_attrs``: its numeric attributes may be infinite or NaN (a fill value).
    """

    name: str
    category: Category
    arity: int
    compute: Callable[..., Array] | None = None
    reducer: Reducer | None = None
    result_dtype: str | None = None
    accepts: frozenset[str] = ALL_DTYPES
    conditions: tuple[int, ...] = ()
    attrs: tuple[str, ...] = ()
    attrs_required: bool = False
    builder: str | None = None
    work_per_point: float = 1.0
    exact_integers: bool = True
    doc: str = ""
    whole: bool = False
    nonfinite_attrs: bool = False

    # -- what the passes ask ------------------------------------------------------------------

    @property
    def divisible(self) -> bool:
        """False when the op runs whole on one core (a fallback)."""
        return self.category is not Category.FALLBACK

    @property
    def elementwise(self) -> bool:
        """True when every output element comes from the same point of every input."""
        return self.category in (Category.POINTWISE, Category.LAYOUT)

    @property
    def tileable_reduction(self) -> bool:
        """True when the op may accumulate across the iterations of a loop over its reduction."""
        return self.reducer is not None and self.reducer.tileable

    def value_inputs(self, n_ins: int) -> tuple[int, ...]:
        return tuple(i for i in range(n_ins) if i not in self.conditions)

    def out_dtype(self, in_dtypes: Sequence[str], attrs: Mapping[str, str], where: str) -> str:
        """The dtype of the result, checking the inputs' dtypes against ``accepts``."""
        for i in self.value_inputs(len(in_dtypes)):
            if in_dtypes[i] not in self.accepts:
                raise ProgramError(
                    f"{where}: {self.name} does not take {in_dtypes[i]} (input {i}); it takes "
                    f"{', '.join(sorted(self.accepts))}")
        if "dtype" in attrs:
            return check_dtype(attrs["dtype"], where)
        if self.result_dtype is not None:
            return self.result_dtype
        values = self.value_inputs(len(in_dtypes))
        return in_dtypes[values[0]] if values else "float32"

    def numeric_attrs(self, attrs: Mapping[str, str]) -> dict[str, float]:
        """The numeric attributes as floats (only those the kind takes)."""
        return {k: float(v) for k, v in attrs.items() if k in self.attrs}

    def check_attrs(self, attrs: Mapping[str, str], where: str) -> None:
        """Refuse attributes the kind does not take and numbers that are not finite (but
        where the kind takes non-finite ones)."""
        takes_dtype = self.category is Category.LAYOUT or self.arity == 0
        allowed = set(self.attrs) | ({"dtype"} if takes_dtype else set())
        for key, value in attrs.items():
            if key == "fn":
                continue  # the legacy fallback form names its kind with "fn"
            if key not in allowed:
                what = ", ".join(sorted(allowed)) or "none"
                raise ProgramError(f"{where}: {self.name} takes no attribute {key!r}; "
                                   f"attributes: {what}")
            if key in self.attrs:
                try:
                    number, parsed = float(value), True
                except ValueError:
                    number, parsed = math.nan, False
                if not (math.isfinite(number) or self.nonfinite_attrs and parsed):
                    what = "a number" if self.nonfinite_attrs else "a finite number"
                    raise ProgramError(f"{where}: attribute {key!r} of {self.name} must be "
                                       f"{what}, got {value!r}")
        if self.attrs_required and not any(k in attrs for k in self.attrs):
            raise ProgramError(f"{where}: {self.name} needs at least one of the attributes "
                               f"{', '.join(self.attrs)}")


# --- reducers --------------------------------------------------------------------------------

def _plain(reduce: Callable[[Any, Array, tuple[int, ...]], Array]
           ) -> Callable[[Any, Array, tuple[int, ...], Sequence[int], Sequence[int]], Array]:
    return lambda xp, a, axes, starts, sizes: reduce(xp, a, axes)


def _argmax_partial(xp: Any, a: Array, axes: tuple[int, ...], starts: Sequence[int],
                    sizes: Sequence[int]) -> Partial:
    """Max values and their flat indices, row-major over the full reduction dims."""
    keep = [i for i in range(a.ndim) if i not in axes]
    moved = xp.transpose(a, (*keep, *axes))
    red_shape = moved.shape[len(keep):]
    flat = moved.reshape(*moved.shape[:len(keep)], -1)
    local = xp.argmax(flat, axis=-1)  # the first maximum: ties go to the lowest index
    values = xp.take_along_axis(flat, local[..., None], axis=-1)[..., 0]
    coords = xp.unravel_index(local, red_shape)
    flat_index = xp.ravel_multi_index(
        tuple(c + s for c, s in zip(coords, starts, strict=True)), tuple(sizes))
    return values, xp.asarray(flat_index, dtype=xp.int64)


def _argmax_combine(xp: Any, p: Partial, q: Partial) -> Partial:
    (pv, pi), (qv, qi) = p, q
    # NaN wins, as in argmax; equal values go to the lower flat index
    take_q = (qv > pv) | (xp.isnan(qv) & ~xp.isnan(pv)) | ((qv == pv) & (qi < pi))
    return xp.where(take_q, qv, pv), xp.where(take_q, qi, pi)


SUM = Reducer("sum", 0.0, _plain(lambda xp, a, ax: xp.sum(a, axis=ax)),
              lambda xp, p, q: xp.add(p, q),
              across_devices=DeviceCombine("sum", "sum"))
MEAN = Reducer("mean", 0.0, _plain(lambda xp, a, ax: xp.sum(a, axis=ax)),
               lambda xp, p, q: xp.add(p, q), lambda xp, p, count: p / count,
               across_devices=DeviceCombine("sum", "sum", SplitFinish.SCALE))
MAX = Reducer("max", -math.inf, _plain(lambda xp, a, ax: xp.max(a, axis=ax)),
              lambda xp, p, q: xp.maximum(p, q),
              across_devices=DeviceCombine("max", "max"))
MIN = Reducer("min", math.inf, _plain(lambda xp, a, ax: xp.min(a, axis=ax)),
              lambda xp, p, q: xp.minimum(p, q),
              across_devices=DeviceCombine("min", "min"))
PROD = Reducer("prod", 1.0, _plain(lambda xp, a, ax: xp.prod(a, axis=ax)),
               lambda xp, p, q: xp.multiply(p, q),
               across_devices=DeviceCombine("prod", "prod"))
ANY = Reducer("any", 0.0, _plain(lambda xp, a, ax: xp.any(a != 0, axis=ax)),
              lambda xp, p, q: xp.logical_or(p, q), widen=False,
              across_devices=DeviceCombine("any", "max"))
# An accumulator buffer holds one array per tensor, not value-index pairs: argmax splits across
# cores (pairs combine in registers) but does not accumulate across loop iterations.
ARGMAX = Reducer("argmax", -math.inf, _argmax_partial, _argmax_combine,
                 lambda xp, p, count: p[1], widen=False, pairs=True, tileable=False,
                 across_devices=DeviceCombine("argmax", "max", SplitFinish.PACK))

#: reducer name -> reducer (plans name a loop's init, combine and finish steps by it)
REDUCERS: dict[str, Reducer] = {r.name: r for r in (SUM, MEAN, MAX, MIN, PROD, ANY, ARGMAX)}


# --- pointwise semantics ---------------------------------------------------------------------

def _sigmoid(xp: Any, x: Array) -> Array:
    # with e = exp(-|x|): 1 / (1 + e) from 0 up, e / (1 + e) below; never overflows, and
    # accurate relatively in both tails, where 0.5 * (1 + tanh(x / 2)) cancels (to 0 below
    # about -37 in float64, -17 in float32)
    e = xp.exp(-xp.abs(x))
    d = 1.0 + e
    return xp.where(x >= 0, 1.0 / d, e / d)


def _silu(xp: Any, x: Array) -> Array:
    # x sigmoid(x) through h = exp(-|x| / 2): x / (1 + h h) from 0 up, (x h) h / (1 + h h)
    # below, so that no factor is subnormal where the result is not (sigmoid(x) is subnormal
    # in float32 from -103 to -87, where x sigmoid(x) is still normal down to -91.8)
    h = xp.exp(-0.5 * xp.abs(x))
    d = 1.0 + h * h
    return xp.where(x >= 0, x / d, x * h * h / d)


def _gelu_tanh(xp: Any, x: Array) -> Array:
    # the tanh approximation (torch's gelu(approximate="tanh")), not the erf form:
    # 0.5 x (1 + tanh(u)) written as x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), the same
    # function without the cancellation of 1 + tanh(u) in the negative tail
    c = 2.0 * math.sqrt(2.0 / math.pi)
    return x * _sigmoid(xp, c * (x + 0.044715 * x * x * x))


def _softplus(xp: Any, x: Array) -> Array:
    # torch's softplus (beta 1, threshold 20): x itself above the threshold, where exp overflows
    return xp.where(x > 20, x, xp.log1p(xp.exp(xp.minimum(x, 20))))


def _clamp(xp: Any, x: Array, min: float | None = None, max: float | None = None) -> Array:
    out = x if min is None else xp.maximum(x, min)
    return out if max is None else xp.minimum(out, max)


def _pointwise(name: str, arity: int, compute: Callable[..., Array], doc: str,
               builder: str | None = None, **extra: Any) -> OpKind:
    return OpKind(name, Category.POINTWISE, arity, compute, builder=builder or name, doc=doc,
                  **extra)


def _reduction(reducer: Reducer, builder: str, doc: str, **extra: Any) -> OpKind:
    return OpKind(reducer.name, Category.REDUCTION, 1, None, reducer, builder=builder, doc=doc,
                  **extra)


def _fallback(name: str, compute: Callable[[Any, Array], Array], doc: str) -> OpKind:
    return OpKind(name, Category.FALLBACK, 1, compute, builder=name, doc=doc)


def _whole(name: str, arity: int, compute: Callable[..., Array], doc: str,
           **extra: Any) -> OpKind:
    return OpKind(name, Category.FALLBACK, arity, compute, doc=doc, whole=True, **extra)


def _gather(xp: Any, table: Array, ids: Array, *, shape: tuple[int, ...]) -> Array:
    # rows of the table in row-major order, a row being (output elements / index elements)
    row = math.prod(shape) // max(ids.size, 1)
    rows = xp.reshape(table, (-1, row))
    return xp.reshape(xp.take(rows, xp.reshape(ids, (-1,)), axis=0), shape)


def _arange(xp: Any, *, shape: tuple[int, ...], start: float = 0.0, step: float = 1.0) -> Array:
    return xp.reshape(start + step * xp.arange(math.prod(shape)), shape)


def _uniform(xp: Any, *, shape: tuple[int, ...], low: float = 0.0, high: float = 1.0,
             seed: float = 0.0) -> Array:
    return xp.random.default_rng(int(seed)).uniform(low, high, shape)


def _normal(xp: Any, *, shape: tuple[int, ...], mean: float = 0.0, std: float = 1.0,
            seed: float = 0.0) -> Array:
    return xp.random.default_rng(int(seed)).normal(mean, std, shape)


def _fill(xp: Any, *, value: float) -> Array:
    return xp.asarray(value)  # broadcast over the box by the executor


def _topk(xp: Any, a: Array, *, shape: tuple[int, ...]) -> Array:
    # the shape[-1] largest along the last axis, largest first (NaN first, as torch's topk)
    return xp.flip(xp.sort(a, axis=-1), axis=-1)[..., :shape[-1]]


_COMPARE = {"result_dtype": "bool"}
_LOGICAL = {"result_dtype": "bool", "conditions": (0, 1)}

#: every op kind apportion knows
KINDS: tuple[OpKind, ...] = (
    # binary arithmetic
    _pointwise("add", 2, lambda xp, a, b: xp.add(a, b), "``x + y``"),
    _pointwise("sub", 2, lambda xp, a, b: xp.subtract(a, b), "``x - y``"),
    _pointwise("mul", 2, lambda xp, a, b: xp.multiply(a, b), "``x * y``"),
    _pointwise("div", 2, lambda xp, a, b: xp.divide(a, b), "``x / y``"),
    _pointwise("max", 2, lambda xp, a, b: xp.maximum(a, b), "elementwise larger of two tensors",
               "maximum"),
    _pointwise("min", 2, lambda xp, a, b: xp.minimum(a, b), "elementwise smaller of two tensors",
               "minimum"),
    _pointwise("pow", 2, lambda xp, a, b: xp.power(a, b), "``x ** y``"),
    _pointwise("floor_div", 2, lambda xp, a, b: xp.floor_divide(a, b),
               "integer division rounding down (Python's ``//``, torch's floor_divide)",
               accepts=INTEGERS),
    _pointwise("remainder", 2, lambda xp, a, b: xp.remainder(a, b),
               "remainder with the divisor's sign (Python's ``%``, torch's remainder)",
               accepts=INTEGERS),
    # comparisons and logic: bool results
    _pointwise("eq", 2, lambda xp, a, b: xp.equal(a, b), "``x == y``", **_COMPARE),
    _pointwise("ne", 2, lambda xp, a, b: xp.not_equal(a, b), "``x != y``", **_COMPARE),
    _pointwise("lt", 2, lambda xp, a, b: xp.less(a, b), "``x < y``", **_COMPARE),
    _pointwise("le", 2, lambda xp, a, b: xp.less_equal(a, b), "``x <= y``", **_COMPARE),
    _pointwise("gt", 2, lambda xp, a, b: xp.greater(a, b), "``x > y``", **_COMPARE),
    _pointwise("ge", 2, lambda xp, a, b: xp.greater_equal(a, b), "``x >= y``", **_COMPARE),
    _pointwise("logical_and", 2, lambda xp, a, b: xp.logical_and(a != 0, b != 0),
               "both non-zero", **_LOGICAL),
    _pointwise("logical_or", 2, lambda xp, a, b: xp.logical_or(a != 0, b != 0),
               "either non-zero", **_LOGICAL),
    _pointwise("logical_not", 1, lambda xp, a: a == 0, "zero", result_dtype="bool",
               conditions=(0,)),
    _pointwise("where", 3, lambda xp, c, a, b: xp.where(c != 0, a, b),
               "``x`` where ``cond`` is non-zero, else ``y``: ``ap.where(cond, x, y)``",
               conditions=(0,)),
    # unary
    _pointwise("neg", 1, lambda xp, a: xp.negative(a), "``-x``"),
    _pointwise("abs", 1, lambda xp, a: xp.abs(a), "``|x|``"),
    _pointwise("exp", 1, lambda xp, a: xp.exp(a), "``e**x``"),
    _pointwise("log", 1, lambda xp, a: xp.log(a), "natural log"),
    _pointwise("sqrt", 1, lambda xp, a: xp.sqrt(a), "square root"),
    _pointwise("rsqrt", 1, lambda xp, a: 1.0 / xp.sqrt(a), "``1 / sqrt(x)``"),
    _pointwise("tanh", 1, lambda xp, a: xp.tanh(a), "hyperbolic tangent"),
    _pointwise("sigmoid", 1, _sigmoid, "logistic sigmoid"),
    _pointwise("relu", 1, lambda xp, a: xp.maximum(a, 0), "``max(x, 0)``"),
    _pointwise("silu", 1, _silu, "``x * sigmoid(x)``"),
    _pointwise("gelu", 1, _gelu_tanh, "GELU, tanh approximation"),
    _pointwise("square", 1, lambda xp, a: xp.square(a), "``x * x``"),
    _pointwise("reciprocal", 1, lambda xp, a: xp.reciprocal(a), "``1 / x``"),
    _pointwise("sin", 1, lambda xp, a: xp.sin(a), "sine (rotary embeddings)", accepts=FLOATS),
    _pointwise("cos", 1, lambda xp, a: xp.cos(a), "cosine (rotary embeddings)", accepts=FLOATS),
    _pointwise("erf", 1, lambda xp, a: xp.erf(a), "the error function", accepts=FLOATS),
    _pointwise("sign", 1, lambda xp, a: xp.sign(a), "-1, 0 or 1 by the sign of ``x``"),
    _pointwise("softplus", 1, _softplus, "``log(1 + e**x)`` (torch's, threshold 20)",
               accepts=FLOATS),
    _pointwise("clamp", 1, _clamp, "``x`` limited to ``[min, max]``: ``ap.clamp(x, min=0.0)``",
               attrs=("min", "max"), attrs_required=True),
    # layout
    OpKind("copy", Category.LAYOUT, 1, lambda xp, a: a, doc="a copy, cast to ``dtype`` if given"),
    # contraction
    OpKind("matmul", Category.MATMUL, 2, lambda xp, a, b: xp.multiply(a, b), SUM,
           work_per_point=2.0, doc="sum over the reduction dims of ``x * w``"),
    # reductions
    _reduction(SUM, "sum", "sum over ``dim``"),
    _reduction(MEAN, "mean", "mean over ``dim``"),
    _reduction(MAX, "amax", "maximum over ``dim``"),
    _reduction(MIN, "amin", "minimum over ``dim``"),
    _reduction(PROD, "prod", "product over ``dim``"),
    _reduction(ANY, "any", "true where any element over ``dim`` is non-zero",
               result_dtype="bool", conditions=(0,)),
    _reduction(ARGMAX, "argmax", "index (int64) of the first maximum over ``dim``",
               result_dtype="int64"),
    # whole-tensor functions along the last axis
    _fallback("sort", lambda xp, a: xp.sort(a, axis=-1), "sorted along the last axis"),
    _fallback("cumsum", lambda xp, a: xp.cumsum(a, axis=-1),
              "running sum along the last axis"),
    _fallback("flip", lambda xp, a: xp.flip(a, axis=-1), "reversed along the last axis"),
    # whole-tensor functions of the PyTorch frontend (no builder function)
    _whole("gather", 2, _gather,
           "``table[ids]``: rows of the table (row-major, a row being output elements / index "
           "elements) picked by the integer ``ids``; embeddings and index gathers"),
    _whole("reshape", 1, lambda xp, a, *, shape: xp.reshape(a, shape),
           "the input's elements in row-major order, in the output's shape"),
    _whole("concat", 2,
           lambda xp, a, b, *, shape, axis: xp.concatenate([a, b], axis=int(axis)),
           "``a`` then ``b`` along ``axis``", attrs=("axis",), attrs_required=True),
    _whole("full", 0, lambda xp, *, shape, value: xp.full(shape, value),
           "a constant: every element ``value`` (in ``dtype``)", attrs=("value",),
           attrs_required=True, nonfinite_attrs=True),
    _whole("arange", 0, _arange,
           "``start + step * i`` over the elements in row-major order (in ``dtype``)",
           attrs=("start", "step")),
    _whole("uniform", 0, _uniform,
           "random numbers uniform in [``low``, ``high``) from numpy's generator at ``seed``",
           attrs=("low", "high", "seed")),
    _whole("normal", 0, _normal,
           "normal random numbers (``mean``, ``std``) from numpy's generator at ``seed``",
           attrs=("mean", "std", "seed")),
)

#: constants, convolution, pooling, top-k and re-layout; builder functions ``ap.fill``,
#: ``ap.conv``, ``ap.max_pool``, ``ap.avg_pool``, ``ap.topk`` (``frontend/builder_ops.py``: their
#: structure is in their accesses, not in a generated elementwise function)
KINDS += (
    OpKind("fill", Category.POINTWISE, 0, _fill, attrs=("value",), attrs_required=True,
           doc="a constant over its iteration space: every element ``value`` (in ``dtype``); "
               "divided over cores and tiled like any pointwise op (``full`` runs whole)"),
    OpKind("conv", Category.MATMUL, 2, lambda xp, a, b: xp.multiply(a, b), SUM,
           work_per_point=2.0,
           doc="convolution: the sum over the window and the input channels of "
               "``x[o+k, c] * w[k, c, f]`` (a matmul whose input index is a sum of dims)"),
    OpKind("max_pool", Category.REDUCTION, 1, None, MAX,
           doc="max pooling: the maximum over the window of ``x[s*o+k, c]``"),
    OpKind("avg_pool", Category.REDUCTION, 1, None, MEAN,
           doc="average pooling: the mean over the window of ``x[s*o+k, c]``"),
    _whole("topk", 1, _topk,
           "the k largest along the last axis, largest first (k: the output's last axis); a "
           "fallback: whole, on one core"),
    OpKind("relayout", Category.LAYOUT, 1, lambda xp, a: a,
           doc="a copy of a tensor laid out with another stick dim (its innermost axis): "
               "inserted by the planner where an op reads a tensor transposed"),
)

# integers through float64: true division, powers, the transcendental functions, clamp's float
# bounds; and the whole-tensor kinds, which compute on their inputs as stored
_THROUGH_FLOAT = frozenset({"div", "pow", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu",
                            "gelu", "reciprocal", "sin", "cos", "erf", "softplus", "clamp"})
KINDS = tuple(dataclasses.replace(k, exact_integers=False)
              if k.name in _THROUGH_FLOAT and k.category is Category.POINTWISE or k.whole else k
              for k in KINDS)

_BY_NAME: dict[str, tuple[OpKind, ...]] = {}
for _k in KINDS:
    _BY_NAME[_k.name] = (*_BY_NAME.get(_k.name, ()), _k)
# the program format's older spelling of a fallback: "op": "fallback", "fn": "sort"
FALLBACK_OP = "fallback"


def names() -> tuple[str, ...]:
    """Every op name a program may use, sorted."""
    return tuple(sorted({*_BY_NAME, FALLBACK_OP}))


def kind(name: str, category: Category | None = None) -> OpKind:
    """The kind called ``name`` (of ``category`` where a name has two, like ``max``)."""
    found = _BY_NAME.get(name, ())
    if category is not None:
        found = tuple(k for k in found if k.category is category)
    if not found:
        raise ProgramError(f"unknown op {name!r}; valid: {', '.join(names())}")
    return found[0]


def resolve(name: str, n_ins: int, reduces: bool, fn: str | None = None) -> OpKind:
    """The kind an op means: ``max``/``min`` are pointwise with two inputs and reductions with
    one input and reduction dims; ``fallback`` takes its kind from ``fn``."""
    if name == FALLBACK_OP:
        fallbacks = sorted(k.name for k in KINDS if k.category is Category.FALLBACK)
        if fn is None or fn not in _BY_NAME or kind(fn).category is not Category.FALLBACK:
            raise ProgramError(f"fallback needs \"fn\" naming one of {', '.join(fallbacks)}")
        return kind(fn)
    found = _BY_NAME.get(name)
    if found is None:
        raise ProgramError(f"unknown op {name!r}; valid: {', '.join(names())}")
    if len(found) == 1:
        return found[0]
    want = Category.REDUCTION if n_ins == 1 and reduces else Category.POINTWISE
    return kind(name, want)


def builder_kinds() -> tuple[OpKind, ...]:
    """The kinds the Python builder makes a function for."""
    return tuple(k for k in KINDS if k.builder is not None)


@dataclass(frozen=True)
class _Check:
    """Registry consistency, checked at import: one builder name per kind, valid dtypes."""

    kinds: tuple[OpKind, ...] = field(default=KINDS)

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for k in self.kinds:
            if k.builder is not None:
                if k.builder in seen:
                    raise ProgramError(f"op kinds {seen[k.builder]!r} and {k.name!r} share the "
                                       f"builder name {k.builder!r}")
                seen[k.builder] = k.name
            if k.result_dtype is not None:
                check_dtype(k.result_dtype, f"op kind {k.name!r}")
            if (k.reducer is None) != (k.category not in (Category.REDUCTION, Category.MATMUL)):
                raise ProgramError(f"op kind {k.name!r}: reductions and matmul need a reducer, "
                                   "others none")


_Check()
