"""Per-device programs: the unrolled plan, run with the reference executor and numpy
collectives, gives the unsharded program's results; the wrappers keep the signature."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.errors import ExecutionError, PlanningError, TargetError
from apportion.frontend.json_format import from_dict, load
from apportion.ir.program import Program
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.sharding.mesh import Axis, Mesh, parse
from apportion.sharding.propagate import propagate
from apportion.sharding.rules import Finish
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from apportion.sharding.unroll import Collective, unroll
from tests.sharding.programs import annotated, attention, hard_inputs, reduction


def _equal(unrolled, seed=0):
    checks = unrolled.check(seed)
    assert all(c.ok for c in checks), checks


@settings(max_examples=40, deadline=None)
@given(annotated())
def test_propagated_plans_unrolled_per_device_equal_the_unsharded_program(case):
    program, mesh, ann = case
    _equal(unroll(propagate(program, mesh, annotations=ann)))


@settings(max_examples=10, deadline=None)
@given(annotated())
def test_per_device_segments_planned_for_the_cores_and_run_core_by_core_equal_it_too(case):
    program, mesh, ann = case
    checks = unroll(propagate(program, mesh, annotations=ann)).check(planned=True)
    assert all(c.ok for c in checks), checks


@settings(max_examples=25, deadline=None)
@given(annotated())
def test_searched_plans_unrolled_per_device_equal_the_unsharded_program(case):
    program, mesh, ann = case
    plan = search(program, mesh, annotations=ann)
    for name, s in ann.items():  # annotations are constraints
        assert plan.sharding(name) == s
    _equal(unroll(plan))



@settings(max_examples=15, deadline=None)
@given(annotated(), st.integers(1, 4))
def test_plans_on_a_symbolic_mesh_bound_at_any_size_are_exact_or_refused(case, size):
    program, mesh, ann = case
    # the first axis symbolic, planned at its size; bound at another
    first = mesh.axes[0]
    sym = Mesh((Axis(first.name, first.size, symbol="N"), *mesh.axes[1:]))
    plan = search(program, sym, annotations=ann)
    try:
        u = unroll(plan, {"N": size})
    except PlanningError as e:  # an empty shard, heads out of line: named, never wrong
        assert f"cannot run at N={size}" in str(e)
        return
    assert u.plan.mesh.shape == (size, *mesh.shape[1:])
    _equal(u)


def test_megatron_unrolls_to_one_segment_and_one_collective_per_device():
    rep = Sharding(((), ()))
    plan = search(load("examples/mlp.json"), parse("tp=2"), annotations={"x": rep, "y": rep})
    u = unroll(plan)
    for dev in u.devices:
        seg, coll = dev.stages
        assert isinstance(seg, Program) and isinstance(coll, Collective)
        assert [o.name for o in seg.ops] == ["gate", "up", "act", "glu", "down"]
        assert str(coll.step) == "all_reduce(sum, tp)"
        assert seg.tensor("wg").shape == (1024, 1408) and seg.tensor("y").shape == (256, 1024)
    assert u.distinct_segments == 1  # both devices run the same program on their shards
    _equal(u)


def test_each_devices_segments_planned_for_its_cores_run_core_by_core_and_match():
    plan = search(load("examples/mlp.json"), parse("dp=2,tp=2"))
    checks = unroll(plan).check(planned=True)
    assert all(c.ok for c in checks), checks
    planned = unroll(plan).planned()
    assert len(planned) == 4 and all(p.target.cores == 32 for seg in planned for p in seg)


def test_uneven_shards_on_three_devices_and_local_cuts_as_copy_ops():
    p = load("examples/mlp.json")
    plan = propagate(p, parse("tp=3"), annotations={"x": Sharding(((), ())),
                                                     "h": Sharding((("tp",), ()))})
    # backward from h: glu splits its rows, so a and u (made replicated) are cut before it
    assert plan.strategy("glu").label == "m:tp"
    u = unroll(plan)
    shapes = [dev.segments[0].tensor("a@1").shape for dev in u.devices]
    assert shapes == [(86, 2816), (85, 2816), (85, 2816)]  # 256 rows as cores cut them
    cuts = [str(o) for o in u.devices[2].segments[0].ops if o.fn == "copy"]
    assert cuts == ["reshard.a@1.0: a@1[d0, d1] = copy(a[d0+171, d1])",
                    "reshard.u@1.0: u@1[d0, d1] = copy(u[d0+171, d1])"]
    _equal(u)


def test_the_wrappers_shard_views_of_the_host_arrays_and_keep_the_signature():
    plan = search(load("examples/mlp.json"), parse("tp=2"))
    u = unroll(plan)
    xs = random_inputs(plan.program)
    parts = u.shard_inputs(xs)
    for name in plan.program.inputs:
        for env in parts:
            assert np.shares_memory(env[name], xs[name])  # a view, not a copy per device
    out = u(xs)
    assert set(out) == {"y"} and out["y"].shape == (256, 1024)
    assert all(c.ok for c in compare(run_unplanned(plan.program, xs), out, plan.program))


def test_replicas_that_disagree_are_an_execution_error():
    plan = search(load("examples/mlp.json"), parse("tp=2"), outputs="replicated")
    u = unroll(plan)
    envs = [{"y@1": np.zeros((256, 1024), np.float16)},
            {"y@1": np.ones((256, 1024), np.float16)}]
    with pytest.raises(ExecutionError, match="replica of output 'y' differs"):
        u.unshard_outputs(envs)


# --- a mean or argmax split over devices ---------------------------------------------------

@pytest.mark.parametrize("fn", ["mean", "argmax"])
@pytest.mark.parametrize("mesh", ["tp=2", "tp=4", "tp=3", "a=2,b=2"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_mean_or_argmax_split_over_devices_equals_the_single_device_result(fn, mesh, dtype):
    p = reduction(fn, dtype=dtype)  # 10 elements: 5 + 5, 3 + 3 + 3 + 1, 4 + 4 + 2
    m = parse(mesh)
    plan = propagate(p, m, annotations={"x": Sharding(((), m.names))})
    assert plan.strategy("r").label == f"k:{'*'.join(m.names)}"
    assert plan.strategy("r").out.reducer == ("sum" if fn == "mean" else "argmax")
    assert plan.collectives_text() == f"{len(m.names)} all_reduce"
    u = unroll(plan)
    assert any(isinstance(s, Finish) for s in u.devices[0].stages)
    for xs in (hard_inputs(p) if fn == "argmax" else random_inputs(p, 1), random_inputs(p, 2)):
        want = run_unplanned(p, xs)
        for planned in (False, True):
            got = u.run(xs, planned=planned)
            if fn == "argmax":
                assert np.array_equal(got["r"], want["r"]), (got["r"], want["r"])
            else:
                assert all(c.ok for c in compare(want, got, p))


@pytest.mark.parametrize(("red", "split"), [
    ("r[i] = x[i, j, k]", {"k": "tp"}),        # an inner reduction dim split
    ("r[i] = x[i, j, k]", {"j": "tp"}),        # the outer one
    ("r[i] = x[i, j, k]", {"j": "a", "k": "b"}),
])
def test_an_argmax_over_several_dims_split_anywhere_gives_the_global_flat_index(red, split):
    p = reduction("argmax", (6, 3, 10) if "a" in split.values() else (6, 4, 10), red=red)
    m = parse("a=2,b=2") if "a" in split.values() else parse("tp=4")
    ann = {"x": Sharding(((), (split["j"],) if "j" in split else (),
                          (split["k"],) if "k" in split else ()))}
    plan = propagate(p, m, annotations=ann)
    assert plan.strategy("r").out.partial
    u = unroll(plan)
    xs = hard_inputs(p)
    assert np.array_equal(u.run(xs)["r"], run_unplanned(p, xs)["r"])


def test_the_search_splits_a_long_mean_and_prices_its_all_reduce():
    p = reduction("mean", (1, 1 << 20))  # one row: only k can split
    plan = search(p, parse("tp=4"), annotations={"r": Sharding(((),))})
    assert plan.strategy("r").label == "k:tp" and plan.collectives_text() == "1 all_reduce"
    (t,) = plan.transfers
    assert str(t.steps[0]) == "all_reduce(sum, tp)" and t.time_us > 0
    _equal(unroll(plan))


# --- outputs written through a merge of dims ------------------------------------------------

@pytest.mark.parametrize("mesh", ["tp=2", "tp=4"])
def test_attention_heads_split_and_merged_back_equal_the_single_device_result(mesh):
    p = attention()
    assert p.op("pv").merges_output
    cols, rows, rep = Sharding(((), ("tp",))), Sharding((("tp",), ())), Sharding(((), ()))
    plan = propagate(p, parse(mesh), annotations={"wq": cols, "wk": cols, "wv": cols,
                                                  "wo": rows, "x": rep, "y": rep})
    assert [plan.strategy(o).label for o in ("s", "pv", "proj")] == ["h:tp", "h:tp", "j:tp"]
    assert str(plan.strategy("pv").out) == "[-, tp]"  # each device writes its heads' columns
    assert plan.collectives_text() == "1 all_reduce"
    _equal(unroll(plan))
    assert all(c.ok for c in unroll(plan).check(planned=True))
    searched = search(p, parse(mesh), annotations={"x": rep, "y": rep})
    _equal(unroll(searched))


def test_heads_that_do_not_line_up_with_the_columns_are_never_written_split():
    p = attention(h=5, d=4, t=6, n=8)  # 5 heads of 4 over 2 devices: 12 + 8, not 10 + 10
    for plan in (search(p, parse("tp=2")),
                 propagate(p, parse("tp=2"), annotations={"v": Sharding(((), ("tp",)))})):
        assert plan.strategy("pv").out.dims[1] == ()
        _equal(unroll(plan))


# --- a mesh with a symbolic axis size -------------------------------------------------------

def test_a_symbolic_mesh_plans_at_its_planning_size_and_unrolls_once_bound():
    p = load("examples/mlp.json")
    plan = search(p, parse("dp=2,tp=N~4"))
    static = search(p, parse("dp=2,tp=4"))
    assert [o.strategy for o in plan.ops] == [o.strategy for o in static.ops]
    assert plan.predicted_us == pytest.approx(static.predicted_us)
    assert "dp=2,tp=N~4 (dp=2,tp=N~4, 8 devices at N=4)" in plan.summary()
    # bound at the planning size, the per-device programs are those of the static mesh
    assert unroll(plan, {"N": 4}).devices == unroll(static).devices
    two = unroll(plan, sizes={"N": 2})
    assert two.devices == unroll(propagate(p, parse("dp=2,tp=2"), annotations={
        **dict(plan.inputs), **{n: s for n, s, _ in plan.outputs}})).devices
    _equal(two)
    _equal(unroll(plan, {"N": 3}))  # uneven shards, cut exactly at the bound size


@pytest.mark.parametrize(("sizes", "error", "match"), [
    (None, TargetError, r"axis 'tp' has symbolic size N \(planned at 4\); the per-device "
                        r"programs need its device count: bind it \(--param N=SIZE"),
    ({"N": 9}, TargetError, r"axis 'tp': N=9 is outside its bounds 2..8"),
    ({"N": 1}, TargetError, r"axis 'tp': N=1 is outside its bounds 2..8"),
    ({"N": 2.0}, TargetError, r"axis 'tp': its size N needs an int, got 2.0 \(float\)"),
    ({"M": 2}, TargetError, r"has no size 'M'; its symbolic sizes: N"),
    ({"N": 8}, PlanningError, r"cannot run at N=8: op 'e': dim 'i' of size 6 split over tp "
                              r"leaves a device nothing"),
])
def test_unrolling_a_symbolic_mesh_refuses_bad_sizes_naming_the_axis(sizes, error, match):
    p = from_dict({"name": "e", "inputs": ["x"], "outputs": ["y"],
                   "tensors": {"x": {"shape": [6, 4], "dtype": "float32"}},
                   "ops": [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}]})
    # 6 rows: every device has some up to 6 devices, as cores cut them (2, 2, 1, 1 at N=4)
    plan = propagate(p, parse("tp=N~4~2..8"), annotations={"x": Sharding((("tp",), ()))})
    with pytest.raises(error, match=match):
        unroll(plan, sizes)
