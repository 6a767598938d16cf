"""apportion's Python children start without the current directory on ``sys.path``: a
``numpy.py``, ``json.py``, ``pickle.py`` or ``multiprocessing.py`` where the user runs apportion
is never imported by them (the openmp backend's JIT worker, the upstream-MLIR checks and runs,
the dtensor ranks, the cuda device runner, the full-size bench's cases)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apportion.mlir.upstream import available
from apportion.runtime.isolated import SAFE_PATH, python_command, safe_path_children

ROOT = Path(__file__).parents[2]
POISONED = ("numpy", "json", "pickle", "multiprocessing")


@pytest.fixture
def poisoned(tmp_path: Path) -> Path:
    """A folder whose modules shadow the standard library's and numpy, each raising on import."""
    for name in POISONED:
        (tmp_path / f"{name}.py").write_text(
            f"raise ImportError('{name} imported from the current directory')\n")
    return tmp_path


def test_a_python_child_imports_nothing_from_the_current_directory(poisoned):
    code = "import json, numpy, pickle, multiprocessing, apportion"
    shadowed = subprocess.run([sys.executable, "-c", code], cwd=poisoned, capture_output=True,
                              text=True, check=False)
    assert "imported from the current directory" in shadowed.stderr  # the folder does poison
    done = subprocess.run(python_command("-c", code), cwd=poisoned, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_safe_path_children_sets_the_variable_only_while_it_runs(monkeypatch):
    monkeypatch.delenv(SAFE_PATH, raising=False)
    with safe_path_children():
        assert os.environ[SAFE_PATH] == "1"
    assert SAFE_PATH not in os.environ
    monkeypatch.setenv(SAFE_PATH, "")
    with safe_path_children():
        pass
    assert os.environ[SAFE_PATH] == ""


def test_every_python_child_of_apportion_is_started_isolated():
    # sys.executable starts a child that puts its directory first on sys.path; only
    # python_command (which adds -P) may name it
    named = []
    for path in sorted((ROOT / "apportion").rglob("*.py")):
        if path.name == "isolated.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "executable" and \
                    isinstance(node.value, ast.Name) and node.value.id == "sys":
                named.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert named == []


#: run by a parent that is itself isolated (-P), from the poisoned folder: what breaks is a child
CHILDREN = f"""
import numpy as np
from apportion.cli.main import main
from apportion.mlir.upstream import run_function
from apportion.sharding.upstream_check import compare_propagation
from apportion.sharding.mesh import parse
from apportion.sharding.spec import load

assert main(["run", {str(ROOT / "examples/mlp.json")!r}, "--backend", "openmp", "--check",
             "--cores", "2"]) == 0
prog, ann = load({str(ROOT / "examples/megatron.json")!r})
print("propagation", compare_propagation(prog, parse("tp=2"), ann).verdict)
f = ("func.func @twice(%x: tensor<2xf32>) -> tensor<2xf32> {{\\n"
     "  %y = arith.addf %x, %x : tensor<2xf32>\\n  return %y : tensor<2xf32>\\n}}")
print("run", run_function(f, "twice", [np.array([1.0, 2.0], np.float32)],
                          [((2,), "float32")])[0].tolist())
"""


@pytest.mark.slow
@pytest.mark.skipif(not available(), reason="needs the mlir extra (upstream MLIR 22)")
def test_openmp_runs_and_upstream_mlir_checks_work_beside_a_poisoned_numpy_and_json(poisoned):
    done = subprocess.run(python_command("-c", CHILDREN), cwd=poisoned, capture_output=True,
                          text=True, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "matches the unplanned program" in done.stdout
    assert "propagation agree" in done.stdout and "run [2.0, 4.0]" in done.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_dtensor_ranks_start_beside_a_poisoned_multiprocessing_and_pickle(poisoned):
    pytest.importorskip("torch")
    # the apportion command, whose own sys.path holds its script's folder, not this one
    script = Path(sys.executable).with_name("apportion")
    if not script.exists():
        pytest.skip("no apportion command beside this interpreter")
    done = subprocess.run([str(script), "run", str(ROOT / "examples/mlp.json"), "--mesh",
                           "dp=2", "--backend", "dtensor", "--check"], cwd=poisoned,
                          capture_output=True, text=True, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "matches" in done.stdout
