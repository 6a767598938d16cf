"""Integers are exact: every executor computes integer programs with numpy's integer
arithmetic (int64, wrapping on overflow), never through float64.

The oracle of the property test is numpy itself, run on the inputs directly in this file, not
another run of an apportion executor: ``check()`` compares two runs of the same executor, so
an executor wrong in the same way twice (float64 rounding 2**53 + 1, overflow saturating to
INT64_MIN) passes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from apportion.errors import PlanningError, ProgramError
from apportion.ir.program import Program
from apportion.passes.geometry import divisors
from apportion.passes.pipeline import plan
from apportion.runtime import compare, run_unplanned
from apportion.target import spyre
from tests.helpers import one_op, program, run_planned, schedule_of

BIG = 2**53 + 1  # the first integer float64 cannot hold
INT64_MAX = np.iinfo(np.int64).max
#: elements per 128-byte stick: a row is whole sticks
PER_STICK = {"int8": 128, "int32": 32, "int64": 16}
NP = {"int8": np.int8, "int32": np.int32, "int64": np.int64}

#: op name -> numpy's own result on two arrays of the tensor's dtype
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
    "min": np.minimum,
}
#: op name -> numpy's own result; the divisor is never 0 or -1 (INT_MIN // -1 traps in C)
DIVIDE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "floor_div": np.floor_divide, "remainder": np.remainder,
}
UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative, "abs": np.abs, "square": np.square, "sign": np.sign,
    "relu": lambda a: np.maximum(a, a.dtype.type(0)),
}
REDUCE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    # numpy's reductions in the tensor's own dtype: they wrap as an int64 sum cast down does
    "sum": lambda a: np.sum(a, axis=1, keepdims=True, dtype=a.dtype),
    "prod": lambda a: np.prod(a, axis=1, keepdims=True, dtype=a.dtype),
    "max": lambda a: np.max(a, axis=1, keepdims=True),
    "min": lambda a: np.min(a, axis=1, keepdims=True),
    # apportion's integer mean: the exact (wrapped) int64 sum divided in float64, truncated
    "mean": lambda a: np.trunc(np.sum(a, axis=1, keepdims=True, dtype=np.int64)
                               / a.shape[1]).astype(a.dtype),
}


def _values(rng: np.random.Generator, regime: str, dtype: str, shape: tuple[int, ...]
            ) -> np.ndarray:
    """Integers of one regime: small, around +-2**53 (int64 only) or anywhere in the dtype."""
    info = np.iinfo(NP[dtype])
    if regime == "small":
        return rng.integers(-6, 7, shape).astype(NP[dtype])
    if regime == "near 2**53" and dtype == "int64":
        sign = rng.choice([-1, 1], shape)
        return (sign * (2**53 + rng.integers(-4, 5, shape))).astype(np.int64)
    return rng.integers(int(info.min), int(info.max), shape, dtype=NP[dtype], endpoint=True)


@st.composite
def integer_programs(draw: Any) -> tuple[Program, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A chain over [m, n] of integer pointwise ops, copies (plain and cast round trips),
    comparisons feeding ``where``, divisions, row reductions broadcast back, matmuls and an
    argmax, some reductions pinned split over cores; its inputs; numpy's own result for every
    output; and a loop nest around it (sometimes). Returns (program, inputs, expected)."""
    dtype = draw(st.sampled_from(sorted(PER_STICK)))
    m = draw(st.sampled_from([1, 1, 2, 4, 8]))
    sticks = draw(st.sampled_from([1, 2, 4]))
    n = PER_STICK[dtype] * sticks
    regimes = ["small", "anywhere"] + (["near 2**53"] if dtype == "int64" else [])
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tensors: dict[str, tuple[list[int], str]] = {}
    xs: dict[str, np.ndarray] = {}

    def new_input(name: str, shape: tuple[int, int], regime: str | None = None) -> np.ndarray:
        tensors[name] = (list(shape), dtype)
        xs[name] = _values(rng, regime or draw(st.sampled_from(regimes)), dtype, shape)
        return xs[name]

    cur, val = "x", new_input("x", (m, n))
    ops: list[dict[str, Any]] = []
    outputs: dict[str, np.ndarray] = {}
    pins: dict[str, dict[str, int]] = {}

    def maybe_split(op: str, dim: str) -> None:
        # sometimes a pinned split of the reduction over cores: partials combined after
        if draw(st.booleans()):
            pins[op] = {dim: draw(st.sampled_from(divisors(sticks, sticks)))}
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["unary", "binary", "divide", "copy", "cast", "where",
                                     "rowstat", "matmul", "argmax"]))
        out = f"t{i}"
        if kind == "unary":
            name = draw(st.sampled_from(sorted(UNARY)))
            ops.append({"name": f"u{i}", "op": name, "out": f"{out}[i,j]", "ins": [f"{cur}[i,j]"]})
            val = UNARY[name](val)
        elif kind in ("binary", "divide"):
            table = BINARY if kind == "binary" else DIVIDE
            name = draw(st.sampled_from(sorted(table)))
            if kind == "divide":
                other = new_input(f"in{i}", (m, n), "small")
                other[:] = rng.choice([-7, -5, -3, -2, 2, 3, 5, 7], (m, n))
            else:
                other = new_input(f"in{i}", (m, n))
            ops.append({"name": f"b{i}", "op": name, "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", f"in{i}[i,j]"]})
            val = table[name](val, other)
        elif kind == "copy":
            ops.append({"name": f"c{i}", "op": "copy", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]"]})
        elif kind == "cast":  # to another integer dtype and back: wraps like numpy's astype
            via = draw(st.sampled_from(sorted(set(PER_STICK) - {dtype})))
            ops.append({"name": f"d{i}", "op": "copy", "out": f"v{i}[i,j]",
                        "ins": [f"{cur}[i,j]"], "dtype": via})
            ops.append({"name": f"e{i}", "op": "copy", "out": f"{out}[i,j]",
                        "ins": [f"v{i}[i,j]"], "dtype": dtype})
            val = val.astype(NP[via]).astype(NP[dtype])
        elif kind == "where":  # a comparison near 2**53 is exact or wrong
            other = new_input(f"in{i}", (m, n))
            if draw(st.booleans()):
                other[:] = val + rng.integers(-1, 2, (m, n)).astype(val.dtype)  # off by one
            ops.append({"name": f"lt{i}", "op": "lt", "out": f"q{i}[i,j]",
                        "ins": [f"{cur}[i,j]", f"in{i}[i,j]"]})
            ops.append({"name": f"w{i}", "op": "where", "out": f"{out}[i,j]",
                        "ins": [f"q{i}[i,j]", f"{cur}[i,j]", f"in{i}[i,j]"]})
            val = np.where(val < other, val, other)
        elif kind == "rowstat":  # a row reduction, then broadcast back over the row
            name = draw(st.sampled_from(sorted(REDUCE)))
            ops.append({"name": f"r{i}", "op": name, "out": f"s{i}[i,0]",
                        "ins": [f"{cur}[i,j]"]})
            maybe_split(f"r{i}", "j")
            ops.append({"name": f"a{i}", "op": "add", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", f"s{i}[i,0]"]})
            val = np.add(val, REDUCE[name](val))
        elif kind == "matmul":
            w = new_input(f"w{i}", (n, n))
            ops.append({"name": f"mm{i}", "op": "matmul", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,k]", f"w{i}[k,j]"]})
            maybe_split(f"mm{i}", "k")
            val = np.matmul(val, w)  # numpy's integer matmul, in the dtype: it wraps
        else:  # argmax: an int64 output of its own, the chain goes on from its input
            ops.append({"name": f"am{i}", "op": "argmax", "out": f"g{i}[i,0]",
                        "ins": [f"{cur}[i,j]"]})
            maybe_split(f"am{i}", "j")
            outputs[f"g{i}"] = np.argmax(val, axis=1, keepdims=True)
            continue
        cur = out
    outputs[cur] = val
    if cur == "x":  # only argmaxes: the input itself is no op's output
        outputs.pop("x")
    tiling = []
    if draw(st.booleans()):  # every op in one loop nest over rows, columns or the matmul's k
        letters = sorted({d for o in ops for d in "ijk" if f"{d}]" in o["out"] + "".join(o["ins"])
                          or f"{d}," in o["out"] + "".join(o["ins"])})
        d = draw(st.sampled_from(letters))
        units = {"i": m, "j": n // PER_STICK[dtype], "k": n // PER_STICK[dtype]}[d]
        count = draw(st.sampled_from(divisors(units, units)))
        tiling = [{"ops": [o["name"] for o in ops], "loops": [{"count": count, "dims": [d]}]}]
    extra = {"tiling": tiling} if tiling else {}
    if pins:
        extra["work_division"] = pins
    p = program(tensors, ops, list(outputs), **extra)
    return p, xs, outputs


def _assert_exact(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], p: Program,
                  who: str) -> None:
    for name, want in expected.items():
        have = np.asarray(got[name])
        assert have.dtype == want.dtype, (who, name, have.dtype, want.dtype)
        assert np.array_equal(have, want), (who, name, have, want, p.ops)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(integer_programs(), st.integers(1, 32))
def test_integer_programs_planned_over_any_cores_give_numpys_exact_wrapped_result(case, cores):
    p, xs, expected = case
    try:
        pl = plan(p, spyre(cores=cores))
    except (PlanningError, ProgramError) as e:
        event(f"refused: {type(e).__name__}")
        assume(False)
        return
    split = any(n > 1 for o in pl.ops for d, n in o.splits if d in o.reduction_dims)
    event(f"loop nest: {bool(pl.groups)}, reduction split over cores: {split}")
    _assert_exact(run_unplanned(p, xs), expected, p, "unplanned")
    planned = run_planned(p, pl, xs)
    _assert_exact(planned, expected, p, "planned")
    assert all(c.ok for c in compare(expected, planned, p))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(integer_programs(), st.integers(1, 32))
def test_the_torch_executor_gives_numpys_exact_wrapped_integers_too(case, cores):
    torch_exec = pytest.importorskip("apportion.backends.torch.executor")
    from apportion.backends.torch.tensors import from_torch_storage
    p, xs, expected = case
    try:
        pl = plan(p, spyre(cores=cores))
    except (PlanningError, ProgramError):
        assume(False)
        return
    ys = torch_exec.run_torch(schedule_of(p, pl), xs, threads=2, grain=0)
    got = {name: from_torch_storage(y) for name, y in ys.items()}
    _assert_exact(got, expected, p, "torch")


# --- the reported cases --------------------------------------------------------------------

def _copy_program() -> Program:
    return one_op("copy", "y[i,j]", ["x[i,j]"], {"x": ([2, 16], "int64")})


def test_a_copy_of_2_53_plus_1_stays_2_53_plus_1_unplanned_and_planned() -> None:
    p = _copy_program()
    x = np.full((2, 16), BIG, dtype=np.int64)
    assert run_unplanned(p, {"x": x})["y"].tolist() == x.tolist()
    for cores in (1, 4, 8):
        got = run_planned(p, plan(p, spyre(cores=cores)), {"x": x})["y"]
        assert got.tolist() == x.tolist()


def test_int64_overflow_wraps_as_numpy_does_instead_of_saturating() -> None:
    p = one_op("add", "y[i,j]", ["x[i,j]", "z[i,j]"],
               {"x": ([2, 16], "int64"), "z": ([2, 16], "int64")})
    x = np.full((2, 16), INT64_MAX, dtype=np.int64)
    z = np.ones((2, 16), dtype=np.int64)
    want = np.add(x, z)  # numpy wraps to INT64_MIN
    assert want[0, 0] == np.iinfo(np.int64).min
    assert np.array_equal(run_unplanned(p, {"x": x, "z": z})["y"], want)
    assert np.array_equal(run_planned(p, plan(p, spyre(cores=4)), {"x": x, "z": z})["y"], want)
    # and a product that overflows: the low 64 bits, not a float rounded to INT64_MIN
    pm = one_op("mul", "y[i,j]", ["x[i,j]", "z[i,j]"],
                {"x": ([2, 16], "int64"), "z": ([2, 16], "int64")})
    z3 = np.full((2, 16), 3, dtype=np.int64)
    assert np.array_equal(run_unplanned(pm, {"x": x, "z": z3})["y"], np.multiply(x, z3))


def test_a_split_integer_sum_is_combined_exactly() -> None:
    # one row of 2**53 + 1 sixteen times over: a float64 partial drops every +1
    p = one_op("sum", "s[i]", ["x[i,k]"], {"x": ([1, 256], "int64")})
    x = np.full((1, 256), BIG, dtype=np.int64)
    pl = plan(p, spyre(cores=16))
    assert pl.op("sum").cores > 1
    got = run_planned(p, pl, {"x": x})["s"]
    assert got.tolist() == [np.sum(x, dtype=np.int64)]


def test_check_compares_integers_exactly_not_through_float64() -> None:
    # through float64 these two are the same number
    got = {"y": np.full((2, 16), BIG - 1, dtype=np.int64)}
    want = {"y": np.full((2, 16), BIG, dtype=np.int64)}
    (check,) = compare(want, got, _copy_program())
    assert not check.ok
    assert check.max_abs_err == 1.0
    assert str(check.tolerance) == "exact"


@given(st.integers(-(2**62), 2**62), st.sampled_from([-1, 1]), st.integers(0, 31))
def test_compare_tells_apart_integers_that_float64_cannot(value: int, step: int, at: int
                                                           ) -> None:
    # near 2**53 (and past it) neighbours round to one float64; compare must still see them
    base = np.full((2, 16), (2**53 + value) if abs(value) < 2**52 else value, dtype=np.int64)
    other = base.copy()
    other.reshape(-1)[at] += step
    (same,) = compare({"y": base}, {"y": base.copy()}, _copy_program())
    (diff,) = compare({"y": base}, {"y": other}, _copy_program())
    assert same.ok and same.max_abs_err == 0.0
    assert not diff.ok and diff.max_abs_err == 1.0


def test_integer_division_truncates_true_division_as_the_parallel_ir_does() -> None:
    # div has no integer semantics in the registry: float64 division, truncated toward zero
    p = one_op("div", "y[i]", ["a[i]", "b[i]"], {"a": ([4], "int32"), "b": ([4], "int32")})
    a = np.array([7, -7, 7, -7], dtype=np.int32)
    b = np.array([2, 2, -2, -2], dtype=np.int32)
    assert run_unplanned(p, {"a": a, "b": b})["y"].tolist() == [3, -3, -3, 3]


def test_a_float_condition_selects_integers_exactly() -> None:
    # the condition is read as a bool (0.5 is true), the values stay int64
    p = one_op("where", "y[i]", ["c[i]", "a[i]", "b[i]"],
               {"c": ([2], "float32"), "a": ([2], "int64"), "b": ([2], "int64")})
    got = run_unplanned(p, {"c": np.array([0.5, 0.0], np.float32),
                            "a": np.array([BIG, 0]), "b": np.array([0, BIG + 2])})["y"]
    assert got.tolist() == [BIG, BIG + 2]


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_an_integer_reduction_tiled_by_a_loop_accumulates_exactly(name: str) -> None:
    p = program({"x": ([2, 256], "int8")},
                [{"name": "r", "op": name, "out": "s[i]", "ins": ["x[i,k]"]}], ["s"],
                tiling=[{"ops": ["r"], "loops": [{"count": 2, "dims": ["k"]}]}])
    x = np.full((2, 256), 100, dtype=np.int8)  # each tile's sum overflows int8
    pl = plan(p, spyre(cores=2))
    want = REDUCE[name](x)[:, 0]
    assert np.array_equal(run_unplanned(p, {"x": x})["s"], want)
    assert np.array_equal(run_planned(p, pl, {"x": x})["s"], want)


# --- IREE: exact already; now the reference agrees with it -----------------------------------

def _int64_chain() -> tuple[Program, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """An int64 chain over values near 2**53 and near INT64_MAX, with numpy's result: a copy,
    an overflowing add and product, a comparison feeding where, a matmul split over k and a
    row sum split over cores."""
    rng = np.random.default_rng(0)
    big = (2**53 + rng.integers(-3, 4, (4, 32))).astype(np.int64)
    top = (INT64_MAX - rng.integers(0, 5, (4, 32))).astype(np.int64)
    w = rng.integers(-3, 4, (32, 16)).astype(np.int64)
    p = program({"x": ([4, 32], "int64"), "z": ([4, 32], "int64"), "w": ([32, 16], "int64")},
                [{"name": "c", "op": "copy", "out": "c[i,j]", "ins": ["x[i,j]"]},
                 {"name": "a", "op": "add", "out": "a[i,j]", "ins": ["c[i,j]", "z[i,j]"]},
                 {"name": "m", "op": "mul", "out": "m[i,j]", "ins": ["a[i,j]", "x[i,j]"]},
                 {"name": "l", "op": "lt", "out": "l[i,j]", "ins": ["x[i,j]", "c[i,j]"]},
                 {"name": "s", "op": "where", "out": "s[i,j]", "ins": ["l[i,j]", "z[i,j]",
                                                                       "m[i,j]"]},
                 {"name": "mm", "op": "matmul", "out": "y[i,n]", "ins": ["s[i,k]", "w[k,n]"]},
                 {"name": "r", "op": "sum", "out": "r[i]", "ins": ["x[i,k]"]}],
                ["c", "y", "r"], work_division={"mm": {"k": 2}, "r": {"k": 2}})
    a = np.add(big, top)
    s = np.where(big < big, top, np.multiply(a, big))
    want = {"c": big, "y": np.matmul(s, w), "r": np.sum(big, axis=1, dtype=np.int64)}
    return p, {"x": big, "z": top, "w": w}, want


@pytest.fixture
def iree_cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("iree.compiler")
    monkeypatch.setenv("HOME", str(tmp_path))  # the default module cache, in the test's folder
    return tmp_path / ".cache" / "apportion" / "iree"


def test_iree_and_the_reference_agree_exactly_on_int64_near_2_53_and_on_overflow(iree_cache):
    from apportion.backends.iree.run import iree_run

    p, xs, want = _int64_chain()
    pl = plan(p, spyre(cores=4))
    ref = run_unplanned(p, xs)
    _assert_exact(ref, want, p, "unplanned")
    got = iree_run(schedule_of(p, pl, spyre(cores=4)), xs, cache_dir=iree_cache).tensors
    _assert_exact(got, want, p, "iree")
    assert all(c.ok for c in compare(ref, got, p))


def test_cli_run_backend_iree_check_passes_an_int64_program_past_2_53(iree_cache, tmp_path,
                                                                      capsys):
    from apportion.cli.main import main
    from apportion.frontend.json_format import dumps

    # --check's random integers are 1, 2 or 3: six squarings take 3 to 3**64, past 2**53 and
    # past INT64_MAX (a float64 reference saturated it and blamed IREE, which wraps)
    squares = [{"name": f"q{i}", "op": "square", "out": f"q{i}[i,j]",
                "ins": [f"{'x' if i == 0 else f'q{i - 1}'}[i,j]"]} for i in range(6)]
    p = program({"x": ([4, 32], "int64"), "w": ([32, 16], "int64")},
                [*squares, {"name": "mm", "op": "matmul", "out": "y[i,n]",
                            "ins": ["q5[i,k]", "w[k,n]"]}],
                ["q4", "y"], work_division={"mm": {"k": 2}})
    path = tmp_path / "ints.json"
    path.write_text(dumps(p))
    assert main(["run", str(path), "--cores", "4", "--backend", "iree", "--check"]) == 0
    out = capsys.readouterr().out
    assert "int64" in out and "exact" in out and "matches the unplanned program" in out


@pytest.mark.parametrize("name", ["sum", "mean", "prod"])
def test_iree_agrees_on_integer_reductions_tiled_by_a_loop(name: str, iree_cache) -> None:
    from apportion.backends.iree.run import iree_run

    p = program({"x": ([2, 256], "int8")},
                [{"name": "r", "op": name, "out": "s[i]", "ins": ["x[i,k]"]}], ["s"],
                tiling=[{"ops": ["r"], "loops": [{"count": 2, "dims": ["k"]}]}])
    x = np.full((2, 256), 100, dtype=np.int8)
    x[:, ::3] = -7
    want = REDUCE[name](x)[:, 0]
    got = iree_run(schedule_of(p, plan(p, spyre(cores=2)), spyre(cores=2)), {"x": x},
                   cache_dir=iree_cache).tensors
    assert np.array_equal(got["s"], want)
    assert np.array_equal(run_unplanned(p, {"x": x})["s"], want)
