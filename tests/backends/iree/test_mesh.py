"""Sharded programs run in IREE: every device's segments compiled and run as IREE modules,
the collectives and finishes between them on the host by the schedule's own data movement,
compared with the unplanned program, through the module's ``run_mesh`` and the registry's.
Meshes of 2 and 4 devices, 2x2, uneven splits. Modules are cached in a folder of the
session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from apportion.backends import get
from apportion.backends.iree import runtime as iree
from apportion.backends.iree.mesh import run_mesh
from apportion.cli.main import main
from apportion.errors import ExecutionError
from apportion.frontend.json_format import from_dict, load
from apportion.mlir.mesh import device_mlir
from apportion.runtime.check import expect
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.mesh import Collective, MeshSchedule, box_shape, unshard_outputs
from apportion.sharding.lower import lower_mesh, lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from apportion.sharding.unroll import unroll
from tests.sharding.programs import annotated, as_float32, hard_inputs, reduction
from tests.sharding.test_uneven import ALL, _inputs

ROWS, COLS, REP = Sharding((("tp",), ())), Sharding(((), ("tp",))), Sharding(((), ()))


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("iree-modules")


def _ok(schedule: MeshSchedule, cache: Path, seed: int = 0):
    want = expect(schedule.program, seed)
    run = run_mesh(schedule, want.inputs, cache)
    checks = want.compare(run)
    assert checks and all(c.ok for c in checks), checks
    return run


def _exp(rows: int, cols: int):
    return from_dict({"name": "e", "inputs": ["x"], "outputs": ["y"],
                      "tensors": {"x": {"shape": [rows, cols], "dtype": "float32"},
                                  "y": {"shape": [rows, cols], "dtype": "float32"}},
                      "ops": [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}]})


def test_two_devices_run_their_segment_in_iree_and_reduce_scatter_on_the_host(cache):
    s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
    run = _ok(s, cache)
    assert run.modules == 1  # both devices' segments are equal: compiled once
    assert [c.kind for c in s.collectives] == ["reduce_scatter"]


def test_four_devices_in_a_2x2_mesh_reduce_scatter_along_each_axis(cache):
    # float32: a float16 model's partials move in float32, and there gathers win
    s = lower_plan(search(as_float32(load("examples/mlp.json")), parse("dp=2,tp=2")))
    assert [(c.kind, c.axis) for c in s.collectives] == [("reduce_scatter", "dp"),
                                                         ("reduce_scatter", "tp")]
    assert s.collectives[1].groups == ((0, 1), (2, 3))
    _ok(s, cache)


def test_an_uneven_split_over_four_devices_gathers_and_all_to_alls_exactly(cache):
    p = _exp(10, 6)  # 10 rows over 4 devices: the plan's uneven cut
    gather = lower_plan(propagate(p, parse("tp=4"), annotations={"x": ROWS, "y": REP}))
    rows = [box_shape(b)[0] for b in gather.collectives[0].src_boxes]
    assert sorted(set(rows)) == [2, 3]
    run = _ok(gather, cache)
    assert run.modules == 2  # shards of 3 rows and of 2 rows
    to_all = lower_plan(propagate(p, parse("tp=4"), annotations={"x": ROWS, "y": COLS}))
    assert [c.kind for c in to_all.collectives] == ["all_to_all"]
    _ok(to_all, cache)


@pytest.mark.parametrize("fn", ["mean", "argmax"])
def test_a_mean_or_argmax_split_over_four_devices_finishes_on_each_and_matches(fn, cache):
    p = reduction(fn)  # 10 columns over 4 devices
    s = lower_plan(propagate(p, parse("tp=4"), annotations={"x": Sharding(((), ("tp",)))}))
    xs = hard_inputs(p) if fn == "argmax" else random_inputs(p, 1)
    got = run_mesh(s, xs, cache).outputs["r"]
    want = run_unplanned(p, xs)["r"]
    if fn == "argmax":  # ties across devices and NaNs: the first maximum, exactly
        assert np.array_equal(got, want), (got, want)
    else:
        assert np.allclose(got, want, rtol=1e-5)


@pytest.mark.slow
def test_local_cuts_on_three_devices_run_as_slices_between_the_segments(cache):
    plan = propagate(load("examples/mlp.json"), parse("tp=3"),
                     annotations={"x": REP, "h": ROWS})
    s = lower_plan(plan)
    assert [c.kind for c in s.collectives] == ["slice", "slice"]
    _ok(s, cache)


def test_a_segment_equal_on_every_device_is_one_launch_value(cache):
    s = lower_mesh(unroll(search(load("examples/megatron.json"), parse("tp=2"),
                                 annotations={"x": ROWS, "y": REP})))
    firsts = s.launches(0)
    assert all(a.schedule is b.schedule for a, b in zip(firsts, s.launches(1), strict=True))
    assert [launch.name for launch in s.launches(1)] == ["megatron.d1.s1"]
    _ok(s, cache)


def test_replicas_that_disagree_are_an_execution_error():
    s = lower_plan(search(load("examples/mlp.json"), parse("tp=2"), outputs="replicated"))
    local = s.devices[0].outputs[0].local
    envs = [{local: np.zeros((256, 1024), np.float16)}, {local: np.ones((256, 1024), np.float16)}]
    with pytest.raises(ExecutionError, match="replica of output 'y' differs"):
        unshard_outputs(s, envs)


def test_run_mesh_backend_iree_check_matches_and_exits_0(cache, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(cache.parent))  # the CLI takes the default module cache
    assert main(["run", "examples/mlp.json", "--mesh", "tp=2", "--backend", "iree",
                 "--check"]) == 0
    out = capsys.readouterr().out
    assert "mlp over tp=2: 2 devices, 2 stages (1 compute, 1 collectives: 1 reduce_scatter)" \
        in out
    assert "per-device modules of mlp over tp=2 (tp=2, 2 devices) (search, iree) in IREE, " \
           "collectives between them on the host, matches the unplanned program" in out
    assert iree.default_cache_dir().is_dir()


def test_a_wrong_collective_is_a_mismatch_and_exits_1(cache, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(cache.parent))
    real = Collective.move
    monkeypatch.setattr(Collective, "move",
                        lambda c, arrays: [np.zeros_like(a) for a in real(c, arrays)])
    assert main(["run", "examples/mlp.json", "--mesh", "tp=2", "--backend", "iree",
                 "--check"]) == 1
    assert "differs from the unplanned program on y" in capsys.readouterr().out


def test_the_device_modules_with_their_collective_ops_compile_with_iree(cache):
    # a 2x2 mesh (channels split per axis), an argmax's keys packed, reduced and unpacked;
    # IREE's CPU driver cannot run the channels, so compiling is as far as IREE goes here
    p = reduction("argmax", dtype="float16")
    s = lower_plan(propagate(p, parse("a=2,b=2"), annotations={"x": Sharding(((), ("a", "b")))}))
    compiled = iree.compile_mlir(device_mlir(s, 3), cache)
    assert compiled.vmfb
    to_all = lower_plan(propagate(_exp(10, 6), parse("tp=4"), annotations={"x": ROWS, "y": COLS}))
    assert iree.compile_mlir(device_mlir(to_all, 2), cache).vmfb


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(annotated())
def test_random_sharded_programs_run_per_device_in_iree_and_match(cache, case):
    program, mesh, ann = case
    _ok(lower_plan(propagate(program, mesh, annotations=ann)), cache)


@pytest.mark.parametrize(("fn", "dtype"), [("argmax", "int8"), ("mean", "bfloat16")])
def test_finishes_of_narrow_dtypes_compile_and_the_runs_match(fn, dtype, cache):
    p = reduction(fn, dtype=dtype)
    s = lower_plan(propagate(p, parse("tp=3"), annotations={"x": Sharding(((), ("tp",)))}))
    assert iree.compile_mlir(device_mlir(s, 2), cache).vmfb
    _ok(s, cache)


def test_run_mesh_backend_iree_without_check_runs_and_threads_are_refused(cache, capsys,
                                                                           monkeypatch):
    monkeypatch.setenv("HOME", str(cache.parent))
    assert main(["run", "examples/mlp.json", "--mesh", "tp=2", "--backend", "iree"]) == 0
    out = capsys.readouterr().out
    assert "2 segment launches in IREE (1 distinct module), the steps between them on the host" \
        in out and "ran mlp over tp=2 (tp=2, 2 devices) (search, iree)" in out
    assert main(["run", "examples/mlp.json", "--mesh", "tp=2", "--backend", "iree",
                 "--threads", "2"]) == 2
    assert "--threads applies to the reference and torch backends" in capsys.readouterr().err


@pytest.mark.slow
def test_the_registrys_run_mesh_runs_the_schedule_in_iree_and_refuses_threads(cache,
                                                                            monkeypatch):
    monkeypatch.setenv("HOME", str(cache.parent))  # the backend takes the default module cache
    s = lower_plan(propagate(_exp(10, 6), parse("tp=4"), annotations={"x": ROWS, "y": COLS}))
    iree_backend = get("iree")
    assert iree_backend.supports(s) == ()
    xs = random_inputs(s.program, 2)
    got = iree_backend.run_mesh(s, xs)
    assert all(c.ok for c in compare(run_unplanned(s.program, xs), got, s.program))
    with pytest.raises(ExecutionError, match="threads applies to the reference and torch"):
        iree_backend.run_mesh(s, xs, threads=2)
    with pytest.raises(ExecutionError, match="runs by run_mesh"):
        iree_backend.run(s, xs)


#: a few uneven meshes in every run (an all-to-all, argmax keys reduce-scattered, rows cut
#: 4, 3, 3 with an all-reduce over the other axis); the rest in the slow sweep
FAST = ("all-to-all", "argmax reduce-scatter", "3x2 rows and k")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in ALL])
def test_uneven_meshes_run_through_the_registrys_run_mesh_in_iree_and_match(name, cache,
                                                                           monkeypatch):
    monkeypatch.setenv("HOME", str(cache.parent))  # the backend takes the default module cache
    plan = ALL[name]()
    s = lower_plan(plan)
    xs = _inputs(name, plan.program)
    got = get("iree").run_mesh(s, xs)
    checks = compare(run_unplanned(plan.program, xs), got, plan.program)
    assert checks and all(c.ok for c in checks), checks


@pytest.mark.slow
def test_a_symbolic_loop_count_runs_in_iree_at_the_value_the_schedule_was_lowered_at(cache):
    plan = search(load("examples/softmax_symbolic.json"), parse("tp=2"))
    s = lower_plan(plan, params={"T": 16})
    assert s.launches(0)[0].schedule.params == (("T", 16),)
    _ok(s, cache)
