"""Tests of the split-K resolvers' rules (IREE's GPU heuristic, tables)."""

from __future__ import annotations

import pytest

from apportion.errors import TargetError
from apportion.target.split_k import ReductionShape, TableRow, gpu_slices, table_slices


@pytest.mark.parametrize(("m", "n", "k", "slices"), [
    (32, 32, 40960, 128),      # tiny output: up to 128 slices, tiles of 320
    (128, 128, 32768, 64),     # output up to 128 x 128: 64
    (128, 256, 131072, 32),    # up to 256 x 256: 32
    (1, 4096, 14336, 128),     # 4096 outputs count as 64 x 64: 128 slices of 112
    (1, 6144, 4096, 64),       # small K but K / sqrt(MN) = 52 >= 48
    (768, 768, 65536, 8),      # large output: at most 8
    (32, 4096, 14336, None),   # K < 18000 and K / sqrt(MN) = 40 < 48: no split
    (4096, 4096, 8192, None),  # output over 2048 x 4096: no split
    (16, 16, 2 * 10**7, 2000),  # K > 1e7: up to 2048 slices; the tile must divide K
])
def test_gpu_heuristic_follows_irees_buckets_and_thresholds(m, n, k, slices):
    assert gpu_slices(ReductionShape(batch=1, m=m, n=n, k=k)) == slices


def test_gpu_heuristic_takes_the_smallest_tile_that_divides_k():
    # 40003 = 109 * 367: the smallest divisor >= ceil(40003 / 128) = 313 is 367: 109 slices
    assert gpu_slices(ReductionShape(1, 32, 32, 40003)) == 109
    # a prime K has no tile but itself: left whole
    assert gpu_slices(ReductionShape(1, 32, 32, 40961)) is None


def test_a_table_gives_the_first_row_holding_the_shape():
    rows = (TableRow(16, k=(65536, None)), TableRow(4, k=(8192, 65535), m=(None, 64)))
    assert table_slices(rows, ReductionShape(1, 8, 8, 131072)) == 16
    assert table_slices(rows, ReductionShape(1, 8, 8, 8192)) == 4
    assert table_slices(rows, ReductionShape(1, 128, 8, 8192)) is None


@pytest.mark.parametrize("bad", [{"slices": 0}, {"slices": True}, {"slices": 2, "k": (0, 4)},
                                 {"slices": 2, "m": (1, "x")}])
def test_a_bad_table_row_names_the_field(bad):
    with pytest.raises(TargetError, match="split_k_table"):
        TableRow(**bad)
