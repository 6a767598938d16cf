"""The torch backend's mesh runner: every device's core schedule run by the threaded torch
executor from the schedule as lowered, the data between devices moved by the schedule. It
matches the unplanned program on random sharded programs and meshes (uneven cuts included),
on one thread and several, and is what ``run --mesh --backend torch`` (and ``run --torch
MODEL --mesh ... --backend torch``) runs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from apportion.backends import get
from apportion.cli.main import main
from apportion.errors import ExecutionError
from apportion.frontend.json_format import load
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from tests.sharding.programs import annotated
from tests.sharding.test_uneven import ALL, _inputs

pytest.importorskip("torch")

from apportion.backends.torch.mesh import run_mesh  # noqa: E402 (needs torch)


def _matches(schedule, inputs, **kw) -> dict[str, np.ndarray]:
    got = run_mesh(schedule, inputs, **kw)
    p = schedule.program
    checks = compare(run_unplanned(p, inputs), got, p)
    assert checks and all(c.ok for c in checks), checks
    return got


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(annotated())
def test_random_sharded_programs_run_with_torch_kernels_match_the_unplanned(case):
    program, mesh, ann = case
    _matches(lower_plan(propagate(program, mesh, annotations=ann)), random_inputs(program, 1))


@pytest.mark.parametrize("name", list(ALL))
def test_uneven_meshes_match_with_torch_kernels(name):
    plan = ALL[name]()
    _matches(lower_plan(plan), _inputs(name, plan.program))


def test_several_threads_give_the_same_numbers_as_one():
    s = lower_plan(search(load("examples/megatron.json"), parse("tp=3")))
    xs = random_inputs(s.program, 5)
    one, three = run_mesh(s, xs), _matches(s, xs, threads=3)
    assert all(np.array_equal(one[k], three[k]) for k in one)


def test_a_symbolic_loop_count_is_run_at_the_value_the_schedule_was_lowered_at():
    plan = search(load("examples/softmax_symbolic.json"), parse("tp=2"))
    _matches(lower_plan(plan, params={"T": 16}), random_inputs(plan.program, 0))


def test_the_registry_runs_meshes_with_torch_and_refuses_a_process_runners_options():
    s = lower_plan(search(load("examples/megatron.json"), parse("tp=2")))
    backend = get("torch")
    assert backend.supports(s) == () and backend.run_mesh is run_mesh
    xs = random_inputs(s.program, 0)
    got = backend.run_mesh(s, xs, seed=3, threads=2)
    assert all(c.ok for c in compare(run_unplanned(s.program, xs), got, s.program))
    with pytest.raises(ExecutionError, match="timeout_s and device apply to the dtensor"):
        backend.run_mesh(s, xs, timeout_s=5.0)


def test_run_mesh_backend_torch_checks_against_the_unplanned_program(capsys):
    assert main(["run", "examples/megatron.json", "--mesh", "tp=2", "--backend", "torch",
                 "--threads", "2", "--check"]) == 0
    assert "per-device programs of megatron over tp=2 (tp=2, 2 devices) (search, torch), run " \
           "core slice by core slice with torch kernels, matches the unplanned program" in \
           capsys.readouterr().out


@pytest.mark.slow
def test_a_pytorch_model_sharded_runs_with_torch_kernels_and_matches_eager(capsys):
    assert main(["run", "--torch", "apportion.frontend.torch_demo:mlp", "--mesh", "tp=2",
                 "--backend", "torch", "--check"]) == 0
    out = capsys.readouterr().out
    assert "(search, torch), run core slice by core slice with torch kernels, matches the " \
           "model run eagerly in PyTorch" in out
