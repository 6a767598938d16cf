"""``--torch module:factory`` puts the current directory on ``sys.path`` only while it loads
the factory: afterwards a local file named like a package apportion imports later (``iree``,
``matplotlib``) must not shadow it."""

from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path

import pytest

from apportion.workflows.torch_model import FactoryError, load_factory


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A current directory holding a factory module (a fresh name: no cached import) and a
    module that would shadow a package; ``sys.path`` is put back after the test whatever."""
    name = f"factories_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "def ok():\n"
        "    return object(), (1,)\n"
        "def lazy():\n"
        "    import neighbour_for_lazy_import as n  # a neighbour imported inside the call\n"
        "    return n.MODEL, (1,)\n"
        "def broken():\n"
        "    raise RuntimeError('no weights')\n")
    (tmp_path / "neighbour_for_lazy_import.py").write_text("MODEL = 'model'\n")
    (tmp_path / "shadow_of_a_package.py").write_text("SHADOW = True\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for mod in ("neighbour_for_lazy_import", "shadow_of_a_package"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    return tmp_path, name


def _importable(module: str) -> bool:
    importlib.invalidate_caches()
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    sys.modules.pop(module, None)
    return True


def test_the_current_directory_leaves_sys_path_after_the_factory_loads(workdir) -> None:
    _, name = workdir
    before = list(sys.path)
    model, inputs = load_factory(f"{name}:ok")
    assert inputs == (1,)
    assert sys.path == before
    assert not _importable("shadow_of_a_package")


def test_a_factory_may_import_its_neighbours_while_it_runs(workdir) -> None:
    _, name = workdir
    before = list(sys.path)
    model, _ = load_factory(f"{name}:lazy")
    assert model == "model"
    assert sys.path == before


@pytest.mark.parametrize("factory", ["broken", "missing"])
def test_sys_path_is_restored_when_the_factory_fails(workdir, factory: str) -> None:
    _, name = workdir
    before = list(sys.path)
    with pytest.raises(FactoryError):
        load_factory(f"{name}:{factory}")
    assert sys.path == before


def test_sys_path_is_restored_when_the_module_cannot_be_imported(workdir) -> None:
    before = list(sys.path)
    with pytest.raises(FactoryError, match="cannot import module"):
        load_factory("no_such_module_here:f")
    assert sys.path == before
    assert not _importable("shadow_of_a_package")


def test_a_directory_already_on_the_path_stays_on_it(workdir) -> None:
    tmp, name = workdir
    sys.path.append(str(tmp))  # the user's own PYTHONPATH entry: not ours to remove
    load_factory(f"{name}:ok")
    assert sys.path[-1] == str(tmp)
