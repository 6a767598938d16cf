"""Dims far beyond any real tensor are planned or refused promptly, never searched by size.

The divisor and split searches are bounded by the core count, not by a dim's size: a dim of
2**62 used to take minutes (trial division to its square root) and one of 2**100 never returned.
These tests only need to finish.
"""

import pytest

from apportion.errors import ApportionError
from apportion.ir.program import Program
from apportion.passes.geometry import OpContext
from apportion.passes.layouts import op_layout, tensor_layouts
from apportion.passes.pipeline import plan
from apportion.passes.work_distribution import candidates, core_split
from apportion.target import spyre
from tests.helpers import program

F16 = "float16"
HUGE = [2**62, 2**100, 2**100 + 192, 2**89 - 1]  # powers of two, sticks plus a prime
STRATEGIES = ["balanced", "greedy"]


def exp_1d(n: int) -> Program:
    return program({"x": ([n], F16)}, [{"name": "e", "op": "exp", "out": "y[i]",
                                        "ins": ["x[i]"]}], ["y"])


def exp_2_by_half(n: int) -> Program:  # the huge dim is a stick dim
    return program({"x": ([2, n // 2], F16)}, [{"name": "e", "op": "exp", "out": "y[i,j]",
                                                "ins": ["x[i,j]"]}], ["y"])


def exp_rows(n: int) -> Program:  # the huge dim is counted in elements
    return program({"x": ([n, 64], F16)}, [{"name": "e", "op": "exp", "out": "y[i,j]",
                                            "ins": ["x[i,j]"]}], ["y"])


def matmul_k(n: int) -> Program:  # a huge reduction dim
    return program({"a": ([64, n], F16), "b": ([n, 64], F16)},
                   [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["a[m,k]", "b[k,n]"]}],
                   ["y"])


def matmul_m(n: int) -> Program:  # a huge output dim
    return program({"a": ([n, 64], F16), "b": ([64, 128], F16)},
                   [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["a[m,k]", "b[k,n]"]}],
                   ["y"])


def row_sum(n: int) -> Program:  # a huge reduction dim on the stick dim
    return program({"x": ([64, n], F16)}, [{"name": "s", "op": "sum", "out": "r[i,0]",
                                            "ins": ["x[i,j]"]}], ["r"])


def tiled_chain(n: int) -> Program:  # a loop group over the huge dim
    return program({"x": ([n, 64], F16)},
                   [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]},
                    {"name": "g", "op": "neg", "out": "z[i,j]", "ins": ["y[i,j]"]}],
                   ["z"], tiling=[{"ops": ["e", "g"], "loops": [{"count": 2, "dims": ["i"]}]}])


def nested(count: int, dim: str) -> list[dict]:
    """Loop levels over ``dim`` whose counts multiply to ``count``, each within max_loop_count.

    A power of two becomes levels of at most 2**15; any other count stays one level (refused).
    """
    if count & (count - 1):
        return [{"count": count, "dims": [dim]}]
    bits = count.bit_length() - 1
    return [{"count": 2 ** min(15, bits - i), "dims": [dim]} for i in range(0, bits, 15)]


def small_tiles(n: int) -> Program:  # nested loops over a huge dim leave tiles that fit
    return program({"x": ([n, 64], F16)},
                   [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]},
                    {"name": "g", "op": "neg", "out": "z[i,j]", "ins": ["y[i,j]"]}],
                   ["z"], tiling=[{"ops": ["e", "g"], "loops": nested(n // 4096, "i")}])


def small_k_tiles(n: int) -> Program:  # a matmul accumulating over nested loops of a huge K
    return program({"a": ([64, n], F16), "b": ([n, 64], F16)},
                   [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["a[m,k]", "b[k,n]"]}],
                   ["y"], tiling=[{"ops": ["mm"], "loops": nested(n // 4096, "k")}])


BUILDERS = [exp_1d, exp_2_by_half, exp_rows, matmul_k, matmul_m, row_sum, tiled_chain,
            small_tiles, small_k_tiles]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("n", HUGE, ids=lambda n: f"2^{n.bit_length() - 1}")
@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_huge_dim_is_planned_or_refused(build, n, strategy):
    p = build(n)
    try:
        # debug verifies the plan's invariants (cores, spans, coverage) when one is made
        result = plan(p, spyre(cores=32), strategy, debug=lambda stage, value: None)
    except ApportionError as e:
        assert str(e)  # refused, with a message
        return
    assert all(op.cores <= 32 for op in result.ops)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_largest_1d_tensor_within_32_spans_is_planned_on_32_cores(strategy):
    # 2**32 float16 elements are 8 GiB: exactly 32 spans of 256 MiB
    op = plan(exp_1d(2**32), spyre(cores=32), strategy).op("e")
    assert op.split_map == {"i": 32}
    assert max(s for _, s in op.span_bytes) == 256 << 20


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("n", [2**62, 2**100], ids=lambda n: f"2^{n.bit_length() - 1}")
def test_huge_dim_in_nested_loops_is_planned_per_tile(n, strategy):
    # every level within max_loop_count; each iteration is a 4096-row tile over 32 cores
    result = plan(small_tiles(n), spyre(cores=32), strategy, debug=lambda stage, value: None)
    for name in ("e", "g"):
        op = result.op(name)
        assert op.sizes == {"i": 4096, "j": 64} and op.split_map == {"i": 32, "j": 1}
    mm = plan(small_k_tiles(n), spyre(cores=32), strategy).op("mm")
    # each iteration is planned as the 4096-deep tile alone would be
    tile = plan(matmul_k(4096), spyre(cores=32), strategy).op("mm")
    assert mm.sizes == tile.sizes == {"m": 64, "n": 64, "k": 4096}
    assert mm.split_map == tile.split_map


def test_core_split_of_huge_sizes():
    assert core_split(2**62, 32) == 32
    assert core_split(2**100, 24) == 16
    assert core_split(3 * 2**100, 24) == 24
    assert core_split(2**127 - 1, 32) == 1


def test_even_candidates_of_a_huge_op_are_bounded_by_the_cores():
    p = matmul_k(2**100)
    op, target = p.op("mm"), spyre(cores=32)
    ctx = OpContext(op, p, target, op_layout(op, p, target), tensor_layouts(p, target),
                    dict(op.dims))
    found = list(candidates(ctx, {d: 1 for d in ctx.sizes}, uneven=False))
    assert found and all(s["k"] in (1, 2, 4, 8, 16, 32) for s in found)
    assert all(s["m"] * s["n"] * s["k"] <= 32 for s in found)
