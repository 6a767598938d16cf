"""Floats into integer tensors: the program's conversion saturates (truncated toward zero,
clamped to the integer type's range, NaN to 0; ``runtime.kernels.saturate``), so a value out of
range, an infinity or a NaN has one meaning on every backend, where numpy's cast was C's
undefined behaviour (machine-dependent) and LLVM's ``fptosi`` poison. Casts of float32,
float16 and bfloat16 tensors into int8, int32 and int64, integer divisions by zero (infinities,
NaN) and integer powers past the range run on the reference, torch, IREE and OpenMP, and each
equals the saturated values computed here from the exact inputs with Python integers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import apportion as ap
from apportion.backends.iree.run import iree_run
from apportion.mlir import upstream
from apportion.runtime.kernels import round_bf16
from tests.helpers import program

SHAPE = [8, 64]
N = SHAPE[0] * SHAPE[1]
BITS = {"int8": 8, "int32": 32, "int64": 64}
#: output -> (input, dtype) of each cast
CASTS = {"x_i8": ("x", "int8"), "x_i32": ("x", "int32"), "x_i64": ("x", "int64"),
         "h_i8": ("h", "int8"), "h_i32": ("h", "int32"), "b_i64": ("b", "int64")}
OPENMP = upstream.available() and upstream.openmp_library() is not None


def saturated(values: np.ndarray, dtype: str) -> np.ndarray:
    """Each value truncated toward zero and clamped to ``dtype``'s range, NaN 0, with Python
    integers (no float-to-integer cast of numpy's)."""
    lo, hi = -(2 ** (BITS[dtype] - 1)), 2 ** (BITS[dtype] - 1) - 1

    def one(v: float) -> int:
        if math.isnan(v):
            return 0
        if math.isinf(v):
            return hi if v > 0 else lo
        return min(max(math.trunc(v), lo), hi)

    return np.array([one(float(v)) for v in np.ravel(values)], dtype=dtype).reshape(
        np.shape(values))


def edges(dtype: type[np.floating], rng: np.random.Generator) -> np.ndarray:
    """NaN, infinities, zeros, halves, each integer type's bounds and the floats either side
    of them, the largest float, and random magnitudes up to it, both signs; of SHAPE."""
    big = float(np.finfo(dtype).max)
    fixed = [math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -0.5, 0.99, -0.99, big, -big]
    for bits in BITS.values():
        for edge in (2.0 ** (bits - 1), -(2.0 ** (bits - 1))):
            with np.errstate(over="ignore"):  # 2**31 is past float16's range
                e = dtype(edge)
            if np.isfinite(e):
                fixed += [float(e), float(np.nextafter(e, dtype(0))),
                          float(np.nextafter(e, dtype(math.copysign(math.inf, edge))))]
        fixed += [2.0 ** (bits - 1) - 0.5, -(2.0 ** (bits - 1)) - 0.5]
    mags = 10.0 ** rng.uniform(-2, math.log10(big), N)
    x = np.concatenate([fixed, mags * np.where(rng.random(N) < 0.5, -1.0, 1.0)])[:N]
    with np.errstate(over="ignore"):
        return x.astype(dtype).reshape(SHAPE)


def cast_program() -> ap.PlannedProgram:
    ops = [{"name": f"cast_{out}", "op": "copy", "out": f"{out}[i,j]", "ins": [f"{src}[i,j]"],
            "dtype": dtype} for out, (src, dtype) in CASTS.items()]
    ops += [{"name": f"div_{d}", "op": "div", "out": f"q_{d}[i,j]",
             "ins": [f"n_{d}[i,j]", f"z_{d}[i,j]"]} for d in ("int32", "int64")]
    ops += [{"name": f"pow_{d}", "op": "pow", "out": f"p_{d}[i,j]",
             "ins": [f"m_{d}[i,j]", f"e_{d}[i,j]"]} for d in ("int8", "int32")]
    tensors = {"x": (SHAPE, "float32"), "h": (SHAPE, "float16"), "b": (SHAPE, "bfloat16"),
               **{f"{t}_{d}": (SHAPE, d) for t in "nz" for d in ("int32", "int64")},
               **{f"{t}_{d}": (SHAPE, d) for t in "me" for d in ("int8", "int32")}}
    outs = [*CASTS, "q_int32", "q_int64", "p_int8", "p_int32"]
    return ap.plan(program(tensors, ops, outs, name="saturating"), ap.targets.spyre(cores=4))


def cast_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(28)
    inputs = {"x": edges(np.float32, rng), "h": edges(np.float16, rng),
              "b": round_bf16(edges(np.float32, rng))}
    for d in ("int32", "int64"):
        info = np.iinfo(d)
        n = np.resize(np.array([info.max, info.min, info.min + 1, 0, 5, -5, 7, 1]), N)
        z = np.resize(np.array([1, -1, 0, 0, 0, 0, 2, -1]), N)  # x/0: inf, -inf, NaN
        inputs[f"n_{d}"], inputs[f"z_{d}"] = (a.astype(d).reshape(SHAPE) for a in (n, z))
    # whole powers, exact in float64 (below 2**53) where they fit, far past the range where not
    base = rng.integers(-40, 41, N)
    for d, top in (("int8", 6), ("int32", 10)):
        inputs[f"m_{d}"] = base.astype(d).reshape(SHAPE)
        inputs[f"e_{d}"] = rng.integers(0, top, N).astype(d).reshape(SHAPE)
    return inputs


def expected(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    want = {out: saturated(inputs[src], dtype) for out, (src, dtype) in CASTS.items()}
    for d in ("int32", "int64"):
        # true division in float64, as the program defines div of integers
        with np.errstate(divide="ignore", invalid="ignore"):
            q = inputs[f"n_{d}"].astype(np.float64) / inputs[f"z_{d}"].astype(np.float64)
        want[f"q_{d}"] = saturated(q, d)
    for d in ("int8", "int32"):
        exact = [float(int(a) ** int(b)) for a, b in zip(np.ravel(inputs[f"m_{d}"]),
                                                         np.ravel(inputs[f"e_{d}"]), strict=True)]
        want[f"p_{d}"] = saturated(np.array(exact).reshape(SHAPE), d)
    return want


@pytest.fixture(scope="module")
def case() -> tuple[ap.PlannedProgram, dict[str, np.ndarray], dict[str, np.ndarray]]:
    planned, inputs = cast_program(), cast_inputs()
    # the cases reach every bound: saturation, NaN and infinities are all exercised
    want = expected(inputs)
    for out, (_, dtype) in CASTS.items():
        info = np.iinfo(dtype)
        assert {info.min, info.max, 0} <= set(want[out].ravel().tolist()), out
    return planned, inputs, want


def check(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name, w in want.items():
        g = np.asarray(got[name])
        assert g.dtype == w.dtype, (name, g.dtype)
        bad = g != w
        assert not bad.any(), (name, np.argwhere(bad)[:3].tolist(), g[bad][:5], w[bad][:5])


def test_floats_out_of_range_nan_and_infinities_saturate_on_the_reference(case):
    planned, inputs, want = case
    check(planned.run(inputs, backend="reference"), want)


def test_floats_out_of_range_nan_and_infinities_saturate_on_torch(case):
    pytest.importorskip("torch")
    planned, inputs, want = case
    check(planned.run(inputs, backend="torch"), want)


def test_floats_out_of_range_nan_and_infinities_saturate_on_iree(case, tmp_path: Path):
    planned, inputs, want = case
    check(iree_run(planned.lowered, inputs,
                   cache_dir=tmp_path).tensors, want)


@pytest.mark.skipif(not OPENMP, reason="needs the mlir extra (upstream MLIR 22 and libiomp5)")
def test_floats_out_of_range_nan_and_infinities_saturate_on_openmp(case):
    from apportion.backends.openmp.run import openmp_run

    planned, inputs, want = case
    check(openmp_run(planned.lowered, inputs, threads=2).tensors,
          want)
