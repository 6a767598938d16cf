"""The reference backend's mesh runner: a sharding plan lowered to its mesh schedule, each
device's core schedule run as the reference runs one device's, the data between devices moved
by the schedule. It matches the unplanned program on random sharded programs and meshes
(uneven cuts included), gives bit for bit what the per-device programs' own planned run
(``oracle.run(planned=True)``) gives, and is what ``run --mesh --backend reference`` runs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from apportion.backends import get
from apportion.backends.reference.mesh import run_mesh
from apportion.cli.main import main
from apportion.errors import ExecutionError, PlanningError
from apportion.frontend.json_format import load
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.values import Loop
from apportion.sharding import oracle
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from apportion.sharding.unroll import unroll
from tests.sharding.programs import annotated
from tests.sharding.test_uneven import ALL, _inputs


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    """Equal bit for bit (NaNs where the other has NaNs)."""
    return all(np.array_equal(got[k], want[k], equal_nan=want[k].dtype.kind == "f")
               for k in want)


def _matches(plan, inputs, **kw) -> dict[str, np.ndarray]:
    got = run_mesh(lower_plan(plan, params=kw.pop("params", None)), inputs, **kw)
    checks = compare(run_unplanned(plan.program, inputs), got, plan.program)
    assert checks and all(c.ok for c in checks), checks
    return got


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(annotated())
def test_random_sharded_programs_run_from_their_mesh_schedule_match_the_unplanned(case):
    program, mesh, ann = case
    _matches(propagate(program, mesh, annotations=ann), random_inputs(program, 1))


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(annotated())
def test_the_mesh_runner_gives_bit_for_bit_what_the_unrolled_planned_run_gives(case):
    program, mesh, ann = case
    plan = search(program, mesh, annotations=ann)
    xs = random_inputs(program, 2)
    assert _same(run_mesh(lower_plan(plan), xs), oracle.run(unroll(plan), xs, planned=True))


@pytest.mark.parametrize("name", list(ALL))
def test_uneven_meshes_match_and_equal_the_unrolled_run_bit_for_bit(name):
    plan = ALL[name]()
    xs = _inputs(name, plan.program)
    got = _matches(plan, xs)
    assert _same(got, oracle.run(unroll(plan), xs, planned=True))


@pytest.mark.slow
def test_a_symbolic_loop_count_kept_by_the_devices_is_bound_when_lowered():
    plan = search(load("examples/softmax_symbolic.json"), parse("tp=2"))
    xs = random_inputs(plan.program, 0)
    got = _matches(plan, xs, params={"T": 16})
    assert _same(got, oracle.run(unroll(plan), xs, planned=True, params={"T": 16}))
    (launch,) = lower_plan(plan, params={"T": 16}).launches(0)
    assert [(lp.count, lp.symbol) for lp in launch.schedule.steps if isinstance(lp, Loop)] == \
        [(16, "T")]
    with pytest.raises(PlanningError, match="have no symbolic loop count 'K'"):
        lower_plan(plan, params={"T": 16, "K": 2})


def test_cores_run_concurrently_give_the_same_numbers():
    plan = search(load("examples/megatron.json"), parse("tp=3"))
    xs = random_inputs(plan.program, 4)
    s = lower_plan(plan)
    assert _same(run_mesh(s, xs, threads=3), run_mesh(s, xs))


def test_the_registry_runs_meshes_through_run_mesh_and_refuses_a_process_runners_options():
    plan = search(load("examples/megatron.json"), parse("tp=2"))
    s = lower_plan(plan)
    backend = get("reference")
    assert backend.supports(s) == () and backend.run_mesh is run_mesh
    xs = random_inputs(plan.program, 0)
    assert _same(backend.run_mesh(s, xs, seed=7), run_mesh(s, xs))
    with pytest.raises(ExecutionError, match="timeout_s and device apply to the dtensor"):
        backend.run_mesh(s, xs, device="cuda")


def test_run_mesh_backend_reference_checks_against_the_unplanned_program(capsys):
    assert main(["run", "examples/megatron.json", "--mesh", "tp=3", "--backend", "reference",
                 "--check"]) == 0
    assert "per-device programs of megatron over tp=3 (tp=3, 3 devices) (search, reference), " \
           "run core slice by core slice, matches the unplanned program" in \
           capsys.readouterr().out
    assert main(["run", "examples/megatron.json", "--mesh", "tp=2", "--cores", "4"]) == 0
    assert "ran megatron over tp=2 (tp=2, 2 devices) (search, reference): 2 devices, each " \
           "segment planned for 4 cores" in capsys.readouterr().out
