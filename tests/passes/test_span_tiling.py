"""Tests of pass span_tiling: a counted loop of last resort where no split fits the span limit.

Each case plans, emits the LoopSpec program and the loop bundle, and runs the plan in simulated
memory against the unplanned program. A small span limit keeps the tensors small.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError
from apportion.frontend.json_format import loads
from apportion.passes.layouts import layouts
from apportion.passes.pipeline import plan
from apportion.passes.span_tiling import choose_loop, fits, span_tiling
from apportion.passes.strategy import Greedy, parse_strategy
from apportion.plans.serialize import from_json, to_json
from apportion.target import spyre
from tests.helpers import program

#: the issue's [1, 8195, 256, 64] float16 tensor (256.1 MiB) scaled down: [1, 35, 128, 64]
#: float16 is 560 KiB against a 512 KiB limit, and 35 rows have no even split on 4 cores
LIMIT = 512 * 1024


def tiny(cores: int = 4, limit: int = LIMIT):
    return dataclasses.replace(spyre(cores=cores), span_limit=limit)


def big(rows: int = 35, op: str = "exp"):
    return program({"x": ([1, rows, 128, 64], "float16")},
                   [{"name": "e", "op": op, "out": "y[a,b,c,d]", "ins": ["x[a,b,c,d]"]}], ["y"])


def planned_and_checked(prog, target, strategy):
    """Plan, emit LoopSpec and bundle (verified MLIR), run with check; the PlannedProgram."""
    p = ap.plan(prog, target, strategy=strategy)
    p.loopspec()
    p.bundle_mlir()
    checks = p.check()
    assert all(c.ok for c in checks), checks
    return p


def test_the_issue_shape_greedy_tiles_the_rows_balanced_splits_them_unevenly():
    p = loads(json.dumps({"name": "big", "tensors": {"x": {"shape": [1, 8195, 256, 64],
                                                            "dtype": "float16"}},
                          "inputs": ["x"], "outputs": ["y"],
                          "ops": [{"name": "e", "op": "exp", "out": "y[a,b,c,d]",
                                   "ins": ["x[a,b,c,d]"]}]}))
    g = plan(p, spyre(cores=4), "greedy")
    assert g.op("e").loop.count == (5,) and g.op("e").loop.tiled_dims == (("b",),)
    assert g.op("e").sizes["b"] == 1639 and g.groups[0].added == "span"
    assert max(s for _, s in g.op("e").span_bytes) <= spyre().span_limit
    b = plan(p, spyre(cores=4), "balanced")
    assert b.op("e").loop is None and not b.groups and not b.op("e").is_even("b")


def test_greedy_loop_plans_emits_and_runs():
    p = planned_and_checked(big(), tiny(), "greedy")
    assert p.op("e").loop.count == (5,) and p.groups[0].added == "span"
    assert p.op("e").cores == 4  # each iteration's tile is divided over every core
    text = p.bundle_mlir()
    assert "scf.for" in text and "e.kernel" in text


def test_balanced_finds_an_uneven_split_and_adds_no_loop():
    p = planned_and_checked(big(), tiny(), "balanced")
    assert not p.groups and not p.op("e").is_even("b")


@pytest.mark.parametrize("strategy", ["greedy", "balanced"])
def test_one_core_loops_under_both_strategies(strategy):
    p = planned_and_checked(big(), tiny(cores=1), strategy)
    assert p.op("e").loop.count == (5,) and p.groups[0].added == "span"  # 35 = 5 x 7


def test_the_smallest_count_that_fits_is_chosen():
    prog, target = big(rows=36), tiny(cores=1)
    lay = layouts(prog, target)
    added = span_tiling(prog, target, lay, Greedy()).added["e"]
    assert (added.dim, added.count) == ("b", 2)
    # a count of 2 fits: nothing smaller does (1 is the op as given)
    assert not fits(_ctx(prog, target), Greedy())


def _ctx(prog, target):
    from apportion.passes.geometry import OpContext
    lay = layouts(prog, target)
    op = prog.ops[0]
    return OpContext(op, prog, target, lay.ops[op.name], lay.tensors, dict(op.sizes))


def test_a_reduction_dim_is_tiled_when_no_output_dim_helps():
    # the reduction reads 600 KiB in one row: only a loop over k brings it under the limit
    prog = program({"x": ([1, 300 * 1024], "float16")},
                   [{"name": "s", "op": "sum", "out": "y[m,0]", "ins": ["x[m,k]"]}], ["y"])
    p = planned_and_checked(prog, tiny(cores=1), "greedy")
    assert p.op("s").loop.tiled_dims == (("k",),) and p.op("s").loop.count == (2,)
    assert [i.tensor for i in p.groups[0].inits] == ["y"]


def test_matmul_over_the_limit_loops_and_accumulates_correctly():
    prog = program({"x": ([8, 48 * 64], "float16"), "w": ([48 * 64, 128], "float16")},
                   [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
                   ["h"])
    p = planned_and_checked(prog, tiny(cores=1, limit=512 * 1024), "greedy")
    assert p.op("mm").loop is not None and p.groups[0].added == "span"


def test_the_plan_json_says_the_loop_was_added_and_round_trips():
    result = plan(big(), tiny(), "greedy")
    doc = json.loads(to_json(result))
    assert doc["groups"][0]["added"] == "span"
    assert from_json(to_json(result)) == result
    # a program's own group has no "added" key
    own = plan(dataclasses.replace(big(), tiling=result_tiling()), tiny(), "greedy")
    assert "added" not in json.loads(to_json(own))["groups"][0]


def result_tiling():
    from apportion.ir.program import LoopLevel, TilingGroup
    return (TilingGroup(("e",), (LoopLevel(5, ("b",)),)),)


def test_report_names_the_added_loop():
    from apportion.report.tables import group_lines

    line = group_lines(plan(big(), tiny(), "greedy"))[0]
    assert "added by the planner" in line and "5 over b" in line


def test_an_op_no_loop_fits_keeps_the_strategy_error():
    # one row of 600 KiB and a pointwise op: the only dim to tile is the stick dim, whose
    # sticks are one row each way... a loop over n fits; a fallback op cannot loop at all
    prog = program({"x": ([1, 300 * 1024], "float16")},
                   [{"name": "c", "op": "cumsum", "out": "y[m,n]", "ins": ["x[m,n]"]}], ["y"])
    with pytest.raises(PlanningError, match="fallback op cannot be divided"):
        plan(prog, tiny(cores=1), "greedy")


def test_choose_loop_tiles_the_dim_that_shrinks_the_span():
    # Spyre lays a 2-D tensor out sticks first ([k sticks, m, 64]): one row still spans every
    # stick, so a loop over the rows m cannot help and the reduction dim k is tiled
    prog = program({"x": ([2, 300 * 512], "float16")},  # two rows of 300 KiB
                   [{"name": "s", "op": "sum", "out": "y[m,0]", "ins": ["x[m,k]"]}], ["y"])
    assert choose_loop(_ctx(prog, tiny(cores=1)), Greedy(), 65535) == ("k", 2)
    assert choose_loop(_ctx(prog, tiny(cores=1)), Greedy(), 1) is None  # count limit 1


@st.composite
def overflowing(draw):
    """A pointwise op or a row reduction over [a, b, c] whose whole tensor is over the limit."""
    dtype = draw(st.sampled_from(["float16", "float32"]))
    eps = 64 if dtype == "float16" else 32
    a, b = draw(st.integers(1, 6)), draw(st.integers(1, 40))
    c = eps * draw(st.integers(1, 3))
    op = draw(st.sampled_from(["exp", "neg", "sum", "max"]))
    out = "y[i,j,0]" if op in ("sum", "max") else "y[i,j,k]"
    prog = program({"x": ([a, b, c], dtype)},
                   [{"name": "o", "op": op, "out": out, "ins": ["x[i,j,k]"]}], ["y"])
    size = a * b * c * (2 if dtype == "float16" else 4)
    limit = max(128, size // draw(st.integers(2, 9)))
    return prog, dataclasses.replace(spyre(cores=draw(st.integers(1, 6))), span_limit=limit)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40)
@given(overflowing(), st.sampled_from(["greedy", "balanced"]))
def test_plans_with_added_loops_respect_the_limit_and_run_exactly(case, strategy):
    prog, target = case
    try:
        p = ap.plan(prog, target, strategy=strategy)
    except PlanningError:
        # planning refuses only where no split and no single-dim loop fits
        lay = layouts(prog, target)
        assert "o" not in span_tiling(prog, target, lay, parse_strategy(strategy)).added
        return
    o = p.op("o")
    event(f"loop added: {o.loop is not None}")
    assert all(s <= target.span_limit for _, s in o.span_bytes)
    assert (o.loop is not None) == bool(p.groups) and all(g.added == "span" for g in p.groups)
    if o.loop is not None:  # a loop only where the strategy alone finds no split
        assert not fits(_ctx(prog, target), parse_strategy(strategy))
    p.loopspec()
    checks = p.check()
    assert all(c.ok for c in checks), checks


def test_a_loop_of_last_resort_in_a_program_with_run_time_sizes_cuts_a_static_dim():
    """The loop's count divides a static dim at every run-time size, and its tile, planned at
    the largest size, bounds every smaller one (runs of such plans: tests/passes/
    test_symbolic_tiles.py; this one's device memory, 64 GiB at the planning size, is too much
    to simulate)."""
    doc = {"name": "dynbig", "symbols": {"T": {"max": 8388608}},
           "tensors": {"x": {"shape": ["T", 4096], "dtype": "float16"}},
           "inputs": ["x"], "outputs": ["y"],
           "ops": [{"name": "e", "op": "exp", "out": "y[t,j]", "ins": ["x[t,j]"]}]}
    for strategy in ("balanced", "greedy"):
        p = ap.plan(loads(json.dumps(doc)), spyre(cores=32), strategy=strategy)
        assert [g.added for g in p.groups] == ["span"]
        assert p.plan.op("e").loop.tiled_dims == (("j",),)
        assert dict(p.plan.op("e").loop.tile_sizes) == {"t": "T"}
    doc["symbols"]["T"]["max"] = 1048576  # 256 MiB per core: fits without a loop
    p = ap.plan(loads(json.dumps(doc)), spyre(cores=32))
    assert not p.groups and all(c.ok for c in p.check(params={"T": 100}))


def test_an_op_that_fits_only_in_a_loop_over_a_run_time_size_is_refused_with_the_bound():
    doc = {"name": "dynbig", "symbols": {"T": {"max": 8589934592}},
           "tensors": {"x": {"shape": ["T"], "dtype": "float16"}},
           "inputs": ["x"], "outputs": ["y"],
           "ops": [{"name": "e", "op": "exp", "out": "y[t]", "ins": ["x[t]"]}]}
    for strategy in ("balanced", "greedy"):
        with pytest.raises(PlanningError, match=(
                r"op 'e': tensor 'x' .*> limit 268435456.*no loop over its dims of static size "
                r"fits.*never cuts a run-time size.*run-time size 'T' \(dim 't'\) is planned "
                r"at 8589934592; bound it with a max of at most \d+")):
            ap.plan(loads(json.dumps(doc)), spyre(cores=32), strategy=strategy)


def test_a_static_op_of_a_program_with_run_time_sizes_gets_its_loop():
    doc = {"name": "dynbig", "symbols": {"T": {"max": 64}},
           "tensors": {"x": {"shape": ["T", 4096], "dtype": "float16"},
                       "z": {"shape": [1, 8195, 256, 64], "dtype": "float16"}},
           "inputs": ["x", "z"], "outputs": ["y", "w"],
           "ops": [{"name": "e", "op": "exp", "out": "y[t,j]", "ins": ["x[t,j]"]},
                   {"name": "big", "op": "exp", "out": "w[a,b,c,d]", "ins": ["z[a,b,c,d]"]}]}
    p = ap.plan(loads(json.dumps(doc)), spyre(cores=4), strategy="greedy")
    assert p.plan.op("big").loop.count == (5,) and p.plan.op("e").loop is None


# -- part-stick tiles of a dim the op only reads (issue 28) ----------------------------------

#: GPT-2's vocabulary: 50257 = 29 x 1733 float32 words, 1571 sticks of 32 with the last padded
VOCAB = 50257


def vocab_softmax(rows: int):
    """A softmax over [rows, VOCAB] float32, one op per step."""
    return program({"x": ([rows, VOCAB], "float32")},
                   [{"name": "mx", "op": "max", "out": "m[r,0]", "ins": ["x[r,v]"]},
                    {"name": "sb", "op": "sub", "out": "d[r,v]", "ins": ["x[r,v]", "m[r,0]"]},
                    {"name": "ex", "op": "exp", "out": "e[r,v]", "ins": ["d[r,v]"]},
                    {"name": "sm", "op": "sum", "out": "s[r,0]", "ins": ["e[r,v]"]},
                    {"name": "dv", "op": "div", "out": "y[r,v]", "ins": ["e[r,v]", "s[r,0]"]}],
                   ["y"])


def vocab_reduction(fn: str, rows: int):
    return program({"x": ([rows, VOCAB], "float32")},
                   [{"name": "s", "op": fn, "out": "y[r,0]", "ins": ["x[r,v]"]}], ["y"])


@pytest.mark.parametrize("strategy", ["balanced", "greedy"])
def test_a_sum_over_the_full_size_gpt2_vocabulary_loops_over_part_stick_tiles(strategy):
    # 2048 rows of 1571 sticks span 393 MiB on any number of cores: the rows lie inside each
    # stick column, and Spyre cannot split a reduction dim with a padded last stick
    p = plan(vocab_reduction("sum", 2048), spyre(), strategy)
    o = p.op("s")
    assert o.loop.count == (29,) and o.loop.tiled_dims == (("v",),) and o.sizes["v"] == 1733
    assert p.groups[0].added == "span"
    # a tile of 1733 words may start up to 31 into a stick: 56 sticks of 2048 rows
    assert dict(o.span_bytes)["x"] == 56 * 2048 * 128 <= spyre().span_limit


def test_a_softmax_over_the_full_size_gpt2_vocabulary_plans():
    p = plan(vocab_softmax(2048), spyre(), "balanced")
    assert {o.name for o in p.ops if o.loop is not None} == {"mx", "sm"}
    assert all(s <= spyre().span_limit for o in p.ops for _, s in o.span_bytes)


#: the full vocabulary in 2 rows, on a limit that holds the pointwise steps split over 4 cores
#: (393 sticks of 2 rows) but no whole row of it (1571 sticks)
VOCAB_TARGET = dataclasses.replace(spyre(cores=4), span_limit=128 * 1024)


@pytest.mark.parametrize("fn", ["sum", "max", "mean"])
def test_a_reduction_over_the_vocabulary_runs_exactly_in_part_stick_tiles(fn):
    p = planned_and_checked(vocab_reduction(fn, 2), VOCAB_TARGET, "balanced")
    assert p.op("s").loop.count == (29,) and p.op("s").sizes["v"] == 1733


def test_a_softmax_over_the_vocabulary_runs_exactly_with_its_reductions_looped():
    p = planned_and_checked(vocab_softmax(2), VOCAB_TARGET, "balanced")
    assert p.op("mx").loop.count == p.op("sm").loop.count == (29,)
    assert p.op("sb").loop is None and p.op("sb").split_map["v"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "iree", "openmp"])
def test_a_vocabulary_reduction_in_part_stick_tiles_runs_on_every_backend(backend):
    p = ap.plan(vocab_reduction("sum", 2), VOCAB_TARGET)
    checks = p.check(backend=backend)
    assert all(c.ok for c in checks), checks


def test_a_matmul_over_a_padded_k_loops_over_part_stick_tiles():
    prog = program({"x": ([4, VOCAB], "float32"), "w": ([VOCAB, 8], "float32")},
                   [{"name": "mm", "op": "matmul", "out": "h[m,n]",
                     "ins": ["x[m,k]", "w[k,n]"]}], ["h"])
    p = planned_and_checked(prog, tiny(cores=1), "greedy")
    assert p.op("mm").loop.count == (29,) and p.op("mm").loop.tiled_dims == (("k",),)


def test_tiles_of_whole_sticks_are_chosen_where_one_fits():
    # 3 float16 sticks over a 2-stick limit: 3 tiles of one stick fit, and so would 2 tiles of
    # a stick and a half (2 sticks each), which read the middle stick twice
    prog = program({"x": ([1, 3 * 64], "float16")},
                   [{"name": "s", "op": "sum", "out": "y[m,0]", "ins": ["x[m,k]"]}], ["y"])
    target = tiny(cores=1, limit=2 * 128)
    assert choose_loop(_ctx(prog, target), Greedy(), 65535) == ("k", 3)
    assert choose_loop(_ctx(prog, target), Greedy(), 2) == ("k", 2)  # where 3 is over the limit


def test_a_padded_dim_the_op_writes_is_never_cut_inside_a_stick():
    # exp writes y along v: two iterations would write one stick, so no loop is added
    prog = program({"x": ([1, VOCAB], "float32")},
                   [{"name": "e", "op": "exp", "out": "y[r,v]", "ins": ["x[r,v]"]}], ["y"])
    target = dataclasses.replace(spyre(cores=1), span_limit=128 * 1024)
    assert choose_loop(_ctx(prog, target), Greedy(), 65535) is None
    with pytest.raises(PlanningError, match=r"op 'e': tensor 'x' \(dims r=1, v=50257\) spans "
                                            r"201088 bytes per core > limit 131072"):
        plan(prog, target, "greedy")
