"""Rank-0 tensors, all-literal indices and reductions to a scalar, planned and run (each crashed
the executor once)."""

from __future__ import annotations

import pytest

import apportion as ap
from tests.helpers import program

TILED_SCALAR = [{"ops": ["r"], "loops": [{"count": 4, "dims": ["i"]}]}]
CASES = {
    "rank-0 input broadcast": ({"s": ([], "D"), "x": ([4, 8], "D")},
                               [{"name": "m", "op": "mul", "out": "y[i,j]",
                                 "ins": ["x[i,j]", "s[]"]}], ["y"], []),
    "reduction to rank 0": ({"x": ([4, 8], "D")},
                            [{"name": "r", "op": "sum", "out": "s[]", "ins": ["x[i,j]"]}],
                            ["s"], []),
    "all indices literal": ({"x": ([4, 8], "D")},
                            [{"name": "c", "op": "copy", "out": "y[0,0]", "ins": ["x[0,0]"]}],
                            ["y"], []),
    "max to a kept scalar": ({"x": ([4, 8], "D")},
                             [{"name": "r", "op": "max", "out": "s[0,0]", "ins": ["x[i,j]"]}],
                             ["s"], []),
    "tiled reduction to rank 0": ({"x": ([64, 256], "D")},
                                  [{"name": "r", "op": "sum", "out": "s[]", "ins": ["x[i,j]"]}],
                                  ["s"], TILED_SCALAR),
    "tiled mean to a kept scalar": ({"x": ([64, 256], "D")},
                                    [{"name": "r", "op": "mean", "out": "s[0]",
                                      "ins": ["x[i,j]"]}], ["s"],
                                    [{"ops": ["r"], "loops": [{"count": 2, "dims": ["j"]}]}]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("strategy", ["balanced", "greedy"])
def test_edge_shapes_plan_and_run_like_the_unplanned_program(case, dtype, strategy):
    tensors, ops, outputs, tiling = CASES[case]
    typed = {n: (shape, dtype) for n, (shape, _) in tensors.items()}
    p = program(typed, ops, outputs, tiling=tiling)
    checks = ap.plan(p, ap.targets.spyre(cores=8), strategy).check()
    assert checks and all(c.ok for c in checks), checks
