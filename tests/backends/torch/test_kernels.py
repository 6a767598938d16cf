"""The torch backend's one kernel table: every registry kind has a kernel, each of the right
shape for its category, and a kind without one is refused in one place, naming the kind and the
backend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

torch = pytest.importorskip("torch")

import apportion as ap  # noqa: E402
from apportion.backends.torch import kernels  # noqa: E402
from apportion.backends.torch.executor import TorchExecutor  # noqa: E402
from apportion.errors import ExecutionError  # noqa: E402
from apportion.ir.kinds import KINDS, Category  # noqa: E402
from tests.helpers import program  # noqa: E402

#: how each category may run
ALLOWED = {Category.POINTWISE: {"elementwise"}, Category.LAYOUT: {"copy"},
           Category.MATMUL: {"matmul"}, Category.REDUCTION: {"reduce"},
           Category.FALLBACK: {"whole", "numpy"}}


def test_every_registry_kind_has_a_kernel_of_its_category():
    for kind in KINDS:
        k = kernels.kernel(kind)
        assert k.how in ALLOWED[kind.category], (kind.name, k)
        assert k.how in kernels.HOWS
    assert set(kernels.KERNELS) == {(k.category, k.name) for k in KINDS}


def test_whole_tensor_kernels_are_functions_and_fused_ones_replace_formulas():
    assert all(k.fn is not None for k in kernels.KERNELS.values() if k.how == "whole")
    fused = {n for (c, n), k in kernels.KERNELS.items() if k.how == "elementwise" and k.fn}
    assert fused == set(kernels.FUSED)


def test_a_kind_without_a_kernel_is_refused_naming_kind_and_backend(monkeypatch):
    monkeypatch.delitem(kernels.KERNELS, (Category.POINTWISE, "exp"))
    p = program({"x": ([8, 64], "float32")},
                [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}], ["y"])
    planned = ap.plan(p, ap.targets.spyre(cores=4))
    with pytest.raises(ExecutionError,
                       match=r"op kind 'exp' \(pointwise\) has no kernel in the torch backend"):
        TorchExecutor(planned.lowered)


def _rounded_once_case(name: str):
    """The kind's function as the executor binds it (clamp with bounds) and its arity."""
    from apportion.ir.kinds import kind

    k = kind(name)
    attrs = {"min": -1.5, "max": 0.1} if name == "clamp" else {}
    fused = kernels.kernel(k).fn
    if fused is not None:
        return (lambda *xs: fused(*xs, **attrs)), k
    return (lambda *xs: k.compute(kernels.XP, *xs, **attrs)), k


def _mixed_floats(seed: int, n: int = 4096) -> np.ndarray:
    """float32 numbers of every magnitude: normal, subnormal, huge, and zeros, infinities
    and NaN (torch's vectorized kernels take a different path than their scalar tails)."""
    rng = np.random.default_rng(seed)
    scale = rng.choice([1.0, 1e3, 1e-40, 1e37, 1e-3], n)
    x = (rng.normal(size=n) * scale).astype(np.float32)
    for value in (np.nan, np.inf, -np.inf, 0.0, -0.0):
        x[rng.integers(0, n, 8)] = value
    return x


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(kernels.ROUNDED_ONCE)),
       st.sampled_from(["float32", "float16", "bfloat16"]),
       st.one_of(st.integers(0, 2**32 - 1).map(lambda s: [_mixed_floats(s + i)
                                                           for i in range(3)]),
                 st.lists(arrays(np.float32, 64, elements=st.floats(width=32)), min_size=3,
                          max_size=3)))
def test_rounded_once_kinds_in_float32_equal_the_float64_result_rounded(name, out, xs):
    # the reference computes float32 operands in float64 and rounds once to the output's
    # dtype; the torch executor computes these kinds in float32, as eager does: the same bits
    fn, k = _rounded_once_case(name)
    out_dtype = getattr(torch, out)
    args32, args64 = [], []
    for i in range(k.arity):
        if i in k.conditions:  # read as bools
            c = torch.from_numpy(xs[i]) > 0
            args32.append(c)
            args64.append(c)
        else:
            x = torch.from_numpy(xs[i])
            args32.append(x)
            args64.append(x.double())
    want, got = fn(*args64), fn(*args32)
    if want.dtype == torch.bool:
        assert torch.equal(got, want), name
        return
    torch.testing.assert_close(got.to(out_dtype), want.to(out_dtype), rtol=0, atol=0,
                               equal_nan=True, msg=name)


def test_sqrt_is_not_rounded_once_in_float32():
    # why sqrt computes in float64: torch's float32 sqrt is off by an ulp on many numbers
    x = torch.from_numpy(np.abs(_mixed_floats(0)))
    assert "sqrt" not in kernels.ROUNDED_ONCE
    assert not torch.equal(torch.sqrt(x), torch.sqrt(x.double()).float())
