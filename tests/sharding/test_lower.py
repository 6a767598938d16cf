"""A sharding plan lowered to a MeshSchedule: the same stages on every device, each segment
with its core plan, every resharding step a Collective with the plan's boxes and the groups
of its axis, local cuts as slice stages; run with numpy segments and the host collectives it
gives the unsharded program's results."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from apportion.frontend.json_format import load
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.mesh import (
    Collective,
    MeshFinish,
    MeshSchedule,
    MeshSteps,
)
from apportion.sharding.lower import lower_mesh, lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from apportion.sharding.unroll import unroll
from tests.sharding.programs import annotated, as_float32, reduction

ROWS, REP = Sharding((("tp",), ())), Sharding(((), ()))


def _numpy_run(s: MeshSchedule, inputs):
    """The schedule run with the unplanned executor per segment and the host collectives."""
    steps = MeshSteps(s, inputs)
    for step in steps:
        steps.give(step, run_unplanned(step.launch.schedule.program, step.inputs))
    return steps.outputs()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(annotated())
def test_lowered_schedules_run_with_host_collectives_equal_the_unsharded_program(case):
    program, mesh, ann = case
    s = lower_plan(propagate(program, mesh, annotations=ann))
    xs = random_inputs(program, 1)
    checks = compare(run_unplanned(program, xs), _numpy_run(s, xs), program)
    assert all(c.ok for c in checks), checks


def test_every_collective_carries_each_devices_boxes_as_the_plan_cuts_them():
    plan = search(as_float32(load("examples/mlp.json")), parse("dp=2,tp=2"))
    s = lower_plan(plan)
    u = unroll(plan)
    steps = [st.step for st in u.devices[0].stages if not isinstance(st, type(u.program))]
    sizes = {a.name: a.size for a in plan.mesh.axes}
    for c, step in zip(s.collectives, steps, strict=True):
        shape = plan.program.tensor(c.tensor).shape
        for d in range(4):
            coords = plan.mesh.coords(d)
            assert c.src_boxes[d] == step.src.block(shape, coords, sizes)
            assert c.dst_boxes[d] == step.dst.block(shape, coords, sizes)
            assert c.group(d) == plan.mesh.group(d, c.axis)
    assert [c.groups for c in s.collectives] == [((0, 2), (1, 3)), ((0, 1), (2, 3))]


def test_each_segment_is_lowered_over_the_devices_cores_nested_in_the_device_axes():
    s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
    for d in range(2):
        (launch,) = s.launches(d)
        assert launch.name == f"mlp.d{d}.s0"
        assert launch.schedule.cores == s.target.cores == 32
        assert [o.op for o in launch.schedule.ops] == \
            [o.name for o in launch.schedule.program.ops]
        for step in launch.schedule.ops:
            axes = s.worker_axes(step)
            assert [a.level for a in axes] == ["device"] + ["core"] * len(step.axes)
            assert axes[0].name == "tp" and axes[0].size == 2
    # equal shards: one schedule, lowered once and shared
    assert s.launches(0)[0].schedule is s.launches(1)[0].schedule and s.distinct() == 1


def test_local_cuts_become_slice_stages_and_the_segment_is_cut_around_them():
    plan = propagate(load("examples/mlp.json"), parse("tp=3"),
                     annotations={"x": REP, "h": ROWS})
    s = lower_plan(plan)
    kinds = [st.kind if isinstance(st, Collective) else type(st).__name__ for st in s.stages]
    assert kinds == ["Compute", "slice", "slice", "Compute"]
    first, second = s.launches(2)
    assert set(first.schedule.program.outputs) == {"a", "u"}
    assert set(second.schedule.program.inputs) == {"a@1", "u@1", "wd"}
    rows = ROWS.block((256, 2816), plan.mesh.coords(2), {"tp": 3})[0]
    assert [c.dst_boxes[2][0] for c in s.collectives] == [rows, rows]  # as the plan cuts them
    assert rows[1] == 256 and rows[0] > 0


def test_a_split_argmax_lowers_to_a_finish_per_device_and_an_unpacking_reduction():
    p = reduction("argmax")
    s = lower_plan(propagate(p, parse("tp=4"), annotations={"x": Sharding(((), ("tp",)))}))
    (fin,) = [st for st in s.stages if isinstance(st, MeshFinish)]
    assert [part.starts for part in fin.parts] == [(0,), (3,), (6,), (8,)]
    (c,) = s.collectives
    assert (c.kind, c.reducer, c.unpack, c.dtype) == ("all_reduce", "argmax", True, "int64")


def test_lowering_takes_the_unrolled_programs_as_given():
    u = unroll(search(load("examples/megatron.json"), parse("tp=2"),
                      annotations={"x": ROWS, "y": REP}))
    s = lower_mesh(u)
    assert s.program is u.program and s.mesh == "tp=2"
    assert s.summary() == ("megatron over tp=2: 2 devices, 3 stages (1 compute, 2 "
                           "collectives: 1 all_gather, 1 all_reduce)")
