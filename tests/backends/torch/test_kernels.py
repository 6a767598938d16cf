"""The torch backend's one kernel table: every registry kind has a kernel, each of the right
shape for its category, and a kind without one is refused in one place, naming the kind and the
backend."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

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
        TorchExecutor(planned.program, planned.plan)
