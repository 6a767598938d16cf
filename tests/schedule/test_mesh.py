"""The device level of the schedule: MeshSchedule values refuse what cannot run in step
(stages for the wrong number of devices, groups missing a device, a reduction without its
reducer), box helpers, the argmax key format a finish packs and a collective unpacks, the
host data movement every mesh runner shares (equal to the planner's numpy collectives and
finishes), and the text of a mesh schedule with each device's core schedule nested in it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.cli.main import main
from apportion.errors import ExecutionError
from apportion.frontend.json_format import load
from apportion.runtime import kernels
from apportion.runtime.reference import random_inputs, run_unplanned
from apportion.schedule.mesh import (
    Collective,
    Compute,
    FinishPart,
    MeshFinish,
    MeshSchedule,
    MeshSteps,
    argmax_index,
    argmax_keys,
    box_shape,
    group_order,
    intersect,
    shard_inputs,
    unshard_outputs,
    within,
)
from apportion.sharding import collectives as reference_collectives
from apportion.sharding.lower import lower_mesh, lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.rules import DeviceFinish
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from apportion.sharding.unroll import UnrolledStep, unroll
from tests.sharding.programs import annotated


def test_argmax_keys_order_values_then_the_lowest_index_as_numpy_does():
    v = np.array([1.0, np.nan, -0.0, 0.0, 3.0, np.nan, 3.0], np.float32)
    i = np.array([4, 1, 2, 3, 0, 5, 6])
    keys = argmax_keys(v, i)
    assert np.array_equal(argmax_index(keys), i)
    order = sorted(range(len(v)), key=lambda k: keys[k])
    assert order[-2:] == [5, 1]  # NaN above all, the lower index first
    assert keys[2] > keys[3] and keys[4] > keys[6]  # -0 as +0; equal: the lower index wins
    assert reference_collectives.argmax_index is argmax_index  # one key format


def test_a_mesh_schedule_refuses_a_stage_for_fewer_devices_than_it_has():
    s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
    with pytest.raises(ExecutionError, match="stage .* has 1 devices' parts, the mesh 2"):
        MeshSchedule(s.program, s.mesh, s.target, s.devices,
                     (Compute(s.stages[0].launches[:1]),))


def test_a_collective_whose_groups_miss_a_device_is_refused():
    with pytest.raises(ExecutionError, match="do not cover the 2 devices once each"):
        Collective("all_gather", "x", "x", "x@1", "float32", "tp", ((0,),),
                   (((0, 1),), ((1, 2),)), (((0, 2),), ((0, 2),)), dim=0)
    with pytest.raises(ExecutionError, match="a all_reduce needs reducer"):
        Collective("all_reduce", "x", "x", "x@1", "float32", "tp", ((0, 1),),
                   (((0, 2),),) * 2, (((0, 2),),) * 2)


def test_a_finish_of_an_unknown_kind_is_refused():
    with pytest.raises(ExecutionError, match="kind 'round'; valid: scale, pack"):
        FinishPart("round", ("m",), "r", "float32")


def test_a_devices_local_flat_index_becomes_the_whole_reductions():
    part = FinishPart("pack", ("v", "i"), "k", "int64", local=(2, 3), starts=(1, 3),
                      sizes=(3, 6))
    # local (1, 2) -> global (2, 5) of 3x6
    assert part.flat_index(np.array([5])).tolist() == [2 * 6 + 5]


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5)), min_size=1, max_size=3),
       st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5)), min_size=3, max_size=3))
def test_intersect_and_within_agree_with_numpy_slicing(a, b):
    a_box = tuple((lo, lo + n) for lo, n in a)
    b_box = tuple((lo, lo + n) for lo, n in b[:len(a)])
    grid = np.arange(20 ** len(a)).reshape((20,) * len(a))
    part = intersect(a_box, b_box)
    in_a = grid[tuple(slice(lo, hi) for lo, hi in a_box)]
    if part is None:
        assert any(min(p[1], q[1]) <= max(p[0], q[0]) for p, q in zip(a_box, b_box,
                                                                       strict=True))
        return
    assert box_shape(part) == tuple(hi - lo for lo, hi in part)
    want = grid[tuple(slice(lo, hi) for lo, hi in part)]
    assert np.array_equal(in_a[tuple(slice(lo, hi) for lo, hi in within(part, a_box))], want)


def test_groups_are_ordered_by_their_first_device():
    assert group_order([(3, 1), (2, 0)]) == ((2, 0), (3, 1))  # ranks keep their order
    assert group_order([[1, 3], [0, 2]]) == ((0, 2), (1, 3))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(annotated())
def test_the_shared_host_movement_equals_the_planners_numpy_collectives_and_finishes(case):
    program, mesh, ann = case
    plan = propagate(program, mesh, annotations=ann)
    u = unroll(plan)
    s = lower_mesh(u)
    steps = [x for x in u.devices[0].stages if isinstance(x, UnrolledStep)]
    ours = [c for c in s.collectives if c.kind != "slice"]
    assert [str(x.step.kind) for x in steps] == [c.kind for c in ours]
    rng = np.random.default_rng(0)
    for x, c in zip(steps, ours, strict=True):
        dtype = kernels.storage_dtype(c.dtype)
        arrays = [(rng.integers(-50, 50, box_shape(b)) if c.dtype.startswith("int") else
                   rng.standard_normal(box_shape(b))).astype(dtype) for b in c.src_boxes]
        want = reference_collectives.apply(x.step, arrays, plan.mesh, c.dtype)
        for got, w in zip(c.move(arrays), want, strict=True):
            assert np.array_equal(got, w), c
    # every device's finish as the schedule holds it computes what the planner's DeviceFinish does
    finishes = [x for x in s.stages if isinstance(x, MeshFinish)]
    theirs = [[x for x in dev.stages if isinstance(x, DeviceFinish)] for dev in u.devices]
    for k, fin in enumerate(finishes):
        for d, part in enumerate(fin.parts):
            planner = theirs[d][k]
            # a local value, and a local flat index within the device's reduction box
            env = {n: rng.standard_normal((3, 1)).astype(np.float32) if i == 0 else
                   rng.integers(0, int(np.prod(part.local)), (3, 1))
                   for i, n in enumerate(planner.sources)}
            assert np.array_equal(part.apply(env), planner.run(env))


def test_a_mesh_schedule_prints_each_devices_core_schedule_nested_under_it_once():
    s = lower_plan(propagate(load("examples/mlp.json"), parse("tp=3"),
                             annotations={"x": Sharding(((), ())),
                                          "h": Sharding((("tp",), ()))}))
    text = str(s)
    lines = text.splitlines()
    assert lines[0] == ("mesh schedule mlp over tp=3 (spyre): 3 devices on device axes tp:3, "
                        "each device's launches over its cores innermost")
    assert "  device 2 (tp=2): in x = x[0:256, 0:1024]" in text
    assert "  stage 1: a@1 = slice(tp) dim 0(a)" in lines
    assert "    device 2: a[0:256, 0:2816] -> [171:256, 0:2816]" in lines  # 86, 85, 85 rows
    # equal shards share one schedule: printed under the first device, named by the others
    assert "    device 1: mlp.d1.s0, the schedule of device 0" in lines
    assert "    device 2: mlp.d2.s3, the schedule of device 1" in lines
    assert lines.count("      schedule mlp.d0.s0 on spyre, 32 cores") == 1
    assert any(line.startswith("        launch gate (matmul) over ") and "(cores)" in line
               for line in lines)
    assert [str(a) for a in s.axes] == ["tp:3"] and s.distinct() == 3


def test_the_schedule_command_prints_a_mesh_schedule(capsys):
    assert main(["schedule", "examples/megatron.json", "--mesh", "tp=2", "--cores", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mesh schedule megatron over tp=2 (spyre): 2 devices on device axes "
                          "tp:2, each device's launches over its cores innermost\n")
    assert "      schedule megatron.d0.s0 on spyre, 2 cores" in out
    assert "  stage 1: " in out and "(rank 1 of devices [0, 1])" in out


def test_a_run_that_gives_no_segment_output_is_refused_naming_the_device_and_segment():
    s = lower_plan(search(load("examples/megatron.json"), parse("tp=2")))
    with pytest.raises(ExecutionError, match="device 0: the run of segment 'megatron.d0.s0' "
                                             "gave no"):
        steps = MeshSteps(s, random_inputs(s.program))
        for step in steps:
            steps.give(step, {})
    # a device that is given no shard of an input its segment reads
    dev = s.devices[0]
    broken = replace(s, devices=(replace(dev, inputs=dev.inputs[1:]), *s.devices[1:]))
    with pytest.raises(ExecutionError, match=f"device 0: segment 'megatron.d0.s0' reads "
                                             f"'{dev.inputs[0].local}', which no earlier stage"):
        next(iter(MeshSteps(broken, random_inputs(s.program))))


def test_a_mesh_run_whose_driver_skips_a_step_is_refused_naming_the_device_and_segment():
    s = lower_plan(search(load("examples/megatron.json"), parse("tp=2")))
    walk = iter(MeshSteps(s, random_inputs(s.program)))
    assert next(walk).device == 0
    with pytest.raises(ExecutionError, match="device 0: segment 'megatron.d0.s0' was not run"):
        next(walk)  # on to the next step with no outputs given back for this one


def test_a_mesh_run_refuses_outputs_of_a_step_it_is_not_waiting_for():
    s = lower_plan(search(load("examples/megatron.json"), parse("tp=2")))
    steps = MeshSteps(s, random_inputs(s.program))
    walk = iter(steps)
    first = next(walk)
    steps.give(first, run_unplanned(first.launch.schedule.program, first.inputs))
    with pytest.raises(ExecutionError, match="device 0: segment 'megatron.d0.s0' is not the "
                                             "step the mesh run is waiting for"):
        steps.give(first, run_unplanned(first.launch.schedule.program, first.inputs))


def test_inputs_cut_into_shards_and_put_back_together_round_trip():
    s = lower_plan(search(load("examples/megatron.json"), parse("a=2,b=2")))
    xs = random_inputs(s.program, 1)
    shards = shard_inputs(s, xs)
    assert [sorted(env) for env in shards] == [sorted(p.local for p in dev.inputs)
                                               for dev in s.devices]
    # an output every device holds whole: put back together, replicas agreeing
    name = s.program.inputs[0]
    y = s.program.outputs[0]
    whole = np.zeros(s.program.tensor(y).shape, dtype=kernels.storage_dtype(
        s.program.tensor(y).dtype))
    envs = [{p.local: whole[tuple(slice(lo, hi) for lo, hi in p.box)] for p in dev.outputs}
            for dev in s.devices]
    assert np.array_equal(unshard_outputs(s, envs)[y], whole) and name in xs
