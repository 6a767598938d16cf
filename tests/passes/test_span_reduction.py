import pytest

from apportion.errors import PlanningError
from apportion.passes.pipeline import plan
from apportion.target import spyre
from tests.helpers import one_op

F16 = "float16"


def test_512_mib_tensor_needs_a_stick_dim_split():
    p = one_op("exp", "y[m,n]", ["x[m,n]"], {"x": ([8192, 32768], F16)})
    op = plan(p, spyre(), "greedy").op("exp")
    assert dict(op.span_splits) == {"m": 1, "n": 2}
    assert max(s for _, s in op.span_bytes) <= 256 << 20


def test_matmul_input_over_the_span_limit_needs_a_k_split():
    p = one_op("matmul", "y[m,n]", ["x[m,k]", "w[k,n]"],
               {"x": ([256, 1 << 20], F16), "w": ([1 << 20, 64], F16)})
    op = plan(p, spyre(), "greedy").op("matmul")
    assert dict(op.span_splits) == {"m": 1, "n": 1, "k": 2}
    assert op.split_map == {"m": 16, "n": 1, "k": 2}
    assert dict(op.span_bytes)["x"] == 256 << 20


def test_prime_stick_count_loops_under_greedy():
    # no even split of 769 sticks fits: greedy's answer of last resort is a loop over the
    # sticks (pass span_tiling; 769 is prime, so one stick per iteration)
    p = one_op("matmul", "y[m,n]", ["x[m,k]", "w[k,n]"],
               {"x": ([16, 4096], F16), "w": ([4096, 49216], F16)})
    result = plan(p, spyre(), "greedy")
    op = result.op("matmul")
    assert op.loop.count == (769,) and op.loop.tiled_dims == (("n",),)
    assert result.groups[0].added == "span"
    assert dict(op.span_bytes)["w"] <= 256 << 20


def test_prime_stick_count_fails_greedy_with_a_clear_error_without_loops():
    import dataclasses
    p = one_op("matmul", "y[m,n]", ["x[m,k]", "w[k,n]"],
               {"x": ([16, 4096], F16), "w": ([4096, 49216], F16)})
    with pytest.raises(PlanningError, match=r"'matmul'.*tensor 'w'.*limit 268435456"):
        plan(p, dataclasses.replace(spyre(), max_loop_count=1), "greedy")


def test_prime_stick_count_plans_with_an_uneven_split_under_balanced():
    p = one_op("matmul", "y[m,n]", ["x[m,k]", "w[k,n]"],
               {"x": ([16, 4096], F16), "w": ([4096, 49216], F16)})
    op = plan(p, spyre(), "balanced").op("matmul")
    assert op.split_map["n"] > 1 and not op.is_even("n")
    assert dict(op.span_bytes)["w"] <= 256 << 20


def test_span_that_no_split_can_fix_names_tensor_and_limit():
    # one core and loops of at most one iteration: neither a split nor a loop can fix it
    import dataclasses
    p = one_op("exp", "y[m,n]", ["x[m,n]"], {"x": ([8192, 32768], F16)})
    with pytest.raises(PlanningError, match=r"tensor 'x'.*spans .* > limit"):
        plan(p, dataclasses.replace(spyre(cores=1), max_loop_count=1))
    # with loops, a loop over the column sticks fits (pass span_tiling)
    op = plan(p, spyre(cores=1)).op("exp")
    assert op.loop.count == (2,) and op.loop.tiled_dims == (("n",),)


def test_fallback_op_over_the_span_limit_is_an_error():
    from tests.helpers import program
    p = program({"x": ([8192, 32768], F16)},
                [{"name": "s", "op": "fallback", "fn": "sort", "out": "y[m,n]", "ins": ["x[m,n]"]}],
                ["y"])
    with pytest.raises(PlanningError, match="fallback op cannot be divided"):
        plan(p, spyre())
