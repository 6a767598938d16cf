"""Smoke test of the public surface: ``ap.plan`` and the value it returns, errors, names."""

from __future__ import annotations

import json
import pkgutil

import numpy as np
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
    # buffers after split_k: a split-K rewrite's partial ops may read a group's tensors
    assert list(stages) == ["layouts", "auto_tile", "coarse_tile", "split_k", "buffers",
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


# -- API misuse, argument by argument: each an apportion error naming the argument ------------

def _exp_program() -> ap.Program:
    A, B = ap.dim("A", 8), ap.dim("B", 64)
    with ap.program("e") as p:
        p.output(ap.exp(p.input("x", [A, B], "float32")))
    return p.program


def _building(make):  # a builder call made inside an open program
    def call() -> None:
        A, B = ap.dim("A", 8), ap.dim("B", 64)
        with ap.program("b") as p:
            make(p, p.input("x", [A, B], "float32"), A, B)
    return call


_PLANNED = ap.plan(_exp_program(), ap.targets.cpu(cores=1))
MISUSES = {
    "load(None)": (lambda: ap.load(None), "path must be a str"),
    "loads(5)": (lambda: ap.loads(5), "expected JSON text"),
    "dumps(5)": (lambda: ap.dumps(5), "needs a Program"),
    "targets.load_toml(5)": (lambda: ap.targets.load_toml(5), "path must be a str"),
    "plan(debug=5)": (lambda: ap.plan(_exp_program(), debug=5), "debug must be None or a call"),
    "run(threads='4')": (lambda: _PLANNED.run(threads="4"), "threads must be None or an int"),
    "run(threads=0)": (lambda: _PLANNED.run(threads=0), "threads must be None or an int >= 1"),
    "run(params=5)": (lambda: _PLANNED.run(params=5), "params must be a mapping"),
    "run(inputs=5)": (lambda: _PLANNED.run(5), "inputs must be a mapping"),
    "run(None array)": (lambda: _PLANNED.run({"x": np.full((8, 64), None)}),
                        "numpy dtype object"),
    "check(seed=-1)": (lambda: _PLANNED.check(seed=-1), "seed must be an int >= 0"),
    "check(seed='a')": (lambda: _PLANNED.check(seed="a"), "seed must be an int >= 0"),
    "check(seed=1.5)": (lambda: _PLANNED.check(seed=1.5), "seed must be an int >= 0"),
    "at(5)": (lambda: _PLANNED.at(5), "sizes must be a mapping"),
    "from_json(5, p)": (lambda: ap.PlannedProgram.from_json(5, _exp_program()),
                        "text must be plan JSON"),
    "sharding.search(p, 'tp=2')": (lambda: ap.sharding.search(_exp_program(), "tp=2"),
                                   "mesh must be a Mesh"),
    "sharding.propagate(p, 2)": (lambda: ap.sharding.propagate(_exp_program(), 2),
                                 "mesh must be a Mesh"),
    "input('y', 5)": (_building(lambda p, x, A, B: p.input("y", 5, "float32")),
                      "dims must be a list"),
    "1 + x": (_building(lambda p, x, A, B: 1 + x), "1 is not a tensor"),
    "2 * x": (_building(lambda p, x, A, B: 2 * x), "2 is not a tensor"),
    "merge(x, 5)": (_building(lambda p, x, A, B: ap.merge(x, 5)), "dims must be a tuple"),
    "merge(x, dims, into=4)": (_building(lambda p, x, A, B: ap.merge(x, (A, B), into=4)),
                               "into must be a Dim"),
    "sum(keepdim='no')": (_building(lambda p, x, A, B: ap.sum(x, B, keepdim="no")),
                          "keepdim must be True or False"),
    "hint(slices=[A, 2])": (lambda: ap.hint(slices=[ap.dim("A", 8), 2]),
                            "slices must be a dict"),
    "hint(work_division=5)": (lambda: ap.hint(work_division=5), "work_division must be a dict"),
    "hint(slices={A: [1]})": (lambda: ap.hint(slices={ap.dim("A", 8): [1]}),
                              "must be an int or a symbol name"),
    "op([1])": (lambda: _PLANNED.op([1]), "name must be an op name"),
    "dumps(indent=1.5)": (lambda: ap.dumps(_exp_program(), 1.5), "indent must be an int"),
    "search(annotations=5)": (lambda: ap.sharding.search(
        _exp_program(), ap.sharding.parse_mesh("tp=2"), annotations=5),
        "annotations must be a dict"),
    "search(time_limit='zz')": (lambda: ap.sharding.search(
        _exp_program(), ap.sharding.parse_mesh("tp=2"), time_limit="zz"),
        "time_limit must be a number"),
    "cast(x, [1])": (_building(lambda p, x, A, B: ap.cast(x, [1])), "unknown dtype"),
    "max_pool(window=None)": (_building(lambda p, x, A, B: ap.max_pool(x, [B], None)),
                              "window and stride must be ints"),
}


@pytest.mark.parametrize("misuse", list(MISUSES))
def test_each_api_misuse_raises_an_apportion_error_naming_the_argument(misuse):
    call, match = MISUSES[misuse]
    with pytest.raises(ApportionError, match=match):
        call()
