"""Whole functions apportion hands to a compiler unplanned, as MLIR text: a baseline that
compiler tiles and threads by itself (``workflows.host_splitk`` times IREE's own matmul beside
the split-K plans).

>>> for line in matmul_func(1, 2, 3).splitlines()[:3]:
...     print(line)
func.func @mm(%x: tensor<1x3xf32>, %w: tensor<3x2xf32>) -> tensor<1x2xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<1x2xf32>
"""

from __future__ import annotations


def matmul_func(m: int, n: int, k: int, name: str = "mm") -> str:
    """The float32 matmul ``y[m,n] = x[m,k] @ w[k,n]`` as one function ``@name``: a plain
    ``linalg.matmul`` into a zero fill, no plan.

    >>> "linalg.matmul" in matmul_func(1, 64, 128)
    True
    """
    x, w, y = (f"tensor<{m}x{k}xf32>", f"tensor<{k}x{n}xf32>", f"tensor<{m}x{n}xf32>")
    return (f"func.func @{name}(%x: {x}, %w: {w}) -> {y} {{\n"
            f"  %zero = arith.constant 0.0 : f32\n"
            f"  %empty = tensor.empty() : {y}\n"
            f"  %init = linalg.fill ins(%zero : f32) outs(%empty : {y}) -> {y}\n"
            f"  %y = linalg.matmul ins(%x, %w : {x}, {w}) outs(%init : {y}) -> {y}\n"
            f"  return %y : {y}\n}}\n")
