"""Tests of the loop-group and buffer plan values, their JSON, and the tile views."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apportion.errors import ExecutionError, PlanningError
from apportion.frontend.json_format import load
from apportion.passes.pipeline import plan
from apportion.plans.memory import Buffer, GroupPlan
from apportion.plans.plan import LoopInfo
from apportion.plans.serialize import from_json, to_json
from apportion.plans.tiles import core_boxes, iterations, resolve_counts, tile_box
from apportion.target import spyre
from tests.helpers import program
from tests.passes.test_coarse_tile import fused

ROOT = Path(__file__).parents[2]


def tiled_plans():
    mm = program({"x": ([64, 256], "float16"), "w": ([256, 128], "float16")},
                 [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
                  {"name": "mx", "op": "max", "out": "r[m,0]", "ins": ["h[m,n]"]}],
                 ["r"], tiling=[{"ops": ["mm"], "loops": [{"count": 2, "dims": ["m"]},
                                                          {"count": 4, "dims": ["k"]}]},
                                {"ops": ["mx"], "count": 2, "dims": ["n"]}])
    copy = program({"x": ([64, 128], "float32")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                    {"name": "n", "op": "neg", "out": "z[m,n]", "ins": ["y[m,n]"]}],
                   ["y", "z"], tiling=[{"ops": ["e", "n"], "count": 4, "dims": ["m"]}])
    return [plan(fused(), spyre()), plan(load(ROOT / "examples/softmax_tiled.json"), spyre(8)),
            plan(mm, spyre(cores=5)), plan(copy, spyre()),
            plan(fused(loops=[{"count": "T", "dims": ["m"]}]), spyre())]


@pytest.mark.parametrize("p", tiled_plans(), ids=["fused", "softmax", "matmul_k", "copy", "sym"])
def test_tiled_plans_round_trip_exactly(p):
    assert p.groups and p.buffers
    assert from_json(to_json(p)) == p


def test_plan_json_holds_loops_groups_and_buffers():
    doc = json.loads(to_json(plan(fused(), spyre())))
    assert doc["ops"][0]["loop"] == {"group": [0, 0], "count": [2, 4],
                                     "tiled_dims": [["m"], ["n"]]}
    assert doc["ops"][0]["iteration_space"] == {"m": 512, "n": 1024}
    (g,) = doc["groups"]
    assert g["group"] == [0, 0] and g["count"] == [2, 4] and g["lx_tensors"] == ["y"]
    y = next(b for b in doc["buffers"] if b["tensor"] == "y")
    assert y == {"tensor": "y", "kind": "tile", "space": "lx", "offset": 0, "nbytes": 32768,
                 "shape": [512, 1024], "group": [0, 0]}


def test_infinite_identities_are_strict_json():
    p = tiled_plans()[2]
    text = to_json(p)
    assert "Infinity" not in text
    inits = json.loads(text)["groups"][1]["inits"]
    assert inits == [{"op": "mx", "tensor": "r", "fn": "max", "identity": "-inf", "level": 0}]


def test_untiled_plans_keep_their_json_shape():
    doc = json.loads(to_json(plan(load(ROOT / "examples/mlp.json"), spyre())))
    assert "groups" not in doc and all(b["kind"] == "full" for b in doc["buffers"])


def test_malformed_groups_are_planning_errors():
    doc = json.loads(to_json(plan(fused(), spyre())))
    del doc["groups"][0]["capacity"]
    with pytest.raises(PlanningError, match="malformed loop group"):
        from_json(json.dumps(doc))


def test_buffer_values_check_themselves():
    with pytest.raises(PlanningError, match="kind 'weird'"):
        Buffer("y", "weird", "hbm", 0, 8, (4,))
    # an untiled op's output may be kept whole in the scratchpad (each core its part)
    assert Buffer("y", "full", "lx", 0, 8, (4,)).space == "lx"
    with pytest.raises(PlanningError, match="needs its loop group path"):
        Buffer("y", "tile", "hbm", 0, 8, (4,))
    with pytest.raises(PlanningError, match="disagree"):
        GroupPlan((0,), ("a",), (2, 2), (("m",),), 0, 0)


def test_tile_boxes_divide_outermost_first():
    loop = LoopInfo((0, 0), (2, 4), (("n",), ("n",)))
    assert tile_box({"m": 8, "n": 64}, loop, (1, 3), (2, 4)) == {"m": (0, 8), "n": (56, 64)}
    assert list(iterations((2, 1, 2))) == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    with pytest.raises(ExecutionError, match=r"count 3 \(symbolic 'T'\) does not divide dim 'n'"):
        tile_box({"n": 64}, LoopInfo((0,), ("T",), (("n",),)), (0,), (3,), "e")


def test_symbolic_counts_need_values():
    assert resolve_counts((2, "T"), {"T": 8}) == (2, 8)
    with pytest.raises(ExecutionError, match=r"'T' needs a value: pass params=\{'T': n\}"):
        resolve_counts((2, "T"))
    with pytest.raises(ExecutionError, match="must be an int >= 1"):
        resolve_counts(("T",), {"T": 0})


def test_core_boxes_offset_the_plans_slices_and_drop_empty_ones():
    op = plan(fused(), spyre(cores=32)).op("add")
    boxes = core_boxes(op, {"m": (512, 1024), "n": (3072, 4096)})
    assert len(boxes) == 32 and boxes[1] == {"m": (528, 544), "n": (3072, 4096)}
    sym = plan(fused(loops=[{"count": "T", "dims": ["m"]}]), spyre(cores=32)).op("add")
    small = core_boxes(sym, {"m": (0, 16), "n": (0, 4096)})  # T = 64: 16 rows over 32 cores
    assert sum(b is not None for b in small) == 16
