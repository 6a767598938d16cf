from pathlib import Path

import pytest

from apportion.errors import PlanningError
from apportion.frontend.json_format import load
from apportion.passes.pipeline import plan
from apportion.plans.serialize import from_json, to_json
from apportion.plans.views import core_slices, dim_slices
from apportion.target import spyre

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("strategy", ["greedy", "balanced"])
def test_plan_json_round_trips_exactly(strategy):
    p = plan(load(ROOT / "examples/attention.json"), spyre(cores=24), strategy)
    assert from_json(to_json(p)) == p


def test_plan_json_has_the_stable_v1_fields():
    import json
    doc = json.loads(to_json(plan(load(ROOT / "examples/mlp.json"), spyre())))
    op = doc["ops"][0]
    assert doc["format"] == "apportion.plan/1" and doc["target"] == {"name": "spyre", "cores": 32}
    for key in ("name", "kind", "iteration_space", "reduction_dims", "stick_dims", "splits",
                "cores", "utilization", "predicted_time_us", "span_bytes", "loop"):
        assert key in op


def test_wrong_plan_format_is_rejected():
    with pytest.raises(PlanningError, match="unsupported plan format"):
        from_json('{"format": "apportion.plan/0"}')


def test_uneven_slices_hold_whole_sticks_larger_first():
    assert dim_slices(769 * 64, 64, 2) == [(0, 385 * 64), (385 * 64, 769 * 64)]


def test_core_view_enumerates_cores_row_major_over_dims():
    p = plan(load(ROOT / "examples/mlp.json"), spyre(cores=8)).op("act")
    views = core_slices(p)
    assert len(views) == p.cores
    volume = sum((v["m"][1] - v["m"][0]) * (v["n"][1] - v["n"][0]) for v in views)
    assert volume == p.sizes["m"] * p.sizes["n"]
    # the last dim varies fastest
    first = [d for d, n in p.splits if n > 1][-1]
    assert views[0][first] != views[1][first]
