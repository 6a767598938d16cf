"""Tests of the numpy reference executor and its kernels."""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import pytest

from apportion.errors import ExecutionError
from apportion.frontend.json_format import loads
from apportion.ir.kinds import KINDS, Category
from apportion.ir.program import Program
from apportion.plans.plan import LoopInfo, OpPlan, Plan
from apportion.runtime import (
    TOLERANCES,
    compare,
    evaluate_op,
    random_inputs,
    round_bf16,
    run_unplanned,
)
from apportion.runtime.kernels import to_storage
from tests.helpers import run_planned

#: the lowering module (``apportion.schedule.lower`` is also the name of its function)
LOWERING = sys.modules["apportion.schedule.lower"]

# --- helpers -------------------------------------------------------------------------------


def program(tensors: dict[str, tuple[list[int], str]], ops: list[dict[str, Any]],
            outputs: list[str]) -> Program:
    """A program from (shape, dtype) inputs and op entries of the JSON format."""
    doc = {"format": "apportion.program/1", "name": "t",
           "tensors": {n: {"shape": s, "dtype": d} for n, (s, d) in tensors.items()},
           "inputs": list(tensors), "outputs": outputs, "ops": ops}
    return loads(json.dumps(doc))


def plan_for(p: Program, splits: dict[str, dict[str, int]] | None = None,
             loop: LoopInfo | None = None) -> Plan:
    """A hand-made plan: every op split as given (default 1), one element per unit."""
    ops = []
    for op in p.ops:
        s = {d: 1 for d, _ in op.dims} | (splits or {}).get(op.name, {})
        ops.append(OpPlan(op.name, op.fn, op.category.value, op.dims, op.reduction_dims, (),
                          tuple((d, 1) for d, _ in op.dims), tuple(s.items()), 1.0, 0.0, (),
                          loop))
    return Plan(p.name, "test", 8, "hand", tuple(ops))


def f32(*shape: int, seed: int = 0, lo: float = 0.5, hi: float = 1.5) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# Direct formulas, written independently of the kernels.
POINTWISE_FORMULAS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "max": np.maximum, "min": np.minimum, "pow": lambda a, b: a ** b,
    "neg": lambda a: -a, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda a: a ** -0.5, "tanh": np.tanh, "sigmoid": sigmoid,
    "relu": lambda a: np.where(a > 0, a, 0.0), "silu": lambda a: a * sigmoid(a),
    "gelu": lambda a: 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3))),
    "copy": lambda a: a, "square": lambda a: a * a, "reciprocal": lambda a: 1 / a,
}

# The registry's kinds of the first releases, by category (tests/ir/test_kinds.py covers every
# kind of the registry, the later ones included).
POINTWISE = {k.name: k.arity for k in KINDS if k.elementwise and k.name in POINTWISE_FORMULAS}
REDUCTIONS = [k.name for k in KINDS if k.category is Category.REDUCTION]
# along the last axis (the whole-tensor fallbacks of the PyTorch frontend: tests/ir/test_kinds.py)
FALLBACKS = [k.name for k in KINDS if k.category is Category.FALLBACK and not k.whole]

# --- kernels -------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", sorted(POINTWISE))
def test_pointwise_kernel_matches_numpy_formula(fn: str) -> None:
    n_in = POINTWISE[fn]
    names = ["a", "b"][:n_in]
    p = program({n: ([3, 5], "float32") for n in names},
                [{"name": "f", "op": fn, "out": "y[i,j]", "ins": [f"{n}[i,j]" for n in names]}],
                ["y"])
    # Signed values where the function allows them, to exercise relu, abs and the like.
    lo = 0.5 if fn in ("log", "sqrt", "rsqrt", "pow", "div", "reciprocal") else -2.0
    xs = {n: f32(3, 5, seed=i, lo=lo, hi=2.0) for i, n in enumerate(names)}
    want = POINTWISE_FORMULAS[fn](*(xs[n].astype(np.float64) for n in names))
    got = run_unplanned(p, xs)["y"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


REDUCTION_FORMULAS = {
    "sum": lambda x: x.sum(1), "mean": lambda x: x.mean(1), "max": lambda x: x.max(1),
    "min": lambda x: x.min(1), "prod": lambda x: x.prod(1), "any": lambda x: (x != 0).any(1),
    "argmax": lambda x: x.argmax(1),
    "max_pool": lambda x: x.max(1), "avg_pool": lambda x: x.mean(1),  # a window of the row
}


@pytest.mark.parametrize("fn", sorted(REDUCTIONS))
def test_reduction_kernel_matches_numpy_formula(fn: str) -> None:
    p = program({"x": ([4, 6], "float32")},
                [{"name": "r", "op": fn, "out": "s[i]", "ins": ["x[i,k]"]}], ["s"])
    x = f32(4, 6)
    if fn == "any":
        x[1] = 0.0  # one row all false
    got = run_unplanned(p, {"x": x})["s"]
    want = REDUCTION_FORMULAS[fn](x.astype(np.float64))
    np.testing.assert_allclose(got, want.astype(got.dtype), rtol=1e-6)
    assert got.dtype == {"argmax": np.int64, "any": np.bool_}.get(fn, np.float32)


@pytest.mark.parametrize("fn", sorted(FALLBACKS))
def test_fallback_applies_along_last_axis_of_whole_tensor(fn: str) -> None:
    p = program({"x": ([3, 5], "float32")},
                [{"name": "f", "op": "fallback", "fn": fn, "out": "y[i,j]", "ins": ["x[i,j]"]}],
                ["y"])
    x = f32(3, 5)
    want = {"sort": np.sort(x, axis=-1), "cumsum": np.cumsum(x, axis=-1),
            "flip": x[:, ::-1]}[fn]
    np.testing.assert_allclose(run_unplanned(p, {"x": x})["y"], want, rtol=1e-6)
    np.testing.assert_allclose(run_planned(p, plan_for(p), {"x": x})["y"], want, rtol=1e-6)


def test_round_bf16_rounds_to_nearest_even_and_keeps_specials() -> None:
    one_ulp = 2.0 ** -7  # bfloat16 spacing just above 1.0
    x = np.array([1.0, 1.0 + one_ulp / 2, 1.0 + 1.5 * one_ulp, 1.0 + 0.75 * one_ulp,
                  1.0 + 0.25 * one_ulp, -3.0, np.inf, -np.inf, np.nan, 0.0], dtype=np.float32)
    got = round_bf16(x)
    assert got.dtype == np.float32
    # Ties go to the even mantissa: 1 + ulp/2 -> 1, 1 + 1.5 ulp -> 1 + 2 ulp.
    want = [1.0, 1.0, 1.0 + 2 * one_ulp, 1.0 + one_ulp, 1.0, -3.0, np.inf, -np.inf]
    assert got[:8].tolist() == want
    assert np.isnan(got[8]) and got[9] == 0.0
    # Every result has zero low 16 bits (is a bfloat16 value).
    assert not np.any(got.view(np.uint32) & 0xFFFF)


def test_bfloat16_tensors_hold_bfloat16_values() -> None:
    p = program({"x": ([2, 3], "bfloat16")},
                [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}], ["y"])
    xs = random_inputs(p)
    y = run_unplanned(p, xs)["y"]
    for a in (xs["x"], y):
        assert a.dtype == np.float32 and not np.any(a.view(np.uint32) & 0xFFFF)
    np.testing.assert_array_equal(y, round_bf16(np.exp(xs["x"])))


def test_float_to_int_storage_truncates_toward_zero() -> None:
    assert to_storage(np.array([2.7, -2.7]), "int8").tolist() == [2, -2]
    assert to_storage(np.array([0.0, 0.3]), "bool").tolist() == [False, True]


# --- indexing ------------------------------------------------------------------------------


def test_compound_index_reads_like_a_hand_loop() -> None:
    # s[t,h] = sum_d x[t, 8*h + d]: heads of 8 laid side by side in one row.
    p = program({"x": ([3, 24], "float32")},
                [{"name": "r", "op": "sum", "out": "s[t,h]", "ins": ["x[t,8*h+d]"],
                  "dims": {"h": 3, "d": 8}}], ["s"])
    x = f32(3, 24)
    want = np.zeros((3, 3))
    for t in range(3):
        for h in range(3):
            for d in range(8):
                want[t, h] += x[t, 8 * h + d]
    np.testing.assert_allclose(run_unplanned(p, {"x": x})["s"], want, rtol=1e-6)
    planned = run_planned(p, plan_for(p, {"r": {"t": 3, "h": 2, "d": 4}}), {"x": x})
    np.testing.assert_allclose(planned["s"], want, rtol=1e-6)


def test_constant_offset_index_reads_like_a_hand_loop() -> None:
    # y[t,f] = silu(gu[t, 6+f]): the second half of a fused gate-up tensor.
    p = program({"gu": ([2, 12], "float32")},
                [{"name": "a", "op": "silu", "out": "y[t,f]", "ins": ["gu[t,6+f]"],
                  "dims": {"f": 6}}], ["y"])
    gu = f32(2, 12, lo=-2.0, hi=2.0)
    want = np.array([[gu[t, 6 + f] * sigmoid(gu[t, 6 + f]) for f in range(6)] for t in range(2)])
    np.testing.assert_allclose(run_unplanned(p, {"gu": gu})["y"], want, rtol=1e-6)
    planned = run_planned(p, plan_for(p, {"a": {"t": 2, "f": 3}}), {"gu": gu})
    np.testing.assert_allclose(planned["y"], want, rtol=1e-6)


def test_literal_zero_index_broadcasts_a_size_one_dim() -> None:
    p = program({"x": ([4, 5], "float32"), "r": ([4, 1], "float32")},
                [{"name": "s", "op": "mul", "out": "y[m,n]", "ins": ["x[m,n]", "r[m,0]"]}],
                ["y"])
    xs = {"x": f32(4, 5), "r": f32(4, 1, seed=1)}
    want = xs["x"] * xs["r"]
    np.testing.assert_allclose(run_unplanned(p, xs)["y"], want, rtol=1e-6)
    planned = run_planned(p, plan_for(p, {"s": {"m": 2, "n": 3}}), xs)
    np.testing.assert_allclose(planned["y"], want, rtol=1e-6)


def test_transposed_operands_and_literal_zero_output() -> None:
    # y[n,0,m] = sum_k x[k,m] * w[n,k]: both inputs transposed against the usual layout.
    p = program({"x": ([6, 4], "float32"), "w": ([3, 6], "float32")},
                [{"name": "mm", "op": "matmul", "out": "y[n,0,m]", "ins": ["x[k,m]", "w[n,k]"]}],
                ["y"])
    xs = {"x": f32(6, 4), "w": f32(3, 6, seed=1)}
    want = (xs["w"] @ xs["x"])[:, None, :]
    np.testing.assert_allclose(run_unplanned(p, xs)["y"], want, rtol=1e-5)
    planned = run_planned(p, plan_for(p, {"mm": {"n": 3, "m": 2, "k": 3}}), xs)
    np.testing.assert_allclose(planned["y"], want, rtol=1e-5)


# --- split reductions ----------------------------------------------------------------------


@pytest.mark.parametrize("fn", ["sum", "mean", "max", "min", "prod", "any", "argmax"])
def test_split_reduction_combines_partials_across_cores(fn: str) -> None:
    p = program({"x": ([4, 9], "float32")},
                [{"name": "r", "op": fn, "out": "s[i]", "ins": ["x[i,k]"]}], ["s"])
    x = f32(4, 9)
    want = run_unplanned(p, {"x": x})["s"]
    got = run_planned(p, plan_for(p, {"r": {"i": 2, "k": 3}}), {"x": x})["s"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.dtype == want.dtype


def test_split_argmax_ties_go_to_the_lowest_index() -> None:
    p = program({"x": ([2, 8], "float32")},
                [{"name": "r", "op": "argmax", "out": "s[i]", "ins": ["x[i,k]"]}], ["s"])
    x = np.zeros((2, 8), dtype=np.float32)
    x[0, [5, 2, 7]] = 3.0  # equal maxima in different cores' slices
    x[1, [6, 7]] = 1.0     # equal maxima in the last core only
    got = run_planned(p, plan_for(p, {"r": {"k": 4}}), {"x": x})["s"]
    assert got.tolist() == [2, 6]


def test_split_mean_divides_by_the_full_count() -> None:
    p = program({"x": ([2, 6], "float32")},
                [{"name": "r", "op": "mean", "out": "s[i]", "ins": ["x[i,k]"]}], ["s"])
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    got = run_planned(p, plan_for(p, {"r": {"k": 4}}), {"x": x})["s"]
    assert got.tolist() == [2.5, 8.5]
    # One core's box alone gives the partial sum, not a mean.
    assert evaluate_op(p.ops[0], p, {"x": x}, {"k": (0, 2)}).tolist() == [1.0, 13.0]


def test_split_k_matmul_sums_partials_before_the_cast() -> None:
    p = program({"x": ([8, 64], "float16"), "w": ([64, 4], "float16")},
                [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
                ["y"])
    xs = random_inputs(p)
    want = (xs["x"].astype(np.float64) @ xs["w"].astype(np.float64)).astype(np.float16)
    got = run_planned(p, plan_for(p, {"mm": {"m": 2, "k": 4}}), xs)["y"]
    assert got.dtype == np.float16
    assert all(c.ok for c in compare({"y": want}, {"y": got}, p))
    np.testing.assert_allclose(got, want, rtol=2e-3)


def test_mlp_example_planned_matches_unplanned() -> None:
    from apportion.frontend.json_format import load

    p = load("examples/mlp.json")
    splits = {op.name: {"m": 4, **{d: 2 for d in op.reduction_dims}} for op in p.ops}
    xs = random_inputs(p)
    want = run_unplanned(p, xs)
    got = run_planned(p, plan_for(p, splits), xs)
    assert np.all(np.isfinite(want["y"]))  # inputs are scaled so float16 does not overflow
    checks = compare(want, got, p)
    assert [c.tensor for c in checks] == ["y"] and all(c.ok for c in checks)


# --- coverage ------------------------------------------------------------------------------


def _sum_program() -> Program:
    return program({"x": ([4, 6], "float32")},
                   [{"name": "r", "op": "sum", "out": "s[i]", "ins": ["x[i,k]"]}], ["s"])


def test_plan_missing_iteration_points_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _sum_program()
    real = LOWERING.core_slices  # the schedule's boxes, as the reference backend runs them
    monkeypatch.setattr(LOWERING, "core_slices", lambda op_plan: [*real(op_plan)[:-1], None])
    with pytest.raises(ExecutionError, match="'r'.*no core"):
        run_planned(p, plan_for(p, {"r": {"i": 2, "k": 2}}), {"x": f32(4, 6)})


def test_plan_covering_points_twice_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _sum_program()
    real = LOWERING.core_slices
    monkeypatch.setattr(LOWERING, "core_slices",
                        lambda op_plan: real(op_plan)[:-1] + real(op_plan)[:1])
    with pytest.raises(ExecutionError, match="'r'.*both compute"):
        run_planned(p, plan_for(p, {"r": {"i": 2, "k": 2}}), {"x": f32(4, 6)})


def test_overlap_that_compensates_a_gap_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    # Same number of points as a true cover, but k 0..3 twice and k 3..6 never.
    p = _sum_program()
    boxes = [{"i": (0, 4), "k": (0, 3)}, {"i": (0, 4), "k": (0, 3)}]
    monkeypatch.setattr(LOWERING, "core_slices", lambda op_plan: boxes)
    with pytest.raises(ExecutionError, match="both compute"):
        run_planned(p, plan_for(p, {"r": {"k": 2}}), {"x": f32(4, 6)})


def test_missing_or_misshapen_inputs_raise() -> None:
    p = _sum_program()
    with pytest.raises(ExecutionError, match="'x'.*missing"):
        run_unplanned(p, {})
    with pytest.raises(ExecutionError, match="shape"):
        run_unplanned(p, {"x": f32(4, 5)})


# --- threads, inputs, compare --------------------------------------------------------------


def test_threaded_run_equals_sequential_run_exactly() -> None:
    p = program({"x": ([16, 32], "float32"), "w": ([32, 8], "float32")},
                [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
                 {"name": "g", "op": "gelu", "out": "y[m,n]", "ins": ["h[m,n]"]}], ["y"])
    plan = plan_for(p, {"mm": {"m": 4, "n": 2, "k": 4}, "g": {"m": 8}})
    xs = random_inputs(p, seed=3)
    seq = run_planned(p, plan, xs)
    par = run_planned(p, plan, xs, threads=4)
    for name in ("h", "y"):
        np.testing.assert_array_equal(seq[name], par[name])


def test_random_inputs_are_deterministic_and_safe_for_every_op() -> None:
    p = program({"f": ([8, 8], "float16"), "i": ([8], "int32"), "b": ([8], "bool")},
                [{"name": "l", "op": "log", "out": "y[a,c]", "ins": ["f[a,c]"]}], ["y"])
    a, b = random_inputs(p, seed=1), random_inputs(p, seed=1)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert a["f"].dtype == np.float16 and a["f"].min() >= 0.5 and a["f"].max() <= 1.5
    assert a["i"].dtype == np.int32 and set(a["i"].tolist()) <= {1, 2, 3}
    assert a["b"].dtype == np.bool_


def test_compare_flags_differences_beyond_the_dtype_tolerance() -> None:
    p = program({"x": ([4], "float32")},
                [{"name": "c", "op": "copy", "out": "y[i]", "ins": ["x[i]"]}], ["y"])
    want = {"y": np.array([0.5, 1.0, np.inf, np.nan], dtype=np.float32)}
    near = {"y": np.array([0.5, 1.0 + 1e-6, np.inf, np.nan], dtype=np.float32)}
    far = {"y": np.array([0.5, 1.1, np.inf, np.nan], dtype=np.float32)}
    inf = {"y": np.array([0.5, 1.0, 3.0, np.nan], dtype=np.float32)}
    (ok,) = compare(want, near, p)
    assert ok.ok and ok.max_abs_err < 1e-5 and ok.tolerance == TOLERANCES["float32"]
    (bad,) = compare(want, far, p)
    assert not bad.ok and bad.max_abs_err == pytest.approx(0.1, rel=1e-5)
    assert bad.max_rel_err == pytest.approx(0.1, rel=1e-5)
    assert not compare(want, inf, p)[0].ok


def test_a_float32_value_near_zero_may_carry_the_rounding_of_the_larger_ones_not_a_wrong_slice(
        ) -> None:
    """A cumsum of mean-centred values in float32 (as seed 100010 of bench conformance): the
    running sums reach 60 and come back to 0, so another summation order (blocks of 16, as a
    core split sums) moves the small ones by ulps of 60, beyond atol 1e-5 at their own size;
    a missing term is off by a value of the output's scale and is still caught."""
    p = program({"x": ([512], "float32")},
                [{"name": "c", "op": "cumsum", "out": "y[i]", "ins": ["x[i]"]}], ["y"])
    x = np.random.default_rng(0).normal(0.0, 4.0, 512)
    x -= x.mean()
    x32 = x.astype(np.float32)
    blocks = x32.reshape(-1, 16)
    starts = np.concatenate([[0], np.cumsum(blocks.sum(1))[:-1]]).astype(np.float32)
    one = {"y": np.cumsum(x32)}
    other = {"y": (starts[:, None] + np.cumsum(blocks, 1)).reshape(-1).astype(np.float32)}
    truth = np.cumsum(x)  # float64: both orders are within float32 rounding of it
    assert max(np.abs(one["y"] - truth).max(), np.abs(other["y"] - truth).max()) < 3e-5
    base = TOLERANCES["float32"]
    diff = np.abs(one["y"] - other["y"])
    assert (diff > base.atol + base.rtol * np.abs(one["y"])).any()  # the fixed atol alone fails
    (check,) = compare(one, other, p)
    assert check.ok, check
    assert "float32 eps at max |expected|" in str(check.tolerance)
    dropped = {"y": one["y"] - np.where(np.arange(512) >= 40, x32[40], 0).astype(np.float32)}
    assert not compare(one, dropped, p)[0].ok


def test_compare_is_exact_for_ints_and_knows_every_dtype() -> None:
    from apportion.ir.dtypes import DTYPE_BYTES

    assert set(TOLERANCES) == set(DTYPE_BYTES)
    p = program({"x": ([3], "int32")},
                [{"name": "c", "op": "copy", "out": "y[i]", "ins": ["x[i]"]}], ["y"])
    want = {"y": np.array([1, 2, 3], dtype=np.int32)}
    assert compare(want, {"y": want["y"].copy()}, p)[0].ok
    assert not compare(want, {"y": np.array([1, 2, 4], dtype=np.int32)}, p)[0].ok


def test_a_gather_by_float_indices_is_an_execution_error_naming_the_op():
    import apportion as ap

    with ap.program("g") as p:
        table = p.input("table", [ap.dim("v", 10), ap.dim("e", 4)], "float32")
        ids = p.input("ids", [ap.dim("t", 3)], "float32")
        p.output(ap.gather(table, ids, name="emb"))
    inputs = {"table": np.zeros((10, 4), np.float32), "ids": np.array([1.0, 2.0, 3.0],
                                                                       np.float32)}
    with pytest.raises(ExecutionError, match="op 'emb': gather failed"):
        run_unplanned(p.program, inputs)
