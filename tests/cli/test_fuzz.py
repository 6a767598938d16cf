"""Fuzzing the command line: random argument lists over the real subcommands and options, with
valid and invalid values, corrupted program files and corrupted target files. ``main`` returns 0,
1 or 2 (or argparse exits with 0 or 2); status 2 comes with exactly one ``apportion: error:`` line
on stderr; no other exception escapes and nothing prints a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.cli.main import main
from tests.helpers import NOT_RUN, runnable_examples

ROOT = Path(__file__).parents[2]
# the prime-vocabulary lm_head takes seconds to run, the span-limit tensor a minute; the others
# plan and run in well under one
EXAMPLES = {p.name: p.read_text()
            for p in runnable_examples(ROOT, "lm_head_prime_vocab.json", *NOT_RUN)}
OPS = sorted({o["name"] for text in EXAMPLES.values() for o in json.loads(text)["ops"]})
TARGET = 'preset = "spyre"\nname = "lite"\nmax_cores = 16\nspan_limit_mib = 128\n'
FULL_TARGET = ("name = \"mine\"\ncores = 8\nmax_cores = 8\nspan_limit = 268435456\n"
               "stick_bytes = 128\nscratchpad_bytes = 2097152\nscratchpad_reserve = 0.2\n"
               "mac_rate = 1.5e6\nsfp_rate = 1.76e3\nreduce_rate = 1.2e4\n"
               "core_bandwidth = 12.8e9\nmem_bandwidth = 2e11\n")
FUZZ = settings(deadline=None,  # example counts: the profile (tests/conftest.py)
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

ints = st.sampled_from(["1", "2", "3", "4", "8", "16", "24", "32", "0", "-1", "33", "1000",
                        "x", "1.5", "", " 4", "1e3", "2_0", "99999999999999999999",
                        # other scripts' digits: int() reads the first two, fails on the third
                        "\u0664", "\uff18", "\u00b2"])
# odd values for a program's or a target's fields: wrong types, zero, negative, huge, near misses
odd = st.one_of(
    st.sampled_from([0, 1, 2, 3, -1, 7, 64, 2 ** 40, 2 ** 100, 1.5, float("inf"), True, None,
                     "", "x", "T", "float16", "int8", "x[m,n]", "x[m,,n]", "s[]", "matmul",
                     "sum", [], {}, [1, 2], {"count": 2}]),
    st.integers(-5, 300), st.text(max_size=6))


TOML_VALUES = st.sampled_from(["0", "-1", "1e400", "33", "true", '"x"', '"cpu"', "[]", "1.5",
                               "nan", "inf", "65536", "", "{", "2_000_000_000_000"])
TOML_KEYS = st.sampled_from(["cores_mib", "warp", "preset", "max_loop_count", "alignment",
                             "span_limit_mib", "span_limit", "target"])


def leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document, containers included."""
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += leaves(v, (*path, i))
    return out


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {k: replaced(v, rest, value) if k == head else v for k, v in doc.items()}
    return [replaced(v, rest, value) if i == head else v for i, v in enumerate(doc)]


@st.composite
def program_texts(draw: st.DrawFn) -> str:
    """An example program, often corrupted: one value replaced, truncated, or a byte changed."""
    text = EXAMPLES[draw(st.sampled_from(sorted(EXAMPLES)))]
    how = draw(st.sampled_from(["asis", "value", "value", "truncate", "char"]))
    if how == "value":
        doc = json.loads(text)
        path = draw(st.sampled_from(leaves(doc)))
        return json.dumps(replaced(doc, path, draw(odd)))
    if how == "truncate":
        return text[: draw(st.integers(0, len(text) - 1))]
    if how == "char":
        i = draw(st.integers(0, len(text) - 1))
        return text[:i] + draw(st.sampled_from(list('{}[]",:0-9aT \x00'))) + text[i + 1:]
    return text


@st.composite
def target_texts(draw: st.DrawFn) -> str:
    """A target file, often corrupted: a line dropped, a value replaced, an unknown key."""
    lines = draw(st.sampled_from([TARGET, FULL_TARGET])).splitlines()
    how = draw(st.sampled_from(["asis", "drop", "value", "value", "key", "truncate"]))
    i = draw(st.integers(0, len(lines) - 1))
    if how == "drop":
        del lines[i]
    elif how == "value":
        key = lines[i].split("=")[0].strip()
        lines[i] = f"{key} = {draw(TOML_VALUES)}"
    elif how == "key":
        lines.append(f"{draw(TOML_KEYS)} = {draw(TOML_VALUES)}")
    text = "\n".join(lines) + "\n"
    if how == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    return text


def check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Run ``main(argv)``: an allowed status and, on status 2, one error line."""
    capsys.readouterr()
    try:
        status = main(argv)
        assert status in (0, 1, 2), (argv, status)
    except SystemExit as e:  # argparse
        status = e.code
        assert status in (0, 2), (argv, status)
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err)
    if status == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("apportion: error: "), (argv, err)


@st.composite
def argv_lists(draw: st.DrawFn, folder: Path) -> list[str]:
    """A command line over the real subcommands and options, its files written to ``folder``."""
    command = draw(st.sampled_from(["plan", "plan", "run", "run", "emit", "bench", "demo"]))
    if command == "demo":  # only refused values: a demo that runs takes seconds
        return ["demo", "--cores", draw(st.sampled_from(["0", "-1", "33", "x", ""]))]
    if command == "bench":  # always --limit 1 or a refused limit: one shape plans in ms
        argv = ["bench", draw(st.sampled_from(["workdiv", "tiling", "both"])),
                "--limit", draw(st.sampled_from(["1", "1", "0", "-1", "x"]))]
        if draw(st.booleans()):
            argv += ["--cores", *draw(st.lists(st.sampled_from(["8", "24", "0", "33", "x"]),
                                               min_size=1, max_size=2))]
        if draw(st.booleans()):
            argv += ["--json", str(folder / draw(st.sampled_from(
                ["out.json", "missing/out.json", "", "."])))]
        if draw(st.booleans()):
            models = folder / "models.json"
            models.write_text(draw(st.sampled_from(
                ['{"models": {}}', "{", "[]", '{"models": {"m": {"hidden": 64}}}'])))
            argv += ["--models", str(models)]
        return argv
    program = folder / "prog.json"
    source = draw(st.sampled_from(["file", "file", "file", "example", "missing", "folder",
                                   "default"]))
    if source == "file":
        program.write_text(draw(program_texts()))
        argv = [command, str(program)]
    elif source == "example":
        argv = [command, str(ROOT / "examples" / draw(st.sampled_from(sorted(EXAMPLES))))]
    elif source == "missing":
        argv = [command, str(folder / "missing.json")]
    elif source == "folder":
        argv = [command, str(folder)]
    else:
        argv = [command] if command != "run" else [command, str(ROOT / "examples/mlp.json")]
    options: dict[str, list[str]] = {
        "--cores": [draw(ints)],
        "--strategy": [draw(st.sampled_from(["balanced", "greedy", "fast", ""]))],
        "--auto-tile": [],
        "--target": [draw(st.sampled_from(["spyre", "cpu", "tpu", "toml", "toml",
                                           "missing.toml"]))],
    }
    if command == "plan":
        options |= {
            "--format": [draw(st.sampled_from(["table", "json", "coeffs", "yaml"]))],
            "--plot": [str(folder / draw(st.sampled_from(
                ["p.png", "p.svg", "p.xyz", "p", "missing/p.png", "."])))],
            "--op": [draw(st.sampled_from([*OPS, "nope", ""]))],
        }
    elif command == "run":
        options |= {
            "--check": [],
            "--threads": [draw(ints)],
            "--seed": [draw(st.sampled_from(["0", "7", "-1", "x", str(2 ** 70)]))],
            "--param": [draw(st.sampled_from(["T=2", "T=4", "T", "T=x", "=4", "U=1", "T=0",
                                              "T=65536", "T=\u0664", "T=\u2074"]))],
        }
    else:
        options |= {f: [] for f in ("--bundle", "--unrolled", "--loopspec", "--loopspec-json")}
    chosen = draw(st.lists(st.sampled_from(sorted(options)), max_size=4, unique=True))
    if command == "emit" and not any(f.startswith(("--bundle", "--unrolled", "--loop"))
                                     for f in chosen):
        chosen.append(draw(st.sampled_from(["--bundle", "--loopspec", "--unrolled"])))
    for flag in chosen:
        values = options[flag]
        if flag == "--target" and values[0] == "toml":
            toml = folder / "t.toml"
            toml.write_text(draw(target_texts()))
            values = [str(toml)]
        elif flag == "--target" and values[0] == "missing.toml":
            values = [str(folder / "missing.toml")]
        argv += [flag, *values]
    return argv


@FUZZ
@given(data=st.data())
def test_random_command_lines(data, tmp_path, capsys):
    check(data.draw(argv_lists(tmp_path)), capsys)


@FUZZ
@given(text=program_texts(), command=st.sampled_from(
    [["plan"], ["plan", "--format", "json"], ["plan", "--auto-tile"], ["emit", "--bundle"],
     ["run", "--check", "--cores", "4"]]))
def test_corrupted_program_files(text, command, tmp_path, capsys):
    path = tmp_path / "prog.json"
    path.write_text(text)
    check([command[0], str(path), *command[1:]], capsys)


@FUZZ
@given(text=target_texts(), command=st.sampled_from(
    [["plan"], ["plan", "--cores", "4"], ["run", "--check"], ["emit", "--loopspec"]]))
def test_corrupted_target_files(text, command, tmp_path, capsys):
    path = tmp_path / "t.toml"
    path.write_text(text)
    check([command[0], str(ROOT / "examples/fused.json"), *command[1:], "--target", str(path)],
          capsys)
