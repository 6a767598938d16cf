"""A split-K select chain of more slices than the gpu target's blocks (128 slices on 8 and 32
cores) built into CUDA builds, one per run-time K, that match the unplanned program when run
on an NVIDIA GPU (each block a run-time range of slices)."""

from __future__ import annotations

import ctypes.util

import pytest

from apportion.backends.cuda.build import build, check_build, run_build
from apportion.mlir import upstream
from tests.split_k_chains import SIZES, planned

pytestmark = pytest.mark.skipif(not upstream.available(),
                                reason="needs the mlir extra (upstream MLIR 22)")


def _has_gpu() -> bool:
    return ctypes.util.find_library("cuda") is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs an NVIDIA GPU and driver")
@pytest.mark.parametrize("threads", [1, 128])
@pytest.mark.parametrize("cores", [8, 32])
def test_a_chain_of_more_slices_than_blocks_runs_on_the_gpu_at_each_size(tmp_path, cores,
                                                                          threads):
    p = planned("gpu", cores)
    assert max(p.plan.op("mm.partial").split_k.select.factors) == 128 > cores
    for k in SIZES:
        b = build(p.schedule({"K": k}), tmp_path / f"k{k}", threads=threads)
        run_build(b.path, tmp_path / f"out{k}")
        checks = check_build(b.path, tmp_path / f"out{k}")
        assert checks and all(c.ok for c in checks), (k, checks)
