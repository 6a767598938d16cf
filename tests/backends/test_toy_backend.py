"""A new backend built on ``apportion.mlir`` touches no file of apportion: the toy backend
(``tests/backends/toy/``, its own folder) renders a schedule's parallel IR with
``apportion.mlir`` and runs it with upstream MLIR; it becomes known by an entry point in the
``apportion.backends`` group, as another installed distribution would declare it (here a
``.dist-info`` folder written on ``sys.path``). Then ``ap.plan(...).run/check(backend="toy")``
and ``apportion run --backend toy --check`` take it, and its own limit refuses what it cannot
run. Files outside its folder that it touched: 0 (the last test checks that no source file of
apportion names it).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

import apportion as ap
from apportion.backends import BACKENDS, ENTRY_POINTS, get
from apportion.errors import ExecutionError
from apportion.limits import Unsupported
from apportion.mlir import upstream

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not upstream.available(),
                                reason="the toy backend runs upstream MLIR (the mlir extra)")


def _installed(where: Path, entry: str) -> None:
    """A distribution's metadata naming ``entry`` in the backends' entry-point group."""
    info = where / "toy_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\n{entry}\n")


@pytest.fixture
def toy(tmp_path, monkeypatch):
    _installed(tmp_path, "toy = tests.backends.toy.adapter")
    monkeypatch.syspath_prepend(str(tmp_path))
    return get("toy")


def test_a_backend_named_by_an_entry_point_is_in_the_registry_after_apportions_own(toy):
    names = list(BACKENDS)
    assert names[-1] == "toy" and names.index("reference") == 0
    assert toy.does == "run" and toy.name == "toy"


def test_without_its_entry_point_the_toy_backend_is_unknown():
    with pytest.raises(ExecutionError, match="unknown backend 'toy'"):
        get("toy")


@pytest.mark.parametrize("example", ["fused.json", "attention.json", "splitk.json"])
def test_the_toy_backend_runs_plans_as_the_reference_does(toy, example):
    planned = ap.plan(ap.load(ROOT / "examples" / example), ap.targets.spyre(cores=8))
    assert toy.supports(planned) == ()
    checks = planned.check(backend="toy")
    assert checks and all(c.ok for c in checks)
    xs = ap.runtime.random_inputs(planned.program, 3)
    got = planned.run(xs, backend="toy")
    want = planned.run(xs)
    for name in planned.program.outputs:
        np.testing.assert_allclose(np.asarray(got[name], np.float64),
                                   np.asarray(want[name], np.float64), rtol=2e-2, atol=2e-2)


def test_the_toy_backends_own_limit_refuses_a_program_with_run_time_sizes(toy):
    planned = ap.plan(ap.load(ROOT / "examples" / "dynamic_k.json"), ap.targets.spyre(cores=8))
    assert [lim.id for lim in toy.supports(planned)] == ["toy-static-only"]
    with pytest.raises(Unsupported, match="toy-static-only"):
        planned.run(backend="toy", params={"K": 64})


def test_the_command_line_runs_the_toy_backend_by_name(toy):
    from apportion.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run", str(ROOT / "examples" / "fused.json"), "--backend", "toy",
                     "--cores", "8", "--check"])
    assert code in (0, None)
    assert "matches the unplanned program" in out.getvalue()


def test_a_broken_entry_point_is_an_error_naming_it(tmp_path, monkeypatch):
    _installed(tmp_path, "toy = tests.backends.no_such_module")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ExecutionError, match="entry point 'tests.backends.no_such_module'"):
        get("toy")


def test_a_plugin_cannot_take_the_name_of_apportions_own_backend(tmp_path, monkeypatch):
    _installed(tmp_path, "reference = tests.backends.toy.adapter")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get("reference").name == "reference"
    assert list(BACKENDS).count("reference") == 1


def test_adding_the_toy_backend_touched_no_file_of_apportion():
    """The files outside its folder a new MLIR backend needs: none (its entry point is its own
    distribution's metadata)."""
    mentions = [p.relative_to(ROOT) for p in (ROOT / "apportion").rglob("*")
                if p.is_file() and p.suffix in (".py", ".toml", ".md", ".json")
                and "toy" in p.read_text(errors="replace").lower().replace("destroy", "")]
    assert mentions == []
