"""Outputs written through a merge of dims (``y[t, 64*h+d]``): validated, planned, executed."""

from __future__ import annotations

import numpy as np
import pytest

import apportion as ap
from apportion.errors import ProgramError
from apportion.frontend.json_format import dumps, loads
from apportion.runtime import compare, random_inputs, run_unplanned
from tests.helpers import program, run_planned


def merge_heads(**extra) -> ap.Program:
    """``y[t, 64*h+d] = exp(x[t,h,d])`` (y's shape inferred), then ``z = -y``."""
    return program({"x": ([8, 4, 64], "float32")},
                   [{"name": "m", "op": "exp", "out": "y[t,64*h+d]", "ins": ["x[t,h,d]"]},
                    {"name": "e", "op": "neg", "out": "z[t,j]", "ins": ["y[t,j]"]}], ["z"],
                   **extra)


def test_a_merged_write_lays_heads_side_by_side_as_a_reshape_would():
    p = merge_heads()
    assert p.tensor("y").shape == (8, 256)  # inferred from the merge: 4 * 64
    x = random_inputs(p, seed=3)["x"]
    env = run_unplanned(p, {"x": x})
    np.testing.assert_allclose(env["y"], np.exp(x).reshape(8, 256), rtol=1e-6)
    op = p.op("m")
    assert op.merges_output and op.out_digits == (("t",), ("h", "d"))
    assert str(op.split_out) == "y[t, h, d]"


@pytest.mark.parametrize("out, why", [
    ("y[t,32*h+d]", "writes each index once"),      # overlapping digits
    ("y[t,128*h+d]", "writes each index once"),     # holes between the heads
    ("y[t,64*h+d+1]", "writes each index once"),    # an offset
    ("y[t,64*t+d]", "repeats a dim"),
])
def test_a_write_that_is_not_a_one_to_one_merge_is_refused(out, why):
    with pytest.raises(ProgramError, match=why):
        loads('{"name": "t", "tensors": {"x": {"shape": [8, 4, 64], "dtype": "float32"}},'
              '"inputs": ["x"], "outputs": ["y"], "ops": [{"name": "m", "op": "exp", '
              f'"out": "{out}", "ins": ["x[t,h,d]"]}}]}}')


def test_a_merge_that_does_not_cover_its_declared_axis_is_refused():
    with pytest.raises(ProgramError, match="must cover its axis whole"):
        loads('{"name": "t", "tensors": {"x": {"shape": [8, 4, 64], "dtype": "float32"},'
              '"y": {"shape": [8, 512], "dtype": "float32"}}, "inputs": ["x"], '
              '"outputs": ["y"], "ops": [{"name": "m", "op": "exp", "out": "y[t,64*h+d]", '
              '"ins": ["x[t,h,d]"]}]}')


def test_a_fallback_cannot_write_through_a_merge():
    with pytest.raises(ProgramError, match="fallback sort writes"):
        loads('{"name": "t", "tensors": {"x": {"shape": [8, 4, 64], "dtype": "float32"}},'
              '"inputs": ["x"], "outputs": ["y"], "ops": [{"name": "m", "op": "sort", '
              '"out": "y[64*h+d,t]", "ins": ["x[t,h,d]"]}]}')


def test_a_merged_write_of_a_symbolic_dim_is_refused_naming_the_dim():
    with pytest.raises(ProgramError, match="symbolic size 'T'"):
        loads('{"name": "t", "symbols": {"T": {"max": 8}}, "tensors": {"x": {"shape": '
              '["T", 4], "dtype": "float32"}}, "inputs": ["x"], "outputs": ["y"], "ops": '
              '[{"name": "m", "op": "exp", "out": "y[4*t+h]", "ins": ["x[t,h]"]}]}')


def test_a_program_with_merged_writes_round_trips_through_json():
    p = merge_heads()
    assert loads(dumps(p)) == p


@pytest.mark.parametrize("cores", [1, 8, 32])
@pytest.mark.parametrize("strategy", ["greedy", "balanced"])
def test_merged_writes_plan_and_run_like_the_unplanned_program(cores, strategy):
    cases = [
        merge_heads(),
        # a matmul writing its heads merged; the planner may split h, d or t
        program({"a": ([16, 4, 32], "float32"), "b": ([4, 32, 64], "float32")},
                [{"name": "mm", "op": "matmul", "out": "o[t,64*h+d]",
                  "ins": ["a[t,h,k]", "b[h,k,d]"]}], ["o"]),
        # a reduction writing two merged axes, one of them with a size-1 digit
        program({"x": ([4, 3, 1, 5, 40], "float32")},
                [{"name": "s", "op": "sum", "out": "s[3*i+j,5*u+v]",
                  "ins": ["x[i,j,u,v,k]"]}], ["s"]),
    ]
    target = ap.targets.spyre(cores=cores)
    for prog in cases:
        planned = ap.plan(prog, target, strategy)
        inputs = random_inputs(prog, seed=1)
        checks = compare(run_unplanned(prog, inputs),
                         run_planned(planned.program, planned.plan, inputs), prog)
        assert all(c.ok for c in checks), (prog.name, checks)


def test_a_split_k_op_writing_merged_keeps_the_merge_on_its_partials_and_combine():
    prog = program({"a": ([8, 2, 4096], "float32"), "b": ([2, 4096, 64], "float32")},
                   [{"name": "mm", "op": "matmul", "out": "o[t,64*h+d]",
                     "ins": ["a[t,h,k]", "b[h,k,d]"]}], ["o"], split_k={"mm": 4})
    planned = ap.plan(prog, ap.targets.spyre(cores=32))
    partial, combine = planned.program.ops
    assert partial.merges_output and combine.merges_output
    assert str(combine.out) == "o[t, 64*h+d]"
    assert all(c.ok for c in planned.check())


def test_a_tiling_group_refuses_a_merged_write_naming_the_op():
    prog = merge_heads(tiling=[{"ops": ["m", "e"], "loops": [{"count": 2, "dims": ["t"]}]}])
    with pytest.raises(ProgramError, match="op 'm' in tiling group .* merge of dims"):
        ap.plan(prog, ap.targets.spyre(cores=8))


def test_writing_merged_runs_of_an_inner_dim_costs_no_less_than_whole_heads():
    # split over h: each core writes whole 64-element heads; over d: runs of 32 elements
    by_h = ap.plan(merge_heads(work_division={"m": {"h": 2}}), ap.targets.spyre(cores=2))
    by_d = ap.plan(merge_heads(work_division={"m": {"d": 2}}), ap.targets.spyre(cores=2))
    assert by_d.op("m").predicted_time_us >= by_h.op("m").predicted_time_us
    assert all(c.ok for c in by_d.check())


def test_the_outer_digit_of_a_merged_write_counts_in_values_that_fill_a_stick():
    """``t2[d1, 8*d2+d3]`` in float16: 8 values of d2 (d3 whole) fill a 64-element stick, so
    d2's planning unit is 8, not 64: a pin of 8 holds, and a span limit that needs d2 split is
    met (both were refused when d2's 64 values made one unit)."""
    import dataclasses

    doc = {"x": ([4, 64, 8], "float16")}
    ops = [{"name": "m", "op": "exp", "out": "t2[d1, 8*d2+d3]", "ins": ["x[d1,d2,d3]"]}]
    pinned = ap.plan(program(doc, ops, ["t2"], work_division={"m": {"d2": 8}}),
                     ap.targets.spyre(cores=32))
    m = pinned.op("m")
    assert m.unit_map["d2"] == 8 and m.split_map["d2"] == 8
    assert all(c.ok for c in pinned.check())
    # one row of t2: x alone spans 8 KiB (64 padded sticks), d2 must split for a 4 KiB limit
    tight = dataclasses.replace(ap.targets.spyre(cores=4), span_limit=4096)
    p = program({"x": ([1, 64, 8], "float16")}, ops, ["t2"])
    planned = ap.plan(p, tight)
    assert planned.op("m").split_map["d2"] >= 2 and not planned.groups
    assert all(s <= 4096 for _, s in planned.op("m").span_bytes)
    assert all(c.ok for c in planned.check())
