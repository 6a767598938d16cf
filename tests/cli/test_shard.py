"""`apportion shard`, `run --mesh`, `emit --mesh`: reports, runs, and errors as one line with
exit status 2 (never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apportion.cli.main import main


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def one_line_error(status, err, match):
    assert status == 2
    assert err.startswith("apportion: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and match in err, err


def test_shard_prints_the_plan_and_json(capsys):
    status, out, _ = run(capsys, "shard", "examples/megatron.json", "--mesh", "tp=2",
                         "--method", "propagate")
    assert status == 0
    assert "f:tp" in out and "partial sum over tp" in out and "all_reduce(sum, tp)" in out
    assert "inputs placed: x [-, -], w1 [-, tp], w2 [tp, -]" in out
    assert "per-device programs: 2 devices" in out
    status, out, _ = run(capsys, "shard", "examples/mlp.json", "--mesh", "dp=2,tp=2",
                         "--format", "json")
    doc = json.loads(out)
    assert status == 0 and doc["format"] == "apportion.sharding/1" and doc["method"] == "search"
    assert [o["name"] for o in doc["ops"]] == ["gate", "up", "act", "glu", "down"]


def test_run_with_a_mesh_checks_the_per_device_programs(capsys):
    status, out, _ = run(capsys, "run", "examples/megatron.json", "--mesh", "tp=3", "--check")
    assert status == 0 and "matches the unplanned program" in out


def test_a_target_file_may_carry_the_mesh(capsys, tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('preset = "spyre"\nmax_cores = 8\n[mesh]\naxes = {tp = 2}\n')
    status, out, _ = run(capsys, "shard", "examples/megatron.json", "--target", str(f))
    assert status == 0 and "8 cores per device" in out and "tp=2" in out


def test_emit_with_a_mesh(capsys):
    status, out, _ = run(capsys, "emit", "examples/megatron.json", "--mesh", "tp=2", "--forall")
    assert status == 0 and out.count("// -----") == 1 and "scf.forall" in out
    status, _, err = run(capsys, "emit", "examples/megatron.json", "--mesh", "tp=2", "--shard")
    one_line_error(status, err, "do not register the shard dialect")


@pytest.mark.parametrize(("shardings", "mesh", "match"), [
    ({"x": [["dq"], []]}, "tp=2", "tensor 'x' dim 0: mesh axis 'dq' is not an axis of mesh "
                                  "'tp=2' (axes: tp)"),
    ({"x": [["tp", "tp"], []]}, "tp=2", "tensor 'x': dim 0 is split twice on mesh axis 'tp'"),
    ({"w1": [[], ["tp"]]}, "dp=2", "tensor 'w1' dim 1: mesh axis 'tp' is not an axis"),
])
def test_bad_annotations_are_one_line_errors(capsys, tmp_path, shardings, mesh, match):
    doc = json.loads(Path("examples/megatron.json").read_text())
    doc["shardings"] = shardings
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    status, _, err = run(capsys, "shard", str(f), "--mesh", mesh)
    one_line_error(status, err, match)


def test_a_mesh_whose_memory_cannot_hold_the_program_is_a_one_line_error(capsys, tmp_path):
    f = tmp_path / "m.toml"
    f.write_text("axes = {tp = 2}\nmemory_gib = 0.0001\n")
    status, _, err = run(capsys, "shard", "examples/megatron.json", "--mesh", str(f))
    one_line_error(status, err, "program 'megatron' does not fit mesh 'mesh': its inputs need "
                                "at least")


@pytest.mark.parametrize(("argv", "match"), [
    (["run", "examples/megatron.json", "--backend", "dtensor"], "give a device mesh with --mesh"),
    (["run", "examples/megatron.json", "--mesh", "tp=2", "--backend", "torch"],
     "--backend torch does not run sharded programs"),
    (["shard", "examples/megatron.json", "--mesh", "tp"], "'tp' is not AXIS=SIZE"),
    (["shard", "examples/megatron.json", "--mesh", "tp=2", "--auto-tile"],
     "--strategy and --auto-tile do not apply with --mesh"),
    (["shard", "examples/megatron.json", "--mesh", "tp=2", "--method", "propagate",
      "--outputs", "replicated"], "--outputs applies to --method search"),
])
def test_bad_sharding_options_are_one_line_errors(capsys, argv, match):
    status, _, err = run(capsys, *argv)
    one_line_error(status, err, match)


def test_a_symbolic_mesh_is_planned_at_its_planning_size_and_run_once_bound(capsys):
    status, out, _ = run(capsys, "shard", "examples/mlp.json", "--mesh", "dp=N~4")
    assert status == 0 and "mlp on dp=N~4 (dp=N~4, 4 devices at N=4) (search)" in out
    assert "per-device programs: once the mesh's sizes are bound (--param N=SIZE)" in out
    status, out, _ = run(capsys, "shard", "examples/mlp.json", "--mesh", "dp=N~4",
                         "--param", "N=3")
    assert status == 0 and "per-device programs at N=3: 3 devices" in out
    status, out, _ = run(capsys, "run", "examples/mlp.json", "--mesh", "dp=N~4", "--param",
                         "N=3", "--check")
    assert status == 0 and "mesh sizes: N=3 (planned at N=4)" in out
    assert "over dp=3 (dp=3, 3 devices)" in out and "matches the unplanned program" in out
    status, out, _ = run(capsys, "emit", "examples/megatron.json", "--mesh", "tp=N~4",
                         "--forall", "--param", "N=2")
    assert status == 0 and out.count("// -----") == 1 and "scf.forall" in out


def test_a_program_with_run_time_sizes_is_bound_by_param_before_sharding(capsys):
    status, out, _ = run(capsys, "run", "examples/dynamic_k.json", "--mesh", "tp=2",
                         "--param", "K=96", "--check")
    assert status == 0 and "matches the unplanned program" in out


@pytest.mark.parametrize(("argv", "match"), [
    (["run", "examples/mlp.json", "--mesh", "dp=N~4", "--check"],
     "mesh 'dp=N~4': axis 'dp' has symbolic size N (planned at 4); the per-device programs "
     "need its device count: bind it (--param N=SIZE"),
    (["run", "examples/mlp.json", "--mesh", "dp=N~2..4", "--param", "N=8"],
     "axis 'dp': N=8 is outside its bounds 2..4"),
    (["run", "examples/mlp.json", "--mesh", "dp=N~4", "--param", "N=two"],
     "--param 'N=two': value 'two' is not an integer"),
    (["run", "examples/mlp.json", "--mesh", "dp=N~4", "--param", "K=2"],
     "--param K: not a symbolic size of mesh 'dp=N~4' (its symbolic sizes: N) nor a run-time "
     "size of program 'mlp'"),
    (["emit", "examples/mlp.json", "--mesh", "dp=N~4", "--forall"],
     "axis 'dp' has symbolic size N"),
    (["shard", "examples/mlp.json", "--mesh", "dp=N"],
     "symbolic size N needs a planning size or a max"),
    (["run", "examples/dynamic_k.json", "--mesh", "tp=2"],
     "program 'dynamic_k' has run-time sizes K; sharding needs static sizes: pass --param "
     "K=SIZE"),
])
def test_bad_symbolic_sizes_are_one_line_errors(capsys, argv, match):
    status, _, err = run(capsys, *argv)
    one_line_error(status, err, match)


@pytest.mark.distributed
def test_a_symbolic_mesh_runs_on_torch_distributed_once_bound(capsys):
    pytest.importorskip("torch")
    status, out, _ = run(capsys, "run", "examples/megatron.json", "--mesh", "tp=N~4",
                         "--param", "N=2", "--backend", "dtensor", "--check")
    assert status == 0 and "2 processes (gloo)" in out and "matches the unplanned program" in out
