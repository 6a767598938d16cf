"""Tests of IREE's split-reduction families as the ``gpu`` resolver carries them over: each
family's thresholds and slice caps, its order of tiling dims, and the divisor search bound."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.errors import TargetError
from apportion.target.split_k import (
    CONV_LARGE_PARALLEL,
    GPU_MAX_TILE_SEARCH,
    TARGET_SIZE,
    ReductionShape,
    arg_compare_split,
    convolution_split,
    gpu_slices,
    gpu_split,
    matmul_like_split,
    outer_reduction_split,
)


def outer(*dims: tuple[str, int]) -> ReductionShape:
    k = math.prod(n for _, n in dims)
    return ReductionShape(1, 64, 1, k, dims[-1][0], family="outer_reduction", reduction=dims)


def test_an_outer_reduction_below_the_target_size_is_left_whole():
    assert outer_reduction_split(outer(("k", TARGET_SIZE - 1))) is None


def test_an_outer_reduction_is_tiled_by_the_square_root_of_its_elements():
    # 4096 elements: a target tile of sqrt(4096) = 64, so 64 slices of 64
    assert outer_reduction_split(outer(("k", 4096))) == {"k": 64}
    # 100000: sqrt is 317; the smallest divisor of 100000 from 317 up is 400: 250 slices
    assert outer_reduction_split(outer(("k", 100000))) == {"k": 250}
    # the target caps the tile: 4M elements want sqrt = 2048 > 1024, so tiles of 1024
    assert outer_reduction_split(outer(("k", 1 << 22))) == {"k": 4096}


def test_an_outer_reduction_over_several_dims_tiles_the_innermost_first():
    # 256 x 1024: the target tile is 512, met inside b (2 slices); a is cut into single rows
    assert outer_reduction_split(outer(("a", 256), ("b", 1024))) == {"a": 256, "b": 2}
    # 4 x 512 = 2048 elements: tile 46 -> b's smallest divisor from 46 is 64 (8 slices), a
    # then needs tiles of 1: every row its own slice
    assert outer_reduction_split(outer(("a", 4), ("b", 512))) == {"a": 4, "b": 8}


def conv(reduction, channels, image, batch=1, depth=1, batch_first=True) -> ReductionShape:
    k = math.prod(n for _, n in reduction)
    return ReductionShape(1, 1, 1, k, reduction[0][0], family="convolution",
                          reduction=reduction, channels=channels, image=image, depth=depth,
                          conv_batch=batch, batch_first=batch_first)


def test_a_convolution_with_many_parallel_outputs_is_left_whole():
    # output channels x image at 640000: enough workgroups already
    assert convolution_split(conv((("c", 1 << 20),), 640, 1000)) is None
    assert CONV_LARGE_PARALLEL == 640 * 1000


def test_a_convolution_with_a_small_reduction_is_left_whole():
    # 4096 channels over 64 x 64 parallel outputs: ratio 64 (not above) and under 8192
    assert convolution_split(conv((("c", 4096),), 64, 64)) is None
    # 8192 elements split however small the ratio
    assert convolution_split(conv((("c", 8192),), 64, 64)) is not None


@pytest.mark.parametrize(("channels", "image", "most"), [
    (8, 16, 2048),      # output 128 < 32 x 32
    (32, 64, 128),      # 2048 < 128 x 128
    (64, 512, 64),      # 32768 < 256 x 256
    (256, 512, 16),     # 131072 < 512 x 512
    (256, 2048, 8),     # larger: min(8, the first tiled dim)
])
def test_a_convolutions_output_caps_its_slices(channels, image, most):
    split = convolution_split(conv((("c", 1 << 16),), channels, image))
    assert split == {"c": most}


def test_a_batch_first_convolution_tiles_its_innermost_reduction_dim_first():
    # NCHW / NHWC: kw (3 taps) and kh (3) are cut into single taps, then c takes what the cap
    # (2048 / 9 = 227) leaves: the smallest tile from ceil(256 / 227) = 2 gives 128 slices
    split = convolution_split(conv((("c", 256), ("kh", 3), ("kw", 3)), 8, 16))
    assert split == {"c": 128, "kh": 3, "kw": 3}


def test_a_weight_gradient_convolution_tiles_its_outermost_reduction_dim_first():
    # the batch is not the output's outermost dim: the walk starts at n (16), cut into single
    # images, and the cap left (128 / 16 = 8) cuts h (225) into tiles of 45
    split = convolution_split(conv((("n", 16), ("h", 225), ("w", 225)), 64, 9, batch=16,
                                   batch_first=False))
    assert split == {"n": 16, "h": 5}


def test_a_matmul_with_several_reduction_dims_tiles_the_outermost_first():
    shape = ReductionShape(1, 16, 16, 64 * 4096, "a", family="matmul_like",
                           reduction=(("a", 64), ("b", 4096)))
    # output 16 x 16: at most 2048 slices; a (64) is cut into single rows, b takes 2048 / 64
    assert matmul_like_split(shape) == {"a": 64, "b": 32}


def test_arg_compare_is_cut_into_tiles_of_the_target_size():
    def am(k):
        return ReductionShape(1, 8, 1, k, family="arg_compare")
    assert arg_compare_split(am(4096)) == {"k": 4}
    assert arg_compare_split(am(1000)) is None            # under the target size
    assert arg_compare_split(am(1031 * 3)) == {"k": 3}    # tiles of 1031, the next divisor
    assert gpu_split(am(1 << 20)) == {"k": 1024}


def test_the_divisor_search_stops_at_two_to_the_fifteen():
    # K = 2^23 over a 32 x 32 output wants 128 slices of 65536: past IREE's search, left whole
    assert gpu_slices(ReductionShape(1, 32, 32, 1 << 23)) is None
    assert GPU_MAX_TILE_SEARCH == 1 << 15


def test_the_issue_shape_gets_irees_2000_partitions():
    # 128 x 134 x 16,800,000: K > 1e7 allows 2048; the smallest tile from 8204 dividing K is
    # 8400, 2000 slices (more than the 304 compute units: no clamp here)
    assert gpu_split(ReductionShape(1, 128, 134, 16_800_000)) == {"k": 2000}


def test_an_unknown_family_is_refused():
    with pytest.raises(TargetError, match="family must be one of"):
        ReductionShape(1, 1, 1, 8, family="magic")


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=3),
       family=st.sampled_from(["outer_reduction", "matmul_like", "arg_compare", "convolution"]),
       channels=st.integers(1, 300), image=st.integers(1, 300))
def test_every_family_cuts_each_dim_into_slices_that_divide_it(sizes, family, channels,
                                                                image):
    dims = tuple((f"d{i}", n) for i, n in enumerate(sizes))
    shape = ReductionShape(1, 4, 4, math.prod(sizes), "d0", family=family, reduction=dims,
                           channels=channels, image=image)
    split = gpu_split(shape)
    if split is not None:
        size = dict(dims)
        assert split and all(size[d] % f == 0 and f > 1 for d, f in split.items())


def test_a_run_time_reduction_dim_is_left_whole_by_every_family_rule():
    # K (planning size 64) beside a static j: a static slice count of K would cut it into
    # whole slices only at its multiples; the walks end at it, the outer walk tiles j alone
    def shape(family: str, dims: tuple[tuple[str, int], ...]) -> ReductionShape:
        return ReductionShape(1, 8, 1, math.prod(n for _, n in dims), "j", family=family,
                              reduction=dims, runtime=("K",))

    assert matmul_like_split(shape("inner_reduction", (("j", 16), ("K", 64)))) == {"j": 16}
    assert matmul_like_split(shape("inner_reduction", (("K", 64), ("j", 16)))) is None
    assert outer_reduction_split(shape("outer_reduction", (("K", 64), ("j", 256)))) == \
        {"j": 2}
    assert arg_compare_split(shape("arg_compare", (("j", 16), ("K", 4096)))) is None
    conv = ReductionShape(1, 1, 1, 2304, family="convolution", runtime=("c",),
                          reduction=(("c", 256), ("kh", 3), ("kw", 3)), channels=8, image=16)
    assert convolution_split(conv) == {"kh": 3, "kw": 3}
