"""numpy side of the reference executor: storage dtypes, and the registry's semantics run on numpy.

What each op kind computes is its registry entry's (``apportion.ir.kinds``), written against an
array namespace; ``XP`` is that namespace here: numpy, plus scipy's ``erf``. The functions below
run an entry's semantics on arrays already converted to the compute dtype (``compute_dtype``);
``to_storage`` casts a result to a tensor's dtype once, at the end.

numpy has no bfloat16, so bfloat16 tensors are stored as float32 arrays whose values are
exactly representable in bfloat16 (``round_bf16``).

Integers are exact. An op whose value operands are all integers (or bools with at least one
integer) computes in int64 with numpy's integer arithmetic when its kind defines integer
semantics (``integer_semantics``: the registry's ``OpKind.exact_integers``, which is also when
the parallel IR computes in ``i64``). int64 arithmetic wraps on
overflow (two's complement, as numpy and IREE do), and the one cast to a narrower output dtype
wraps again, which is the same as computing in that dtype for ``+ - *`` and sums. What the
integer kinds mean: ``floor_div`` and ``remainder`` are numpy's (Python's ``//`` and ``%``);
``max``/``min``/comparisons, ``abs``, ``neg``, ``sign``, ``relu``, ``square``, copies,
``where``, matmul and convolution, ``sum``/``prod``/``amax``/``amin``/``argmax`` and the
``sort``/``cumsum``/``flip`` fallbacks are exact. Kinds with no integer semantics
(``div``, ``pow``, ``exp``, ``sqrt``, ``clamp``, ...) compute integers in float64, so they are
exact only below 2**53, and the result truncates toward zero, saturating at the integer
type's range (NaN to 0: ``saturate``): ``div`` of integers is true division truncated (C's
``/``), as the parallel IR does (``sitofp``, ``divf``, a clamped ``fptosi``).
``mean`` sums exactly in int64 and divides that sum in float64.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import scipy.special

from apportion.errors import ExecutionError
from apportion.ir.kinds import INTEGERS, OpKind, Partial, Reducer

#: tensor dtype -> numpy dtype of the array that holds it (bfloat16 lives in float32)
STORAGE: dict[str, type[np.generic]] = {
    "float16": np.float16,
    "bfloat16": np.float32,
    "float32": np.float32,
    "int8": np.int8,
    "int32": np.int32,
    "int64": np.int64,
    "bool": np.bool_,
}

# Operands of these dtypes are computed in float32; floats with anything else in float64, so
# float32 results stay accurate (integers: see ``compute_dtype``).
_NARROW = frozenset({"float16", "bfloat16", "bool"})


def round_bf16(a: np.ndarray) -> np.ndarray:
    """Round to the nearest bfloat16 value (ties to even), returned as a float32 array.

    Works on the float32 bit pattern: add ``0x7FFF`` plus the lowest kept bit, clear the low
    16 bits. NaN stays NaN (the add could otherwise carry a NaN payload into infinity).

    >>> round_bf16(np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8], dtype=np.float32)).tolist()
    [1.0, 1.015625]
    """
    f = np.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    # ascontiguousarray makes a 0-d array 1-d: give the result the input's shape back
    out = np.where(np.isnan(f), f, rounded).astype(np.float32, copy=False)
    return out.reshape(np.shape(a))


def storage_dtype(dtype: str) -> type[np.generic]:
    """The numpy dtype that stores tensors of ``dtype``.

    >>> storage_dtype("bfloat16").__name__
    'float32'
    """
    try:
        return STORAGE[dtype]
    except KeyError:
        valid = ", ".join(STORAGE)
        raise ExecutionError(f"no storage for dtype {dtype!r}; valid: {valid}") from None


def saturate(a: np.ndarray, target: type[np.signedinteger]) -> np.ndarray:
    """Floats as the integer type ``target``, the program's float-to-integer conversion:
    truncated toward zero, clamped to the type's range, NaN to 0. numpy's own cast of a value
    out of range is C's undefined behaviour (it differs between CPUs and numpy builds) and
    LLVM's ``fptosi`` gives poison there; this one is defined, and every backend implements it.

    >>> saturate(np.array([2.7, -2.7, 300.0, -1e30, np.inf, np.nan]), np.int8).tolist()
    [2, -2, 127, -128, 127, 0]
    >>> saturate(np.array([2.0 ** 63, -2.0 ** 63]), np.int64).tolist()
    [9223372036854775807, -9223372036854775808]
    """
    info = np.iinfo(target)
    edge = 2.0 ** (info.bits - 1)  # exact in float64; the max (2**n - 1) may not be
    t = np.trunc(np.asarray(a, dtype=np.float64))  # float16 and float32 are exact in float64
    over, under = t >= edge, t < -edge
    inside = np.where(over | under | np.isnan(t), 0.0, t).astype(target)
    return np.where(over, info.max, np.where(under, info.min, inside)).astype(target)


def to_storage(a: np.ndarray, dtype: str) -> np.ndarray:
    """Cast a computed array to the storage of ``dtype``.

    Floats to ints saturate (``saturate``: truncated toward zero, clamped to the integer
    type's range, NaN to 0); ints to narrower ints wrap (two's complement); anything to bool
    is ``!= 0``; floats to narrower floats round to nearest (overflow to infinity).

    >>> to_storage(np.array([2.7, -2.7]), "int32").tolist()
    [2, -2]
    >>> to_storage(np.array([1e10, -np.inf, np.nan]), "int32").tolist()
    [2147483647, -2147483648, 0]
    """
    a = np.asarray(a)
    target = storage_dtype(dtype)
    if dtype == "bool":
        return a if a.dtype == np.bool_ else a != 0
    if dtype == "bfloat16":
        with np.errstate(over="ignore"):
            return round_bf16(a.astype(np.float32))
    if np.issubdtype(target, np.integer) and np.issubdtype(a.dtype, np.floating):
        return saturate(a, target)
    # Overflow to inf is what the narrower dtype does; numpy's warning would only be noise.
    with np.errstate(over="ignore"):
        return a.astype(target, copy=False)


def integer_semantics(kind: OpKind) -> bool:
    """True when ``kind`` defines its result on integers exactly (the registry's
    ``OpKind.exact_integers``; without it the kind computes integers through float64).

    >>> from apportion.ir.kinds import kind
    >>> [integer_semantics(kind(k)) for k in ("add", "sum", "matmul", "div", "exp")]
    [True, True, True, False, False]
    """
    return kind.exact_integers


def compute_dtype(dtypes: Iterable[str], kind: OpKind) -> type[np.number]:
    """The numpy type an op of ``kind`` computes in, from its *value* operands' ``dtypes``
    (condition operands are read as bools, whatever their dtype).

    float16, bfloat16 and bool operands alone compute in float32; integers (with bools) in
    int64 where the kind has integer semantics (``integer_semantics``); anything else in
    float64. The same choice as the parallel IR's compute type, but float32 operands, which
    compute in float64 here.

    >>> from apportion.ir.kinds import kind
    >>> compute_dtype(["float16", "bfloat16"], kind("add")).__name__
    'float32'
    >>> compute_dtype(["float32"], kind("add")).__name__
    'float64'
    >>> compute_dtype(["int64", "int8"], kind("add")).__name__
    'int64'
    >>> compute_dtype(["int64"], kind("div")).__name__
    'float64'
    """
    values = list(dtypes)
    if all(d in _NARROW for d in values):
        return np.float32
    if all(d in INTEGERS or d == "bool" for d in values) and integer_semantics(kind):
        return np.int64
    return np.float64


class _Numpy:
    """The array namespace the registry's semantics run on: numpy, plus ``erf``."""

    erf = staticmethod(scipy.special.erf)

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


#: the namespace passed to every registry semantics function
XP = _Numpy()


def pointwise(kind: OpKind, *args: np.ndarray, attrs: Mapping[str, str] | None = None
              ) -> np.ndarray:
    """A pointwise, layout or matmul-point kind over broadcastable arrays; domain errors give
    NaN/inf silently (both runs see the same ones).

    >>> from apportion.ir.kinds import kind
    >>> pointwise(kind("relu"), np.array([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    >>> pointwise(kind("clamp"), np.array([-1.0, 2.0]), attrs={"max": "1.0"}).tolist()
    [-1.0, 1.0]
    """
    assert kind.compute is not None, f"op kind {kind.name!r} has no pointwise semantics"
    with np.errstate(all="ignore"):
        return np.asarray(kind.compute(XP, *args, **kind.numeric_attrs(attrs or {})))


# A reduction runs in steps so that a split reduction dim can be combined across cores:
# ``reduce_partial`` over one box, ``combine_partials`` over the boxes' partials in core order,
# then ``finish`` (mean divides by the full count, argmax keeps the indices).

def reduce_partial(reducer: Reducer, a: np.ndarray, axes: tuple[int, ...],
                   starts: Sequence[int], sizes: Sequence[int]) -> Partial:
    """Reduce ``axes`` of ``a`` to a partial (``starts``/``sizes``: the box in the reduced dims).

    >>> from apportion.ir.kinds import MEAN, ARGMAX
    >>> reduce_partial(MEAN, np.ones((2, 3)), (1,), [0], [3]).tolist()   # the partial sum
    [3.0, 3.0]
    >>> v, i = reduce_partial(ARGMAX, np.array([[1.0, 5.0, 5.0]]), (1,), [10], [20])
    >>> v.tolist(), i.tolist()
    ([5.0], [11])
    """
    with np.errstate(all="ignore"):
        return reducer.partial(XP, a, axes, starts, sizes)


def combine_partials(reducer: Reducer, partials: Sequence[Partial]) -> Partial:
    """Combine the partials of one output slice, left to right (a fixed, deterministic order).

    >>> from apportion.ir.kinds import SUM
    >>> combine_partials(SUM, [np.array([1.0]), np.array([2.0])]).tolist()
    [3.0]
    """
    if not partials:
        raise ExecutionError(f"no partials to combine for {reducer.name!r}")
    acc = partials[0]
    with np.errstate(all="ignore"):
        for p in partials[1:]:
            acc = reducer.combine(XP, acc, p)
    return acc


def finish(reducer: Reducer, partial: Partial, count: int) -> np.ndarray:
    """Turn a fully combined partial into the value: mean divides by ``count``, argmax indices.

    >>> from apportion.ir.kinds import MEAN
    >>> finish(MEAN, np.array([6.0]), 3).tolist()
    [2.0]
    """
    with np.errstate(all="ignore"):
        return np.asarray(reducer.value(XP, partial, count))


def fallback(kind: OpKind, a: np.ndarray) -> np.ndarray:
    """A fallback kind along the last axis of the whole tensor ``a``.

    >>> from apportion.ir.kinds import kind
    >>> fallback(kind("cumsum"), np.array([[1.0, 2.0, 3.0]])).tolist()
    [[1.0, 3.0, 6.0]]
    """
    assert kind.compute is not None, f"op kind {kind.name!r} has no semantics"
    with np.errstate(all="ignore"):
        return np.asarray(kind.compute(XP, a))
