"""Partial results waiting for a reduction across devices are held and moved in the
accumulator dtype (``spec.partial_dtype``: float32 for a float16 or bfloat16 sum or mean) and
cast to the tensor's dtype once whole, so a float16 K-split over devices rounds once, as the
unplanned program does: a cancellation after it (a row mean subtracted, then a cumsum) no
longer magnifies a rounding per device (conformance mesh seeds 34 and 56, issue 18)."""

from __future__ import annotations

import numpy as np
import pytest

from apportion.backends import get
from apportion.bench.conformance import plan_mesh_case
from apportion.frontend.json_format import from_dict
from apportion.frontend.random_meshes import mesh_case
from apportion.ir.program import Program
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.mesh import MeshSchedule
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.spec import Sharding, partial_dtype


def _k_split_then_cancel(dtype: str = "float16") -> Program:
    """``t = x @ w`` over a K of 32 (cut 11, 11, 10 over three devices), its row mean
    subtracted, then a cumsum along the row: the cancellation that magnifies a rounding."""
    return from_dict({
        "name": "cancel", "inputs": ["x", "w"], "outputs": ["cs"],
        "tensors": {"x": {"shape": [4, 32], "dtype": dtype},
                    "w": {"shape": [32, 32], "dtype": dtype}},
        "ops": [{"name": "mm", "op": "matmul", "out": "t[i,j]", "ins": ["x[i,k]", "w[k,j]"]},
                {"name": "m", "op": "mean", "out": "r[i,0]", "ins": ["t[i,j]"]},
                {"name": "s", "op": "sub", "out": "d[i,j]", "ins": ["t[i,j]", "r[i,0]"]},
                {"name": "cs", "op": "cumsum", "out": "cs[i,j]", "ins": ["d[i,j]"]}]})


def _schedule(dtype: str = "float16") -> MeshSchedule:
    rows, cols = Sharding(((), ("dp",))), Sharding((("dp",), ()))
    p = _k_split_then_cancel(dtype)
    return lower_plan(propagate(p, parse("dp=3"), annotations={"x": rows, "w": cols}))


def _inputs(p: Program) -> dict[str, np.ndarray]:
    # large rows: each device's partial sum is far from zero, its float16 ulp far from small
    xs = random_inputs(p, 7)
    return {"x": (xs["x"].astype(np.float32) * 8).astype(p.tensor("x").dtype),
            "w": xs["w"]}


def _matches(backend: str, s: MeshSchedule, **kw: object) -> None:
    xs = _inputs(s.program)
    got = get(backend).run_mesh(s, xs, **kw)
    checks = compare(run_unplanned(s.program, xs), got, s.program)
    assert checks and all(c.ok for c in checks), (backend, checks)


def test_a_float16_k_split_moves_float32_partials_and_casts_them_once_reduced():
    s = _schedule()
    (red,) = [c for c in s.collectives if c.reducer is not None]
    assert (red.reducer, red.dtype, red.out_dtype) == ("sum", "float32", "float16")
    assert s.layout(red.source).dtype == "float32"  # the partial as the devices hold it
    assert s.layout(red.result).dtype is None  # whole: the tensor's own float16
    (seg,) = {launch.schedule.program for launch in s.launches(0)[:1]}
    assert seg.tensor("t").dtype == "float32" and seg.tensor("x").dtype == "float16"


def test_partials_widen_as_the_reducers_accumulator_and_an_exact_max_does_not():
    assert [partial_dtype(r, "float16") for r in ("sum", "prod", "max", "min")] == \
        ["float32", "float32", "float16", "float16"]
    assert partial_dtype("sum", "bfloat16") == "float32"
    assert partial_dtype("sum", "int32") == "int32" and partial_dtype("argmax", "int64") == \
        "int64"
    assert Sharding(((),), ("dp",), "sum").held_dtype("float32") == "float32"


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_a_float16_k_split_then_a_mean_subtracted_and_a_cumsum_match_the_unplanned(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    _matches(backend, _schedule())


@pytest.mark.slow
def test_a_float16_k_split_then_a_mean_subtracted_and_a_cumsum_match_on_iree():
    pytest.importorskip("iree.compiler")
    _matches("iree", _schedule())


@pytest.mark.distributed
def test_a_float16_k_split_then_a_mean_subtracted_and_a_cumsum_match_on_dtensor():
    pytest.importorskip("torch")
    pytest.importorskip("apportion.backends.dtensor.runner")
    _matches("dtensor", _schedule(), timeout_s=120, device="cpu")


@pytest.mark.parametrize("seed", [34, 56])
def test_conformance_mesh_cases_with_a_float16_k_split_match_the_unplanned(seed):
    c = mesh_case(seed)
    s = plan_mesh_case(c)
    assert any(k.dtype == "float32" and k.out_dtype == "float16" for k in s.collectives)
    xs = random_inputs(c.program, seed)
    got = get("reference").run_mesh(s, xs)
    checks = compare(run_unplanned(c.program, xs), got, c.program)
    assert all(k.ok for k in checks), checks
