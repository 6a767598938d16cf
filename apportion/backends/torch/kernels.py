"""The torch backend's kernels: the one table of how each op kind of the registry runs in torch.

``KERNELS`` maps every op kind (``ir.kinds``, keyed by category and name: ``max`` is both a
pointwise and a reduction kind) to a ``Kernel``: how it runs (``HOWS``) and, where it is not the
registry's own formula, the torch function:

- ``copy``: copies and casts, one ``copy_``;
- ``elementwise``: the registry's formula on the torch namespace ``XP``, or one fused torch
  kernel where the formula would take several (``silu``, ``sigmoid``, ...; same math);
- ``matmul``: ``torch.matmul`` or ``torch.einsum`` over the operands' views (the executor picks);
- ``reduce``: a torch partial per box (``reduce``), combined with the kind's reducer on ``XP``;
- ``whole``: a whole-tensor fallback in torch (inputs as stored, the output's shape);
- ``numpy``: through the reference executor (sorts, scans, top-k, and random numbers, whose
  numbers are numpy's generator's).

A kind the table lacks is refused in one place, ``kernel(kind)``, with an ExecutionError naming
the kind and the backend.

>>> from apportion.ir.kinds import kind
>>> kernel(kind("silu")).how, kernel(kind("gather")).how, kernel(kind("sort")).how
('elementwise', 'whole', 'numpy')
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from apportion.errors import ExecutionError
from apportion.ir.kinds import KINDS, Category, OpKind, Partial, Reducer
from apportion.limits import cite
from apportion.runtime.torch_xp import XP as XP

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the optional extra .[torch]; the executor says so
    torch = None  # type: ignore[assignment]
    F = None  # type: ignore[assignment]

BACKEND = "torch"
HOWS = ("copy", "elementwise", "matmul", "reduce", "whole", "numpy")


def require_torch() -> None:
    if torch is None:
        raise ExecutionError("the torch executor needs PyTorch: pip install 'apportion[torch]' "
                             f"{cite('needs-pytorch')}")


# --- the array namespace: torch under numpy's names (``runtime.torch_xp``) ------------------


def _clamp(a: Any, min: float | None = None, max: float | None = None) -> Any:
    return torch.clamp(a, min=min, max=max)


#: kinds whose registry formula takes several torch kernels: one fused kernel, same math (not
#: gelu: F.gelu's tanh form cancels in the negative tail, where the registry's x * sigmoid(2u)
#: does not; it runs the registry's formula). F.silu in float32 (float16 and bfloat16 inputs)
#: gives -0.0 from -91.9 to -88.7 (exp(-x) overflows) where the registry's is below 3e-37,
#: within the comparison's tolerance
FUSED: dict[str, Callable[..., Any]] = {
    "silu": lambda a: F.silu(a),
    "sigmoid": lambda a: torch.sigmoid(a),
    "relu": lambda a: torch.relu(a),
    "rsqrt": lambda a: torch.rsqrt(a),
    "softplus": lambda a: F.softplus(a, beta=1.0, threshold=20.0),
    "clamp": _clamp,
}


def _pow(a: Any, b: Any) -> Any:
    """``a ** b``; an exponent that is one number (a view repeating one element: a scalar
    operand) is passed as a number, so that torch takes its power of a scalar (x * x * x for
    3: the float64 power within an ulp, against a general power per element)."""
    if b.numel() and not any(b.stride()) and b.is_floating_point():
        return torch.pow(a, float(b.as_strided((), ())))
    return torch.pow(a, b)


#: kinds whose registry formula is one torch function once condition operands are bools (the
#: executor reads them as bools): that function, called directly (the same kernel, without the
#: formula's Python around it; ``logical_and(a != 0, b != 0)`` is ``logical_and(a, b)``)
DIRECT: dict[str, str] = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "max": "maximum",
    "min": "minimum",
    "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
    "logical_and": "logical_and", "logical_or": "logical_or", "logical_not": "logical_not",
    "where": "where", "neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "tanh": "tanh", "square": "square", "reciprocal": "reciprocal", "sin": "sin", "cos": "cos",
    "erf": "erf", "sign": "sign",
}


def direct(name: str) -> Callable[..., Any] | None:
    """The torch function that computes pointwise kind ``name`` directly (``DIRECT``, and
    ``pow``'s ``_pow``), or None.

    >>> direct("add") is torch.add, direct("silu")
    (True, None)
    """
    if name == "pow":
        return _pow
    if name in ("floor_div", "remainder"):  # numpy's at a divisor of 0 (torch's raises)
        return XP.floor_divide if name == "floor_div" else XP.remainder
    return getattr(torch, DIRECT[name]) if name in DIRECT else None


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


def reduce(reducer: Reducer, x: Any, axes: tuple[int, ...], starts: Sequence[int],
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
        flat = _flat(x, axes)
        return torch.any(flat if flat.dtype == torch.bool else flat != 0, dim=-1)
    raise ExecutionError(f"reducer {name!r} has no partial in the torch backend")



# --- whole-tensor fallbacks ---------------------------------------------------------------

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
WHOLE: dict[str, Callable[..., Any]] = {
    "gather": _gather,
    "reshape": lambda a, *, shape: a.reshape(shape).clone(),
    "concat": lambda a, b, *, shape, axis: torch.cat(
        [a, b.to(torch.promote_types(a.dtype, b.dtype))]
        if a.dtype != b.dtype else [a, b], dim=int(axis)),
    "full": lambda *, shape, value: torch.full(shape, value, dtype=torch.float64),
    "arange": _arange,
}


# --- the table ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kernel:
    """How the torch backend runs one op kind: ``how`` (one of ``HOWS``) and ``fn``, the torch
    function of a fused elementwise kind or of a whole-tensor fallback (None: the registry's
    formula, or nothing to call)."""

    how: str
    fn: Callable[..., Any] | None = None


_P, _L, _M, _R, _F = (Category.POINTWISE, Category.LAYOUT, Category.MATMUL,
                      Category.REDUCTION, Category.FALLBACK)

#: pointwise kinds run as the registry's formula on ``XP``
_FORMULA = ("add", "sub", "mul", "div", "max", "min", "pow", "floor_div", "remainder", "eq",
            "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "where",
            "neg", "abs", "exp", "log", "sqrt", "tanh", "square", "reciprocal", "sin", "cos",
            "erf", "sign", "fill", "gelu")
#: reductions with a torch partial (``reduce``), by kind
_REDUCTIONS = ("sum", "mean", "avg_pool", "max", "max_pool", "min", "prod", "any", "argmax")
#: pointwise kinds whose float32 result is the reference's exactly: one correctly rounded IEEE
#: operation (or a selection or comparison, which rounds nothing), so computing it in float32,
#: as eager PyTorch does, gives the float64 result rounded once to float32; and rounding that
#: to float16 or bfloat16 gives the float64 result rounded once to them too (a format of p bits
#: holds a double rounding to one of q bits harmless where p >= 2q + 2). The transcendental
#: kinds (exp, tanh, pow, rsqrt's two roundings, ...) are not: their float32 results are
#: within an ulp of the float64 ones, and chains of them drift apart. Nor is sqrt: torch's
#: vectorized float32 sqrt is not correctly rounded (1 in 6 normal numbers differ by an ulp)
ROUNDED_ONCE = frozenset({
    "add", "sub", "mul", "div", "max", "min", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_not", "where", "neg", "abs", "relu", "square",
    "reciprocal", "sign", "clamp",
})

#: fallbacks run through the reference executor
_NUMPY = ("sort", "cumsum", "flip", "topk", "uniform", "normal")

#: of those, the scans along the last axis torch runs with numpy's numbers where they compute
#: in float64 or int64 (torch's cumsum adds in order there, as numpy's does; in float32 it adds
#: in float64, so a float16 or bfloat16 cumsum stays with the reference): the whole stored input
#: in, its result read through the input's access, as the reference does
SCANS: dict[str, Callable[[Any], Any]] = {
    "cumsum": lambda x: torch.cumsum(x, dim=-1),
    "flip": lambda x: torch.flip(x, dims=(-1,)),
}

#: (category, kind name) -> its kernel
KERNELS: dict[tuple[Category, str], Kernel] = {
    **{(_P, n): Kernel("elementwise") for n in _FORMULA},
    **{(_P, n): Kernel("elementwise", fn) for n, fn in FUSED.items()},
    **{(_L, n): Kernel("copy") for n in ("copy", "relayout")},
    **{(_M, n): Kernel("matmul") for n in ("matmul", "conv")},
    **{(_R, n): Kernel("reduce") for n in _REDUCTIONS},
    **{(_F, n): Kernel("whole", fn) for n, fn in WHOLE.items()},
    **{(_F, n): Kernel("numpy") for n in _NUMPY},
}

# a name the registry does not know would never match: refuse it when the table is read
_unknown = set(KERNELS) - {(k.category, k.name) for k in KINDS}
if _unknown:
    raise ExecutionError(f"torch kernels for kinds the registry lacks: {sorted(_unknown)}")


def kernel(kind: OpKind) -> Kernel:
    """The torch kernel of op ``kind``; an ExecutionError naming the kind and the backend when
    the table has none.

    >>> from apportion.ir.kinds import kind
    >>> kernel(kind("matmul"))
    Kernel(how='matmul', fn=None)
    """
    found = KERNELS.get((kind.category, kind.name))
    if found is None:
        raise ExecutionError(f"op kind {kind.name!r} ({kind.category}) has no kernel in the "
                             f"{BACKEND} backend")
    return found
