"""The unplanned baselines of ``apportion.mlir.kernels``: valid MLIR that computes what it says."""

import numpy as np
import pytest

from apportion.mlir import upstream
from apportion.mlir.kernels import matmul_func

needs_mlir = pytest.mark.skipif(not upstream.available(), reason=upstream.MISSING)


def test_matmul_func_names_its_shapes_and_function():
    text = matmul_func(2, 3, 5, name="base")
    assert text.startswith("func.func @base(%x: tensor<2x5xf32>, %w: tensor<5x3xf32>) "
                           "-> tensor<2x3xf32> {")
    assert "linalg.matmul ins(%x, %w : tensor<2x5xf32>, tensor<5x3xf32>)" in text


@needs_mlir
def test_matmul_func_verifies_and_computes_x_times_w_under_upstream_mlir():
    text = matmul_func(2, 3, 5)
    upstream.verify_upstream(text)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    (y,) = upstream.run_function(text, "mm", [x, w], [((2, 3), "float32")])
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
