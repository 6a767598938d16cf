"""Tests of greedy's rule for a dim the span limit forces to split (the reference's newer rule).

``greedy`` lets a forced minimum grow to any legal factor; ``greedy-multiples`` keeps the older
rule (only multiples of the minimum). Each case plans, emits LoopSpec and bundle, and runs with
check.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError
from apportion.passes.geometry import OpContext
from apportion.passes.layouts import layouts
from apportion.passes.span_reduction import minimum_splits
from apportion.passes.strategy import STRATEGIES
from apportion.passes.work_distribution import greedy
from apportion.target import spyre
from tests.helpers import program


def rows(m: int = 6, n: int = 64, op: str = "exp"):
    return program({"x": ([m, n], "float16")},
                   [{"name": "e", "op": op, "out": "y[m,n]", "ins": ["x[m,n]"]}], ["y"])


def target(cores: int, limit: int):
    return dataclasses.replace(spyre(cores=cores), span_limit=limit)


def planned_and_checked(prog, tgt, strategy):
    p = ap.plan(prog, tgt, strategy=strategy)
    p.loopspec()
    p.bundle_mlir()
    checks = p.check()
    assert all(c.ok for c in checks), checks
    return p


def test_six_rows_on_three_cores_with_a_forced_split_of_two_give_three():
    # [6, 64] float16 spans 768 bytes; a 384-byte limit forces the rows to split in 2
    prog, tgt = rows(), target(3, 384)
    ctx = _ctx(prog, tgt)
    assert minimum_splits(ctx) == {"m": 2, "n": 1}
    new = planned_and_checked(prog, tgt, "greedy")
    old = planned_and_checked(prog, tgt, "greedy-multiples")
    assert new.op("e").split_map == {"m": 3, "n": 1} and new.op("e").cores == 3
    assert old.op("e").split_map == {"m": 2, "n": 1} and old.op("e").cores == 2
    assert dict(new.op("e").span_splits) == {"m": 2, "n": 1}  # the forced minimum, reported


def test_the_rules_agree_without_a_forced_split():
    prog, tgt = rows(12, 128), spyre(cores=8)
    new = planned_and_checked(prog, tgt, "greedy")
    old = planned_and_checked(prog, tgt, "greedy-multiples")
    assert new.op("e").split_map == old.op("e").split_map == {"m": 6, "n": 1}


def test_the_newer_rule_may_use_fewer_cores():
    # rows forced to 2 of 10 units, 4 sticks of columns, 8 cores: the newer rule grows the rows
    # to 5 (no core left for the columns), the older keeps 2 rows and cuts 4 column sticks
    prog = program({"x": ([10, 256], "float16")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]}], ["y"])
    tgt = spyre(cores=8)
    ctx = _ctx(prog, tgt)
    assert greedy(ctx, {"m": 2, "n": 1}) == {"m": 5, "n": 1}
    assert greedy(ctx, {"m": 2, "n": 1}, "multiples") == {"m": 2, "n": 4}


def test_a_forced_reduction_split_grows_too():
    # a row sum whose 12 column sticks are laid out outermost: the limit forces k to split
    prog = program({"x": ([2, 12 * 64], "float16")},
                   [{"name": "s", "op": "sum", "out": "y[m,0]", "ins": ["x[m,k]"]}], ["y"])
    tgt = target(24, 12 * 2 * 128 // 2)
    ctx = _ctx(prog, tgt)
    minimum = minimum_splits(ctx)
    assert minimum["k"] == 2
    new = planned_and_checked(prog, tgt, "greedy")
    old = planned_and_checked(prog, tgt, "greedy-multiples")
    assert new.op("s").split_map["k"] >= old.op("s").split_map["k"]
    assert new.op("s").split_map == {"m": 2, "k": 12}


def _ctx(prog, tgt):
    lay = layouts(prog, tgt)
    op = prog.ops[0]
    return OpContext(op, prog, tgt, lay.ops[op.name], lay.tensors, dict(op.sizes))


def test_the_flag_is_a_strategy_name():
    assert "greedy-multiples" in STRATEGIES
    assert ap.plan(rows(), spyre(cores=4), strategy="greedy-multiples").plan.strategy == \
        "greedy-multiples"


@st.composite
def forced(draw):
    m = draw(st.integers(2, 40))
    sticks = draw(st.integers(1, 4))
    prog = rows(m, 64 * sticks, draw(st.sampled_from(["exp", "neg", "relu"])))
    whole = m * 128 if sticks == 1 else sticks * m * 128
    limit = max(128, whole // draw(st.integers(2, 6)))
    return prog, target(draw(st.integers(2, 24)), limit)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40)
@given(forced())
def test_the_first_forced_dim_never_shrinks_and_every_plan_runs(case):
    prog, tgt = case
    try:
        new = ap.plan(prog, tgt, strategy="greedy")
        old = ap.plan(prog, tgt, strategy="greedy-multiples")
    except PlanningError:
        return
    minimum, units = dict(new.op("e").span_splits), new.op("e").unit_map
    ranked = sorted(("m", "n"), key=lambda d: -units[d])  # greedy's order: most units first
    first = next((d for d in ranked if minimum.get(d, 1) > 1), None)
    event(f"forced: {first}")
    if first is not None and new.op("e").loop is None and old.op("e").loop is None:
        assert new.op("e").split_map[first] >= old.op("e").split_map[first]
    for p in (new, old):
        assert all(s <= tgt.span_limit for _, s in p.op("e").span_bytes)
        checks = p.check()
        assert all(c.ok for c in checks), checks
