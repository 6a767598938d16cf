"""Run-time (symbolic) sizes: planned at the planning size, split-K select chains, bound runs."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.frontend.json_format import dumps, from_dict
from apportion.target.split_k import (
    Case,
    ReductionShape,
    SelectChain,
    gpu_chain,
    gpu_slices,
)


def matmul_doc(m: int | str = 32, k: int | str = "K", n: int = 32, kmax: int | None = 65536,
               dtype: str = "float32") -> dict[str, Any]:
    symbols = {s: ({"max": kmax} if kmax else {}) for s in (m, k) if isinstance(s, str)}
    return {"name": "dynk", "symbols": symbols,
            "tensors": {"x": {"shape": [m, k], "dtype": dtype},
                        "w": {"shape": [k, n], "dtype": dtype}},
            "inputs": ["x", "w"], "outputs": ["y"],
            "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}]}


def reduction_doc() -> dict[str, Any]:
    return {"name": "dynsum", "symbols": {"T": {"max": 4096, "min": 8}},
            "tensors": {"x": {"shape": [16, "T"], "dtype": "float32"}},
            "inputs": ["x"], "outputs": ["z"],
            "ops": [{"name": "e", "op": "exp", "out": "y[r,t]", "ins": ["x[r,t]"]},
                    {"name": "s", "op": "sum", "out": "z[r]", "ins": ["y[r,t]"]}]}


def test_a_symbolic_shape_plans_at_its_bound_and_writes_back_as_a_symbol():
    p = from_dict(matmul_doc())
    assert p.tensor("x").shape == (32, 65536) and p.tensor("x").symbols == {1: "K"}
    assert p.dim_symbols["mm"] == {"k": "K"}
    assert from_dict(json.loads(dumps(p))) == p
    assert json.loads(dumps(p))["tensors"]["w"]["shape"] == ["K", 32]


def test_an_unbounded_symbol_plans_at_its_minimum():
    p = from_dict(reduction_doc() | {"symbols": {"T": {"min": 8}}})
    assert p.tensor("x").shape == (16, 8)


def test_binding_changes_shapes_and_op_dims_together_and_checks_bounds():
    p = from_dict(reduction_doc())
    b = p.bind({"T": 100})
    assert b.tensor("y").shape == (16, 100) and b.op("s").sizes == {"r": 16, "t": 100}
    assert not b.symbols
    with pytest.raises(ProgramError, match=r"symbol 'T' = 5000 is outside its bounds 8\.\.4096"):
        p.bind({"T": 5000})
    with pytest.raises(ProgramError, match=r"no symbol 'Q'"):
        p.bind({"Q": 4})


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d["ops"].__setitem__(0, {"name": "mm", "op": "matmul", "out": "y[m,n]",
                                         "ins": ["x[m,1+k]", "w[k,n]"]}),
     r"op 'mm': tensor 'x' dim 1 has symbolic size 'K'; index it with one dim"),
    (lambda d: d["tensors"].__setitem__("y", {"shape": [32, 65536], "dtype": "float32"}) or
     d["ops"].__setitem__(0, {"name": "mm", "op": "add", "out": "y[m,k]",
                              "ins": ["x[m,k]", "x[m,k]"]}),
     r"dim 'k' has symbolic size 'K' but indexes dim 1 of tensor 'y', whose size is static"),
    (lambda d: d["symbols"].__setitem__("K", {"max": 4, "min": 8}),
     r"symbol 'K': max 4 is below min 8"),
    (lambda d: d["symbols"].__setitem__("K", {"top": 4}), r"symbol 'K'.*'top'"),
])
def test_bad_symbolic_programs_are_refused_naming_op_tensor_and_symbol(edit, match):
    doc = matmul_doc()
    edit(doc)
    with pytest.raises(ProgramError, match=match):
        from_dict(doc)


def test_a_symbolic_program_with_tiling_groups_keeps_its_tile_sizes_symbolic_and_runs():
    # more in tests/passes/test_symbolic_tiles.py
    doc = reduction_doc() | {"tiling": [{"ops": ["e"], "loops": [{"count": 2, "dims": ["r"]}]}]}
    planned = ap.plan(from_dict(doc), ap.targets.spyre(cores=4))
    assert dict(planned.plan.op("e").loop.tile_sizes) == {"t": "T"}
    assert all(c.ok for c in planned.check(params={"T": 100}))


def test_the_gpu_resolver_decides_a_select_chain_and_runs_take_different_branches():
    planned = ap.plan(from_dict(matmul_doc()), ap.targets.resolve("gpu"))
    split = planned.op("mm.partial").split_k
    assert split is not None and split.by == "gpu" and split.select is not None
    assert split.factor == split.select.evaluate(65536)
    for k, slices in ((40960, 128), (1000, 1)):
        program, plan = planned.bound({"K": k})
        assert program.tensor("y.partials").shape[0] == slices
        assert plan.op("mm.partial").split_k.factor == slices
        assert all(c.ok for c in planned.check(params={"K": k}))


def test_sizes_are_read_off_the_inputs_when_not_given():
    planned = ap.plan(from_dict(matmul_doc()), ap.targets.resolve("gpu"))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((32, 4096), np.float32), rng.standard_normal((4096, 32), np.float32)
    got = planned.run({"x": x, "w": w})
    np.testing.assert_allclose(got["y"], x @ w, rtol=1e-4, atol=1e-3)
    with pytest.raises(ExecutionError, match=r"symbol 'K': input 'w' dim 0 has size 64"):
        planned.run({"x": x, "w": w[:64]})


def test_a_pinned_factor_that_does_not_divide_the_run_time_size_is_an_error():
    doc = matmul_doc(kmax=4096) | {"split_k": {"mm": 4}}
    planned = ap.plan(from_dict(doc), ap.targets.resolve("gpu"))
    assert all(c.ok for c in planned.check(params={"K": 2048}))
    # the gpu pads a slice's last stick: 1000 is 4 slices of 250, 1002 is no 4 whole slices
    assert all(c.ok for c in planned.check(params={"K": 1000}))
    with pytest.raises(ExecutionError, match=r"op 'mm': at sizes \{'K': 1002\}.*4 slices"):
        planned.check(params={"K": 1002})


def test_spyre_leaves_a_symbolic_reduction_to_work_division_and_cuts_it_at_run_time():
    planned = ap.plan(from_dict(reduction_doc()), ap.targets.spyre(cores=8))
    assert all(o.split_k is None or o.split_k.select is None for o in planned.ops)
    for t in (8, 77, 4096):
        assert all(c.ok for c in planned.check(params={"T": t}))


def transposed_doc() -> dict[str, Any]:
    """A run-time T read transposed by a pointwise op: the copy the relayout pass adds is
    symbolic on the axis it moves innermost."""
    return {"name": "dyntr", "symbols": {"T": {"max": 4096}},
            "tensors": {"x": {"shape": ["T", 64], "dtype": "float16"}},
            "inputs": ["x"], "outputs": ["y"],
            "ops": [{"name": "tr", "op": "relu", "out": "y[j,t]", "ins": ["x[t,j]"]}]}


def test_a_transposed_read_of_a_run_time_size_plans_a_relayout_and_runs_at_any_size():
    program = from_dict(transposed_doc())
    planned = ap.plan(program, ap.targets.spyre(cores=32))
    assert [o.name for o in planned.ops] == ["x.relayout0", "tr"]
    assert planned.program.tensor("x.relayout0").shape == (64, 4096)
    for t in (1, 1000, 4096):
        bound, plan = planned.bound({"T": t})
        assert bound.tensor("x.relayout0").shape == (64, t)
        assert [o.name for o in plan.ops] == ["x.relayout0", "tr"]
        assert all(c.ok for c in planned.check(params={"T": t}))
    back = ap.PlannedProgram.from_json(planned.to_json(), program, planned.target)
    assert all(c.ok for c in back.check(params={"T": 77}))


def test_a_plan_with_a_select_chain_round_trips_through_json():
    program = from_dict(matmul_doc())
    planned = ap.plan(program, ap.targets.resolve("gpu"))
    back = ap.PlannedProgram.from_json(planned.to_json(), program, planned.target)
    assert back.plan == planned.plan
    assert all(c.ok for c in back.check(params={"K": 40960}))
    doc = json.loads(planned.to_json())
    assert doc["symbols"] == {"K": 65536}
    factor = next(o for o in doc["ops"] if o["name"] == "mm.partial")["split_k"]["factor"]
    assert factor["size"] == "K" and factor["default"] == 1 and factor["select"]


def test_a_user_resolver_may_return_a_select_chain():
    chain = SelectChain("K", (Case(4, lo=4096, multiple=128),))

    def resolver(shape: ReductionShape) -> SelectChain | int | None:
        return chain if shape.symbol == "K" else None

    planned = ap.plan(from_dict(matmul_doc()), ap.targets.spyre(cores=32), split_k=resolver)
    assert planned.op("mm.partial").split_k.by == "user"
    for k, slices in ((8192, 4), (2048, 1)):
        assert planned.bound({"K": k})[0].tensor("y.partials").shape[0] == slices
        assert all(c.ok for c in planned.check(params={"K": k}))


def test_a_select_chain_on_a_static_reduction_is_an_error_naming_the_op():
    doc = matmul_doc(k=4096)
    with pytest.raises(PlanningError, match=r"op 'mm'.*select chain.*static size 4096"):
        ap.plan(from_dict(doc), ap.targets.spyre(cores=8),
                split_k=lambda shape: SelectChain("K", (Case(2),)))


@pytest.mark.parametrize("power", range(11, 24))
def test_the_gpu_chain_agrees_with_the_static_heuristic_on_power_of_two_sizes(power):
    for m, n in ((32, 32), (64, 64), (128, 128), (512, 512), (1, 4096)):
        k = 2 ** power
        static = gpu_slices(ReductionShape(1, m, n, k)) or 1
        chain = gpu_chain(ReductionShape(1, m, n, 0, symbol="K"))
        assert chain is not None and chain.evaluate(k) == static, (m, n, k)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 8192), m=st.sampled_from([1, 8, 32]), cores=st.sampled_from([1, 4, 32]),
       target=st.sampled_from(["gpu", "cpu", "spyre"]), strategy=st.sampled_from(
           ["balanced", "greedy"]))
def test_a_symbolic_matmul_runs_right_at_any_size(k, m, cores, target, strategy):
    planned = ap.plan(from_dict(matmul_doc(m=m, kmax=8192)),
                      ap.targets.resolve(target, cores), strategy)
    assert all(c.ok for c in planned.check(params={"K": k}))
