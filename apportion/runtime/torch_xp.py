"""PyTorch under numpy's names: the array namespace the registry's formulas (``ir.kinds``,
written against numpy's names) run on when torch runs them: the torch backend's kernels and the
dtensor backend's ops on DTensors. torch is imported on first use, so importing this module
imports no torch.

>>> XP.power is XP.power   # looked up once
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _scalar_aware(both: str, one: str) -> Callable[[Any, Any], Any]:
    # numpy's maximum(a, 0) takes a number; torch's maximum wants two tensors
    def fn(a: Any, b: Any) -> Any:
        import torch

        return getattr(torch, both if isinstance(b, torch.Tensor) else one)(a, b)
    return fn


def _asarray(value: Any, dtype: Any = None) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value if dtype is None else value.to(dtype)
    if dtype is None and isinstance(value, float | int) and not isinstance(value, bool):
        dtype = torch.float64  # numpy's for a Python number
    return torch.as_tensor(value, dtype=dtype)


def _integer_safe(name: str) -> Callable[[Any, Any], Any]:
    # torch raises ZeroDivisionError for an integer division by 0, where numpy gives 0 (and
    # x // -1 is -x, wrapping at the least value, x % -1 is 0): the divisor is 1 there and the
    # result set to numpy's, as the MLIR bodies do
    def fn(a: Any, b: Any) -> Any:
        import torch

        op = getattr(torch, name)
        if not isinstance(b, torch.Tensor) or b.is_floating_point() or b.dtype == torch.bool:
            return op(a, b)
        zero, minus_one = b == 0, b == -1
        out = op(a, torch.where(zero | minus_one, torch.ones_like(b), b))
        if name == "floor_divide":
            out = torch.where(minus_one, torch.zeros_like(out) - out, out)
        return torch.where(zero, torch.zeros_like(out), out)
    return fn


_RENAMED: dict[str, Any] = {
    "floor_divide": _integer_safe("floor_divide"), "remainder": _integer_safe("remainder"),
    "equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le", "greater": "gt",
    "greater_equal": "ge", "power": "pow", "asarray": _asarray,
    "maximum": _scalar_aware("maximum", "clamp_min"),
    "minimum": _scalar_aware("minimum", "clamp_max")}


class _Torch:
    """torch under numpy's names (``equal`` is elementwise, ``maximum`` takes a number,
    ``power``, ``asarray``); torch is imported on first use."""

    def __getattr__(self, name: str) -> Any:
        import torch

        fn = _RENAMED.get(name, name)
        fn = getattr(torch, fn) if isinstance(fn, str) else fn
        setattr(self, name, fn)  # looked up once
        return fn


#: the namespace passed to the registry's formulas and reducers
XP = _Torch()


def saturate(t: Any, target: Any) -> Any:
    """A float tensor as the integer torch dtype ``target``, as ``kernels.saturate`` converts:
    truncated toward zero, clamped to the type's range, NaN to 0 (torch's own cast of a value
    out of range is undefined, as numpy's).

    >>> import torch
    >>> saturate(torch.tensor([2.7, -2.7, 300.0, -float("inf"), float("nan")]), torch.int8)
    tensor([   2,   -2,  127, -128,    0], dtype=torch.int8)
    """
    import torch

    info = torch.iinfo(target)
    edge = 2.0 ** (info.bits - 1)  # exact in float64; the max (2**n - 1) may not be
    w = torch.trunc(t.to(torch.float64))  # float16, bfloat16 and float32 are exact in float64
    over, under = w >= edge, w < -edge
    inside = w.masked_fill(over | under | torch.isnan(w), 0.0).to(target)
    return inside.masked_fill_(over, info.max).masked_fill_(under, info.min)
