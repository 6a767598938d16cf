from apportion.cost.model import op_cost, slice_bytes
from apportion.target import spyre
from tests.helpers import one_op

F16 = "float16"
MATMUL = one_op("matmul", "y[m,n]", ["x[m,k]", "w[k,n]"],
                {"x": ([256, 1024], F16), "w": ([1024, 2048], F16)})
SIZES = {"m": 256, "n": 2048, "k": 1024}


def test_splitting_rows_makes_every_core_reread_the_whole_weight():
    op = MATMUL.ops[0]
    by_rows = slice_bytes(op, MATMUL, spyre(), {"m": 8, "n": 2048, "k": 1024})
    by_cols = slice_bytes(op, MATMUL, spyre(), {"m": 256, "n": 64, "k": 1024})
    assert by_rows > by_cols  # w (4 MiB) re-read per core dominates


def test_combine_cost_appears_only_when_a_reduction_is_split():
    op = MATMUL.ops[0]
    whole = op_cost(op, MATMUL, spyre(), SIZES, {"m": 256, "n": 64, "k": 1024})
    split = op_cost(op, MATMUL, spyre(), SIZES, {"m": 256, "n": 128, "k": 512}, 2)
    assert whole.combine_us == 0 and split.combine_us > 0


def test_compute_time_scales_with_the_largest_slice():
    op = MATMUL.ops[0]
    half = op_cost(op, MATMUL, spyre(), SIZES, {"m": 128, "n": 2048, "k": 1024})
    full = op_cost(op, MATMUL, spyre(), SIZES, SIZES)
    assert full.compute_us == 2 * half.compute_us


def test_padding_to_sticks_counts_in_traffic():
    p = one_op("exp", "y[m,n]", ["x[m,n]"], {"x": ([4, 65], F16)})
    # 65 fp16 elements take two 64-element sticks per row, in and out
    assert slice_bytes(p.ops[0], p, spyre(), {"m": 4, "n": 65}) == 2 * 4 * 128 * 2
