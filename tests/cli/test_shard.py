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
    status, out, _ = run(capsys, "emit", "examples/megatron.json", "--mesh", "tp=2",
                         "--shard-form", "annotated")
    assert status == 0 and out.startswith("shard.grid @mesh(shape = 2)")


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
    (["run", "examples/megatron.json", "--backend", "dtensor"], "--mesh"),
    (["run", "examples/megatron.json", "--mesh", "tp=2", "--backend", "bundle"],
     "--backend bundle emits, it does not run"),
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


_OUTSIDE = "--param N=9: mesh 'tp=N~2..8': axis 'tp': N=9 is outside its bounds 2..8"


@pytest.mark.parametrize("argv", [
    ["emit", "--shard-form", "dynamic"], ["emit", "--shard-form", "partitioned"],
    ["emit", "--shard-form", "unrolled"], ["emit", "--forall"], ["run", "--check"], ["shard"],
    ["shard", "--format", "json"], ["schedule"],
])
def test_a_mesh_size_outside_its_bounds_is_refused_before_planning_by_every_command(capsys,
                                                                                     argv):
    status, out, err = run(capsys, *argv[:1], "examples/mlp.json", *argv[1:], "--mesh",
                           "tp=N~2..8", "--param", "N=9")
    one_line_error(status, err, _OUTSIDE)
    assert out == ""  # nothing planned or printed first


@pytest.mark.parametrize(("argv", "match"), [
    # the symbolic forms print the mesh for every size: a size given would be dropped
    (["emit", "examples/mlp.json", "--mesh", "tp=N~2..8", "--shard-form", "dynamic", "--param",
      "N=4"], "--param N=4: --shard-form dynamic keeps the mesh symbolic, for every N in 2..8 "
              "(axis 'tp'); --param N binds it for --shard-form partitioned or unrolled"),
    (["emit", "examples/mlp.json", "--mesh", "tp=N~2..8", "--shard-form", "annotated",
      "--param", "N=4"], "--shard-form annotated keeps the mesh symbolic"),
    (["emit", "examples/mlp.json", "--mesh", "tp=N~2..8", "--param", "N=1", "--forall"],
     "--param N=1: mesh 'tp=N~2..8': axis 'tp': N=1 is outside its bounds 2..8"),
    (["shard", "examples/mlp.json", "--mesh", "dp=M~2,tp=N~4", "--param", "N=4"],
     "--param N=4: mesh 'dp=M~2,tp=N~4' has symbolic sizes M, N, and its per-device programs "
     "need every one: give --param M=SIZE too, or none"),
    (["shard", "examples/mlp.json", "--mesh", "dp=M~2,tp=N~4", "--param", "N=4000", "--param",
      "M=2"], "--param N=4000 --param M=2: mesh 'dp=2,tp=4000': dp=2, tp=4000 makes 8000 "
              "devices, more than the 4096 a mesh may have"),
    (["run", "examples/mlp.json", "--mesh", "tp=N~4", "--param", "N=\u0663"],
     "--param 'N=\u0663': value '\u0663' is not an integer in decimal digits 0-9"),
])
def test_a_mesh_size_the_command_cannot_use_is_a_one_line_error(capsys, argv, match):
    status, out, err = run(capsys, *argv)
    one_line_error(status, err, match)
    assert out == ""


@pytest.mark.distributed
def test_a_symbolic_mesh_runs_on_torch_distributed_once_bound(capsys):
    pytest.importorskip("torch")
    status, out, _ = run(capsys, "run", "examples/megatron.json", "--mesh", "tp=N~4",
                         "--param", "N=2", "--backend", "dtensor", "--check")
    assert status == 0 and "2 processes (gloo)" in out and "matches the unplanned program" in out


# --- PyTorch models (--torch MODULE:FACTORY) -----------------------------------------------

TORCH_MLP = "apportion.frontend.torch_demo:mlp"

DRIFTING = '''
import torch

class Drifting(torch.nn.Module):
    """Run eagerly it doubles what the exported program computes."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.lin(x)
        return y if torch.compiler.is_exporting() else 2 * y

def drifting():
    torch.manual_seed(0)
    return Drifting().eval(), (torch.randn(8, 16),)
'''


@pytest.fixture
def torch_factories(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    (tmp_path / "driftfactories.py").write_text(DRIFTING)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_shard_torch_prints_the_plan_of_the_lowered_model_with_its_weights_placed(capsys):
    pytest.importorskip("torch")
    status, out, _ = run(capsys, "shard", "--torch", TORCH_MLP, "--mesh", "tp=2")
    assert status == 0
    assert "mlp over tp=2 (tp=2, 2 devices) (search; spyre, 32 cores per device)" in out
    assert ("inputs placed: p_gate_weight [tp, -], p_up_weight [tp, -], p_down_weight [-, tp], "
            "x [-, -]") in out
    assert "per-device programs: 2 devices" in out
    assert "ATen nodes: 9 lowered to non-fallback ops, 0 to fallbacks (none), 0 dropped" in out


def test_shard_torch_json_carries_each_ops_pytorch_origin(capsys):
    pytest.importorskip("torch")
    status, out, _ = run(capsys, "shard", "--torch", TORCH_MLP, "--mesh", "tp=2",
                         "--format", "json")
    doc = json.loads(out)
    assert status == 0 and doc["format"] == "apportion.sharding/1" and doc["torch"] == TORCH_MLP
    assert doc["inputs"]["p_gate_weight"] == [["tp"], []]
    assert doc["origins"]["mm"]["target"] == "aten.mm.default"
    assert doc["origins"]["mm"]["module"] == "gate"


@pytest.mark.slow
def test_run_torch_with_a_mesh_checks_the_per_device_programs_against_eager_pytorch(capsys):
    pytest.importorskip("torch")
    status, out, _ = run(capsys, "run", "--torch", TORCH_MLP, "--mesh", "dp=2,tp=2", "--check")
    assert status == 0
    assert "per-device programs of mlp from --torch apportion.frontend.torch_demo:mlp over " \
           "dp=2,tp=2" in out
    assert "matches the model run eagerly in PyTorch" in out
    status, out, _ = run(capsys, "run", "--torch", TORCH_MLP, "--mesh", "tp=N~4", "--param",
                         "N=2")
    assert status == 0 and "mesh sizes: N=2 (planned at N=4)" in out and "ran mlp" in out


def test_emit_torch_with_a_mesh_prints_every_devices_programs(capsys):
    pytest.importorskip("torch")
    status, out, _ = run(capsys, "emit", "--torch", TORCH_MLP, "--mesh", "tp=2", "--forall")
    assert status == 0 and "// device 1 (tp=1) of mesh tp=2" in out and "scf.forall" in out


def test_a_sharded_torch_model_whose_numbers_differ_from_eager_exits_1(torch_factories, capsys):
    status, out, _ = run(capsys, "run", "--torch", "driftfactories:drifting", "--mesh", "tp=2",
                         "--check")
    assert status == 1
    assert "MISMATCH" in out and "differs from" in out
    assert " ".join(out.split()).endswith("the model run eagerly in PyTorch on addmm")


@pytest.mark.parametrize(("argv", "match"), [
    (["shard", "examples/mlp.json", "--torch", TORCH_MLP, "--mesh", "tp=2"],
     "give a program file or --torch, not both ('examples/mlp.json' and --torch "
     "'apportion.frontend.torch_demo:mlp')"),
    (["run", "--torch", "nosuchmodule:make", "--mesh", "tp=2", "--check"],
     "--torch 'nosuchmodule:make': cannot import module 'nosuchmodule'"),
    (["shard", "--torch", TORCH_MLP, "--mesh", "tp=0"],
     "mesh axis 'tp': size must be an int >= 1, got 0"),
    (["run", "--torch", TORCH_MLP, "--mesh", "tp=2", "--param", "K=3"],
     "--param K: not a symbolic size of mesh 'tp=2' (its symbolic sizes: none) nor a run-time "
     "size of program 'mlp'"),
    (["shard", "--torch", TORCH_MLP, "--mesh", "tp=2", "--strategy", "greedy"],
     "--strategy and --auto-tile do not apply with --mesh"),
    (["run", "--torch", "nosuchmodule:make", "--mesh", "tp=N~2..8", "--param", "N=9"],
     _OUTSIDE),  # refused before the model is imported
])
def test_bad_torch_sharding_input_is_a_one_line_error(capsys, argv, match):
    pytest.importorskip("torch")
    status, _, err = run(capsys, *argv)
    one_line_error(status, err, match)


@pytest.mark.distributed
def test_run_torch_on_torch_distributed_matches_eager_pytorch(capsys):
    pytest.importorskip("torch")
    status, out, err = run(capsys, "run", "--torch", TORCH_MLP, "--mesh", "tp=2", "--backend",
                           "dtensor", "--check")
    assert status == 0 and "2 processes (gloo)" in out
    assert "distributed run of mlp from --torch apportion.frontend.torch_demo:mlp over tp=2" in out
    assert "matches the model run eagerly in PyTorch" in out


# --- tiling groups and pins in the per-device programs --------------------------------------

def test_shard_says_what_became_of_each_tiling_group_and_run_keeps_it(capsys):
    status, out, _ = run(capsys, "shard", "examples/fused.json", "--mesh", "tp=2")
    assert status == 0
    assert "tiling group ['add', 'mul'] on every device: 2 over m, 4 over n of its" in out
    status, out, _ = run(capsys, "run", "examples/fused.json", "--mesh", "tp=2", "--check")
    assert status == 0 and "matches the unplanned program" in out


def test_propagation_keeps_a_tiled_op_whole_where_a_devices_share_would_break_its_count(
        capsys, tmp_path):
    doc = json.loads(Path("examples/fused.json").read_text())
    doc["tiling"][0]["loops"] = [{"count": 4, "dims": ["m"]}]
    doc["shardings"] = {"a": [["tp"], []]}
    for name in "abc":
        doc["tensors"][name]["shape"] = [24, 64]
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    # annotated by rows over 4 devices: 6 rows each, which 4 tiles cannot cut; propagation
    # keeps m whole (the ops split n), so the plan reshards a rather than break the group
    status, out, _ = run(capsys, "shard", str(f), "--mesh", "tp=4", "--method", "propagate")
    assert status == 0 and "a: all_to_all(tp) dim 0 -> dim 1" in out
    assert "tiling group ['add', 'mul'] on every device: 4 over m of its m=24" in out
    status, out, _ = run(capsys, "run", str(f), "--mesh", "tp=4", "--method", "propagate",
                         "--check")
    assert status == 0 and "matches the unplanned program" in out


def test_ops_of_a_tiling_group_the_mesh_cuts_unlike_are_a_one_line_error(capsys, tmp_path):
    doc = json.loads(Path("examples/fused.json").read_text())
    doc["ops"][1]["ins"] = ["c[m,n]", "c[m,n]"]  # mul no longer reads add's output
    doc["outputs"] = ["y", "z"]
    doc["shardings"] = {"a": [["tp"], []], "c": [[], []]}
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    status, _, err = run(capsys, "shard", str(f), "--mesh", "tp=2", "--method", "propagate")
    one_line_error(status, err, "tiling group ['add', 'mul'] cannot be kept on device 0 (tp=0): "
                                "dim 'm' is 512 there in op 'add' but 1024 in op 'mul'")


def test_a_symbolic_loop_count_given_with_param_is_the_count_every_device_loops(capsys):
    status, out, _ = run(capsys, "shard", "examples/softmax_symbolic.json", "--mesh", "tp=2",
                         "--param", "T=16")
    assert status == 0 and "tiling group ['rowmax', 'shift', 'exp', 'rowsum', 'norm'] on " \
                           "every device: 16 over m of its m=" in out
    status, out, _ = run(capsys, "shard", "examples/softmax_symbolic.json", "--mesh", "tp=2")
    assert status == 0 and "on every device: T over m of its m=" in out
    status, out, _ = run(capsys, "run", "examples/softmax_symbolic.json", "--mesh", "tp=2",
                         "--param", "T=16", "--check")
    assert status == 0 and "matches the unplanned program" in out
    status, _, err = run(capsys, "run", "examples/softmax_symbolic.json", "--mesh", "tp=2",
                         "--param", "T=4", "--check")
    one_line_error(status, err, "--param T=4: loop count 'T' of tiling group ['rowmax', "
                                "'shift', 'exp', 'rowsum', 'norm'] takes 8..64")
    status, _, err = run(capsys, "run", "examples/softmax_symbolic.json", "--mesh", "tp=2",
                         "--check")
    one_line_error(status, err, "program 'softmax_symbolic' has symbolic loop count T, which "
                                "its per-device programs keep: pass --param T=N")
