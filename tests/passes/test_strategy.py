"""Strategies as values (``passes/strategy.py``) and a pipeline that runs each stage once.

A strategy object plans exactly as its name did (the golden plans, byte for byte), names and
objects give equal plans on random programs, bad names and objects are refused naming the valid
ones, and a split-K rewrite adds the layouts and contexts of its new ops instead of running
layouts, coarse tiling, buffers and contexts again: what it keeps equals what they would give.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.cli.main import main
from apportion.errors import PlanningError
from apportion.frontend.json_format import load
from apportion.passes import pipeline
from apportion.passes.coarse_tile import coarse_tile
from apportion.passes.geometry import OpContext, contexts
from apportion.passes.layouts import layouts
from apportion.passes.relayout import relayout
from apportion.passes.split_k import partials, split_k
from apportion.passes.strategy import (
    ALL,
    STRATEGIES,
    Balanced,
    Greedy,
    parse_strategy,
)
from apportion.passes.work_distribution import distribute
from apportion.plans.serialize import from_json, to_json
from apportion.target.presets import cpu, gpu, spyre
from tests.golden.generate import OUT, cases, plan_json
from tests.helpers import program
from tests.passes.test_pipeline_properties import programs, targets

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.json"))
GOLDEN = cases()
#: the stages that ran again after a split-K rewrite before each stage ran once
REPLANNED = ("layouts", "coarse_tile", "buffers", "contexts")


def plan_or_error(prog, target, strategy, **kw) -> str:
    """The plan's JSON, or the refusal's message: equal for equal planning."""
    try:
        return to_json(pipeline.plan(prog, target, strategy, **kw))
    except ap.ApportionError as e:
        return f"{type(e).__name__}: {e}"


# --- the values ---------------------------------------------------------------------------


def test_each_strategy_has_the_name_a_plan_records_and_parses_back_to_itself():
    assert STRATEGIES == ("balanced", "greedy", "greedy-multiples")
    for s in ALL:
        assert parse_strategy(s.name) == s and parse_strategy(s) is s
    assert [s.name for s in ALL] == list(STRATEGIES)
    # frozen values: equal by value, usable as keys (the plan cache keys on them)
    assert Greedy() == Greedy(rule="any") != Greedy(rule="multiples")
    assert len({Balanced(), Balanced(), Greedy(), Greedy("any")}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        Greedy().rule = "multiples"  # type: ignore[misc]


def test_each_strategy_carries_what_the_passes_ask_of_it():
    b, g, old = Balanced(), Greedy(), Greedy(rule="multiples")
    assert (b.uneven, g.uneven, old.uneven) == (True, False, False)
    assert (b.span_refusal_final, g.span_refusal_final) == (False, True)
    assert b.group_baseline == Greedy(rule="any") and g.group_baseline is None
    assert b.start({"m": 4, "n": 2}) == {"m": 1, "n": 1}
    assert g.start({"m": 4, "n": 2}) == old.start({"m": 4, "n": 2}) == {"m": 4, "n": 2}


@pytest.mark.parametrize("bad", ["fast", "", "Balanced", "GREEDY", 3, None, Balanced,
                                 ("greedy",)])
def test_a_bad_strategy_is_refused_naming_the_valid_ones(bad):
    valid = "valid: balanced, greedy, greedy-multiples, or a strategy object"
    for call in (lambda: ap.plan(ap.load(ROOT / "examples/mlp.json"), strategy=bad),
                 lambda: pipeline.plan(load(ROOT / "examples/mlp.json"), spyre(), bad),
                 lambda: parse_strategy(bad)):
        with pytest.raises(PlanningError, match=f"unknown strategy .*; {valid}"):
            call()


def test_an_unknown_greedy_rule_is_refused_naming_the_rules():
    with pytest.raises(PlanningError, match="unknown greedy rule 'all'; valid: 'any', "
                                            "'multiples'"):
        Greedy(rule="all")  # type: ignore[arg-type]


def test_a_pass_given_a_name_says_to_parse_it():
    p = load(ROOT / "examples/mlp.json")
    t = spyre(cores=8)
    lay = layouts(p, t)
    ctx = OpContext(p.op("gate"), p, t, lay.ops["gate"], lay.tensors, dict(p.op("gate").sizes))
    with pytest.raises(PlanningError, match="op 'gate': work distribution needs a strategy "
                                            "object .* parse_strategy"):
        distribute(ctx, {d: 1 for d in ctx.sizes}, "balanced")  # type: ignore[arg-type]


def test_the_cli_refuses_an_unknown_strategy_with_exit_status_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", str(ROOT / "examples/mlp.json"), "--strategy", "fast"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'fast'" in err and "greedy-multiples" in err
    assert "Traceback" not in err


def test_the_public_api_exports_the_strategies():
    assert ap.strategies.Balanced is Balanced and ap.strategies.Greedy is Greedy
    assert ap.strategies.parse_strategy("greedy") == Greedy()
    for name in ("Balanced", "Greedy", "parse_strategy"):
        assert getattr(ap.strategies, name).__doc__


def test_the_torch_compile_backend_takes_a_name_or_an_object():
    torch_compile = pytest.importorskip("apportion.torch_compile")
    assert torch_compile.backend(strategy="greedy").strategy == Greedy()
    old = Greedy(rule="multiples")
    b = torch_compile.backend(strategy=old)
    assert b.strategy is old and "strategy='greedy-multiples'" in repr(b)
    with pytest.raises(PlanningError, match="unknown strategy 'fast'; valid: balanced"):
        torch_compile.backend(strategy="fast")


# --- plans ----------------------------------------------------------------------------------


def test_a_plan_records_the_strategys_name_and_reads_back():
    for s in ALL:
        planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8),
                          strategy=s)
        doc = json.loads(planned.to_json())
        assert planned.plan.strategy == doc["strategy"] == s.name
        assert from_json(planned.to_json()) == planned.plan


def test_a_plan_whose_strategy_is_not_a_name_is_refused():
    doc = json.loads(ap.plan(ap.load(ROOT / "examples/mlp.json")).to_json())
    for bad in (3, None, ""):
        doc["strategy"] = bad
        with pytest.raises(PlanningError, match="malformed 'strategy' in plan"):
            from_json(json.dumps(doc))


@pytest.mark.parametrize("cores", [32, 8])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_strategy_object_plans_the_examples_as_its_name_did(path, cores):
    prog = load(path)
    for s in ALL:
        by_object = plan_or_error(prog, spyre(cores=cores), s)
        assert by_object == plan_or_error(prog, spyre(cores=cores), s.name)
        if not by_object.startswith("PlanningError"):
            assert json.loads(by_object)["strategy"] == s.name


@pytest.mark.parametrize("case", GOLDEN, ids=[c[0] for c in GOLDEN])
def test_golden_plans_are_byte_identical_when_planned_with_strategy_objects(case):
    stem, prog, name, cores, auto_tile = case
    doc = plan_json(prog, parse_strategy(name), cores, auto_tile)
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    assert text == (OUT / f"{stem}.json").read_text()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(), targets(), st.sampled_from(STRATEGIES))
def test_a_name_and_its_object_give_equal_plans_on_random_programs(prog, target, name):
    assert plan_or_error(prog, target, name) == plan_or_error(prog, target,
                                                              parse_strategy(name))


# --- each stage once ------------------------------------------------------------------------


@pytest.fixture
def stage_calls(monkeypatch) -> Counter:
    """How often the pipeline calls each of ``REPLANNED``."""
    calls: Counter = Counter()
    for name in REPLANNED:
        real = getattr(pipeline, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(pipeline, name, counted)
    return calls


def mlp_grouped(split: dict[str, int], group=("gate", "up", "act", "glu")) -> ap.Program:
    """A small gated MLP (examples/mlp.json's ops) with a loop group over ``group`` and
    split-K pins ``split``: the split ops outside the group read what the group makes."""
    d, f = 256, 512
    return program(
        {"x": ([32, d], "float16"), "wg": ([d, f], "float16"), "wu": ([d, f], "float16"),
         "wd": ([f, d], "float16")},
        [{"name": "gate", "op": "matmul", "out": "g[m,n]", "ins": ["x[m,k]", "wg[k,n]"]},
         {"name": "up", "op": "matmul", "out": "u[m,n]", "ins": ["x[m,k]", "wu[k,n]"]},
         {"name": "act", "op": "silu", "out": "a[m,n]", "ins": ["g[m,n]"]},
         {"name": "glu", "op": "mul", "out": "h[m,n]", "ins": ["a[m,n]", "u[m,n]"]},
         {"name": "down", "op": "matmul", "out": "y[m,n]", "ins": ["h[m,k]", "wd[k,n]"]}],
        ["y"], tiling=[{"ops": list(group), "loops": [{"count": 2, "dims": ["m"]}]}],
        split_k=split)


def eight_core_cpu():
    """The cpu preset at 8 cores whatever this machine has (its split-K table decides)."""
    return dataclasses.replace(cpu(), cores=8, max_cores=8)


SPLIT_K_CASES = [
    ("splitk-gpu", lambda: ap.load(ROOT / "examples/splitk.json"), lambda: gpu()),
    ("mlp-grouped-down4", lambda: mlp_grouped({"down": 4}), lambda: spyre(cores=32)),
    ("mlp-grouped-gpu", lambda: mlp_grouped({"down": 2}, ("act", "glu")), lambda: gpu(cores=8)),
    ("mlp-pins-cpu", lambda: mlp_grouped({"down": 4, "gate": 2}, ("act",)), eight_core_cpu),
]


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.name)
@pytest.mark.parametrize(("name", "make", "target"), SPLIT_K_CASES,
                         ids=[c[0] for c in SPLIT_K_CASES])
def test_a_split_k_rewrite_runs_each_stage_once(name, make, target, strategy, stage_calls):
    seen: list[str] = []
    planned = ap.plan(make(), target(), strategy=strategy,
                      debug=lambda stage, value: seen.append(stage))
    assert any(o.name.endswith(".partial") for o in planned.ops)  # the rewrite happened
    assert "partials" in seen and len(seen) == len(set(seen)), seen
    assert stage_calls == Counter(dict.fromkeys(REPLANNED, 1))
    assert seen.index("split_k") < seen.index("buffers")  # roles name the partial readers
    assert all(c.ok for c in planned.check())


def test_a_plan_without_split_k_runs_each_stage_once_too(stage_calls):
    seen: list[str] = []
    ap.plan(ap.load(ROOT / "examples/softmax_tiled.json"), ap.targets.spyre(cores=32),
            auto_tile=True, debug=lambda stage, value: seen.append(stage))
    assert len(seen) == len(set(seen)) and "partials" not in seen
    assert stage_calls == Counter(dict.fromkeys(REPLANNED, 1))


def rewrite(prog: ap.Program, target):
    """The pipeline's front up to the split-K rewrite: (rewritten program, its source's
    layouts, tiling and contexts)."""
    prog = relayout(prog, target)[0].bind()
    lay = layouts(prog, target)
    tiling = coarse_tile(prog, lay.ops, target.max_loop_count)
    loops = {o.name: None if tiling.tile(o.name) is None else tiling.tile(o.name).loop
             for o in prog.ops}
    ctxs = contexts(prog, target, lay, {o.name: tiling.sizes(o) for o in prog.ops}, loops)
    decisions = split_k(ctxs, prog.split_k_pins)
    grouped = frozenset(n for g in tiling.groups for n in g.ops)
    return partials(prog, ctxs, decisions, grouped)[0], lay, tiling, ctxs, loops


@st.composite
def grouped_then_split(draw):
    """A loop group over the first ops of a chain, then reductions outside it (a matmul, a
    row sum) reading what the group made, with split-K pins on some of them."""
    dtype = draw(st.sampled_from(["float16", "float32"]))
    eps = 64 if dtype == "float16" else 32  # elements per 128-byte stick
    m = draw(st.sampled_from([8, 16, 32]))
    k = eps * draw(st.sampled_from([2, 4, 8]))
    n = eps * draw(st.sampled_from([1, 2]))
    ops = [{"name": "e", "op": draw(st.sampled_from(["exp", "neg", "relu"])),
            "out": "a[i,j]", "ins": ["x[i,j]"]},
           {"name": "g", "op": "mul", "out": "h[i,j]", "ins": ["a[i,j]", "x[i,j]"]},
           {"name": "mm", "op": "matmul", "out": "y[i,c]", "ins": ["h[i,j]", "w[j,c]"]},
           {"name": "rs", "op": draw(st.sampled_from(["sum", "max"])), "out": "s[i,0]",
            "ins": ["h[i,j]"]}]
    grouped = ["e", "g"][:draw(st.integers(1, 2))]  # with one, g outside reads the group's a
    sticks = k // eps
    pins = {op: f for op in ("mm", "rs")
            if (f := draw(st.sampled_from([0, 2, 4]))) and sticks % f == 0}
    extra = {"tiling": [{"ops": grouped, "loops": [{"count": draw(st.sampled_from([1, 2])),
                                                    "dims": ["i"]}]}]}
    if pins:
        extra["split_k"] = pins
    prog = program({"x": ([m, k], dtype), "w": ([k, n], dtype)}, ops, ["y", "s"], **extra)
    target = draw(st.sampled_from([spyre(cores=draw(st.integers(4, 32))),
                                   gpu(cores=draw(st.sampled_from([4, 8, 32]))),
                                   eight_core_cpu()]))
    return prog, target


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(grouped_then_split())
def test_what_a_split_k_rewrite_keeps_equals_running_the_stages_again(case):
    prog, target = case
    rewritten, lay, tiling, ctxs, loops = rewrite(prog, target)
    event(f"ops rewritten: {sum(o.name.endswith('.partial') for o in rewritten.ops)}")
    kept_lay, kept_ctxs = pipeline.with_rewritten(rewritten, target, lay, ctxs)
    fresh_lay = layouts(rewritten, target)
    assert kept_lay == fresh_lay
    assert list(kept_lay.ops) == [o.name for o in rewritten.ops]
    # only ops outside loop groups are rewritten: the tiling stands
    assert coarse_tile(rewritten, fresh_lay.ops, target.max_loop_count) == tiling
    fresh = contexts(rewritten, target, fresh_lay, {o.name: tiling.sizes(o)
                                                    for o in rewritten.ops},
                     {n: loops.get(n) for n in kept_ctxs})
    assert kept_ctxs == fresh
    assert all(c.program is rewritten for c in kept_ctxs.values())
    # the pipeline plans the rewritten program's ops (where the target lets it plan at all)
    try:
        planned = pipeline.plan(prog, target, Balanced())
    except PlanningError:
        return
    assert [o.name for o in planned.ops] == [o.name for o in rewritten.ops]
