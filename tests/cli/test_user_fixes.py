"""What a new user hit on the command line: ``--plot`` into folders that do not exist yet or
one picture per op into a folder, ``--target`` help naming every preset, an unbounded span
limit printed as such, one least-utilized op per PyTorch node, distinct colours for adjacent
cores, and a progress line on a terminal only."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from apportion.cli.main import build_parser, main
from apportion.cli.progress import progress
from apportion.planned import plan
from apportion.report.plot import core_colour, is_plot_file, plot_file_name
from apportion.report.tables import lowest_utilization, span_limit_text
from apportion.target.presets import PRESETS, resolve
from tests.helpers import program

ROOT = Path(__file__).parents[2]
MLP = str(ROOT / "examples/mlp.json")
PNG = b"\x89PNG"


def test_plot_file_in_missing_folders_makes_them(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "gate.png"
    assert main(["plan", MLP, "--cores", "4", "--plot", str(out), "--op", "gate"]) == 0
    assert out.read_bytes()[:4] == PNG
    assert f"wrote {out} (op gate)" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["plots", "new/plots/", "."])
def test_plot_folder_gets_one_picture_per_op(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", MLP, "--cores", "4", "--plot", name]) == 0
    folder = tmp_path / name
    for op in ("gate", "up", "act", "glu", "down"):
        assert (folder / f"{op}.png").read_bytes()[:4] == PNG
    assert "wrote 5 pictures to" in capsys.readouterr().out


def test_plot_folder_with_op_draws_that_op_only(tmp_path, capsys):
    assert main(["plan", MLP, "--cores", "4", "--plot", str(tmp_path / "d"), "--op", "up"]) == 0
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["up.png"]


def test_plot_under_a_file_is_one_error_line(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    for where in ("f/g.png", "f/sub"):
        assert main(["plan", MLP, "--plot", str(tmp_path / where)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is not a folder" in err, err


def test_plot_path_kinds_and_file_names():
    assert is_plot_file("g.png") and is_plot_file("x/g.svg") and is_plot_file("g.xyz")
    assert not is_plot_file("plots") and not is_plot_file("plots.d/") and not is_plot_file(".")
    assert plot_file_name("mm.partial") == "mm.partial.png"
    assert plot_file_name("a/b") == "a_b.png"


def test_plot_help_documents_files_and_folders(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "FILE.png|DIR" in text and "one OP.png per op" in text
    assert "Missing folders are made" in text


@pytest.mark.parametrize("command", ["plan", "run", "emit", "shard"])
def test_target_help_names_every_preset(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"a preset ({', '.join(PRESETS)})" in text and "gpu" in text


def test_unbounded_span_limit_prints_as_unbounded(capsys):
    assert span_limit_text(256 << 20) == "256.0"
    assert span_limit_text(1 << 62) == "unbounded"
    assert main(["plan", str(ROOT / "examples/splitk.json"), "--target", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "/ unbounded" in out and "4398046511104" not in out
    assert main(["plan", MLP, "--cores", "4"]) == 0
    assert "/ 256.0" in capsys.readouterr().out


def test_least_utilized_ops_show_one_per_source_node():
    ops = [{"name": f"c{i}", "op": "exp", "out": f"y{i}[m,n]", "ins": ["x[m,n]"]}
           for i in range(6)] + [{"name": "big", "op": "exp", "out": "z[m,n]", "ins": ["w[m,n]"]}]
    p = program({"x": ([1, 64], "float16"), "w": ([256, 256], "float16")}, ops,
                [*(f"y{i}" for i in range(6)), "z"])
    planned = plan(p, resolve("spyre", 32))
    labels = {f"c{i}": "torch node 'cat'" for i in range(6)} | {"big": "torch node 'exp'"}
    lines = lowest_utilization(planned.plan, labels)
    assert len(lines) == 2  # six chunks of 'cat', one op of 'exp'
    assert "torch node 'cat'" in lines[0] and "5 more ops of this node" in lines[0]
    assert "torch node 'exp'" in lines[1] and "more op" not in lines[1]
    # without labels every op is its own source
    assert len(lowest_utilization(planned.plan)) == 5


def test_adjacent_cores_get_distinct_colours():
    colours = [core_colour(c) for c in range(64)]
    for a, b in zip(colours, colours[1:], strict=False):
        assert a != b
    assert len(set(colours[:20])) == 20  # twenty cores in a row: twenty colours


def test_progress_shows_on_a_terminal_only():
    piped = io.StringIO()
    with progress(Console(file=piped, width=160), "compiling"):
        pass
    assert piped.getvalue() == ""
    tty = io.StringIO()
    with progress(Console(file=tty, force_terminal=True, width=160), "compiling"):
        pass
    assert "compiling" in tty.getvalue()


def test_run_iree_shows_its_step_on_a_terminal_and_not_in_a_pipe(monkeypatch, capsys, tmp_path):
    import apportion.cli.main as cli

    monkeypatch.setenv("HOME", str(tmp_path))  # a fresh module cache: the compile happens
    argv = ["run", str(ROOT / "examples/fused.json"), "--backend", "iree", "--check"]
    assert main(argv) == 0
    piped = capsys.readouterr().out
    assert "compiling" not in piped and "matches the unplanned program" in piped
    tty = io.StringIO()

    class Terminal(cli._Console):
        def __init__(self, **_: object) -> None:
            super().__init__(file=tty, force_terminal=True, width=160)

    monkeypatch.setattr(cli, "_Console", Terminal)
    assert main(argv) == 0
    assert "compiling fused with IREE" in tty.getvalue()
    assert "matches the unplanned program" in tty.getvalue()


def test_plan_torch_plot_names_a_folder_not_a_file(tmp_path, capsys):
    assert main(["plan", "--torch", "apportion.frontend.torch_demo:mlp",
                 "--plot", str(tmp_path / "u.png")]) == 2
    err = capsys.readouterr().err
    assert "names a folder" in err and err.count("\n") == 1
    assert not (tmp_path / "u.png").exists()


def test_plan_torch_plot_makes_its_folder(tmp_path, capsys):
    out = tmp_path / "new" / "plots"
    assert main(["plan", "--torch", "apportion.frontend.torch_demo:mlp", "--plot", str(out)]) == 0
    for name in ("utilization.png", "largest_op.png"):
        assert (out / name).read_bytes()[:4] == PNG
