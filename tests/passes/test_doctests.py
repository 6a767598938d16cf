"""The docstring examples of the coarse-tiling passes, plan values and loop executor hold."""

import doctest
from pathlib import Path

import pytest

from apportion.passes import auto_tile, buffers, coarse_tile, pipeline, scratchpad
from apportion.plans import memory, tiles
from apportion.runtime import loops

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("module", [auto_tile, buffers, coarse_tile, pipeline, scratchpad,
                                    memory, tiles, loops], ids=lambda m: m.__name__)
def test_doctests(module, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples are named relative to the repository root
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
