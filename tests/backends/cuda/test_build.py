"""A cuda build's folder: built beside ``--out`` and renamed into place, never replacing what
is not a build; a malformed manifest or inputs file refused naming the field."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import apportion as ap
from apportion.backends.cuda import build as build_module
from apportion.backends.cuda.build import _signals_deferred, build, check_build
from apportion.cli.main import main
from apportion.errors import ExecutionError
from apportion.mlir import upstream
from apportion.runtime.reference import run_unplanned
from tests.helpers import cli_status, one_error_line

pytestmark = pytest.mark.skipif(not upstream.available(),
                                reason="needs the mlir extra (upstream MLIR 22)")

ROOT = Path(__file__).resolve().parents[3]
FUSED = str(ROOT / "examples" / "fused.json")


def _planned() -> ap.PlannedProgram:
    return ap.plan(ap.load(FUSED), ap.targets.gpu(cores=8))


def _digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by relative path, with its content's hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build of the fused example, with a run's results in it (the reference's outputs)."""
    p = _planned()
    b = build(p.lowered, tmp_path_factory.mktemp("built") / "b", seed=1)
    want = run_unplanned(p.program, {k: np.asarray(v) for k, v in
                                     np.load(b.path / "inputs.npz").items()})
    (b.path / "results").mkdir()
    np.savez(b.path / "results" / "outputs.npz", **{n: want[n] for n in p.program.outputs})
    return b.path


@pytest.fixture
def old(built: Path, tmp_path: Path) -> Path:
    """A copy of ``built`` of this test's own, in a folder of its own."""
    return Path(shutil.copytree(built, tmp_path / "work" / "b"))


# --- the folder ---------------------------------------------------------------------------

@pytest.mark.parametrize("holds", ["keep.txt", "manifest.json"])
def test_a_folder_that_is_not_a_build_is_refused_and_kept(tmp_path, capsys, holds):
    project = tmp_path / "project"
    project.mkdir()
    # a manifest.json of another tool's (a web extension's) does not make a build
    (project / holds).write_text('{"name": "my extension", "version": "1.0"}')
    before = _digest(project)
    assert main(["cuda", "build", FUSED, "--cores", "8", "--out", str(project)]) == 2
    line = one_error_line(capsys)
    assert f"will not write the build into {str(project)!r}" in line
    assert "not a cuda build" in line
    assert _digest(project) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]  # nothing left beside


def test_a_build_holding_a_file_of_the_user_is_not_replaced(old, capsys):
    (old / "notes.txt").write_text("what I found on the H100")
    before = _digest(old)
    assert main(["cuda", "build", FUSED, "--cores", "8", "--out", str(old)]) == 2
    assert "it holds 'notes.txt'" in one_error_line(capsys)
    assert _digest(old) == before


def test_rebuilding_over_a_build_replaces_it_whole_and_leaves_nothing_beside(old, capsys):
    p = _planned()
    before = _digest(old)
    b = build(p.lowered, old, seed=2)
    assert b.path == old
    after = _digest(old)
    assert "results/outputs.npz" not in after  # the old build's run is not the new one's
    assert after["inputs.npz"] != before["inputs.npz"]  # seed 2, not 1
    assert set(after) == set(before) - {"results/outputs.npz"}
    assert [q.name for q in old.parent.iterdir()] == ["b"]


@pytest.mark.parametrize("fault", [KeyboardInterrupt, ExecutionError])
def test_an_interrupted_or_failed_rebuild_leaves_the_old_build_and_its_results(
        old, monkeypatch, fault):
    before = _digest(old)
    linked = []

    def half_link(llvm: str, out: Path) -> Path:  # the link stopped with its file half-written
        out.write_bytes(b"\x7fELF half")
        linked.append(out)
        raise fault("stopped during the link")

    monkeypatch.setattr(build_module, "link", half_link)
    p = _planned()
    with pytest.raises(fault):
        build(p.lowered, old, seed=2)
    assert linked and linked[0].parent != old  # the link wrote beside the build, not in it
    assert _digest(old) == before
    assert [q.name for q in old.parent.iterdir()] == ["b"]  # no half-written folder


@pytest.mark.parametrize("caller", ["command line", "library"])
def test_sigterm_during_the_link_leaves_the_old_build_and_no_half_written_folder(old, caller):
    before = _digest(old)
    command = (f"sys.exit(main(['cuda', 'build', {FUSED!r}, '--cores', '8', '--out', "
             f"{str(old)!r}]))" if caller == "command line" else
             f"p = ap.plan(ap.load({FUSED!r}), ap.targets.gpu(cores=8))\n"
             f"build.build(p.lowered, Path({str(old)!r}), seed=2)")
    # the build in a process of its own, terminated (as a batch system's time limit does)
    # while its link is running
    script = "\n".join([
        "import os, signal, sys, time",
        "from pathlib import Path",
        "import apportion as ap",
        "from apportion.backends.cuda import build",
        "from apportion.cli.main import main",
        "def link(llvm, out):",
        "    out.write_bytes(b'half')",
        "    os.kill(os.getpid(), signal.SIGTERM)",
        "    time.sleep(60)",
        "build.link = link",
        command,
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT)
    if caller == "command line":
        # 143 where the command line ends a SIGTERM as such, 130 where as Ctrl-C; one line
        assert done.returncode in (130, 143), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith(("apportion: interrupted", "apportion: terminated"))
    else:  # build alone raises it as KeyboardInterrupt
        assert "KeyboardInterrupt" in done.stderr, done.stderr
    assert _digest(old) == before
    assert [q.name for q in old.parent.iterdir()] == ["b"]


def test_signals_during_the_swap_wait_until_it_is_done():
    # Python's own Ctrl-C handler, whatever the process had (a pytest-xdist worker, or a test
    # before this one in the same worker, may have set another): the deferral restores it
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt), _signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("the swap went on")
        assert reached == ["the swap went on"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("out", [".", "", "..", "/", "~", "cwd"])
def test_the_current_folder_its_parents_home_root_and_an_empty_path_are_refused(
        tmp_path, monkeypatch, capsys, out):
    here = tmp_path / "home" / "project"
    here.mkdir(parents=True)
    (here / "main.py").write_text("print('mine')")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(here)
    given = {"~": str(tmp_path / "home"), "cwd": str(here)}.get(out, out)
    assert cli_status(["cuda", "build", FUSED, "--cores", "8", "--out", given]) == 2
    line = one_error_line(capsys)
    assert ("is empty (an unset variable?)" in line if out == "" else
            f"will not write the build into {given!r}" in line)
    assert (here / "main.py").read_text() == "print('mine')"
    assert sorted(q.name for q in here.iterdir()) == ["main.py"]
    assert sorted(q.name for q in (tmp_path / "home").iterdir()) == ["project"]


def test_a_file_or_a_symbolic_link_as_the_folder_is_refused(tmp_path, capsys, old):
    (tmp_path / "f").write_text("data")
    assert main(["cuda", "build", FUSED, "--cores", "8", "--out", str(tmp_path / "f")]) == 2
    assert "it is a file, not a folder" in one_error_line(capsys)
    (tmp_path / "link").symlink_to(old)
    assert main(["cuda", "build", FUSED, "--cores", "8", "--out", str(tmp_path / "link")]) == 2
    assert "it is a symbolic link" in one_error_line(capsys)
    assert (tmp_path / "f").read_text() == "data" and (tmp_path / "link").is_symlink()


# --- the manifest and inputs --------------------------------------------------------------

def _set(path: list[object], value: object):
    def change(m: dict[str, object]) -> None:
        where: object = m
        for key in path[:-1]:
            where = where[key]  # type: ignore[index]
        where[path[-1]] = value  # type: ignore[index]
    return change


@pytest.mark.parametrize(("change", "said"), [
    (_set(["function"], 3), "function is 3, not a string"),
    (_set(["args"], {"a": 1}), "args is dict, not a list"),
    (_set(["args", 0], "a"), r"args\[0\] is str, not an object"),
    (_set(["args", 0, "type"], "f128"), r"args\[0\] \('a'\) has element type 'f128'; known:"),
    (_set(["args", 0, "type"], 16), r"args\[0\] \('a'\) has element type 16"),
    (_set(["args", 0, "kind"], "tensor"), r"has kind 'tensor'; known: index, memref"),
    (_set(["args", 0, "name"], ["a"]), r"args\[0\]'s name is \['a'\]"),
    (_set(["results", 0, "type"], "complex64"), r"results\[0\] \('z'\) has element type"),
    (_set(["results", 0, "shape"], "1024x4096"), r"has shape '1024x4096', not a list of"),
    (_set(["results", 0, "shape"], [1024, -1]), r"has shape \[1024, -1\], not a list of"),
    (_set(["results", 0, "shape"], [1024, True]), r"has shape \[1024, true\]|not a list of"),
    (_set(["outputs"], ["y"]), r"outputs names 'y', not one of the results \(z\)"),
    (_set(["blocks"], "8"), r"blocks is '8', not a count"),
])
def test_a_manifest_field_of_the_wrong_type_or_an_unknown_element_type_is_refused(
        old, capsys, change, said):
    path = old / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(ExecutionError, match=said):
        check_build(old, old / "results")
    assert main(["cuda", "check", str(old)]) == 2
    line = one_error_line(capsys)
    assert "manifest.json: " in line and "not a build manifest" in line


def test_an_index_argument_that_is_not_an_integer_is_refused(old):
    path = old / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["args"].append({"kind": "index", "name": "T", "value": "16"})
    path.write_text(json.dumps(manifest))
    with pytest.raises(ExecutionError, match=r"args\[3\] \('T'\) has index value '16'"):
        check_build(old, old / "results")


@pytest.mark.parametrize(("fault", "said"), [
    ("missing", r"inputs\.npz lacks input 'c', which the manifest names"),
    ("extra", r"inputs\.npz holds 'd', which the manifest names no input"),
    ("float32", r"input 'a' is stored as float32; its element type f16 is stored as float16"),
])
def test_an_inputs_file_that_disagrees_with_the_manifest_is_refused(old, fault, said):
    with np.load(old / "inputs.npz") as f:
        stored = {k: f[k] for k in f.files}
    assert sorted(stored) == ["a", "b", "c"]
    if fault == "missing":
        del stored["c"]
    elif fault == "extra":
        stored["d"] = stored["a"]
    else:
        stored["a"] = stored["a"].astype(np.float32)
    np.savez(old / "inputs.npz", **stored)
    with pytest.raises(ExecutionError, match=said):
        check_build(old, old / "results")


def test_the_build_as_made_still_checks(old):
    assert all(c.ok for c in check_build(old, old / "results"))
