"""``apportion cuda build | run | check``: a ``--torch`` model or ``.pt2`` program built as
given (not the default MLP), and every numeric option checked in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from apportion.cli.main import main
from apportion.mlir import upstream
from tests.helpers import cli_status, one_error_line

pytestmark = pytest.mark.skipif(not upstream.available(),
                                reason="needs the mlir extra (upstream MLIR 22)")

#: the demo MLP at a size that builds in a second or two
TINY = "tests.cli.test_cuda:tiny_mlp"
FUSED = str(Path(__file__).resolve().parents[2] / "examples" / "fused.json")


def tiny_mlp():
    """A factory for ``--torch``: the demo's gated MLP on 8 tokens of 32 features."""
    from apportion.frontend.torch_demo import mlp

    return mlp(tokens=8, hidden=32)


def _eager_results(folder: Path, model, args) -> None:
    """The model run eagerly in PyTorch, written as the outputs of a GPU run of the build in
    ``folder``."""
    import torch

    with torch.no_grad():
        out = model(*args).numpy()
    (result,) = json.loads((folder / "manifest.json").read_text())["results"]
    assert result["shape"] == list(out.shape)
    (folder / "results").mkdir()
    np.savez(folder / "results" / "outputs.npz", **{result["name"]: out})


def _check_against_the_model(folder: Path, model, args, capsys) -> None:
    """``cuda check`` of the model's eager outputs passes, and of one changed number fails:
    the build's reference and inputs are the model's own."""
    _eager_results(folder, model, args)
    capsys.readouterr()
    assert main(["cuda", "check", str(folder)]) == 0, capsys.readouterr()
    assert "matches" in capsys.readouterr().out
    outputs = folder / "results" / "outputs.npz"
    with np.load(outputs) as f:
        changed = {k: f[k].copy() for k in f.files}
    for a in changed.values():
        a.flat[0] += 1.0
    np.savez(outputs, **changed)
    assert main(["cuda", "check", str(folder)]) == 1


def test_cuda_build_of_a_torch_model_builds_the_model_on_its_own_inputs(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "mlp"
    assert main(["cuda", "build", "--torch", TINY, "--cores", "8", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"built {out}: tiny_mlp, ")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["program"] == "tiny_mlp"  # not the built-in llama3-8b-mlp-128
    model, (x,) = tiny_mlp()
    with np.load(out / "inputs.npz") as saved:
        np.testing.assert_array_equal(saved["x"], x.numpy())
    _check_against_the_model(out, model, (x,), capsys)


def test_cuda_build_of_a_pt2_file_builds_the_saved_program(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    model, (x,) = tiny_mlp()
    saved = tmp_path / "small_mlp.pt2"
    torch.export.save(torch.export.export(model, (x,)), saved)
    out = tmp_path / "b"
    assert main(["cuda", "build", str(saved), "--cores", "8", "--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["program"] == "small_mlp"
    _check_against_the_model(out, model, (x,), capsys)


@pytest.mark.parametrize(("extra", "said"), [
    (["--seed", "3"], "--seed 3: a --torch model's build runs on the model's example inputs"),
    (["--partial"], "cuda build --partial: a build runs every node of the model"),
    (["--param", "rows=4"], "--param rows=4: 'rows' is not a symbolic loop count"),
    (["--dynamic", "x:0=rows:2..128", "--param", "rows=400"],
     "--param rows=400: symbol 'rows' = 400 is outside its bounds 2..128"),
])
def test_what_a_torch_model_s_build_cannot_take_is_refused_in_one_line(tmp_path, capsys,
                                                                        extra, said):
    pytest.importorskip("torch")
    out = tmp_path / "b"
    assert main(["cuda", "build", "--torch", TINY, "--cores", "8", "--out", str(out),
                 *extra]) == 2
    assert said in one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize(("argv", "said"), [
    (["build", FUSED, "--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
    (["build", FUSED, "--seed", "1_0"], "argument --seed: expected an integer >= 0 in digits"),
    (["build", FUSED, "--threads", "0"], "argument --threads: must be an integer in 1..1024"),
    (["build", FUSED, "--threads", "1025"], "argument --threads: must be an integer in 1..1024"),
    (["build", FUSED, "--threads", "\u0661\u0662"], "argument --threads: expected an integer"),
    (["build", FUSED, "--cores", "0"], "argument --cores: must be an integer >= 1"),
    (["build", FUSED, "--param", "X=3"], "--param X=3: 'X' is not a symbolic loop count"),
    (["run", "B", "--repeat", "0"], "argument --repeat: must be an integer >= 1, got 0"),
    (["run", "B", "--repeat", "\u00b3"], "argument --repeat: expected an integer >= 1"),
])
def test_an_out_of_range_number_is_refused_in_one_line(tmp_path, capsys, argv, said):
    out = ["--out", str(tmp_path / "b")] if argv[0] == "build" else []
    assert cli_status(["cuda", *argv, *out]) == 2
    assert said in one_error_line(capsys)
    assert not (tmp_path / "b").exists()


def test_a_program_with_a_loop_count_names_the_param_it_needs(tmp_path, capsys):
    examples = Path(FUSED).parent
    assert main(["cuda", "build", str(examples / "softmax_symbolic.json"), "--out",
                 str(tmp_path / "b")]) == 2
    assert "pass --param T=N" in one_error_line(capsys)
