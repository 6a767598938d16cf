"""Scratchpad co-planning under pinned splits (``scratchpad.follow_pins``): when the user pins a
softmax's ops, the ops around it are cut like them where that keeps the tensors between on
chip and is not predicted slower, so the max, shifted scores, exponentials, sum and
probabilities all stay in the scratchpad. Each plan runs in simulated memory (each core's
scratchpad its own bytes) against the unplanned program.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError
from apportion.frontend.json_format import loads
from apportion.target import spyre

ROOT = Path(__file__).resolve().parents[2]
SOFTMAX = ("rowmax", "shift", "exp", "rowsum", "norm")
INTERMEDIATES = ("mx", "sh", "e", "den")  # the max, the shifted scores, exp, the sum


def attention(pins: dict[str, int]) -> ap.Program:
    doc = json.loads((ROOT / "examples/attention.json").read_text())
    doc["work_division"] = {n: dict(pins) for n in SOFTMAX}
    return loads(json.dumps(doc))


def on_chip(p: ap.PlannedProgram) -> set[str]:
    return {b.tensor for b in p.plan.buffers if b.space == "lx"}


def checked(prog, strategy="balanced", cores=32) -> ap.PlannedProgram:
    p = ap.plan(prog, spyre(cores=cores), strategy=strategy)
    checks = p.check()
    assert all(c.ok for c in checks), checks
    return p


def test_a_pinned_softmax_keeps_every_intermediate_and_its_neighbours_tensors_on_chip():
    p = checked(attention({"h": 2, "t": 16}))
    # the matmuls around the softmax are cut like it: scores and probabilities stay on chip
    assert {n: p.op(n).split_map for n in ("scores", "pv")} == {
        "scores": {"h": 2, "t": 16, "c": 1, "d": 1}, "pv": {"h": 2, "t": 16, "d": 1, "c": 1}}
    assert {"s", *INTERMEDIATES, "p"} <= on_chip(p)
    assert all(p.op(n).split_map["h"] == 2 and p.op(n).split_map["t"] == 16 for n in SOFTMAX)


def test_work_distribution_alone_cuts_pv_another_way_so_following_keeps_p_on_chip():
    # the same cuts asked of the softmax alone: work distribution cut pv another way
    free = ap.plan(attention({"h": 2, "t": 16}), spyre(cores=32))
    unpinned = ap.plan(loads((ROOT / "examples/attention.json").read_text()), spyre(cores=32))
    assert unpinned.op("pv").split_map != {"h": 2, "t": 16, "d": 1, "c": 1}
    assert free.plan.buffer("p").space == "lx"


def test_a_neighbour_follows_only_where_it_is_not_predicted_slower():
    # 16 cores for the softmax: scores follows (two pinned readers of its output gain), pv
    # would run on half the cores for one tensor's traffic, and keeps its own cut
    p = checked(attention({"h": 4, "t": 4}))
    assert p.op("scores").split_map == {"h": 4, "t": 4, "c": 1, "d": 1}
    assert p.op("pv").split_map["t"] == 8
    assert {"s", *INTERMEDIATES} <= on_chip(p)
    assert p.plan.buffer("p").space == "hbm"


def test_greedy_follows_the_pins_too():
    p = checked(attention({"h": 2, "t": 16}), strategy="greedy")
    assert {"s", *INTERMEDIATES, "p"} <= on_chip(p)


def test_a_plan_without_pins_is_left_as_work_distribution_made_it():
    stages: dict[str, object] = {}
    ap.plan(loads((ROOT / "examples/attention.json").read_text()), spyre(cores=32),
            debug=stages.__setitem__)
    assert "follow_pins" not in stages


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=20, deadline=None)
@given(h=st.sampled_from([1, 2, 4]), t=st.sampled_from([1, 2, 4, 8, 16]),
       cores=st.sampled_from([8, 32]), strategy=st.sampled_from(["balanced", "greedy"]))
def test_any_pinned_softmax_runs_exactly_and_keeps_its_pins(h, t, cores, strategy):
    if h * t > cores:
        return
    try:
        p = ap.plan(attention({"h": h, "t": t}), spyre(cores=cores), strategy=strategy)
    except PlanningError as e:
        event(f"refused: {str(e)[:40]}")
        return
    for n in SOFTMAX:
        assert (p.op(n).split_map["h"], p.op(n).split_map["t"]) == (h, t)
    # the row statistics and exponentials never leave the chip under consistent pins
    assert set(INTERMEDIATES) <= on_chip(p)
    event(f"p on chip: {p.plan.buffer('p').space == 'lx'}")
    checks = p.check()
    assert all(c.ok for c in checks), checks
