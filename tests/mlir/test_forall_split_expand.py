"""A split-K partial whose slices divide K evenly reads K through ``tensor.expand_shape``
(K -> [slices, K/slices], a view) indexed by its slice dim and k_in, so every indexing map of
its ``linalg.generic`` is a projected permutation (IREE's llvm-cpu runs the ``slice * K/f +
k_in`` sum 4-20x slower than no split, its CUDA codegen cannot compile it); the expanded form
runs in IREE to the unplanned program's result. Other sums keep their form."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import apportion as ap
from apportion.backends.iree.run import iree_run
from apportion.frontend.json_format import from_dict
from apportion.mlir.forall import forall_mlir
from apportion.passes.pipeline import plan
from apportion.plans.plan import Plan
from apportion.runtime.check import expect
from apportion.target.presets import cpu
from apportion.target.target import Target
from tests.helpers import emitted

FACTORS = [2, 4, 8, 16, 32, 64]
M, N, K = 8, 16, 1024


def matmul(factor: int, k: int = K) -> ap.Program:
    return from_dict({
        "name": "splitk",
        "tensors": {"x": {"shape": [M, k], "dtype": "float32"},
                    "w": {"shape": [k, N], "dtype": "float32"}},
        "inputs": ["x", "w"], "outputs": ["y"],
        "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
        "split_k": {"mm": factor},
    })


def planned(factor: int, cores: int, k: int = K) -> tuple[ap.Program, Plan, Target]:
    program, target = matmul(factor, k), cpu(cores=cores)
    result = plan(program, target)
    partial = result.op("mm.partial")
    assert partial.split_k is not None and partial.split_k.factor == factor
    return (result.rewritten if result.rewritten is not None else program), result, target


def partial_maps(text: str) -> list[str]:
    """The indexing maps of the generic writing the partials (``%y.partials_acc``)."""
    found = re.search(r"%y\.partials_acc\w* = linalg\.generic \{indexing_maps = \[(.*?)\], "
                      r"iterator_types", text)
    assert found, text
    return re.findall(r"affine_map<[^>]*>", found.group(1))


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("factor", FACTORS)
def test_an_even_split_k_partial_reads_k_expanded_with_plain_maps(factor: int, cores: int):
    program, result, target = planned(factor, cores)
    text = forall_mlir(emitted(program, result, target))
    step = K // factor
    assert re.search(rf"tensor\.expand_shape %x\w* \[\[0\], \[1, 2\]\] output_shape "
                     rf"\[{M}, \d+, {step}\] : tensor<{M}x\d+xf32> into", text), text
    assert re.search(rf"tensor\.expand_shape %w\w* \[\[0, 1\], \[2\]\] output_shape "
                     rf"\[\d+, {step}, {N}\]", text), text
    # no sum in any map of the partial: slice and k_in index their own axes
    assert all(" + " not in m and " * " not in m for m in partial_maps(text))


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("factor", FACTORS)
def test_an_expanded_split_k_partial_matches_the_unplanned_run_in_iree(
        factor: int, cores: int, tmp_path: Path):
    program, result, target = planned(factor, cores)
    want = expect(program, factor + cores)
    checks = want.compare(iree_run(emitted(program, result, target), want.inputs, tmp_path))
    assert checks and all(c.ok for c in checks), checks


def test_a_sum_outside_a_split_k_partial_keeps_its_form():
    # q[t, 128*h+d] of attention heads is no partial's slice: the map keeps the sum
    text = ap.plan(ap.load(Path(__file__).parents[2] / "examples/attention.json"),
                   ap.targets.spyre(cores=32)).forall_mlir()
    assert "affine_map<(d0, d1, d2, d3) -> (d1, d0 * 128 + d3)>" in text
    assert "tensor.expand_shape %q" not in text
