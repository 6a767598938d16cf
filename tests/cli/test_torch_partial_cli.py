"""``--torch`` with a model on the meta device (plan, emit and shard from shapes; run refuses in
one line) and with nodes apportion cannot lower (their table, ``--partial``)."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from apportion.cli.main import main  # noqa: E402
from apportion.frontend.torch_aten import LOWERINGS  # noqa: E402

META = "apportion.frontend.torch_models:llama3_tiny"

FACTORY = '''
import torch


class ConvTopk(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3)
        self.conv2 = torch.nn.Conv2d(4, 4, 3)
        self.head = torch.nn.Linear(4, 8)

    def forward(self, x):
        y = self.conv2(torch.relu(self.conv1(x)))
        top, _ = torch.topk(self.head(y.mean((2, 3))), 3)
        return torch.exp(top) + 1


def conv_topk():
    torch.manual_seed(0)
    return ConvTopk().eval(), (torch.randn(2, 3, 10, 10),)
'''


@pytest.fixture
def unlowerable(tmp_path, monkeypatch):
    """A factory of a model with two convolutions and a topk, neither of which has a lowering
    here (taken out of the table: another module may add them)."""
    (tmp_path / "partialfactories.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    for target in ("aten.convolution.default", "aten.topk.default"):
        monkeypatch.delitem(LOWERINGS, target, raising=False)


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("apportion: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_plan_of_a_meta_device_llama_prints_the_model_report(capsys):
    assert main(["plan", "--torch", META, "--cores", "8"]) == 0
    out = capsys.readouterr().out
    assert "by op family" in out and "22 weights with shapes only (meta device)" in out


@pytest.mark.slow
def test_emit_and_shard_of_a_meta_device_llama_work_from_shapes(capsys):
    assert main(["emit", "--forall", "--torch", META, "--cores", "4"]) == 0
    assert "scf.forall" in capsys.readouterr().out
    assert main(["shard", "--torch", META, "--mesh", "tp=2"]) == 0
    assert "per-device programs: 2 devices" in capsys.readouterr().out


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_run_of_a_meta_device_llama_refuses_in_one_line_naming_weights(check, capsys):
    assert main(["run", "--torch", META, "--cores", "4", *check]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "22 weights with shapes only" in line and "needs weights" in line


def test_every_unsupported_node_is_one_table_and_one_error_line(unlowerable, capsys):
    assert main(["plan", "--torch", "partialfactories:conv_topk"]) == 2
    err = capsys.readouterr().err
    line = _one_error_line(err)
    assert "3 ATen nodes of 'conv_topk' cannot be lowered" in line and "--partial" in line
    rows = {r.split()[0]: r.split() for r in err.splitlines() if r.startswith("aten.")}
    assert rows["aten.convolution.default"][1:4] == ["2", "partialfactories.py:13", "conv1"]
    assert rows["aten.topk.default"][1:3] == ["1", "partialfactories.py:14"]
    assert "3 of 9 ATen nodes (33.3%) cannot be lowered" in err


def test_plan_partial_plans_the_rest_and_prints_the_table_of_what_it_left_out(unlowerable,
                                                                            capsys):
    assert main(["plan", "--torch", "partialfactories:conv_topk", "--partial"]) == 0
    captured = capsys.readouterr()
    assert "left out by --partial" in captured.err and "aten.topk.default" in captured.err
    assert "3 of 9 ATen nodes (33.3%) cannot be lowered" in captured.err
    assert "by op family" in captured.out
    assert ("3 left out by --partial (aten.convolution.default, aten.topk.default)"
            in captured.out)


def test_plan_partial_json_lists_the_nodes_left_out(unlowerable, capsys):
    assert main(["plan", "--torch", "partialfactories:conv_topk", "--partial", "--format",
                 "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    left = doc["unsupported"]
    assert [u["target"] for u in left] == ["aten.convolution.default"] * 2 + [
        "aten.topk.default"]
    assert left[1]["inputs"] == ["convolution_1"] and left[1]["reads"] == ["relu"]


def test_emit_partial_emits_the_lowered_part(unlowerable, capsys):
    assert main(["emit", "--forall", "--torch", "partialfactories:conv_topk", "--partial"]) == 0
    captured = capsys.readouterr()
    assert "scf.forall" in captured.out and "left out by --partial" in captured.err


def test_run_partial_is_refused_before_any_work(unlowerable, capsys):
    assert main(["run", "--torch", "partialfactories:conv_topk", "--partial"]) == 2
    assert "run does not support" in _one_error_line(capsys.readouterr().err)
