"""numpy kernels of the reference executor: dtypes, pointwise functions, reductions, fallbacks.

Every function the IR names (``POINTWISE``, ``REDUCTIONS``, ``FALLBACKS``) has one kernel here.
Kernels take arrays already converted to the compute dtype (see ``compute_dtype``) and return
arrays in it; ``to_storage`` casts a result to a tensor's dtype once, at the end.

numpy has no bfloat16, so bfloat16 tensors are stored as float32 arrays whose values are
exactly representable in bfloat16 (``round_bf16``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from apportion.errors import ExecutionError
from apportion.ir.op import FALLBACKS, POINTWISE, REDUCTIONS

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

# Operands of these dtypes are computed in float32; anything else (float32, ints) in float64,
# so float32 results stay accurate and integer sums and products stay exact below 2**53.
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
    return np.where(np.isnan(f), f, rounded).astype(np.float32, copy=False)


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


def to_storage(a: np.ndarray, dtype: str) -> np.ndarray:
    """Cast a computed array to the storage of ``dtype``.

    Floats to ints truncate toward zero (C semantics); anything to bool is ``!= 0``.

    >>> to_storage(np.array([2.7, -2.7]), "int32").tolist()
    [2, -2]
    """
    a = np.asarray(a)
    target = storage_dtype(dtype)
    if dtype == "bool":
        return a if a.dtype == np.bool_ else a != 0
    if dtype == "bfloat16":
        with np.errstate(over="ignore"):
            return round_bf16(a.astype(np.float32))
    if np.issubdtype(target, np.integer) and np.issubdtype(a.dtype, np.floating):
        with np.errstate(invalid="ignore"):
            return np.trunc(a).astype(target)
    # Overflow to inf is what the narrower dtype does; numpy's warning would only be noise.
    with np.errstate(over="ignore"):
        return a.astype(target, copy=False)


def compute_dtype(dtypes: Iterable[str]) -> type[np.floating]:
    """The float type an op with operands of ``dtypes`` computes in.

    >>> compute_dtype(["float16", "bfloat16"]).__name__, compute_dtype(["float32"]).__name__
    ('float32', 'float64')
    """
    return np.float32 if all(d in _NARROW for d in dtypes) else np.float64


# --- pointwise -----------------------------------------------------------------------------

def _sigmoid(x: np.ndarray) -> np.ndarray:
    # The tanh form never overflows, unlike 1 / (1 + exp(-x)) for very negative x.
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    # The tanh approximation (torch's gelu(approximate="tanh")), not the erf form.
    c = np.sqrt(2.0 / np.pi).astype(x.dtype)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))


#: pointwise function -> kernel over broadcastable arrays of the compute dtype
POINTWISE_KERNELS: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh, "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x * _sigmoid(x),
    "gelu": _gelu_tanh,
    "copy": np.copy, "square": np.square, "reciprocal": np.reciprocal,
}


def pointwise(fn: str, *args: np.ndarray) -> np.ndarray:
    """Apply pointwise ``fn`` with numpy broadcasting; domain errors give NaN/inf silently.

    >>> pointwise("relu", np.array([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    """
    kernel = POINTWISE_KERNELS.get(fn)
    if kernel is None:
        raise ExecutionError(f"no pointwise kernel {fn!r}; valid: {', '.join(POINTWISE_KERNELS)}")
    # Both runs see the same NaNs; numpy's warnings would only be noise here.
    with np.errstate(all="ignore"):
        return np.asarray(kernel(*args))


# --- reductions ----------------------------------------------------------------------------
# A reduction runs in two steps so that a split reduction dim can be combined across cores:
# ``reduce_partial`` over one box, ``combine_partials`` over the boxes' partials in core order,
# then ``finish`` (mean divides by the full count, argmax keeps the indices).

#: reduction -> kernel reducing the given axes to a partial (mean gives the partial sum)
REDUCE_KERNELS: dict[str, Callable[[np.ndarray, tuple[int, ...]], np.ndarray]] = {
    "sum": lambda a, ax: np.sum(a, axis=ax),
    "mean": lambda a, ax: np.sum(a, axis=ax),
    "max": lambda a, ax: np.max(a, axis=ax),
    "min": lambda a, ax: np.min(a, axis=ax),
    "prod": lambda a, ax: np.prod(a, axis=ax),
    "any": lambda a, ax: np.any(a != 0, axis=ax),
}

#: reduction -> binary combine of two partials (matmul combines with "sum")
COMBINE_KERNELS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum,
    "prod": np.multiply, "any": np.logical_or,
}

ArgPartial = tuple[np.ndarray, np.ndarray]
Partial = np.ndarray | ArgPartial


def reduce_partial(fn: str, a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Reduce ``axes`` of ``a`` with ``fn`` (not argmax), keeping no dims.

    >>> reduce_partial("mean", np.ones((2, 3)), (1,)).tolist()   # the partial sum
    [3.0, 3.0]
    """
    if fn not in REDUCE_KERNELS:
        raise ExecutionError(f"no reduction kernel {fn!r}; valid: {', '.join(REDUCE_KERNELS)}")
    with np.errstate(all="ignore"):
        return np.asarray(REDUCE_KERNELS[fn](a, axes))


def argmax_partial(a: np.ndarray, axes: tuple[int, ...], starts: Sequence[int],
                   sizes: Sequence[int]) -> ArgPartial:
    """Max values and their global flat indices over ``axes`` of a box of the reduction space.

    ``starts``/``sizes`` give, per reduced axis, where the box starts and the full dim size;
    the flat index is row-major over the full reduction dims (the plain index for one dim).

    >>> v, i = argmax_partial(np.array([[1.0, 5.0, 5.0]]), (1,), [10], [20])
    >>> v.tolist(), i.tolist()
    ([5.0], [11])
    """
    keep = [i for i in range(a.ndim) if i not in axes]
    moved = np.transpose(a, (*keep, *axes))
    red_shape = moved.shape[len(keep):]
    flat = moved.reshape(*moved.shape[:len(keep)], -1)
    local = np.argmax(flat, axis=-1)  # first maximum: ties go to the lowest index
    values = np.take_along_axis(flat, local[..., None], axis=-1)[..., 0]
    coords = np.unravel_index(local, red_shape)
    glob = np.ravel_multi_index(
        tuple(c + s for c, s in zip(coords, starts, strict=True)), tuple(sizes))
    return values, np.asarray(glob, dtype=np.int64)


def _argmax_combine(x: ArgPartial, y: ArgPartial) -> ArgPartial:
    (xv, xi), (yv, yi) = x, y
    # NaN wins like in np.argmax; equal values go to the lower global index.
    take_y = (yv > xv) | (np.isnan(yv) & ~np.isnan(xv)) | ((yv == xv) & (yi < xi))
    return np.where(take_y, yv, xv), np.where(take_y, yi, xi)


def combine_partials(fn: str, partials: Sequence[Partial]) -> Partial:
    """Combine the partials of one output slice, left to right (a fixed, deterministic order).

    >>> combine_partials("sum", [np.array([1.0]), np.array([2.0])]).tolist()
    [3.0]
    """
    if not partials:
        raise ExecutionError(f"no partials to combine for {fn!r}")
    if fn == "argmax":
        acc_arg: ArgPartial = partials[0]  # type: ignore[assignment]
        for p in partials[1:]:
            acc_arg = _argmax_combine(acc_arg, p)  # type: ignore[arg-type]
        return acc_arg
    key = "sum" if fn == "matmul" else fn
    acc: np.ndarray = partials[0]  # type: ignore[assignment]
    with np.errstate(all="ignore"):
        for p in partials[1:]:
            acc = COMBINE_KERNELS[key](acc, p)
    return acc


def finish(fn: str, partial: Partial, count: int) -> np.ndarray:
    """Turn a fully combined partial into the value: mean divides by ``count``, argmax indices.

    >>> finish("mean", np.array([6.0]), 3).tolist()
    [2.0]
    """
    if fn == "argmax":
        return partial[1]  # type: ignore[index]
    if fn == "mean":
        return partial / count  # type: ignore[operator]
    return partial  # type: ignore[return-value]


# --- fallbacks -----------------------------------------------------------------------------

#: whole-tensor function -> kernel along the last axis
FALLBACK_KERNELS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sort": lambda a: np.sort(a, axis=-1),
    "cumsum": lambda a: np.cumsum(a, axis=-1),
    "flip": lambda a: np.flip(a, axis=-1),
}


def fallback(fn: str, a: np.ndarray) -> np.ndarray:
    """Apply a fallback function along the last axis of the whole tensor ``a``.

    >>> fallback("cumsum", np.array([[1.0, 2.0, 3.0]])).tolist()
    [[1.0, 3.0, 6.0]]
    """
    kernel = FALLBACK_KERNELS.get(fn)
    if kernel is None:
        raise ExecutionError(f"no fallback kernel {fn!r}; valid: {', '.join(FALLBACK_KERNELS)}")
    with np.errstate(all="ignore"):
        return np.asarray(kernel(a))


def _check_complete() -> None:
    # Every function the IR can name must have a kernel; fail at import, not mid-run.
    missing = ({*POINTWISE} - {*POINTWISE_KERNELS}) \
        | ({*REDUCTIONS} - {*REDUCE_KERNELS, "argmax"}) | (set(FALLBACKS) - {*FALLBACK_KERNELS})
    if missing:
        raise ExecutionError(f"reference kernels missing for {sorted(missing)}")


_check_complete()
