"""Per-device programs: the unrolled plan, run with the reference executor and numpy
collectives, gives the unsharded program's results; the wrappers keep the signature."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from apportion.errors import ExecutionError
from apportion.frontend.json_format import load
from apportion.ir.program import Program
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from apportion.sharding.unroll import Collective, unroll
from tests.sharding.programs import annotated


def _equal(unrolled, seed=0):
    checks = unrolled.check(seed)
    assert all(c.ok for c in checks), checks


@settings(max_examples=40, deadline=None)
@given(annotated())
def test_propagated_plans_unrolled_per_device_equal_the_unsharded_program(case):
    program, mesh, ann = case
    _equal(unroll(propagate(program, mesh, annotations=ann)))


@settings(max_examples=10, deadline=None)
@given(annotated())
def test_per_device_segments_planned_for_the_cores_and_run_core_by_core_equal_it_too(case):
    program, mesh, ann = case
    checks = unroll(propagate(program, mesh, annotations=ann)).check(planned=True)
    assert all(c.ok for c in checks), checks


@settings(max_examples=25, deadline=None)
@given(annotated())
def test_searched_plans_unrolled_per_device_equal_the_unsharded_program(case):
    program, mesh, ann = case
    plan = search(program, mesh, annotations=ann)
    for name, s in ann.items():  # annotations are constraints
        assert plan.sharding(name) == s
    _equal(unroll(plan))



def test_megatron_unrolls_to_one_segment_and_one_collective_per_device():
    rep = Sharding(((), ()))
    plan = search(load("examples/mlp.json"), parse("tp=2"), annotations={"x": rep, "y": rep})
    u = unroll(plan)
    for dev in u.devices:
        seg, coll = dev.stages
        assert isinstance(seg, Program) and isinstance(coll, Collective)
        assert [o.name for o in seg.ops] == ["gate", "up", "act", "glu", "down"]
        assert str(coll.step) == "all_reduce(sum, tp)"
        assert seg.tensor("wg").shape == (1024, 1408) and seg.tensor("y").shape == (256, 1024)
    assert u.distinct_segments == 1  # both devices run the same program on their shards
    _equal(u)


def test_each_devices_segments_planned_for_its_cores_run_core_by_core_and_match():
    plan = search(load("examples/mlp.json"), parse("dp=2,tp=2"))
    checks = unroll(plan).check(planned=True)
    assert all(c.ok for c in checks), checks
    planned = unroll(plan).planned()
    assert len(planned) == 4 and all(p.target.cores == 32 for seg in planned for p in seg)


def test_uneven_shards_on_three_devices_and_local_cuts_as_copy_ops():
    p = load("examples/mlp.json")
    plan = propagate(p, parse("tp=3"), annotations={"x": Sharding(((), ())),
                                                     "h": Sharding((("tp",), ()))})
    # backward from h: glu splits its rows, so a and u (made replicated) are cut before it
    assert plan.strategy("glu").label == "m:tp"
    u = unroll(plan)
    shapes = [dev.segments[0].tensor("a@1").shape for dev in u.devices]
    assert shapes == [(86, 2816), (86, 2816), (84, 2816)]  # 256 rows as torch.chunk cuts them
    cuts = [str(o) for o in u.devices[2].segments[0].ops if o.fn == "copy"]
    assert cuts == ["reshard.a@1.0: a@1[d0, d1] = copy(a[d0+172, d1])",
                    "reshard.u@1.0: u@1[d0, d1] = copy(u[d0+172, d1])"]
    _equal(u)


def test_the_wrappers_shard_views_of_the_host_arrays_and_keep_the_signature():
    plan = search(load("examples/mlp.json"), parse("tp=2"))
    u = unroll(plan)
    xs = random_inputs(plan.program)
    parts = u.shard_inputs(xs)
    for name in plan.program.inputs:
        for env in parts:
            assert np.shares_memory(env[name], xs[name])  # a view, not a copy per device
    out = u(xs)
    assert set(out) == {"y"} and out["y"].shape == (256, 1024)
    assert all(c.ok for c in compare(run_unplanned(plan.program, xs), out, plan.program))


def test_replicas_that_disagree_are_an_execution_error():
    plan = search(load("examples/mlp.json"), parse("tp=2"), outputs="replicated")
    u = unroll(plan)
    envs = [{"y@1": np.zeros((256, 1024), np.float16)},
            {"y@1": np.ones((256, 1024), np.float16)}]
    with pytest.raises(ExecutionError, match="replica of output 'y' differs"):
        u.unshard_outputs(envs)
