"""Smoke test of the public surface: ``ap.plan`` and the value it returns, errors, names."""

from __future__ import annotations

import json
import pkgutil

import pytest

import apportion as ap
from apportion.errors import ApportionError


def fused() -> ap.Program:
    return ap.load("examples/fused.json")


def test_plan_returns_a_value_that_knows_program_and_target_and_runs_emits_and_prints():
    planned = ap.plan(fused(), ap.targets.spyre(cores=8), strategy="greedy")
    assert planned.program.name == "fused" and planned.target.cores == 8
    assert all(c.ok for c in planned.check())
    assert set(planned.run()) >= {"a", "b", "c", "z"}
    assert [s.count for s in planned.loopspec()] == [2]
    assert "scf.for" in planned.bundle_mlir() and "scf.for" not in planned.bundle_mlir(True)
    doc = json.loads(planned.to_json())
    assert doc["target"] == {"name": "spyre", "cores": 8} and doc["strategy"] == "greedy"
    again = ap.PlannedProgram.from_json(planned.to_json(), fused())
    assert again == planned


def test_auto_tile_and_debug_reach_the_pipeline_and_every_stage_shows_its_own_value():
    stages: dict[str, object] = {}
    planned = ap.plan(ap.load("examples/softmax_tiled.json"), ap.targets.spyre(cores=32),
                      auto_tile=True, debug=stages.__setitem__)
    assert list(stages) == ["layouts", "auto_tile", "coarse_tile", "buffers", "split_k",
                            "span_reduction",
                            "work_distribution", "group_distribution", "scratchpad"]
    chosen = stages["auto_tile"]
    assert planned.groups[0].counts == tuple(lv.count for lv in chosen[0].loops)
    # frozen stage values: group distribution's result is its own, work distribution's stays
    assert stages["work_distribution"] is not stages["group_distribution"]


@pytest.mark.parametrize(("program", "target", "match"), [
    ("examples/mlp.json", None, r"needs a Program .* got str .*ap.load\(path\)"),
    (3, None, "needs a Program or a builder's program, got int"),
    (None, "spyre", r"needs a Target .*got str 'spyre': make one with ap.targets.resolve"),
    (None, 32, "needs a Target"),
])
def test_api_misuse_is_an_apportion_error_naming_what_was_given(program, target, match):
    with pytest.raises(ApportionError, match=match):
        ap.plan(fused() if program is None else program, target)


def test_bad_strategy_and_auto_tile_are_errors():
    with pytest.raises(ap.PlanningError, match="unknown strategy 'fast'; valid: balanced"):
        ap.plan(fused(), strategy="fast")
    with pytest.raises(ap.PlanningError, match="auto_tile must be True or False"):
        ap.plan(fused(), auto_tile="yes")


@pytest.mark.parametrize(("doc", "match"), [
    ({"format": "apportion.plan/1", "ops": []}, "plan has no target"),
    ({"format": "apportion.plan/1", "target": {"name": "spyre"}, "ops": []}, "has no target"),
    ({"format": "apportion.plan/1", "target": {"name": "spyre", "cores": 8}}, "no field 'ops'"),
    ([1, 2], "must be a JSON object"),
])
def test_reading_a_plan_without_its_target_or_ops_is_a_clear_error(doc, match):
    with pytest.raises(ap.PlanningError, match=match):
        ap.PlannedProgram.from_json(json.dumps(doc), fused())


def test_symbolic_counts_are_checked_against_the_targets_loop_limit():
    doc = json.loads(ap.dumps(fused()))
    doc["tiling"][0]["loops"][0]["count"] = "T"
    planned = ap.plan(ap.loads(json.dumps(doc)), ap.targets.spyre(cores=8))
    assert planned.params == ("T",)
    assert all(c.ok for c in planned.check(params={"T": 4}))
    with pytest.raises(ap.ExecutionError, match=r"'T' = 70000: must be an int in 1..65535"):
        planned.run(params={"T": 70000})
    with pytest.raises(ap.ExecutionError, match="'U' is not a symbolic loop count"):
        planned.run(params={"U": 2})


def test_no_public_name_hides_a_subpackage_and_every_error_type_is_exported():
    subpackages = {m.name for m in pkgutil.iter_modules(ap.__path__)}
    for name in subpackages:
        value = getattr(ap, name, None)
        assert value is None or getattr(value, "__name__", "") == f"apportion.{name}", name
    for err in ("ApportionError", "ProgramError", "TargetError", "PlanningError",
                "ExecutionError", "EmitError"):
        assert issubclass(getattr(ap, err), ApportionError)
