"""``--torch module:factory`` on the command line, and the demo."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from apportion.cli.main import main  # noqa: E402

FACTORY = '''
import torch

def tiny():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 32))
    return model, (torch.randn(8, 64),)

def broken():
    raise RuntimeError("no weights here")

def not_a_pair():
    return 3

def exits():
    raise SystemExit(3)

def empty_tokens():
    return torch.nn.Embedding(10, 8), (torch.zeros(0, dtype=torch.long),)

def bf16():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8).to(torch.bfloat16), (torch.ones(2, 8, dtype=torch.bfloat16),)
'''


@pytest.fixture
def factory_dir(tmp_path, monkeypatch):
    (tmp_path / "userfactories.py").write_text(FACTORY)
    (tmp_path / "syntaxfactories.py").write_text("def make(:\n    pass\n")
    (tmp_path / "exitingfactories.py").write_text("import sys\nsys.exit(4)\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_plan_torch_prints_the_model_report_with_pytorch_names(factory_dir, capsys):
    assert main(["plan", "--torch", "userfactories:tiny", "--cores", "8"]) == 0
    out = capsys.readouterr().out
    assert "by op family" in out and "matmul" in out and "lowest utilization:" in out
    assert "torch node" in out and "userfactories" not in out.split("lowest")[0]
    assert "lowered to non-fallback ops" in out and "100.0% lowered" in out


def test_plan_torch_json_carries_each_ops_origin(factory_dir, capsys):
    assert main(["plan", "--torch", "userfactories:tiny", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    origins = doc["origins"]
    assert set(origins) <= {o["name"] for o in doc["ops"]} and origins
    assert all("node" in o and "target" in o for o in origins.values())


def test_plan_torch_plot_writes_both_pictures(factory_dir, capsys):
    assert main(["plan", "--torch", "userfactories:tiny", "--plot", str(factory_dir)]) == 0
    for name in ("utilization.png", "largest_op.png"):
        assert (factory_dir / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("strategy", ["greedy", "balanced"])
def test_run_torch_check_matches_the_model_run_eagerly(factory_dir, strategy, capsys):
    assert main(["run", "--torch", "userfactories:tiny", "--check", "--strategy", strategy,
                 "--cores", "8"]) == 0
    assert "matches the model run eagerly in PyTorch" in capsys.readouterr().out


def test_run_torch_check_on_gpt2_from_transformers(capsys):
    assert main(["run", "--torch", "apportion.frontend.torch_demo:tiny_gpt2", "--check",
                 "--cores", "32"]) == 0
    assert "matches the model run eagerly" in capsys.readouterr().out


def test_emit_torch_bundle_verifies(factory_dir, capsys):
    assert main(["emit", "--torch", "userfactories:tiny", "--bundle", "--cores", "4"]) == 0
    assert "apportion.execute" in capsys.readouterr().out


@pytest.mark.parametrize(("spec", "message"), [
    ("userfactories", "expected MODULE:FACTORY"),
    ("nosuchmodule:tiny", "cannot import module 'nosuchmodule'"),
    ("userfactories:missing", "has no callable 'missing'"),
    ("userfactories:broken", "broken() raised RuntimeError: no weights here"),
    ("userfactories:not_a_pair", "must return (model, example_inputs)"),
    ("syntaxfactories:make", "module 'syntaxfactories' has a syntax error: invalid syntax ("),
    ("../userfactories:tiny", "'../userfactories' is not a module name"),
    ("exitingfactories:make", "importing module 'exitingfactories' raised SystemExit(4)"),
    ("userfactories:exits", "exits() raised SystemExit(3)"),
    ("userfactories:empty_tokens", "the example input 'input' has shape [0], an empty tensor"),
])
def test_a_bad_factory_is_one_error_line_and_exit_2(factory_dir, spec, message, capsys):
    assert main(["plan", "--torch", spec]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_run_torch_check_of_a_bfloat16_model_matches_eager_within_bf16s_precision(factory_dir,
                                                                                 capsys):
    assert main(["run", "--torch", "userfactories:bf16", "--check", "--cores", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 bfloat16 eps" in out and "matches the model run eagerly in PyTorch" in out


def test_a_program_file_and_torch_together_are_refused(factory_dir, capsys):
    assert main(["plan", "prog.json", "--torch", "userfactories:tiny"]) == 2
    assert "not both" in capsys.readouterr().err


def test_demo_exports_plans_runs_and_checks_a_small_llama(capsys):
    assert main(["demo", "--cores", "8"]) == 0
    out = capsys.readouterr().out
    assert "Llama-style decoder" in out and "by op family" in out
    assert "greedy for comparison" in out and "matches the model run eagerly in PyTorch" in out
