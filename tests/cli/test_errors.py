"""Bad command-line input: exit status 2 and one line on stderr naming what is at fault, checked
before any long work; a reader that closes the pipe early ends the command quietly."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import apportion.cli.main as cli
from apportion.bench import tiling as bench_tiling
from apportion.bench import workdiv as bench_workdiv
from apportion.cli import options
from apportion.cli.main import main
from apportion.errors import EmitError
from tests.helpers import cli_status, one_error_line

ROOT = Path(__file__).parents[2]
MLP = str(ROOT / "examples/mlp.json")
SCALAR = {  # one op whose output is a scalar: nothing to draw
    "format": "apportion.program/1", "name": "tot",
    "tensors": {"x": {"shape": [4, 64], "dtype": "float32"},
                "s": {"shape": [], "dtype": "float32"}},
    "inputs": ["x"], "outputs": ["s"],
    "ops": [{"name": "total", "op": "sum", "out": "s[]", "ins": ["x[i,j]"]}],
}


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a refused command, apportion's own."""
    line = one_error_line(capsys)
    assert line.startswith("apportion: error: "), line
    return line


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *parts: str) -> str:
    assert cli_status(argv) == 2
    line = one_error(capsys)
    for part in parts:
        assert part in line, line
    return line


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the command plans or benchmarks anything."""
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command started work before refusing its input")

    monkeypatch.setattr(options, "plan_program", boom)
    monkeypatch.setattr(bench_workdiv, "run", boom)
    monkeypatch.setattr(bench_tiling, "run", boom)


def symbolic_program(tmp_path: Path) -> str:
    """examples/fused.json with its outer loop count the symbol T."""
    doc = json.loads((ROOT / "examples/fused.json").read_text())
    doc["tiling"][0]["loops"][0]["count"] = "T"
    path = tmp_path / "sym.json"
    path.write_text(json.dumps(doc))
    return str(path)


# -- 1. --plot ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "parts"), [  # a missing folder is made; no extension: a folder
    ("gate.xyz", ["--plot", "gate.xyz", "'.xyz'", ".png", ".pdf", ".svg"]),
    ("sub/gate.bmpx", ["--plot", "gate.bmpx", "'.bmpx'", ".png"]),
])
def test_plot_path_is_refused_before_planning(name, parts, tmp_path, capsys, no_work):
    refused(["plan", MLP, "--plot", str(tmp_path / name)], capsys, *parts)


def test_plot_path_whose_folder_is_a_file_is_refused(tmp_path, capsys, no_work):
    (tmp_path / "f").write_text("")
    refused(["plan", MLP, "--plot", str(tmp_path / "f" / "g.png")], capsys, "is not a folder")


def test_plot_extensions_come_from_matplotlib(tmp_path, capsys, no_work):
    from matplotlib.figure import Figure

    line = refused(["plan", MLP, "--plot", str(tmp_path / "g.bmpx")], capsys)
    for ext in Figure().canvas.get_supported_filetypes():
        assert f".{ext}" in line


@pytest.mark.parametrize(("argv", "parts"), [
    (["--op", "gate"], ["--op 'gate'", "needs --plot"]),
    (["--op", "nope", "--plot", "{tmp}/g.png"], ["--op 'nope'", "no such op", "gate, up"]),
])
def test_op_is_checked_before_planning(argv, parts, tmp_path, capsys, no_work):
    refused(["plan", MLP] + [a.format(tmp=tmp_path) for a in argv], capsys, *parts)


def test_plot_of_a_scalar_output_is_refused(tmp_path, capsys, no_work):
    path = tmp_path / "tot.json"
    path.write_text(json.dumps(SCALAR))
    refused(["plan", str(path), "--plot", str(tmp_path / "t.png")], capsys, "scalar output")
    refused(["plan", str(path), "--plot", str(tmp_path / "t.png"), "--op", "total"], capsys,
            "--op 'total'", "scalar output")


def test_plot_in_upper_case_and_svg_is_written(tmp_path, capsys):
    assert main(["plan", MLP, "--cores", "4", "--plot", str(tmp_path / "g.PNG")]) == 0
    assert (tmp_path / "g.PNG").read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {tmp_path / 'g.PNG'} (op " in capsys.readouterr().out
    assert main(["plan", MLP, "--cores", "4", "--plot", str(tmp_path / "g.svg")]) == 0
    assert b"<svg" in (tmp_path / "g.svg").read_bytes()[:400]


def test_plot_write_failure_is_one_line(tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    def fail(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Figure, "savefig", fail)
    refused(["plan", MLP, "--plot", str(tmp_path / "g.png")], capsys,
            "cannot write plot", "g.png", "Permission denied")


# -- 2. bench outputs, limits and core counts ---------------------------------------------------

@pytest.mark.parametrize("suite", ["workdiv", "tiling"])
@pytest.mark.parametrize(("argv", "parts"), [
    (["--json", "{tmp}/missing/out.json"], ["--json", "missing/out.json", "does not exist"]),
    (["--json", "{tmp}"], ["--json", "is a folder"]),
    (["--json", ""], ["--json", "empty"]),
    (["--limit", "0"], ["--limit", ">= 1", "got 0"]),
    (["--limit", "-1"], ["--limit", "got -1"]),
    (["--limit", "x"], ["--limit", "'x'"]),
    (["--cores", "8", "0"], ["--cores", "got 0"]),
    (["--cores", "8", "33"], ["cores must be in 1..32, got 33"]),
])
def test_bench_input_is_refused_before_the_benchmark(suite, argv, parts, tmp_path, capsys,
                                                     no_work):
    refused(["bench", suite] + [a.format(tmp=tmp_path) for a in argv], capsys, *parts)


@pytest.mark.parametrize(("text", "parts"), [
    ("{not json", ["models file", "is not valid JSON"]),
    ('{"models": {"m": {}}}', ["--models", "no key 'prefill_tokens'"]),
    ('{"models": {"m": 3}, "prefill_tokens": [128], "decode_batch": [1], '
     '"decode_context": [8]}', ["--models", "not a models file"]),
    ("[]", ["models file", "expected an object with a \"models\" table"]),
])
@pytest.mark.parametrize("suite", ["workdiv", "tiling"])
def test_bad_models_file_is_one_line(suite, text, parts, tmp_path, capsys, no_work):
    path = tmp_path / "models.json"
    path.write_text(text)
    refused(["bench", suite, "--models", str(path)], capsys, *parts)


@pytest.mark.parametrize("suite", ["workdiv", "tiling"])
def test_bench_limit_and_json(suite, tmp_path, capsys):
    out = tmp_path / "out.json"
    assert main(["bench", suite, "--limit", "1", "--cores", "8", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    # workdiv adds its prime-vocabulary probe to the first N shapes
    assert len(rows) == (2 if suite == "workdiv" else 1)
    assert all(r["case"] for r in rows)


# -- 3. numeric options -------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "parts"), [
    (["run", MLP, "--check", "--seed", "-1"], ["argument --seed", ">= 0", "got -1"]),
    (["run", MLP, "--seed", "1.5"], ["argument --seed", "'1.5'"]),
    (["run", MLP, "--threads", "0"], ["argument --threads", "in 1..4096", "got 0"]),
    (["run", MLP, "--threads", "-2"], ["argument --threads", "got -2"]),
    (["plan", MLP, "--cores", "0"], ["argument --cores", "got 0"]),
    (["emit", MLP, "--bundle", "--cores", "-3"], ["argument --cores", "got -3"]),
    (["demo", "--cores", "0"], ["argument --cores", "got 0"]),
    (["plan", MLP, "--strategy", "fast"], ["argument --strategy", "'fast'"]),
    (["plan", MLP, "--nope"], ["unrecognized arguments: --nope"]),
    (["emit", MLP], ["one of the arguments", "--bundle"]),
    ([], ["command"]),
])
def test_bad_option_values_exit_2_with_one_line(argv, parts, capsys, no_work):
    refused(argv, capsys, *parts)


def test_seed_zero_and_a_large_seed_run(capsys):
    assert main(["run", MLP, "--cores", "4", "--check", "--seed", str(2 ** 70)]) == 0


def test_nul_in_an_argument_is_refused(capsys, no_work):
    refused(["plan", MLP, "--target", "a\0b.toml"], capsys, "NUL")


# -- 4. a reader that closes early --------------------------------------------------------------

class ClosedPipe(io.TextIOBase):
    """A stdout whose reader has gone: every write fails as a closed pipe does."""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("argv", [
    ["plan", MLP, "--format", "json"],
    ["plan", MLP],  # the table goes through rich
    ["emit", str(ROOT / "examples/fused.json"), "--loopspec"],
])
def test_broken_pipe_ends_quietly_with_status_0(argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(argv) == 0
    monkeypatch.undo()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [
    ["plan", "examples/mlp.json", "--format", "json"],
    ["plan", "examples/attention.json"],
])
def test_broken_pipe_in_a_real_process(argv):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        p = subprocess.run([sys.executable, "-m", "apportion.cli.main", *argv], cwd=ROOT,
                           stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert (p.returncode, p.stderr) == (0, "")


def test_head_reads_the_first_bytes():
    p = subprocess.run(f"{sys.executable} -m apportion.cli.main plan examples/mlp.json "
                       "--format json | head -c 10", shell=True, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.stdout == '{\n  "forma' and "Error" not in p.stderr


# -- 5. program and target files ----------------------------------------------------------------

@pytest.mark.parametrize(("make", "parts"), [
    (lambda d: d / "missing.json", ["cannot read program file", "No such file"]),
    (lambda d: d, ["cannot read program file", "directory"]),
    (lambda d: (d / "bin.json", (d / "bin.json").write_bytes(b'{"\xff\xfe"}'))[0],
     ["not UTF-8"]),
    (lambda d: (d / "half.json", (d / "half.json").write_text('{"format": "apportion.pro'))[0],
     ["half.json"]),
])
def test_bad_program_file_is_one_line(make, parts, tmp_path, capsys, no_work):
    refused(["plan", str(make(tmp_path))], capsys, *parts)


@pytest.mark.parametrize(("text", "parts"), [
    (None, ["cannot read target file", "No such file"]),
    (b'preset = "spyre"\nmax_cores = "x"\n', ["max_cores"]),
    (b'preset = "spyre"\nspan_limit_mib = -1\n', ["span_limit_mib"]),
    (b'preset = "spyre"\nwarp = 3\n', ["unknown field 'warp'"]),
    (b'preset = "tpu"\n', ["preset must be one of"]),
    (b"max_cores = [[\n", ["not valid TOML"]),
    (b"\xff\xfe = 1", ["not UTF-8"]),
    (b"name = 'x'\n", ["missing fields"]),
])
def test_bad_target_file_is_one_line(text, parts, tmp_path, capsys, no_work):
    path = tmp_path / "t.toml"
    if text is not None:
        path.write_bytes(text)
    refused(["plan", MLP, "--target", str(path)], capsys, "t.toml", *parts)


def test_target_toml_that_is_a_folder(tmp_path, capsys, no_work):
    (tmp_path / "d.toml").mkdir()
    refused(["run", MLP, "--target", str(tmp_path / "d.toml")], capsys, "cannot read target")


# -- 6. --param ---------------------------------------------------------------------------------

def test_param_runs_a_symbolic_loop_count(tmp_path, capsys):
    assert main(["run", symbolic_program(tmp_path), "--param", "T=4", "--check"]) == 0
    assert "matches the unplanned program" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "parts"), [
    ([], ["symbolic loop count T", "--param T=N", "1..65535"]),
    (["--check"], ["--param T=N"]),
    (["--param", "T"], ["--param 'T'", "NAME=VALUE"]),
    (["--param", "T=x"], ["--param 'T=x'", "not an integer"]),
    (["--param", "=4"], ["--param '=4'", "NAME=VALUE"]),
    (["--param", "U=4"], ["--param U=4", "'U' is not a symbolic loop count", "counts: T"]),
    (["--param", "T=65536"], ["--param T=65536", "1..65535", "max_loop_count"]),
    (["--param", "T=0"], ["--param T=0", "1..65535"]),
    (["--param", "T=-2"], ["--param T=-2", "1..65535"]),
    (["--param", "T=2", "--param", "T=4"], ["--param T given twice"]),
])
def test_bad_param_is_refused_before_planning(argv, parts, tmp_path, capsys, no_work):
    refused(["run", symbolic_program(tmp_path), *argv], capsys, *parts)


@pytest.mark.parametrize(("command", "value"), [("run", "1"), ("run", "9"), ("schedule", "1"),
                                                ("schedule", "65535")])
def test_a_loop_count_outside_the_bounds_the_program_gives_it_is_refused_before_planning(
        command, value, tmp_path, capsys, no_work):
    path = Path(symbolic_program(tmp_path))
    doc = json.loads(path.read_text())
    doc["tiling"][0]["loops"][0] |= {"min": 2, "max": 8}
    path.write_text(json.dumps(doc))
    refused([command, str(path), "--param", f"T={value}"], capsys,
            f"--param T={value}: loop count 'T' of tiling group", "takes 2..8")


def test_param_for_a_program_without_symbolic_counts(capsys, no_work):
    refused(["run", MLP, "--param", "T=4"], capsys, "'T' is not a symbolic loop count",
            "counts: none")


def test_param_that_does_not_divide_the_dim_names_it(tmp_path, capsys):
    refused(["run", symbolic_program(tmp_path), "--param", "T=3"], capsys, "'T'", "divide")


# -- the rest of the rule -----------------------------------------------------------------------

def test_run_too_big_for_this_machine_is_refused_before_any_work(tmp_path, capsys, no_work):
    doc = json.loads((ROOT / "examples/fused.json").read_text())
    for t in doc["tensors"].values():
        t["shape"] = [2 ** 22, 2 ** 22]  # 32 TiB each
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(doc))
    refused(["run", str(path), "--target", "cpu"], capsys, "needs at least", "GiB",
            "tensor 'a'")


def test_out_of_memory_is_one_line(monkeypatch, capsys):
    def oom(*args, **kwargs):
        raise MemoryError("Unable to allocate 8.00 GiB for an array")

    monkeypatch.setattr(options, "plan_program", oom)
    refused(["plan", MLP], capsys, "out of memory", "8.00 GiB")


def test_a_multi_line_error_prints_as_one_line(monkeypatch, capsys):
    def bad(*args, **kwargs):
        raise EmitError("bundle does not verify:\n  error: 'scf.for' op\n  note: here")

    monkeypatch.setattr(options, "plan_program", bad)
    refused(["plan", MLP], capsys, "does not verify:; error: 'scf.for' op; note: here")


def test_interrupt_is_one_line_and_status_130(monkeypatch, capsys):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(options, "plan_program", interrupt)
    assert main(["plan", MLP]) == 130
    assert capsys.readouterr().err == "apportion: interrupted\n"


# -- issue 17: values, files and outputs refused in one line ------------------------------------

FUSED = str(ROOT / "examples/fused.json")


@pytest.mark.parametrize(("argv", "parts"), [
    (["run", MLP, "--mesh", "dp=2", "--backend", "dtensor", "--timeout", "-5"],
     ["argument --timeout", "> 0", "'-5'"]),
    (["run", MLP, "--mesh", "dp=2", "--backend", "dtensor", "--timeout", "nan"],
     ["argument --timeout", "'nan'"]),
    (["run", str(ROOT / "examples/dynamic_k.json"), "--param", "K=4_0"],
     ["--param 'K=4_0'", "decimal digits"]),
    (["run", str(ROOT / "examples/dynamic_k.json"), "--param", "K=\u0664"],
     ["--param", "decimal digits"]),
    (["plan", MLP, "--cores", "\u0664"], ["argument --cores", "expected an integer"]),
    (["plan", MLP, "--cores", "1_6"], ["argument --cores", "'1_6'"]),
    (["shard", MLP, "--mesh", "dp=\u0662"], ["size", "neither an integer nor a symbol"]),
    # float() alone takes other scripts' digits and underscores: --timeout 12, --timeout 10
    (["run", MLP, "--mesh", "dp=2", "--backend", "dtensor", "--timeout", "\u0661\u0662"],
     ["argument --timeout", "digits 0-9", "'\u0661\u0662'"]),
    (["run", MLP, "--mesh", "dp=2", "--backend", "dtensor", "--timeout", "1_0"],
     ["argument --timeout", "digits 0-9", "'1_0'"]),
    (["run", MLP, "--mesh", "dp=2", "--backend", "dtensor", "--timeout", "inf"],
     ["argument --timeout", "'inf'"]),
    (["run", MLP, "--seed", "\u0661"], ["argument --seed", "digits 0-9"]),
    (["run", MLP, "--threads", "\u00b2"], ["argument --threads", "digits 0-9"]),
    (["bench", "conformance", "--n", "\u0663"], ["argument --n", "digits 0-9"]),
    (["bench", "conformance", "--seed", "\u2070"], ["argument --seed", "digits 0-9"]),
    (["demo", "--cores", "\u0662"], ["argument --cores", "digits 0-9"]),
])
def test_numbers_in_other_forms_than_plain_ascii_digits_are_refused(argv, parts, capsys,
                                                                    no_work):
    refused(argv, capsys, *parts)


# OpenMP and torch hold a team size in a C int: 10**20 failed inside them (bench e2e: a traceback)
@pytest.mark.parametrize("argv", [["run", MLP, "--threads", "4097"],
                                  ["bench", "e2e", "--threads", "99999999999999999999"],
                                  ["bench", "forall", "--threads", "4097"]])
def test_a_thread_count_over_the_limit_is_refused(argv, capsys, no_work):
    refused(argv, capsys, "argument --threads: must be an integer in 1..4096, got")


def test_a_timeout_beyond_what_torch_distributed_counts_is_refused(capsys, no_work):
    # its clocks count nanoseconds in an int64: --timeout 1e11 hung the ranks
    refused(["run", MLP, "--mesh", "dp=2", "--backend", "dtensor", "--timeout", "1e11"], capsys,
            "argument --timeout: must be a number of seconds > 0 and at most 1e+09, got '1e11'")


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_an_explicit_target_wins_over_the_target_of_a_mesh_file(tmp_path, capsys):
    mesh = _write(tmp_path / "mesh.toml", '[mesh]\ntarget = "cpu"\naxes = {tp = 2}\n')
    assert main(["shard", MLP, "--mesh", mesh, "--target", "spyre", "--cores", "4"]) == 0
    assert "spyre, 4 cores per device" in capsys.readouterr().out
    assert main(["shard", MLP, "--mesh", mesh, "--cores", "1"]) == 0  # no --target: the mesh's
    assert "cpu, 1 cores per device" in capsys.readouterr().out


def test_a_target_files_mesh_target_is_used_and_one_beside_target_fields_refused(tmp_path,
                                                                                capsys):
    only_mesh = _write(tmp_path / "m.toml", '[mesh]\ntarget = "cpu"\naxes = {tp = 2}\n')
    assert main(["shard", MLP, "--target", only_mesh, "--cores", "1"]) == 0
    assert "cpu, 1 cores per device" in capsys.readouterr().out
    both = _write(tmp_path / "t.toml",
                  'preset = "spyre"\ncores = 8\n[mesh]\ntarget = "cpu"\naxes = {tp = 2}\n')
    for flag in ("--target", "--mesh"):
        refused(["shard", MLP, flag, both], capsys, "[mesh] target = 'cpu' conflicts")


def test_overlap_of_one_is_accepted_and_above_one_refused_as_the_message_says(tmp_path,
                                                                               capsys):
    ok = _write(tmp_path / "one.toml", 'preset = "spyre"\noverlap = 1.0\n')
    assert main(["plan", MLP, "--target", ok]) == 0
    capsys.readouterr()
    bad = _write(tmp_path / "over.toml", 'preset = "spyre"\noverlap = 1.0001\n')
    refused(["plan", MLP, "--target", bad], capsys, "overlap must be a finite number in [0, 1]")


@pytest.mark.parametrize("redirect", [">&-", "> /dev/full"])
def test_a_closed_or_full_stdout_is_one_line_and_status_2(redirect):
    if redirect.endswith("full") and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    p = subprocess.run(f"{sys.executable} -m apportion.cli.main plan examples/mlp.json "
                       f"{redirect}", shell=True, cwd=ROOT, capture_output=False,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("apportion: error: ") and p.stderr.count("\n") == 1, p.stderr


def test_dotted_tensor_names_in_a_loop_group_emit_a_bundle_that_verifies(tmp_path, capsys):
    doc = {"name": "dotted", "tensors": {n: {"shape": [64, 128], "dtype": "float16"}
                                         for n in ("x.y", "x_y")},
           "inputs": ["x.y", "x_y"], "outputs": ["z.w"],
           "ops": [{"name": "e.1", "op": "exp", "out": "t.q[m,n]", "ins": ["x.y[m,n]"]},
                   {"name": "a", "op": "add", "out": "z.w[m,n]",
                    "ins": ["t.q[m,n]", "x_y[m,n]"]}],
           "tiling": [{"ops": ["e.1", "a"], "count": 2}]}
    path = _write(tmp_path / "dotted.json", json.dumps(doc))
    assert main(["emit", path, "--bundle"]) == 0
    out = capsys.readouterr().out
    assert "#tile_x_y = " in out and "#tile_x_y_1 = " in out and "#tile_x.y" not in out


def test_a_dim_past_two_to_the_63_is_named_when_emitted(tmp_path, capsys):
    doc = {"name": "huge", "tensors": {"x": {"shape": [2 ** 63, 2], "dtype": "float16"}},
           "inputs": ["x"], "outputs": ["y"],
           "ops": [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]}]}
    path = _write(tmp_path / "huge.json", json.dumps(doc))
    refused(["emit", path, "--forall", "--target", "cpu"], capsys, "tensor 'x' dim 0",
            "2**63 - 1")
    refused(["emit", path, "--bundle", "--target", "cpu"], capsys, "tensor 'x'", "2**63 - 1")


def test_an_op_at_a_lesser_loop_depth_is_emitted_by_emit_forall_in_the_outer_loop(tmp_path,
                                                                                    capsys):
    doc = json.loads(Path(FUSED).read_text())
    doc["tiling"][0]["depths"] = {"add": 1}
    path = _write(tmp_path / "depth.json", json.dumps(doc))
    assert cli_status(["emit", path, "--forall"]) == 0
    text = capsys.readouterr().out
    outer = text.index("scf.for %i0")
    inner = text.index("scf.for %i1")
    # add runs in the outer loop only, before the inner loop that holds mul
    assert outer < text.index("linalg.generic") < inner


def test_a_calibration_record_splitting_a_fallback_op_is_refused(tmp_path, capsys):
    record = {"program": {"name": "c", "tensors": {"x": {"shape": [64, 128],
                                                         "dtype": "float32"}},
                          "inputs": ["x"], "outputs": ["y"],
                          "ops": [{"name": "cs", "op": "cumsum", "out": "y[m,n]",
                                   "ins": ["x[m,n]"]}]},
              "cores": 4, "splits": {"m": 4}, "time_us": 10.0}
    path = _write(tmp_path / "m.json", json.dumps([record]))
    refused(["calibrate", path, "--target", "cpu"], capsys, "divides dim 'm' of op 'cs'",
            "fallback")


def test_a_bug_is_status_70_with_its_traceback_and_one_line_never_status_1(monkeypatch, capsys):
    def bug(*args, **kwargs):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(options, "plan_program", bug)
    assert main(["plan", MLP]) == cli.INTERNAL_ERROR == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith(
        "apportion: internal error: TypeError: unsupported operand")
