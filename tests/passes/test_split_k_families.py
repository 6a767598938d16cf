"""Tests of pass split_k with IREE's families on the ``gpu`` target, several reduction dims cut,
more slices than cores, ``"?"`` pins and tile-size pins: each plan run against the unplanned
reference."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError, ProgramError
from apportion.frontend.json_format import dumps, loads
from apportion.ir.program import SplitKPin
from apportion.passes.split_k import family
from apportion.plans.plan import SplitK
from tests.helpers import program
from tests.runtime_reductions import CUT, PROGRAMS
from tests.runtime_reductions import planned as runtime_planned


def matmul(m: int, k: int, n: int, dtype: str = "float32", **extra) -> ap.Program:
    return program({"x": ([m, k], dtype), "w": ([k, n], dtype)},
                   [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
                   ["y"], **extra)


def conv(c: int = 512, **extra) -> ap.Program:
    """A 1-d convolution with 3 taps as a matmul reading the window pair ``h+r``."""
    return program({"x": ([2, 6, c], "float32"), "w": ([3, c, 8], "float32")},
                   [{"name": "conv", "op": "matmul", "out": "y[n,h,f]",
                     "ins": ["x[n,h+r,c]", "w[r,c,f]"], "dims": {"h": 4}}], ["y"], **extra)


def runs(planned: ap.PlannedProgram, *backends: str) -> bool:
    return all(c.ok for b in backends or ("reference",) for c in planned.check(backend=b))


def test_ops_are_sorted_into_irees_families_by_their_indexing():
    outer = program({"x": ([4096, 8], "float32")},
                    [{"name": "s", "op": "sum", "out": "y[n]", "ins": ["x[k,n]"]}], ["y"])
    inner = program({"x": ([8, 4096], "float32")},
                    [{"name": "s", "op": "sum", "out": "y[n]", "ins": ["x[n,k]"]}], ["y"])
    arg = program({"x": ([8, 4096], "float32")},
                  [{"name": "s", "op": "argmax", "out": "y[n]", "ins": ["x[n,k]"]}], ["y"])
    assert [family(p.ops[0]) for p in (outer, inner, arg, conv(), matmul(8, 64, 8))] == [
        "outer_reduction", "inner_reduction", "arg_compare", "convolution", "matmul_like"]


def test_an_outer_reduction_on_gpu_is_split_by_the_outer_rule_and_runs():
    p = program({"x": ([16384, 8], "float32")},
                [{"name": "s", "op": "sum", "out": "y[n]", "ins": ["x[k,n]"]}], ["y"])
    planned = ap.plan(p, ap.targets.gpu())
    partial = planned.op("s.partial")
    # sqrt(16384) = 128: 128 slices of 128 rows, summed by the combine op
    assert partial.split_k == SplitK(("k",), 128, "gpu")
    assert planned.op("s.combine").op == "sum"
    assert runs(planned, "reference", "torch")


def test_a_convolution_on_gpu_cuts_its_channels_and_taps_and_runs_on_every_backend():
    planned = ap.plan(conv(), ap.targets.gpu())
    partial = planned.op("conv.partial")
    # output 2 x 4 x 8 = 64 < 32 x 32: up to 2048 slices; c (innermost) into single channels,
    # then the 3 taps with what is left (2048 / 512 = 4)
    assert partial.split_k == SplitK(("r", "c"), 1536, "gpu", factors=(3, 512))
    assert [str(o) for o in planned.program.ops] == [
        "conv.partial: y.partials[r_slice, c_slice, n, h, f] = matmul(x[n, h+r_slice+r_in, "
        "c_slice+c_in], w[r_slice+r_in, c_slice+c_in, f])",
        "conv.combine: y[n, h, f] = sum(y.partials[r_slice, c_slice, n, h, f])"]
    assert partial.cores <= planned.target.cores
    assert runs(planned, "reference", "torch", "iree")


def test_argmax_on_gpu_is_cut_into_tiles_of_1024_inside_the_op_and_runs():
    p = program({"x": ([8, 8192], "float32")},
                [{"name": "am", "op": "argmax", "out": "y[n]", "ins": ["x[n,k]"]}], ["y"])
    planned = ap.plan(p, ap.targets.gpu())
    op = planned.op("am")
    assert op.split_k == SplitK(("k",), 8, "gpu") and op.split_map["k"] == 8
    assert runs(planned)


def test_the_gpu_factor_is_not_clamped_to_the_cores_and_each_core_runs_several_slices():
    planned = ap.plan(matmul(4, 65536, 4), ap.targets.gpu())
    partial = planned.op("mm.partial")
    # output 4 x 4: 2048 slices of 32, on 256 of the 304 compute units (8 slices each)
    assert partial.split_k == SplitK(("k",), 2048, "gpu")
    assert partial.split_map["k_slice"] == 256 and partial.cores <= 304
    assert planned.program.tensor("y.partials").shape == (2048, 4, 4)
    assert runs(planned, "reference", "torch")


def test_2000_slices_run_on_250_of_304_cores_eight_each():
    # 4 x 4 outputs, K = 64000: tiles of 32 (the smallest divisor from 64000 / 2048), 2000
    # slices, divided over the largest divisor of 2000 within the 304 compute units
    planned = ap.plan(matmul(4, 64000, 4), ap.targets.gpu())
    partial = planned.op("mm.partial")
    assert partial.split_k == SplitK(("k",), 2000, "gpu")
    assert partial.split_map["k_slice"] == 250 and partial.cores == 250
    assert runs(planned, "reference", "torch")


def test_irees_2000_partitions_are_planned_over_250_of_304_cores():
    # the shape (too large to run here): IREE's 2000 partitions, not the 304 cores
    planned = ap.plan(matmul(128, 16_800_000, 134, "float16"), ap.targets.gpu())
    partial = planned.op("mm.partial")
    assert partial.split_k == SplitK(("k",), 2000, "gpu")
    assert partial.split_map["k_slice"] == 250 and partial.cores <= 304


def test_a_question_mark_pin_lets_the_target_decide_past_a_user_resolver():
    p = matmul(32, 40960, 32, split_k={"mm": "?"})
    planned = ap.plan(p, ap.targets.gpu(), split_k=lambda shape: 2)
    assert planned.op("mm.partial").split_k == SplitK(("k",), 128, "gpu")
    assert runs(planned)
    # without the pin the user resolver decides
    assert ap.plan(matmul(32, 40960, 32), ap.targets.gpu(),
                   split_k=lambda shape: 2).op("mm.partial").split_k.by == "user"
    # on Spyre the target's decision is the cost model's search: nothing fixed here
    assert ap.plan(matmul(64, 4096, 256, "float16", split_k={"mm": "?"})).op("mm").split_k \
        is None


def test_a_question_mark_pin_on_an_op_without_a_reduction_is_refused():
    p = program({"x": ([8, 128], "float16")},
                [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}], ["y"],
                split_k={"e": "?"})
    with pytest.raises(PlanningError, match=r"op 'e': split_k pins \"\?\", but a pointwise op"):
        ap.plan(p)


def test_a_tile_pin_gives_slices_of_that_many_elements_and_runs():
    planned = ap.plan(matmul(64, 4096, 256, "float16", split_k={"mm": {"tile": 512}}),
                      ap.targets.spyre(cores=32))
    partial = planned.op("mm.partial")
    assert partial.split_k == SplitK(("k",), 8, "pinned") and partial.split_map["k_slice"] == 8
    assert "x[m, 512*k_slice+k_in]" in str(planned.program.op("mm.partial"))
    assert runs(planned)


def test_per_dim_slice_and_tile_pins_cut_several_reduction_dims_and_run():
    by_slices = ap.plan(conv(64, split_k={"conv": {"slices": {"r": 3, "c": 2}}}),
                        ap.targets.cpu())
    by_tiles = ap.plan(conv(64, split_k={"conv": {"tile": {"r": 1, "c": 32}}}),
                       ap.targets.cpu())
    for planned in (by_slices, by_tiles):
        partial = planned.op("conv.partial")
        assert partial.split_k == SplitK(("r", "c"), 6, "pinned", factors=(3, 2))
        assert planned.program.tensor("y.partials").shape == (3, 2, 2, 4, 8)
        assert runs(planned, "reference", "torch")


def test_a_multi_dim_plan_reads_back_from_its_json():
    given_ = conv(64, split_k={"conv": {"slices": {"r": 3, "c": 2}}})
    planned = ap.plan(given_, ap.targets.cpu())
    doc = json.loads(planned.to_json())["ops"][0]["split_k"]
    assert doc == {"dims": ["r", "c"], "factor": 6, "by": "pinned", "factors": [3, 2]}
    assert ap.PlannedProgram.from_json(planned.to_json(), given_, planned.target) == planned


def test_split_k_pins_round_trip_through_the_program_format():
    p = conv(64, split_k={"conv": {"tile": {"c": 32}}})
    assert p.split_k == (("conv", SplitKPin(tiles=(("c", 32),))),)
    assert loads(dumps(p)) == p
    for pin in ("?", 4, {"tile": 16}, {"slices": {"r": 3}}):
        q = conv(64, split_k={"conv": pin})
        assert json.loads(dumps(q))["split_k"] == {"conv": pin} and loads(dumps(q)) == q


@pytest.mark.parametrize(("pin", "match"), [
    ({"tile": {"h": 2}}, r"split_k for op 'conv': tile of dim 'h': not a reduction dim of the "
                         r"op \(its reduction dims: r, c\)"),
    ({"slices": {"c": 0}}, r"slices of dim 'c' must be an int >= 1"),
    ({"tile": {"c": 128}}, r"tile 128 of dim 'c' exceeds its size 64"),
    ({"tile": 2.5}, r"field 'split_k' must be an object mapping op names"),
    ({"tiles": 4}, r"field 'split_k' must be an object mapping op names"),
    ("all", r"field 'split_k' must be an object mapping op names"),
])
def test_bad_split_k_pins_are_refused_naming_op_dim_and_value(pin, match):
    with pytest.raises(ProgramError, match=match):
        conv(64, split_k={"conv": pin})


def test_a_tile_that_does_not_divide_its_dim_is_refused_naming_op_dim_and_tile():
    with pytest.raises(PlanningError, match=r"op 'conv': split_k tile 24 of reduction dim 'c' "
                                            r"does not divide its 64 elements"):
        ap.plan(conv(64, split_k={"conv": {"tile": {"c": 24}}}), ap.targets.cpu())


def test_several_dims_cut_inside_a_loop_group_are_refused_naming_the_dims():
    p = conv(64, split_k={"conv": {"slices": {"r": 3, "c": 2}}},
             tiling=[{"ops": ["conv"], "loops": [{"count": 2, "dims": ["n"]}]}])
    with pytest.raises(PlanningError, match=r"op 'conv': split_k of reduction dims 'r', 'c': "
                                            r"more than one dim is cut only into partial and "
                                            r"combine ops, and the op is in a loop group"):
        ap.plan(p, ap.targets.cpu())


@settings(max_examples=12, deadline=None)
@given(a=st.sampled_from([2, 4, 6, 8]), b=st.sampled_from([64, 128, 192]),
       fa=st.sampled_from([1, 2]), fb=st.sampled_from([1, 2, 4]),
       target=st.sampled_from(["cpu", "gpu"]))
def test_any_per_dim_split_of_a_two_dim_reduction_matches_the_reference(a, b, fa, fb, target):
    p = program({"x": ([a, b, 8], "float32")},
                [{"name": "s", "op": "sum", "out": "y[n]", "ins": ["x[i,j,n]"]}], ["y"],
                split_k={"s": {"slices": {"i": fa, "j": fb}}})
    planned = ap.plan(p, ap.targets.resolve(target))
    cut = {d: f for d, f in (("i", fa), ("j", fb)) if f > 1}
    op = planned.op("s.partial" if cut else "s")
    assert op.split_k is not None
    assert {d: f for d, f in op.split_k.per_dim.items() if f > 1} == cut
    assert runs(planned)


@pytest.fixture(scope="module")
def runtime_plans():
    return {name: runtime_planned(name) for name in PROGRAMS}


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(sorted(PROGRAMS)), k=st.integers(1, 64))
def test_a_gpu_reduction_over_several_dims_beside_a_run_time_size_runs_at_every_declared_size(
        runtime_plans, name, k):
    # planned once at K=64: the gpu rules cut only static reduction dims, so every size of
    # 1..64 binds (a static count of K's slices held only at multiples of it)
    planned = runtime_plans[name]
    partial = next((o for o in planned.plan.ops if o.name == "r.partial"), None)
    assert (None if partial is None else partial.split_k.per_dim) == CUT[name]
    assert all(c.ok for c in planned.check(params={"K": k}))
