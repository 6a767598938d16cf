"""Tests of pass split_k: pins, the target's resolver, a user resolver, and the plan field."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import apportion as ap
from apportion.errors import PlanningError, ProgramError, TargetError
from apportion.target import load_toml
from apportion.target.split_k import TableRow
from tests.helpers import program


def matmul(m: int, k: int, n: int, dtype: str = "float16", **extra) -> ap.Program:
    return program({"x": ([m, k], dtype), "w": ([k, n], dtype)},
                   [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
                   ["y"], **extra)


def test_the_gpu_target_splits_k_by_irees_heuristic_into_partial_and_combine_ops():
    given = matmul(32, 40960, 32)
    planned = ap.plan(given, ap.targets.gpu())
    # 128 slices of 320: a partial matmul over each slice, then a sum over the slices
    assert [str(o) for o in planned.program.ops] == [
        "mm.partial: y.partials[k_slice, m, n] = matmul(x[m, 320*k_slice+k_in], "
        "w[320*k_slice+k_in, n])",
        "mm.combine: y[m, n] = sum(y.partials[k_slice, m, n])"]
    assert planned.program.tensor("y.partials").dtype == "float32"  # the accumulator dtype
    assert planned.source is given
    partial, combine = planned.op("mm.partial"), planned.op("mm.combine")
    assert partial.split_map["k_slice"] == 128 and partial.split_map["k_in"] == 1
    assert partial.split_k == partial.split_k.__class__(("k",), 128, "gpu")
    assert combine.split_k is None
    doc = json.loads(planned.to_json())["ops"]
    assert doc[0]["split_k"] == {"dims": ["k"], "factor": 128, "by": "gpu"}
    assert ap.PlannedProgram.from_json(planned.to_json(), given) == planned
    assert all(c.ok for c in planned.check())


def test_the_gpu_heuristic_leaves_a_large_output_whole():
    op = ap.plan(matmul(4096, 8192, 4096), ap.targets.gpu(cores=64)).op("mm")
    assert op.split_map["k"] == 1 and op.split_k.factor == 1 and op.split_k.by == "gpu"


def test_spyre_leaves_split_k_to_the_cost_model_and_records_nothing():
    op = ap.plan(matmul(512, 4096, 4096)).op("mm")
    assert op.split_k is None


@pytest.mark.parametrize("strategy", ["balanced", "greedy"])
def test_a_pinned_factor_is_honoured_under_both_strategies_and_runs(strategy):
    planned = ap.plan(matmul(64, 4096, 256, split_k={"mm": 4}), ap.targets.spyre(cores=16),
                      strategy)
    op = planned.op("mm.partial")
    assert op.split_map["k_slice"] == 4 and op.split_k == op.split_k.__class__(("k",), 4,
                                                                              "pinned")
    assert op.cores <= 16 and planned.op("mm.combine").op == "sum"
    assert all(c.ok for c in planned.check())


def test_a_pinned_factor_that_cannot_be_honoured_names_op_dim_and_factor():
    with pytest.raises(PlanningError, match=r"op 'mm': split_k 1000 of reduction dim 'k' "
                                            r"exceeds its 64 sticks"):
        ap.plan(matmul(64, 4096, 256, split_k={"mm": 1000}))
    # argmax keeps its split inside the op: at most one slice per core
    am = program({"x": ([8, 4096], "float32")},
                 [{"name": "r", "op": "argmax", "out": "s[i]", "ins": ["x[i,k]"]}], ["s"],
                 split_k={"r": 64})
    with pytest.raises(PlanningError, match=r"op 'r': split_k 64 of reduction dim 'k' exceeds "
                                            r"the target's 32 cores; more slices than cores "
                                            r"need partial and combine ops, and argmax's"):
        ap.plan(am)


def test_split_k_pins_are_checked_in_the_program():
    with pytest.raises(ProgramError, match="split_k pins unknown op 'nope'"):
        matmul(8, 128, 8, split_k={"nope": 2})
    with pytest.raises(ProgramError, match=r"field 'split_k' must be an object mapping op names"):
        matmul(8, 128, 8, split_k={"mm": 2.5})
    with pytest.raises(ProgramError, match="pinned by both work_division and split_k"):
        matmul(8, 128, 8, split_k={"mm": 2}, work_division={"mm": {"k": 2}})
    exp = program({"x": ([8, 128], "float16")},
                  [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}], ["y"],
                  split_k={"e": 2})
    with pytest.raises(PlanningError, match="a pointwise op has no reduction dim to split"):
        ap.plan(exp)


def test_a_user_resolver_decides_before_the_target():
    seen = []

    def resolver(shape):
        seen.append((shape.m, shape.n, shape.k, shape.dim))
        return 2

    op = ap.plan(matmul(64, 4096, 256), split_k=resolver).op("mm.partial")
    assert seen == [(64, 256, 4096, "k")]
    assert op.split_map["k_slice"] == 2 and op.split_k.by == "user"
    with pytest.raises(PlanningError, match="the user split-K resolver returned 'two'"):
        ap.plan(matmul(64, 4096, 256), split_k=lambda shape: "two")


def test_a_table_target_from_toml_splits_by_its_first_matching_row(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('preset = "spyre"\nsplit_k = "table"\n'
                    '[[split_k_table]]\nslices = 8\nk = [8192, 1048576]\n'
                    '[[split_k_table]]\nslices = 2\n')
    target = load_toml(path)
    assert target.split_k_table == (TableRow(8, k=(8192, 1048576)), TableRow(2))
    assert ap.plan(matmul(64, 16384, 256), target).op("mm.partial").split_map["k_slice"] == 8
    assert ap.plan(matmul(64, 4096, 256), target).op("mm.partial").split_map["k_slice"] == 2


@pytest.mark.parametrize(("toml", "match"), [
    ('split_k = "magic"', "split_k must be one of cost, gpu, table, none"),
    ('split_k = "table"', "needs split_k_table rows"),
    ("split_k_table = 3", "split_k_table must be an array of tables"),
    ("[[split_k_table]]\nk = [1, 2]", "row 0 needs slices"),
    ("[[split_k_table]]\nslices = 2\nk = [1]", r"k must be \[low, high\]"),
])
def test_bad_split_k_settings_in_a_target_file_name_the_field(tmp_path, toml, match):
    path = tmp_path / "t.toml"
    path.write_text('preset = "spyre"\n' + toml + "\n")
    with pytest.raises(TargetError, match=match):
        load_toml(path)


def test_none_never_splits_a_reduction():
    target = replace(ap.targets.spyre(), split_k="none")
    op = ap.plan(matmul(8, 4096, 64), target).op("mm")
    assert op.split_map["k"] == 1 and op.split_k.by == "none"


def test_auto_tile_weighs_a_group_with_its_split_k_decisions():
    p = matmul(256, 4096, 512, split_k={"mm": 4},
               tiling=[{"ops": ["mm"], "loops": [{"count": 1, "dims": ["m"]}]}])
    planned = ap.plan(p, ap.targets.spyre(cores=32), auto_tile=True)
    op = planned.op("mm")
    assert op.split_map["k"] == 4 and op.split_k.by == "pinned" and op.loop is not None
    assert all(c.ok for c in planned.check())


@pytest.mark.parametrize("fn", ["sum", "mean", "max", "min", "prod", "any"])
@pytest.mark.parametrize("backend", ["reference", "iree"])
def test_split_reductions_become_partials_combined_by_their_reducer(fn, backend):
    p = program({"x": ([8, 4096], "float32")},
                [{"name": "r", "op": fn, "out": "s[i,0]", "ins": ["x[i,k]"]}], ["s"],
                split_k={"r": 4})
    planned = ap.plan(p, ap.targets.spyre(cores=32))
    combine = planned.op("r.combine")
    assert combine.op == fn and planned.op("r.partial").split_map["k_slice"] == 4
    assert all(c.ok for c in planned.check(backend=backend))


def test_argmax_and_uneven_slices_keep_the_split_inside_the_op():
    am = program({"x": ([8, 4096], "float32")},
                 [{"name": "r", "op": "argmax", "out": "s[i]", "ins": ["x[i,k]"]}], ["s"],
                 split_k={"r": 4})
    op = ap.plan(am).op("r")
    assert op.split_map["k"] == 4 and op.split_k.by == "pinned"
    uneven = matmul(64, 4096 + 64, 256, split_k={"mm": 3})  # 65 sticks in 3 slices
    planned = ap.plan(uneven)
    assert [o.name for o in planned.ops] == ["mm"] and planned.op("mm").split_map["k"] == 3
    assert all(c.ok for c in planned.check())


def test_an_integer_mean_keeps_its_split_inside_the_op_and_runs_right():
    # a mean of truncated slice means is not the truncated mean: no partial/combine pair
    import apportion as ap
    from apportion.frontend.json_format import from_dict

    doc = {"name": "im", "tensors": {"x": {"shape": [4, 8192], "dtype": "int32"}},
           "inputs": ["x"], "outputs": ["y"],
           "ops": [{"name": "r", "op": "mean", "out": "y[m]", "ins": ["x[m,k]"]}]}
    planned = ap.plan(from_dict(doc), ap.targets.resolve("gpu"))
    assert [o.name for o in planned.ops] == ["r"] and planned.op("r").split_map["k"] > 1
    assert all(c.ok for c in planned.check())


def test_work_division_pins_follow_an_op_the_gpu_resolver_splits():
    """The pins of ``mm`` hold in its partial and combine ops, the resolver's slices take the
    cores the pins leave, and a pin the op cannot take is refused naming ``mm`` and its dim."""
    given = matmul(32, 65536, 32, "float32", work_division={"mm": {"m": 2}})
    planned = ap.plan(given, ap.targets.gpu())
    partial, combine = planned.op("mm.partial"), planned.op("mm.combine")
    assert partial.split_k is not None and partial.split_k.by == "gpu"
    assert partial.split_map["m"] == 2 and partial.split_map["n"] == 1
    assert partial.cores <= planned.target.cores and combine.split_map["m"] == 2
    assert ap.PlannedProgram.from_json(planned.to_json(), given, planned.target) == planned
    assert all(c.ok for c in planned.check())
    # a pin naming the reduction dim is the user's split of it: the resolver is not asked
    pinned_k = ap.plan(matmul(32, 65536, 32, "float32", work_division={"mm": {"k": 4}}),
                       ap.targets.gpu())
    assert [o.name for o in pinned_k.ops] == ["mm"] and pinned_k.op("mm").split_map["k"] == 4
    with pytest.raises(PlanningError, match=r"op 'mm': work_division split 4 of dim 'n' does not "
                                            r"divide its 1 sticks"):
        ap.plan(matmul(32, 65536, 32, "float32", work_division={"mm": {"m": 32, "n": 4}}),
                ap.targets.gpu())


@pytest.mark.parametrize("out", ["y[]", "y[0]"])
def test_a_reduction_of_two_dims_to_a_scalar_splits_both_dims_on_gpu(out):
    """A scalar's partials are ``[slices..., 1]``: the slice axes are no stick dim, so the cores
    take whole slices. IREE's outer-reduction rule tiles b by 512 (sqrt of the 262144
    elements) and cuts a into single rows: 256 x 2 slices, 256 cores running 2 each."""
    p = program({"x": ([256, 1024], "float32")},
                [{"name": "red", "op": "sum", "out": out, "ins": ["x[a,b]"]}], ["y"])
    planned = ap.plan(p, ap.targets.gpu())
    partial = planned.op("red.partial")
    assert partial.split_k == partial.split_k.__class__(("a", "b"), 512, "gpu", factors=(256, 2))
    assert partial.split_map["a_slice"] == 256 and partial.split_map["b_slice"] == 1
    assert planned.program.tensor("y.partials").shape == (256, 2, 1)
    for backend in ("reference", "iree"):
        assert all(c.ok for c in planned.check(backend=backend))
