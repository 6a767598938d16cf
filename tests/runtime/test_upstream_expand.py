"""A reshape with two run-time sizes in one group, which upstream MLIR 22.1's
expand-strided-metadata asserts on, said as a cast: the gpu target's split of a run-time K runs
through upstream's lowerings."""

from __future__ import annotations

from pathlib import Path

import pytest

import apportion as ap
from apportion.mlir import upstream
from apportion.mlir.upstream import expand_as_cast

pytestmark = pytest.mark.skipif(not upstream.available(),
                                reason="needs the mlir extra (upstream MLIR 22)")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_group_of_one_run_time_size_is_left_to_upstream():
    line = ("  %v = memref.expand_shape %x [[0], [1, 2]] output_shape [4, %s, 8] : "
            "memref<4x?xf32> into memref<4x?x8xf32>")
    assert expand_as_cast(line) == line + "\n"


def test_the_cast_has_the_row_major_strides_of_the_expanded_sizes():
    line = ("  %v = memref.expand_shape %x [[0, 1], [2, 3]] output_shape [%a, %b, %c, 32] : "
            "memref<?x?xf32> into memref<?x?x?x32xf32>")
    out = expand_as_cast(line)
    # strides: b*c*32, c*32, 32, 1
    assert "strides: [%v_stride0, %v_stride1, 32, 1]" in out
    assert "%v_stride1 = arith.muli %c, %c32_v : index" in out
    assert "%v_stride0 = arith.muli %b, %v_stride1 : index" in out
    upstream.verify_upstream(
        "func.func @f(%x: memref<?x?xf32>, %a: index, %b: index, %c: index) {\n"
        f"{out}  return\n}}\n")


@pytest.mark.parametrize("k", [4096, 3000])
def test_a_run_time_k_split_for_the_gpu_runs_on_openmp_as_the_reference(k):
    from apportion.backends.openmp.run import openmp_run
    from tests.helpers import checked

    planned = ap.plan(ap.load(EXAMPLES / "dynamic_k.json"), ap.targets.gpu(cores=8))
    checks, _ = checked(planned, lambda s, xs: openmp_run(s, xs, 2), params={"K": k})
    assert all(c.ok for c in checks), checks
