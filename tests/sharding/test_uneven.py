"""One rule for uneven cuts: devices cut a dim as cores cut their work (10 over 4 is 3, 3, 2, 2),
through the same function; uneven meshes run exactly in the reference executor, and under
DTensor on gloo, where DTensor's own ``Shard`` would cut as ``torch.chunk`` (3, 3, 3, 1)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from apportion.frontend.json_format import from_dict
from apportion.plans.plan import OpPlan
from apportion.plans.views import core_slices, dim_slices
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.sharding import oracle
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.rules import local_ranges, make_strategy
from apportion.sharding.spec import Sharding, chunk, chunk_agrees, dim_block, torch_chunk
from apportion.sharding.unroll import unroll
from tests.sharding.programs import hard_inputs, reduction

S = Sharding
ROWS = S((("tp",), ()))
COLS = S(((), ("tp",)))
REP = S(((), ()))


# --- the rule ---------------------------------------------------------------------------------

@given(st.integers(1, 200), st.integers(1, 12), st.integers(1, 64))
def test_a_device_cut_is_the_core_cut_in_units_of_one_element(n, parts, per):
    assert list(chunk(n, parts)) == dim_slices(n, 1, parts)
    # cores cut whole units of per elements: n units over parts cores is n elements over
    # parts devices, scaled
    assert dim_slices(n * per, per, parts) == [(lo * per, hi * per) for lo, hi in
                                               chunk(n, parts)]


@given(st.integers(1, 60), st.integers(1, 8), st.integers(1, 8))
def test_an_op_split_over_devices_computes_what_the_same_split_over_cores_would(n, a, b):
    """A dim of an op split over mesh axes (a, b) cuts as a core plan splitting it a ways and
    each part b ways: the same function, so the same blocks."""
    assume(n >= a * b)
    p = from_dict({"name": "e", "inputs": ["x"], "outputs": ["y"],
                   "tensors": {"x": {"shape": [n, 3], "dtype": "float32"}},
                   "ops": [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}]})
    mesh = parse(f"a={a},b={b}")
    s = make_strategy(p.ops[0], p, mesh, {"i": ("a", "b")})
    devices = sorted({local_ranges(p.ops[0], s, mesh, mesh.coords(d))["i"]
                      for d in range(mesh.devices)})
    outer = core_slices(OpPlan("e", "exp", "pointwise", (("i", n),), (), (), (("i", 1),),
                               (("i", a),), 1.0, 0.0, ()))
    cores = sorted((lo + c, lo + d) for box in outer for lo, hi in [box["i"]]
                   for c, d in dim_slices(hi - lo, 1, b))
    assert devices == cores


@given(st.integers(1, 60), st.integers(1, 9))
def test_torch_chunk_agrees_exactly_where_the_remainder_is_zero_or_one_short(n, k):
    agree = chunk(n, k) == torch_chunk(n, k)
    assert agree == (n % k in (0, k - 1) or n < k)  # at most the last shard is one short
    assert chunk_agrees(n, ("t",), {"t": k}) == agree


def test_ten_over_four_is_three_three_two_two_for_cores_and_devices():
    assert dim_slices(10, 1, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)] == list(chunk(10, 4))
    assert [dim_block(10, ("tp",), {"tp": i}, {"tp": 4}) for i in range(4)] == \
        [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert torch_chunk(10, 4) == ((0, 3), (3, 6), (6, 9), (9, 10))


def test_a_split_that_torch_chunk_would_leave_empty_is_offered_now():
    # 5 rows over 4: torch.chunk gives 2, 2, 1, 0 (a device with nothing); the rule 2, 1, 1, 1
    p = one("exp", [5, 4])
    s = make_strategy(p.ops[0], p, parse("tp=4"), {"i": "tp"})
    assert [s.out.block((5, 4), {"tp": i}, {"tp": 4})[0] for i in range(4)] == \
        [(0, 2), (2, 3), (3, 4), (4, 5)]


# --- uneven meshes run -----------------------------------------------------------------------

def one(fn: str, shape: list[int], out: str = "y[i,j]") -> object:
    return from_dict({"name": fn, "inputs": ["x"], "outputs": ["y"],
                      "tensors": {"x": {"shape": shape, "dtype": "float32"}},
                      "ops": [{"name": "e", "op": fn, "out": out, "ins": ["x[i,j]"]}]})


def mlp(t: int = 10, n: int = 12, f: int = 10) -> object:
    return from_dict({
        "name": "mlp", "inputs": ["x", "w1", "w2"], "outputs": ["y"],
        "tensors": {"x": {"shape": [t, n], "dtype": "float32"},
                    "w1": {"shape": [n, f], "dtype": "float32"},
                    "w2": {"shape": [f, n], "dtype": "float32"}},
        "ops": [{"name": "up", "op": "matmul", "out": "h[t,f]", "ins": ["x[t,n]", "w1[n,f]"]},
                {"name": "act", "op": "gelu", "out": "a[t,f]", "ins": ["h[t,f]"]},
                {"name": "down", "op": "matmul", "out": "y[t,n]", "ins": ["a[t,f]",
                                                                          "w2[f,n]"]}]})


def kmm(m: int = 10, k: int = 10, n: int = 6) -> object:
    return from_dict({
        "name": "kmm", "inputs": ["x", "w"], "outputs": ["y"],
        "tensors": {"x": {"shape": [m, k], "dtype": "float32"},
                    "w": {"shape": [k, n], "dtype": "float32"}},
        "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}]})


#: plans over uneven meshes, by device count; each says which collectives it needs
UNEVEN = {
    4: {
        # the hidden dim of 10 over 4 (3, 3, 2, 2): columns, then gathered (at these sizes)
        "megatron 10 over 4": lambda: propagate(mlp(), parse("tp=4"), annotations={
            "x": REP, "w1": COLS, "w2": ROWS, "y": REP}),
        # rows of 10 over 4 end gathered
        "data-parallel 10 over 4": lambda: propagate(mlp(), parse("tp=4"),
                                                     annotations={"x": ROWS}),
        # a split k reduce-scattered onto 10 rows
        "k-split reduce-scatter": lambda: propagate(kmm(), parse("tp=4"), annotations={
            "x": COLS, "w": ROWS, "y": ROWS}),
        # rows of 10 to columns of 6: an all-to-all between uneven cuts
        "all-to-all": lambda: propagate(one("exp", [10, 6]), parse("tp=4"), annotations={
            "x": ROWS, "y": COLS}),
        # replicated to rows: a local cut
        "slice": lambda: propagate(one("exp", [10, 6]), parse("tp=4"), annotations={
            "x": REP, "y": ROWS}),
        # a mean over 10 columns split 3, 3, 2, 2: each part scaled by its own share
        "mean split": lambda: propagate(reduction("mean", (6, 10)), parse("tp=4"),
                                        annotations={"x": COLS}),
        # an argmax's keys reduce-scattered onto 6 rows (2, 2, 1, 1) and unpacked
        "argmax reduce-scatter": lambda: propagate(reduction("argmax", (6, 10)), parse("tp=4"),
                                                   annotations={"x": COLS, "r": S((("tp",),))}),
        # a 2x2 mesh nesting both axes on one dim of 10 (5 + 5, then 3 + 2)
        "2x2 nested": lambda: propagate(one("exp", [10, 6]), parse("a=2,b=2"), annotations={
            "x": S((("a", "b"), ())), "y": REP}),
        # a 2x2 mesh, rows over a (7: 4 + 3) and columns over b (5: 3 + 2)
        "2x2 rows and columns": lambda: propagate(one("exp", [7, 5]), parse("a=2,b=2"),
                                                  annotations={"x": S((("a",), ("b",))),
                                                               "y": REP}),
    },
    3: {
        # the hidden dim of 10 over 3 (4, 3, 3): columns, then rows reduce-scattered
        "megatron 10 over 3": lambda: propagate(mlp(), parse("tp=3"), annotations={
            "x": REP, "w1": COLS, "w2": ROWS, "y": ROWS}),
        "argmax all-reduce": lambda: propagate(reduction("argmax", (6, 10)), parse("tp=3"),
                                               annotations={"x": COLS}),
    },
    6: {
        # rows of 10 over a (4, 3, 3), k over b: partial sums all-reduced over b while the
        # rows stay cut unevenly (this rank's own all-reduce)
        "3x2 rows and k": lambda: propagate(kmm(), parse("a=3,b=2"), annotations={
            "x": S((("a",), ("b",))), "w": S((("b",), ())), "y": S((("a",), ()))}),
    },
}
#: the collectives each plan needs
COLLECTIVES = {"megatron 10 over 4": "2 all_gather", "data-parallel 10 over 4": "none",
               "k-split reduce-scatter": "1 reduce_scatter", "all-to-all": "1 all_to_all",
               "slice": "none", "mean split": "1 all_reduce",
               "argmax reduce-scatter": "1 reduce_scatter", "2x2 nested": "2 all_gather",
               "2x2 rows and columns": "2 all_gather", "megatron 10 over 3": "1 reduce_scatter",
               "argmax all-reduce": "1 all_reduce", "3x2 rows and k": "1 all_reduce"}
INPUTS = {"argmax reduce-scatter": hard_inputs, "argmax all-reduce": hard_inputs}
ALL = {name: make for plans in UNEVEN.values() for name, make in plans.items()}


def _inputs(name, program):
    return INPUTS.get(name, lambda p: random_inputs(p, 0))(program)


def _cut_unlike_torch(plan) -> bool:
    """Whether some operand of some op is cut unlike torch.chunk on some device."""
    sizes = {a.name: a.size for a in plan.mesh.axes}
    return any(not chunk_agrees(n, axes, sizes)
               for op, o in zip(plan.program.ops, plan.ops, strict=True)
               for acc, s in zip(op.operands, (*o.strategy.ins, o.strategy.out), strict=True)
               for n, axes in zip(plan.program.tensor(acc.tensor).shape, s.dims, strict=True))


def test_the_uneven_plans_cut_tensors_where_torch_chunk_would_cut_otherwise():
    # on a 2x2 mesh every cut is in two, where both rules agree: those run through DTensor's
    # own placements, uneven as they are
    unlike = {name for name, make in ALL.items() if _cut_unlike_torch(make())}
    assert unlike == set(ALL) - {"2x2 nested", "2x2 rows and columns"}


@pytest.mark.parametrize("name", list(ALL))
def test_uneven_meshes_run_exactly_in_the_reference(name):
    plan = ALL[name]()
    assert plan.collectives_text() == COLLECTIVES[name]
    u = unroll(plan)
    xs = _inputs(name, plan.program)
    want = run_unplanned(plan.program, xs)
    got = oracle.run(u, xs)
    checks = compare(want, got, plan.program)
    assert all(c.ok for c in checks), checks
    # every device holds its cut of every input as the cores' rule cuts it
    sizes = {a.name: a.size for a in plan.mesh.axes}
    for dev in u.devices:
        for tensor, _, block in dev.inputs:
            s = dict(plan.inputs)[tensor]
            assert block == tuple(dim_block(n, axes, dict(dev.coords), sizes) for n, axes in
                                  zip(plan.program.tensor(tensor).shape, s.dims, strict=True))
    if plan.program.tensor("y" if "y" in plan.program.tensor_map else "r").dtype == "int64" \
            or name in ("all-to-all", "slice", "2x2 nested", "2x2 rows and columns"):
        out = plan.program.outputs[0]
        assert np.array_equal(got[out], want[out])  # picks and elementwise ops: exact


@pytest.mark.distributed
@pytest.mark.parametrize("world", [3, 4, pytest.param(6, marks=pytest.mark.slow)])
def test_uneven_meshes_run_under_dtensor_on_gloo_and_match_the_reference(world):
    """Each device count in one launch (6 processes: slow)."""
    pytest.importorskip("torch")
    from apportion.backends.dtensor.runner import run_mesh_many
    from apportion.sharding.lower import lower_plan

    plans = {name: make() for name, make in UNEVEN[world].items()}
    inputs = [_inputs(name, p.program) for name, p in plans.items()]
    runs = run_mesh_many([lower_plan(p) for p in plans.values()], inputs, timeout_s=180,
                         device="cpu")
    for (name, plan), xs, run in zip(plans.items(), inputs, runs, strict=True):
        want = run_unplanned(plan.program, xs)
        checks = compare(want, run.outputs, plan.program)
        assert all(c.ok for c in checks), (name, checks)
        assert run.placement_checks >= len(plan.ops) + len(plan.program.inputs), name
        if plan.program.tensor(plan.program.outputs[0]).dtype == "int64":
            out = plan.program.outputs[0]
            assert np.array_equal(run.outputs[out], want[out]), name  # ties, NaNs as numpy
