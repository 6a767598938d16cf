"""Per-device programs: the unrolled plan, run with the reference executor and numpy
collectives, gives the unsharded program's results; the wrappers keep the signature."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from apportion.errors import ExecutionError, PlanningError, TargetError
from apportion.frontend.json_format import from_dict, load
from apportion.ir.program import Program
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.sharding import oracle
from apportion.sharding.mesh import Axis, Mesh, parse
from apportion.sharding.plan import build_plan
from apportion.sharding.propagate import propagate
from apportion.sharding.rules import DeviceFinish, make_strategy
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding, dim_block
from apportion.sharding.unroll import UnrolledStep, unroll
from tests.sharding.programs import (
    annotated,
    as_float32,
    attention,
    hard_inputs,
    reduction,
)


def _equal(unrolled, seed=0):
    checks = oracle.check(unrolled, seed)
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
    checks = oracle.check(unroll(propagate(program, mesh, annotations=ann)), planned=True)
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
    # float32: a float16 model's partials move in float32, and there the gathers win
    plan = search(as_float32(load("examples/mlp.json")), parse("tp=2"),
                  annotations={"x": rep, "y": rep})
    u = unroll(plan)
    for dev in u.devices:
        seg, coll = dev.stages
        assert isinstance(seg, Program) and isinstance(coll, UnrolledStep)
        assert [o.name for o in seg.ops] == ["gate", "up", "act", "glu", "down"]
        assert str(coll.step) == "all_reduce(sum, tp)"
        assert seg.tensor("wg").shape == (1024, 1408) and seg.tensor("y").shape == (256, 1024)
    assert u.distinct_segments == 1  # both devices run the same program on their shards
    _equal(u)


def test_each_devices_segments_planned_for_its_cores_run_core_by_core_and_match():
    plan = search(load("examples/mlp.json"), parse("dp=2,tp=2"))
    checks = oracle.check(unroll(plan), planned=True)
    assert all(c.ok for c in checks), checks
    planned = oracle.planned(unroll(plan))
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
    parts = oracle.shard_inputs(u, xs)
    for name in plan.program.inputs:
        for env in parts:
            assert np.shares_memory(env[name], xs[name])  # a view, not a copy per device
    out = oracle.run(u, xs)
    assert set(out) == {"y"} and out["y"].shape == (256, 1024)
    assert all(c.ok for c in compare(run_unplanned(plan.program, xs), out, plan.program))


def test_replicas_that_disagree_are_an_execution_error():
    plan = search(load("examples/mlp.json"), parse("tp=2"), outputs="replicated")
    u = unroll(plan)
    envs = [{"y@1": np.zeros((256, 1024), np.float16)},
            {"y@1": np.ones((256, 1024), np.float16)}]
    with pytest.raises(ExecutionError, match="replica of output 'y' differs"):
        oracle.unshard_outputs(u, envs)


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
    assert any(isinstance(s, DeviceFinish) for s in u.devices[0].stages)
    for xs in (hard_inputs(p) if fn == "argmax" else random_inputs(p, 1), random_inputs(p, 2)):
        want = run_unplanned(p, xs)
        for planned in (False, True):
            got = oracle.run(u, xs, planned=planned)
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
    assert np.array_equal(oracle.run(u, xs)["r"], run_unplanned(p, xs)["r"])


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
    assert all(c.ok for c in oracle.check(unroll(plan), planned=True))
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


# --- tiling groups and pins carried into the per-device programs ----------------------------

def _tiled(rows=1024, cols=256, counts=((2, ("m",)), (4, ("n",))), pins=None, split_k=None,
           ops=None, outputs=("z",)):
    """``y = a + b; z = y * c`` over [rows, cols] float16 in one tiling group (``counts``: its
    levels, outermost first), or ``ops`` named add and mul."""
    doc = {"name": "tiled", "inputs": ["a", "b", "c"], "outputs": list(outputs),
           "tensors": {n: {"shape": [rows, cols], "dtype": "float16"} for n in "abc"},
           "ops": ops or [
               {"name": "add", "op": "add", "out": "y[m,n]", "ins": ["a[m,n]", "b[m,n]"]},
               {"name": "mul", "op": "mul", "out": "z[m,n]", "ins": ["y[m,n]", "c[m,n]"]}],
           "tiling": [{"ops": ["add", "mul"], "loops": [{"count": c, "dims": list(d)}
                                                        for c, d in counts]}]}
    if pins:
        doc["work_division"] = pins
    if split_k:
        doc["split_k"] = split_k
    return from_dict(doc)


ROWS, COLS = Sharding((("tp",), ())), Sharding(((), ("tp",)))


def _by_rows(p, mesh="tp=2", s=ROWS):
    return unroll(propagate(p, parse(mesh), annotations={"a": s, "z": s}))


def test_a_tiling_group_is_kept_on_every_device_with_its_counts_over_the_devices_shares():
    u = _by_rows(_tiled())
    for dev in u.devices:
        (seg,) = dev.segments
        (g,) = seg.tiling
        assert g.ops == ("add", "mul")
        assert [(lv.count, lv.dims) for lv in g.loops] == [(2, ("m",)), (4, ("n",))]
        (carry,) = dev.tiling
        assert carry.carried == g and carry.shares == (("m", 512), ("n", 256))
        assert carry.changes == ()
    assert u.tiling_lines() == ["tiling group ['add', 'mul'] on every device: 2 over m, 4 over n "
                                "of its m=512, n=256"]
    assert all(c.ok for c in oracle.check(u, planned=True))


def test_planning_each_device_keeps_the_tiling_its_tiles_the_devices_share_over_the_counts():
    u = _by_rows(_tiled(), "tp=4")
    for plans in oracle.planned(u):
        (planned,) = plans
        assert [g.counts for g in planned.plan.groups] == [(2, 4)]
        for op in planned.plan.ops:  # per iteration: 256 rows / 2, 256 columns / 4
            assert op.loop is not None and op.sizes == {"m": 128, "n": 64}
    assert all(c.ok for c in oracle.check(u, planned=True))


def test_a_group_whose_count_does_not_divide_a_devices_share_is_an_error_naming_group_dim_count():
    p = _tiled(rows=24, counts=((4, ("m",)),))  # 24 rows over 4 devices: 6 each, not 4 tiles
    plan = propagate(p, parse("tp=4"), annotations={"a": ROWS, "z": ROWS})
    # the search and propagation never choose it ...
    assert plan.strategy("add").label != "m:tp"
    # ... but a plan made with it is refused when unrolled, naming the group, dim and count
    m = parse("tp=4")
    strategies = {o.name: make_strategy(o, p, m, {"m": ("tp",)}) for o in p.ops}
    forced = build_plan(p, m, plan.target, strategies, {n: ROWS for n in "abc"}, {"z": ROWS},
                        {})
    with pytest.raises(PlanningError, match=r"tiling group \['add', 'mul'\] cannot be kept on "
                                            r"device 0 \(tp=0\): loop level 0 count 4 does not "
                                            r"divide dim 'm' as the device sees it: 6 of op "
                                            r"'add''s 24"):
        unroll(forced)


def test_ops_of_one_group_cut_alike_on_a_dim_or_the_unroll_says_which_differ():
    # two independent ops of one group: add split by rows, mul whole
    p = _tiled(ops=[
        {"name": "add", "op": "add", "out": "y[m,n]", "ins": ["a[m,n]", "b[m,n]"]},
        {"name": "mul", "op": "mul", "out": "z[m,n]", "ins": ["c[m,n]", "c[m,n]"]}],
        outputs=("y", "z"))
    m = parse("tp=2")
    strategies = {"add": make_strategy(p.op("add"), p, m, {"m": ("tp",)}),
                  "mul": make_strategy(p.op("mul"), p, m, {})}
    rep = Sharding(((), ()))
    forced = build_plan(p, m, search(p, m).target, strategies, {"a": ROWS, "b": ROWS, "c": rep},
                        {"y": ROWS, "z": rep}, {})
    with pytest.raises(PlanningError, match=r"dim 'm' is 512 there in op 'add' but 1024 in op "
                                            r"'mul' \(of 1024: the mesh splits it in one op and "
                                            r"not the other\)"):
        unroll(forced)


def test_a_group_cut_by_a_collective_runs_as_one_group_per_run_and_says_so():
    # the matmul splits k: its partial output is all-reduced before the add reads it, so the
    # group [mm, add] cannot be one loop nest on a device; each run keeps the loop over m
    p = from_dict({
        "name": "mmadd", "inputs": ["x", "w", "b"], "outputs": ["z"],
        "tensors": {"x": {"shape": [64, 256], "dtype": "float16"},
                    "w": {"shape": [256, 128], "dtype": "float16"},
                    "b": {"shape": [64, 128], "dtype": "float16"}},
        "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
                {"name": "add", "op": "add", "out": "z[m,n]", "ins": ["y[m,n]", "b[m,n]"]}],
        "tiling": [{"ops": ["mm", "add"], "loops": [{"count": 2, "dims": ["m"]}]}]})
    rep = Sharding(((), ()))
    plan = propagate(p, parse("tp=2"), annotations={"x": COLS, "w": ROWS, "b": rep, "z": rep})
    assert plan.strategy("mm").label == "k:tp" and plan.strategy("add").label == "m:tp"
    assert plan.collectives_text() == "1 all_gather, 1 reduce_scatter"
    u = unroll(plan)
    first, second = u.devices[0].segments
    assert [g.ops for g in first.tiling] == [("mm",)]
    assert [g.ops for g in second.tiling] == [("add",)]
    assert u.tiling_lines() == ["tiling group ['mm', 'add'] on every device: ops mm: 2 over m "
                                "of its m=64; then ops add: 2 over m of its m=32"]
    assert all(c.ok for c in oracle.check(u, planned=True))


def test_a_level_no_op_of_a_run_tiles_is_left_out_and_said():
    # r sums rows tiled over m and n; f reads the finished sums once per row block (depth 1).
    # Split over n, r's sums are partial and all-reduced before f: f's run has no level over n
    p = from_dict({
        "name": "rowsum", "inputs": ["x"], "outputs": ["t"],
        "tensors": {"x": {"shape": [256, 128], "dtype": "float32"}},
        "ops": [{"name": "r", "op": "sum", "out": "s[m]", "ins": ["x[m,n]"]},
                {"name": "f", "op": "exp", "out": "t[m]", "ins": ["s[m]"]}],
        "tiling": [{"ops": ["r", "f"], "loops": [{"count": 2, "dims": ["m"]},
                                                 {"count": 2, "dims": ["n"]}],
                    "depths": {"f": 1}}]})
    plan = propagate(p, parse("tp=2"), annotations={"x": COLS, "t": Sharding(((),))})
    assert plan.strategy("r").label == "n:tp"
    u = unroll(plan)
    first, second = u.devices[0].tiling
    assert first.ops == ("r",) and first.changes == ()
    assert [lv.count for lv in first.carried.loops] == [2, 2]
    assert second.ops == ("f",) and [lv.dims for lv in second.carried.loops] == [("m",)]
    assert second.changes == ("level 1 (2 over n) left out: no op of the run tiles it",)
    assert "then ops f: 2 over m of its m=128 (level 1 (2 over n) left out: no op of the run " \
           "tiles it)" in u.tiling_lines()[0]
    assert all(c.ok for c in oracle.check(u, planned=True))


def test_work_division_and_split_k_pins_stay_on_the_ops_they_pin_at_the_devices_sizes():
    p = _tiled(counts=((2, ("m",)),), pins={"add": {"m": 4, "n": 2}})
    u = _by_rows(p)
    for dev in u.devices:
        (seg,) = dev.segments
        assert seg.pins == {"add": {"m": 4, "n": 2}}
    for (planned,) in oracle.planned(u):
        assert planned.plan.op("add").split_map == {"m": 4, "n": 2}
    assert all(c.ok for c in oracle.check(u, planned=True))
    mm = from_dict({
        "name": "kmm", "inputs": ["x", "w"], "outputs": ["y"], "split_k": {"mm": 2},
        "tensors": {"x": {"shape": [64, 1024], "dtype": "float16"},
                    "w": {"shape": [1024, 128], "dtype": "float16"}},
        "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}]})
    u = unroll(propagate(mm, parse("tp=2"), annotations={"x": ROWS, "y": ROWS}))
    assert all(seg.split_k_pins == {"mm": 2} for dev in u.devices for seg in dev.segments)
    assert all(c.ok for c in oracle.check(u, planned=True))


def test_a_pin_the_devices_share_cannot_take_is_the_planners_error_naming_the_device():
    p = _tiled(rows=32, counts=((1, ("m",)),), pins={"add": {"m": 16}})
    u = _by_rows(p, "tp=4")  # 8 rows per device: 16 cores cannot split them
    with pytest.raises(PlanningError, match=r"device 0 \(tp=0\), segment 'tiled.d0.s0' \(its "
                                            r"shares of the ops\): op 'add': work_division "
                                            r"split 16 of dim 'm' does not divide its 8"):
        oracle.planned(u)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 4), st.integers(1, 4), st.integers(1, 6))
def test_a_tiled_program_sharded_by_rows_keeps_its_count_or_is_refused_by_name(devices, count,
                                                                             per):
    rows = count * per  # the source's count divides its rows; a device's share may not
    assume(rows >= devices)  # an empty shard is refused before any tiling is looked at
    p = _tiled(rows=rows, cols=64, counts=((count, ("m",)),))
    mesh = parse(f"tp={devices}")
    shares = {dim_block(rows, ("tp",), {"tp": d}, {"tp": devices}) for d in range(devices)}
    fits = all((hi - lo) % count == 0 for lo, hi in shares)
    plan = propagate(p, mesh, annotations={"a": ROWS})
    # propagation offers a row split only where every device's share takes the count
    assert (plan.strategy("add").label == "m:tp") == fits
    u = unroll(plan)
    for dev in u.devices:
        (seg,) = dev.segments
        (g,) = seg.tiling
        assert [lv.count for lv in g.loops] == [count]
    assert all(c.ok for c in oracle.check(u, planned=True))


def test_a_symbolic_loop_count_stays_symbolic_per_device_and_a_planned_run_takes_it():
    p = load("examples/softmax_symbolic.json")
    u = unroll(search(p, parse("tp=2")))
    for dev in u.devices:
        (g,) = [c.carried for c in dev.tiling]
        assert [lv.count for lv in g.loops] == ["T"] and g.loops[0].min == 8
    assert u.counts == ("T",)
    assert all(c.ok for c in oracle.check(u, planned=True, params={"T": 16}))
    with pytest.raises(ExecutionError, match=r"needs a value for symbolic loop count T"):
        oracle.check(u, planned=True)
    with pytest.raises(ExecutionError, match=r"has no symbolic loop count 'K'"):
        oracle.check(u, planned=True, params={"T": 16, "K": 2})


@pytest.mark.parametrize("mesh", ["tp=2", "tp=4", "a=2,b=2"])
def test_the_search_splits_a_dim_alike_in_every_op_of_a_group_so_each_device_keeps_it(mesh):
    # two independent ops of one group: nothing but the group ties their splits together
    p = _tiled(ops=[
        {"name": "add", "op": "add", "out": "y[m,n]", "ins": ["a[m,n]", "b[m,n]"]},
        {"name": "mul", "op": "mul", "out": "z[m,n]", "ins": ["c[m,n]", "c[m,n]"]}],
        outputs=("y", "z"))
    m = parse(mesh)
    first = m.names[0]
    plan = search(p, m, annotations={"a": Sharding(((first,), ())), "c": Sharding(((), ()))})
    add, mul = plan.strategy("add").split_map, plan.strategy("mul").split_map
    assert all(add.get(d, ()) == mul.get(d, ()) for d in ("m", "n"))
    u = unroll(plan)
    assert all(len(dev.tiling) == 1 and dev.tiling[0].carried is not None for dev in u.devices)
    assert all(c.ok for c in oracle.check(u, planned=True))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 4), st.integers(1, 3),
       st.sampled_from(["tp=2", "tp=3", "a=2,b=2"]))
def test_the_search_never_makes_a_plan_whose_devices_cannot_keep_a_group(cm, a, cn, b, mesh):
    # a group over rows and columns (whole sticks of 64 float16 per column tile at the source)
    p = _tiled(rows=cm * a, cols=64 * cn * b, counts=((cm, ("m",)), (cn, ("n",))))
    u = unroll(search(p, parse(mesh)))
    for dev in u.devices:
        (carry,) = dev.tiling
        assert [lv.count for lv in carry.carried.loops] == [cm, cn] and carry.changes == ()
    assert all(c.ok for c in oracle.check(u, planned=True))


def test_a_split_whose_tiles_would_cut_sticks_the_op_writes_is_not_offered():
    # 256 columns in 4 tiles: 64 each at the source, whole sticks of 64 float16; split over 2
    # devices, 128 columns in 4 tiles of 32 would cut sticks, so the columns stay whole
    p = _tiled(rows=64, cols=256, counts=((4, ("n",)),))
    plan = propagate(p, parse("tp=2"), annotations={"a": COLS})
    assert "n" not in plan.strategy("add").split_map
    u = unroll(plan)
    assert all(c.ok for c in oracle.check(u, planned=True))
    wide = _tiled(rows=64, cols=512, counts=((4, ("n",)),))  # 256 per device: tiles of 64
    assert propagate(wide, parse("tp=2"), annotations={"a": COLS}).strategy("add").label == \
        "n:tp"
