"""Symbolic loop counts in work division: tiles planned at the count's bound or smallest value.

A count given as a name (``"T"``) with a lower bound ``min`` is planned at the smallest value it
may take (``min``, or the first value above it dividing the tiled dims into whole sticks); a
count without bounds at 1, the whole range per iteration. Each case plans, emits the LoopSpec
program and the loop bundle, and runs with check at several run-time counts.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.frontend.json_format import dumps, loads
from apportion.ir.program import LoopLevel
from apportion.passes.coarse_tile import coarse_tile
from apportion.passes.layouts import layouts
from apportion.plans.serialize import from_json, to_json
from apportion.report.tables import group_lines
from apportion.target import spyre
from tests.helpers import program

ROWS, COLS = 2048, 1024


def softmax(loop: dict) -> ap.Program:
    """The softmax over rows of [2048, 1024] float16, one loop level over the rows."""
    ops = [{"name": "rowmax", "op": "max", "out": "mx[m,0]", "ins": ["x[m,n]"]},
           {"name": "shift", "op": "sub", "out": "d[m,n]", "ins": ["x[m,n]", "mx[m,0]"]},
           {"name": "exp", "op": "exp", "out": "e[m,n]", "ins": ["d[m,n]"]},
           {"name": "rowsum", "op": "sum", "out": "s[m,0]", "ins": ["e[m,n]"]},
           {"name": "norm", "op": "div", "out": "y[m,n]", "ins": ["e[m,n]", "s[m,0]"]}]
    return program({"x": ([ROWS, COLS], "float16")}, ops, ["y"],
                   tiling=[{"ops": [o["name"] for o in ops], "loops": [loop]}])


def checked(planned: ap.PlannedProgram, counts: list[int]) -> None:
    planned.loopspec()
    planned.bundle_mlir()
    for t in counts:
        checks = planned.check(params={"T": t})
        assert all(c.ok for c in checks), (t, checks)


def test_without_bounds_the_whole_range_is_planned_and_the_report_says_so():
    p = ap.plan(softmax({"count": "T", "dims": ["m"]}), spyre(cores=32))
    assert p.op("exp").sizes == {"m": ROWS, "n": COLS}
    assert p.groups[0].symbolic == (("T", 1, None, 1),)
    assert "T planned at its smallest value 1" in group_lines(p.plan)[0]
    bounded = ap.plan(softmax({"count": "T", "dims": ["m"], "min": 8}), spyre(cores=32))
    # the whole range per iteration asks 8 times the scratchpad of tiles planned at T = 8
    assert p.groups[0].working_set_bytes == 8 * bounded.groups[0].working_set_bytes


def test_a_lower_bound_plans_the_tile_at_it_and_tiles_stay_on_chip():
    p = ap.plan(softmax({"count": "T", "dims": ["m"], "min": 8, "max": 64}), spyre(cores=32))
    assert p.op("exp").sizes == {"m": ROWS // 8, "n": COLS}
    assert p.groups[0].symbolic == (("T", 8, 64, 8),)
    assert "T planned at its bound min=8 (runs take 8 <= T <= 64)" in group_lines(p.plan)[0]
    assert set(p.groups[0].lx_tensors) >= {"d", "e"}
    checked(p, [8, 16, 64])


def test_counts_below_the_planned_value_or_above_the_bound_are_refused():
    p = ap.plan(softmax({"count": "T", "dims": ["m"], "min": 8, "max": 64}), spyre(cores=32))
    with pytest.raises(ExecutionError, match=r"'T' = 4 is below 8, the value loop group"):
        p.run(params={"T": 4})
    with pytest.raises(ExecutionError, match=r"'T' = 128 is above its bound max 64"):
        p.run(params={"T": 128})


def test_the_smallest_value_is_the_first_from_min_dividing_into_whole_sticks():
    # 1024 rows, a count of at least 3: 3 does not divide them, 4 does
    prog = program({"x": ([1024, 128], "float16")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]}], ["y"],
                   tiling=[{"ops": ["e"], "loops": [{"count": "T", "dims": ["m"], "min": 3}]}])
    p = ap.plan(prog, spyre(cores=8))
    assert p.groups[0].symbolic == (("T", 3, None, 4),) and p.op("e").sizes["m"] == 256
    assert "T planned at 4, its smallest value from min=3" in group_lines(p.plan)[0]
    checked(p, [4, 8, 1024])


def test_a_stick_dim_count_divides_whole_sticks():
    # 5 sticks of 64 columns: from min 2 the first count dividing them is 5
    prog = program({"x": ([8, 320], "float16")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]}], ["y"],
                   tiling=[{"ops": ["e"], "loops": [{"count": "T", "dims": ["n"], "min": 2}]}])
    t = coarse_tile(prog, layouts(prog, spyre()).ops, 65535)
    assert t.groups[0].symbolic == (("T", 2, None, 5),) and t.tile("e").size_map["n"] == 64


def test_no_value_in_the_bounds_is_an_error_naming_the_count():
    prog = program({"x": ([8, 320], "float16")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]}], ["y"],
                   tiling=[{"ops": ["e"], "loops": [{"count": "T", "dims": ["n"], "min": 2,
                                                     "max": 4}]}])
    with pytest.raises(PlanningError, match=r"count 'T' at level 0 has no value in 2\.\.4"):
        ap.plan(prog, spyre())


def test_bounds_belong_to_symbolic_counts_and_are_checked():
    with pytest.raises(ProgramError, match="bounds .* belong to a symbolic count"):
        LoopLevel(4, ("m",), min=2)
    with pytest.raises(ProgramError, match="max 2 is below min 4"):
        LoopLevel("T", ("m",), min=4, max=2)
    with pytest.raises(ProgramError, match="min must be an int >= 1"):
        LoopLevel("T", ("m",), min=0)


def test_program_format_and_builder_carry_the_bounds():
    prog = softmax({"count": "T", "dims": ["m"], "min": 8, "max": 64})
    assert loads(dumps(prog)) == prog
    assert json.loads(dumps(prog))["tiling"][0]["loops"][0] == {
        "count": "T", "dims": ["m"], "min": 8, "max": 64}
    M, N = ap.dim("M", 512), ap.dim("N", 256)
    with ap.program("b") as b:
        x = b.input("x", [M, N], "float32")
        with ap.hint(slices={M: "T"}, min=4):
            y = ap.exp(x)
        b.output(y)
    assert b.program.tiling[0].loops[0] == LoopLevel("T", ("M",), min=4)
    with pytest.raises(ProgramError, match="min and max bound a symbolic count"):
        ap.hint(slices={M: 2}, min=4)
    checked(ap.plan(b, spyre(cores=4)), [4, 8])


def test_plan_json_round_trips_the_symbolic_counts():
    p = ap.plan(softmax({"count": "T", "dims": ["m"], "min": 8}), spyre(cores=32))
    doc = json.loads(p.to_json())
    assert doc["groups"][0]["symbolic"] == [{"count": "T", "min": 8, "max": None,
                                             "planned": 8}]
    assert from_json(to_json(p.plan)) == p.plan


def test_loopspec_launches_the_planned_tile():
    p = ap.plan(softmax({"count": "T", "dims": ["m"], "min": 8}), spyre(cores=32))
    loop = p.loopspec()[0]
    assert loop.count == "T"
    exp = next(s for s in loop.body if s.name == "exp")
    assert exp.iteration_space["m"] == (ROWS // 8, 32)
    norm = next(s for s in loop.body if s.name == "norm")  # y moves through device memory
    assert "floordiv T" in "".join(str(a.tile_strides) for a in norm.args)


@st.composite
def bounded(draw):
    rows = draw(st.sampled_from([8, 12, 16, 24, 32]))
    lo = draw(st.integers(1, 6))
    return rows, lo, draw(st.integers(1, 8))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=30)
@given(bounded(), st.data())
def test_every_count_from_the_planned_value_runs_exactly(case, data):
    rows, lo, cores = case
    prog = program({"x": ([rows, 128], "float32"), "b": ([rows, 1], "float32")},
                   [{"name": "s", "op": "sum", "out": "r[m,0]", "ins": ["x[m,n]"]},
                    {"name": "a", "op": "add", "out": "y[m,n]", "ins": ["x[m,n]", "r[m,0]"]}],
                   ["y"],
                   tiling=[{"ops": ["s", "a"], "loops": [{"count": "T", "dims": ["m"],
                                                          "min": lo}]}])
    try:
        p = ap.plan(prog, spyre(cores=cores))
    except PlanningError:
        assert not any(rows % c == 0 for c in range(lo, rows + 1))
        return
    planned = p.groups[0].symbolic[0][3]
    assert planned >= lo and rows % planned == 0
    assert p.op("a").sizes["m"] == rows // planned
    ok = [t for t in range(planned, rows + 1) if rows % t == 0]
    t = data.draw(st.sampled_from(ok))
    event(f"planned {'at min' if planned == lo else 'above min'}")
    checks = p.check(params={"T": t})
    assert all(c.ok for c in checks), checks
