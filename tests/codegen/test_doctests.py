"""The codegen modules' docstring examples run and hold."""

import doctest
from pathlib import Path

import pytest

from apportion.codegen import addressing, bundle, loopspec, mlir, spec_text, specs

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("module", [addressing, bundle, loopspec, mlir, spec_text, specs],
                         ids=lambda m: m.__name__)
def test_doctests(module, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples are named relative to the repository root
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
