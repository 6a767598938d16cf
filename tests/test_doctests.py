"""Every module's docstring examples run and hold (the examples are part of the docs)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import apportion

ROOT = Path(__file__).parents[1]
MODULES = sorted(m.name for m in pkgutil.walk_packages(apportion.__path__, "apportion."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples are named relative to the repository root
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_core_modules_carry_examples():
    for name in ("apportion.ir.kinds", "apportion.passes.pipeline", "apportion.planned",
                 "apportion.backends.reference.execute", "apportion.passes.span_reduction",
                 "apportion.passes.work_distribution", "apportion.passes.auto_tile"):
        assert doctest.testmod(importlib.import_module(name)).attempted > 0, name
