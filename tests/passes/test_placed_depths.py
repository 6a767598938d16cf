"""Ops placed by the planner at the loop depth their dims allow (pass ``coarse_tile``,
``placed_depths``): the reference design's working-set-reduction example, a matmul tiled over M
and K followed by an add that belongs to the M loop, and the rules around it.

Each case that plans runs the planned program against the unplanned one.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError, ProgramError
from apportion.passes.coarse_tile import coarse_tile, placed_depths
from apportion.plans.plan import LoopInfo
from apportion.plans.serialize import from_json, to_json
from apportion.schedule.loopspec_values import OpSpec
from apportion.target import spyre
from tests.helpers import program

MK = [{"count": 2, "dims": ["m"]}, {"count": 4, "dims": ["k"]}]


def matmul_then(readers: list[dict], loops=MK, depths=None, extra=None, out="y"):
    """h = x @ w over [256, 1024] x [1024, 512] float16, then ``readers``, in one group."""
    tensors = {"x": ([256, 1024], "float16"), "w": ([1024, 512], "float16"),
               "b": ([256, 512], "float16"), **(extra or {})}
    ops = [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
           *readers]
    group = {"ops": [o["name"] for o in ops], "loops": loops,
             **({"depths": depths} if depths else {})}
    return program(tensors, ops, [out], tiling=[group])


ADD = {"name": "add", "op": "add", "out": "y[m,n]", "ins": ["h[m,n]", "b[m,n]"]}


def checked(prog, target=None) -> ap.PlannedProgram:
    p = ap.plan(prog, target or spyre(cores=32))
    p.loopspec()
    p.bundle_mlir()
    checks = p.check()
    assert all(c.ok for c in checks), checks
    assert from_json(to_json(p.plan)) == p.plan
    return p


def names(specs) -> list:
    """The nest as names: an op's name, or [count, body] for a loop."""
    return [s.name if isinstance(s, OpSpec) else [s.count, names(s.body)] for s in specs]


def test_an_add_after_a_matmul_tiled_over_m_and_k_runs_once_per_m_tile_after_the_k_loop():
    p = checked(matmul_then([ADD]))
    assert p.plan.op("add").loop == LoopInfo((0,), (2,), (("m",),))
    assert p.plan.op("mm").loop == LoopInfo((0, 0), (2, 4), (("m",), ("k",)))
    assert p.op("add").sizes == {"m": 128, "n": 512}
    assert names(p.loopspec()) == [[2, ["mm.init", [4, ["mm"]], "mm.finish", "add"]]]


def test_the_placed_add_runs_in_the_torch_executor_too():
    pytest.importorskip("torch")
    p = ap.plan(matmul_then([ADD]), spyre(cores=8))
    checks = p.check(backend="torch")
    assert all(c.ok for c in checks), checks


def test_a_chain_after_the_reduction_follows_it_out_of_the_loop():
    readers = [ADD, {"name": "act", "op": "relu", "out": "r[m,n]", "ins": ["y[m,n]"]}]
    p = checked(matmul_then(readers, out="r"))
    assert [len(p.plan.op(n).loop.count) for n in ("mm", "add", "act")] == [2, 1, 1]
    assert names(p.loopspec()) == [[2, ["mm.init", [4, ["mm"]], "mm.finish", "add", "act"]]]


def test_a_pinned_depth_is_kept_and_a_pinned_depth_inside_the_loop_is_refused():
    p = checked(matmul_then([ADD], depths={"add": 1}))
    assert p.plan.op("add").loop.count == (2,)
    with pytest.raises(PlanningError, match=r"op 'add' reads 'h' inside the loop over 'k' "
                                            r"\(loop level 1\).*put 'add' at a lesser depth"):
        ap.plan(matmul_then([ADD], depths={"add": 2}), spyre(cores=32))


def test_a_reader_with_a_dim_of_the_reduction_loop_cannot_leave_it_and_says_why():
    # o[m,k] = h[m,n] @ v[n,k]: o has k, tiled by the K loop, so it cannot run after it
    reader = {"name": "mm2", "op": "matmul", "out": "o[m,k]", "ins": ["h[m,n]", "v[n,k]"]}
    prog = matmul_then([reader], extra={"v": ([512, 1024], "float16")}, out="o")
    with pytest.raises(PlanningError, match=r"op 'mm2' reads 'h' inside the loop over 'k'.*"
                                            r"'mm2' has dim 'k', tiled inside that loop, so it "
                                            r"cannot run after it; move it out of the group"):
        ap.plan(prog, spyre(cores=32))


def test_a_one_level_reduction_loop_read_inside_gives_no_advice_to_lessen_the_depth():
    prog = program({"x": ([64, 256], "float32")},
                   [{"name": "r", "op": "sum", "out": "s[m,0]", "ins": ["x[m,n]"]},
                    {"name": "u", "op": "exp", "out": "e[m,0]", "ins": ["s[m,0]"]}], ["e"],
                   tiling=[{"ops": ["r", "u"], "loops": [{"count": 4, "dims": ["n"]}]}])
    with pytest.raises(PlanningError, match=r"complete only after that loop; move it out") as e:
        coarse_tile(prog)
    assert "lesser depth" not in str(e.value)


def test_a_trailing_op_without_the_inner_dims_leaves_the_inner_loop():
    # g reads only rows: it computes each row tile once, not once per column tile
    prog = program({"x": ([64, 256], "float32"), "c": ([64], "float32")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                    {"name": "g", "op": "neg", "out": "g[m]", "ins": ["c[m]"]}], ["y", "g"],
                   tiling=[{"ops": ["e", "g"], "loops": [{"count": 2, "dims": ["m"]},
                                                         {"count": 4, "dims": ["n"]}]}])
    p = checked(prog, spyre(cores=4))
    assert p.plan.op("g").loop == LoopInfo((0,), (2,), (("m",),))
    assert names(p.loopspec()) == [[2, [[4, ["e"]], "g"]]]


def test_an_op_between_deeper_neighbours_stays_in_their_loop():
    # leaving the inner loop would split the loop e and f share in two
    prog = program({"x": ([64, 256], "float32"), "c": ([64], "float32")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                    {"name": "g", "op": "neg", "out": "g[m]", "ins": ["c[m]"]},
                    {"name": "f", "op": "neg", "out": "z[m,n]", "ins": ["y[m,n]"]}],
                   ["z", "g"],
                   tiling=[{"ops": ["e", "g", "f"], "loops": [{"count": 2, "dims": ["m"]},
                                                              {"count": 4, "dims": ["n"]}]}])
    assert placed_depths(prog.tiling[0], list(prog.ops)) == {"e": 2, "g": 2, "f": 2}
    p = checked(prog, spyre(cores=4))
    assert names(p.loopspec()) == [[2, [[4, ["e", "g", "f"]]]]]


def test_a_forced_reader_in_the_middle_makes_two_sibling_inner_loops():
    # add must leave the K loop; the row-tiled exp after it tiles k again in a loop of its own
    readers = [ADD, {"name": "e", "op": "exp", "out": "z[m,k]", "ins": ["x[m,k]"]}]
    p = checked(matmul_then(readers, out="z"), spyre(cores=8))
    assert names(p.loopspec()) == [[2, ["mm.init", [4, ["mm"]], "mm.finish", "add",
                                        [4, ["e"]]]]]


def test_an_op_with_no_dim_of_any_level_stays_in_the_outer_level():
    prog = program({"x": ([64, 256], "float32"), "c": ([8], "float32")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                    {"name": "g", "op": "neg", "out": "g[p]", "ins": ["c[p]"]}], ["y", "g"],
                   tiling=[{"ops": ["e", "g"], "loops": [{"count": 2, "dims": ["m"]},
                                                         {"count": 4, "dims": ["n"]}]}])
    assert placed_depths(prog.tiling[0], list(prog.ops)) == {"e": 2, "g": 1}
    checked(prog, spyre(cores=4))


# --- properties --------------------------------------------------------------------------------

@st.composite
def groups(draw):
    """A matmul or row sum whose reduction a loop may tile, followed by 1 to 3 ops over rows,
    rows and columns or the reduction dim, in a group of one to three levels."""
    m, n, k = 64, 64, 128
    tensors = {"x": ([m, k], "float32"), "w": ([k, n], "float32"), "b": ([m, n], "float32"),
               "c": ([m], "float32")}
    ops = [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]}]
    outs = []
    for i in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["bias", "relu", "rows", "xk"]))
        if kind == "bias":
            ops.append({"name": f"o{i}", "op": "add", "out": f"t{i}[m,n]",
                        "ins": ["h[m,n]", "b[m,n]"]})
        elif kind == "relu":
            ops.append({"name": f"o{i}", "op": "relu", "out": f"t{i}[m,n]", "ins": ["h[m,n]"]})
        elif kind == "rows":
            ops.append({"name": f"o{i}", "op": "neg", "out": f"t{i}[m]", "ins": ["c[m]"]})
        else:
            ops.append({"name": f"o{i}", "op": "exp", "out": f"t{i}[m,k]", "ins": ["x[m,k]"]})
        outs.append(f"t{i}")
    pool = [{"count": 2, "dims": ["m"]}, {"count": 2, "dims": ["k"]}, {"count": 2, "dims": ["n"]}]
    loops = draw(st.permutations(pool))[:draw(st.integers(1, 3))]
    prog = program(tensors, ops, outs, tiling=[{"ops": [o["name"] for o in ops],
                                                 "loops": loops}])
    return prog, draw(st.integers(1, 8))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40, deadline=None)
@given(groups())
def test_every_placement_that_plans_runs_exactly_and_within_its_dims(case):
    prog, cores = case
    group = prog.tiling[0]
    depths = placed_depths(group, list(prog.ops))
    for op in prog.ops:
        levels = [k + 1 for k, lv in enumerate(group.loops) if set(lv.dims) & set(op.sizes)]
        # never deeper than its pin, never shallower than its dims allow
        assert max(levels, default=1) <= depths[op.name] <= len(group.loops)
    try:
        p = ap.plan(prog, dataclasses.replace(spyre(cores=cores)))
    except (PlanningError, ProgramError) as e:
        event(f"refused: {str(e).split(';')[0][-40:]}")
        return
    event(f"depths {sorted(set(depths.values()))}")
    for op in prog.ops:
        assert len(p.plan.op(op.name).loop.count) >= depths[op.name]
    p.loopspec()
    checks = p.check()
    assert all(c.ok for c in checks), checks
