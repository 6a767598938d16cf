import pytest

from apportion.errors import PlanningError
from apportion.passes.pipeline import plan
from apportion.passes.work_distribution import core_split
from apportion.target import spyre
from tests.helpers import one_op, program

F16 = "float16"


def test_core_split_is_largest_divisor_within_budget():
    assert core_split(4096, 24) == 16
    assert core_split(12, 32) == 12
    assert core_split(769, 32) == 1


def test_pointwise_1024x4096_fp16_on_32_cores_splits_rows():
    p = one_op("add", "y[m,n]", ["a[m,n]", "b[m,n]"], {"a": ([1024, 4096], F16),
                                                       "b": ([1024, 4096], F16)})
    for strategy in ("greedy", "balanced"):
        op = plan(p, spyre(), strategy).op("add")
        assert op.stick_dims == ("n",) and op.unit_map == {"m": 1024, "n": 64}
        assert op.split_map == {"m": 32, "n": 1} and op.cores == 32 and op.utilization == 1.0


def test_reduction_over_dim_0_of_512x1024_splits_columns_then_rows():
    p = one_op("sum", "r[0,n]", ["x[m,n]"], {"x": ([512, 1024], F16)})
    op = plan(p, spyre(), "greedy").op("sum")
    assert op.reduction_dims == ("m",)
    # n has 16 sticks: 16 cores; the 2 left go to the reduction dim
    assert op.split_map == {"n": 16, "m": 2}


def test_greedy_leaves_cores_idle_on_24_cores_where_balanced_does_not():
    p = one_op("exp", "y[m,n]", ["x[m,n]"], {"x": ([4096, 4096], F16)})
    greedy = plan(p, spyre(24), "greedy").op("exp")
    balanced = plan(p, spyre(24), "balanced").op("exp")
    assert greedy.cores == 16 and greedy.utilization == pytest.approx(16 / 24)
    assert balanced.utilization > 0.99
    assert balanced.predicted_time_us < greedy.predicted_time_us


def test_pinned_splits_are_used_as_given():
    p = one_op("exp", "y[m,n]", ["x[m,n]"], {"x": ([64, 256], F16)},
               work_division={"exp": {"m": 4, "n": 2}})
    assert plan(p, spyre()).op("exp").split_map == {"m": 4, "n": 2}


@pytest.mark.parametrize(("pins", "match"), [
    ({"m": 0}, ">= 1"),
    ({"m": 3}, "does not divide its 64 elements"),
    ({"n": 3}, "does not divide its 4 sticks"),
    ({"m": 64, "n": 2}, "128 cores > 32"),
])
def test_invalid_pins_are_errors(pins, match):
    p = one_op("exp", "y[m,n]", ["x[m,n]"], {"x": ([64, 256], F16)},
               work_division={"exp": pins})
    with pytest.raises(PlanningError, match=match):
        plan(p, spyre())


def test_pinning_two_reduction_dims_is_an_error():
    p = one_op("sum", "r[0,0]", ["x[m,n]"], {"x": ([64, 256], F16)},
               work_division={"sum": {"m": 2, "n": 2}})
    with pytest.raises(PlanningError, match="at most one reduction dim"):
        plan(p, spyre())


def test_fallback_op_runs_on_one_core():
    p = program({"x": ([64, 256], F16)},
                [{"name": "s", "op": "fallback", "fn": "sort", "out": "y[m,n]", "ins": ["x[m,n]"]}],
                ["y"])
    op = plan(p, spyre()).op("s")
    assert op.kind == "fallback" and op.cores == 1


def test_unknown_strategy_lists_the_valid_ones():
    p = one_op("exp", "y[m]", ["x[m]"], {"x": ([64], F16)})
    with pytest.raises(PlanningError, match="balanced, greedy"):
        plan(p, spyre(), "clever")


def bound_of(p, target):
    from apportion.passes.geometry import OpContext
    from apportion.passes.layouts import layouts, tensor_layouts
    from apportion.passes.work_distribution import best_utilization

    op = p.ops[0]
    ctx = OpContext(op, p, target, layouts(p, target).ops[op.name], tensor_layouts(p, target),
                    dict(op.dims))
    util, splits = best_utilization(ctx, {d: 1 for d in op.sizes})
    return util, splits, ctx


def test_bound_splits_a_short_reduction_that_balanced_keeps_whole_to_skip_the_combine():
    # 16 rows of 128 (two sticks): only 16 cores without splitting the reduction; the bound
    # uses all 32, a mean of each row kept as a [16, 1] column
    p = one_op("mean", "r[m,0]", ["x[m,k]"], {"x": ([16, 128], F16)})
    util, splits, ctx = bound_of(p, spyre())
    assert util == 1.0 and splits["m"] * splits["k"] == 32 and splits["k"] > 1
    op = plan(p, spyre(), "balanced").op("mean")
    assert op.split_map == {"m": 16, "k": 1} and op.utilization == 0.5
    # the ring hop and the cut stick cost more than the shorter slices save
    assert op.predicted_time_us < ctx.time_us(splits)


def test_bound_is_never_below_either_strategy():
    p = one_op("exp", "y[m,n]", ["x[m,n]"], {"x": ([96, 769 * 64], F16)})
    for cores in (24, 32):
        util, splits, ctx = bound_of(p, spyre(cores))
        assert ctx.utilization(splits) == util
        for strategy in ("greedy", "balanced"):
            assert plan(p, spyre(cores), strategy).op("exp").utilization <= util + 1e-12


@pytest.mark.parametrize("strategy", ["balanced", "greedy"])
def test_spyre_never_splits_a_reduction_whose_last_stick_is_padded(strategy):
    # 2 rows of 64*40+1 elements: k is the only dim worth cutting, but its last stick is padded
    p = one_op("sum", "r[m,0]", ["x[m,k]"], {"x": ([2, 64 * 47 + 1], F16)})
    assert plan(p, spyre(), strategy).op("sum").split_map["k"] == 1
    even = one_op("sum", "r[m,0]", ["x[m,k]"], {"x": ([2, 64 * 40], F16)})
    assert plan(even, spyre(), strategy).op("sum").split_map["k"] > 1
    from dataclasses import replace

    lenient = replace(spyre(), split_padded_reduction=True)
    assert plan(p, lenient, strategy).op("sum").split_map["k"] > 1


def test_pinning_a_split_of_a_padded_reduction_names_op_dim_and_target():
    p = one_op("sum", "r[m,0]", ["x[m,k]"], {"x": ([2, 64 * 47 + 1], F16)},
               work_division={"sum": {"k": 2}})
    with pytest.raises(PlanningError, match=r"op 'sum': work_division splits reduction dim 'k' "
                                            r"\(3009 elements\) 2 ways, but its last stick"):
        plan(p, spyre())
