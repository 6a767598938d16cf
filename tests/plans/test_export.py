"""Tests of the coefficient-keyed split export (the reference design's form)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apportion.errors import PlanningError
from apportion.frontend.json_format import load
from apportion.passes.pipeline import plan
from apportion.plans.export import coefficient_splits
from apportion.target import spyre
from tests.helpers import program

ROOT = Path(__file__).parents[2]


def export(prog, name, target=None):
    p = plan(prog, target or spyre())
    return coefficient_splits(prog, p, p.op(name))


def test_size_one_dim_does_not_hide_the_split_of_a_dim_with_the_same_coefficient():
    prog = program({"x": ([4, 1, 8], "float16")},
                   [{"name": "e", "op": "exp", "out": "y[a,b,c]", "ins": ["x[a,b,c]"]}], ["y"])
    p = plan(prog, spyre())
    assert p.op("e").split_map == {"a": 4, "b": 1, "c": 1}
    out = coefficient_splits(prog, p, p.op("e"))
    # a and b both have coefficient 8; b (size 1, nothing to split) is left out
    assert out["splits"] == {"(8, (8,))": 4, "(1, (1,))": 1}
    assert out["dims"] == {"(8, (8,))": "a", "(1, (1,))": "c"}


def test_tile_buffer_operands_are_keyed_by_per_tile_strides():
    prog = load(ROOT / "examples/fused.json")
    p = plan(prog, spyre(cores=32))
    (y_tile,) = [b for b in p.buffers_of("y") if b.kind == "tile"]
    assert y_tile.shape == (512, 1024) and y_tile.group == p.op("add").loop.group
    add = {d: k for k, d in coefficient_splits(prog, p, p.op("add"))["dims"].items()}
    mul = {d: k for k, d in coefficient_splits(prog, p, p.op("mul"))["dims"].items()}
    # add writes y (tile, row stride 1024) from a, b (full, 4096); mul reads y and c, writes z
    assert add == {"m": "(1024, (4096, 4096))", "n": "(1, (1, 1))"}
    assert mul == {"m": "(4096, (1024, 4096))", "n": "(1, (1, 1))"}


def test_operands_without_a_tile_buffer_keep_full_tensor_strides():
    prog = load(ROOT / "examples/mlp.json")
    p = plan(prog, spyre())
    assert coefficient_splits(prog, p, p.op("act"))["splits"] == {
        "(1, (1,))": 1, "(2816, (2816,))": 32}


def test_two_dims_with_one_signature_are_ambiguous():
    # sum over k and j of x[m, k+j]: k and j are both reduction dims read with coefficient 1
    prog = program({"x": ([8, 255], "float16")},
                   [{"name": "s", "op": "sum", "out": "y[m,0]", "ins": ["x[m,k+j]"],
                     "dims": {"k": 128, "j": 128}}], ["y"])
    with pytest.raises(PlanningError, match=r"op 's': dims 'k' and 'j'"):
        export(prog, "s")
