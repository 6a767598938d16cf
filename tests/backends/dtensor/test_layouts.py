"""What the dtensor backend reads of a mesh schedule, without starting a process: the layouts
``lower_plan`` gives every value (consistent with the boxes the collectives and placements
list), DTensor's own cut of a layout (``torch.chunk``'s, nested in mesh order) and where it
differs from the plan's, and the adapter's refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import apportion as ap
from apportion.backends import get
from apportion.backends.dtensor.adapter import supports
from apportion.backends.dtensor.rank import (
    TORCH_REDUCE,
    combine,
    native_form,
    torch_agrees,
    torch_box,
)
from apportion.backends.dtensor.runner import check_schedule, run_mesh
from apportion.errors import ExecutionError
from apportion.frontend.json_format import load
from apportion.ir.kinds import REDUCERS
from apportion.schedule.mesh import Collective, Layout, MeshSchedule
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.spec import Sharding, chunk_agrees
from tests.backends.dtensor.test_runner import PLANS, matmul
from tests.sharding.test_uneven import ALL


def _lowered(plan):
    return lower_plan(plan, {"N": 2} if plan.mesh.symbolic else None)


SCHEDULES = {**{f"even {n}": (lambda m=m: _lowered(m())) for n, m in PLANS.items()},
             **{f"uneven {n}": (lambda m=m: _lowered(m())) for n, m in ALL.items()}}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_layout_holds_the_boxes_its_collectives_and_placements_list(name):
    s: MeshSchedule = SCHEDULES[name]()
    for c in s.collectives:
        assert s.layout(c.source).boxes == c.src_boxes, c
        assert s.layout(c.result).boxes == c.dst_boxes, c
        assert s.layout(c.source).tensor == s.layout(c.result).tensor == c.tensor
    for dev in s.devices:
        for p in (*dev.inputs, *dev.outputs):
            lay = s.layout(p.local)
            assert lay.tensor == p.tensor and lay.boxes[dev.index] == p.box
            assert not lay.partial  # inputs and outputs are whole values
    for stage in s.stages:  # a finish writes the op's partial result; its sources have none
        if hasattr(stage, "parts"):
            assert s.layout(stage.parts[0].result).partial
            assert all(s.layout(src) is None for src in stage.parts[0].sources)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_dtensor_cuts_a_layout_as_the_plan_does_exactly_where_torch_chunk_agrees(name):
    s: MeshSchedule = SCHEDULES[name]()
    axes = [(a.name, a.size) for a in s.axes]
    sizes = dict(axes)
    for lay in s.layouts:
        shape = s.program.tensor(lay.tensor).shape
        want = all(chunk_agrees(n, axes_, sizes) for n, axes_ in zip(shape, lay.split,
                                                                     strict=True))
        assert torch_agrees(shape, lay, axes, s.devices) == want, lay


@given(st.integers(1, 40), st.integers(1, 5), st.integers(1, 4))
def test_torch_box_is_torch_chunk_nested_over_the_mesh_axes_in_order(n, a, b):
    import torch

    lay = Layout("x", "x", (("a", "b"),))
    whole = torch.arange(n)
    for i in range(a):
        outer = whole.chunk(a)  # what Shard(0) over a keeps (fewer pieces: the rest empty)
        piece = outer[i] if i < len(outer) else whole[:0]
        inner = piece.chunk(b)
        for j in range(b):
            mine = inner[j] if j < len(inner) else piece[:0]
            lo, hi = torch_box((n,), lay, [("a", a), ("b", b)], {"a": i, "b": j})[0]
            assert whole[lo:hi].tolist() == mine.tolist()


def test_partials_combine_by_the_registry_s_collective_as_dtensor_s_partial_ops():
    assert [combine(r) for r in ("sum", "mean", "prod", "any", "argmax")] == \
        ["sum", "sum", "prod", "max", "max"]
    assert {combine(r) for r in REDUCERS} <= set(TORCH_REDUCE)  # each has a Partial op


def test_matmuls_and_pointwise_kinds_read_alike_run_natively_others_locally():
    p = load("examples/mlp.json")
    assert [native_form(o, p) for o in p.ops] == ["matmul", "matmul", "pointwise", "pointwise",
                                                  "matmul"]
    r = lower_plan(PLANS["argmax all-reduce"]())
    (launch,) = r.launches(0)
    assert [native_form(o, launch.schedule.program) for o in launch.schedule.program.ops] == \
        [None, None]  # a max and an argmax: reductions run on the local shards


def test_the_adapter_takes_only_mesh_schedules_dtensor_can_place():
    planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    assert [lim.id for lim in supports(planned)] == ["dtensor-needs-mesh"]
    assert supports(lower_plan(PLANS["megatron"]())) == ()
    # a dim split over b then a, unlike the mesh's order a, b: DTensor nests a first
    crossed = lower_plan(propagate(matmul(), parse("a=1,b=2"),
                                   annotations={"x": Sharding((("b", "a"), ()))}))
    assert [lim.id for lim in supports(crossed)] == ["dtensor-axes-in-mesh-order"]
    with pytest.raises(ExecutionError, match=r"x \(tensor 'x'\): dim 0 is split over b\*a"):
        check_schedule(crossed)
    assert get("dtensor").run_mesh is not None and get("dtensor").supports is supports


def test_threads_are_refused_before_any_process_starts():
    with pytest.raises(ExecutionError, match="one process per device"):
        run_mesh(lower_plan(PLANS["megatron"]()), threads=2)


def test_a_layout_names_its_placement_per_mesh_axis():
    lay = Layout("y", "y", ((), ("tp",)), ("dp",), "sum")
    assert [lay.axis_placement(a) for a in ("dp", "tp", "pp")] == \
        [("partial", "sum"), ("shard", 1), ("replicate", None)]
    assert str(lay) == "y = y[-, tp] partial sum(dp)"
    with pytest.raises(ExecutionError, match="a partial value needs its reducer"):
        Layout("y", "y", ((),), ("dp",))
    with pytest.raises(ExecutionError, match="has 1 devices' boxes, the mesh 2 devices"):
        s = lower_plan(PLANS["megatron"]())
        MeshSchedule(s.program, s.mesh, s.target, s.devices, s.stages,
                     (Layout("x", "x", ((), ()), boxes=(((0, 1), (0, 1)),)),))
    assert isinstance(s.collectives[0], Collective)
