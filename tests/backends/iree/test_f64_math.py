"""f64 tanh, sin, cos, erf and pow in IREE: its executables link no libm, so where an op computes
in f64 (integer inputs of kinds that are not exact in integers) the emitter expands them into
f64 arithmetic (``f64_math.expand_f64_math``). The expansions are compiled in IREE and compared
with numpy float64 (scipy's erf, as the reference executor) on edge values, within a few ulps;
integer tensors, which compute through f64 and truncate, equal the reference run exactly."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import apportion as ap
from apportion.backends.iree import runtime as iree
from apportion.backends.iree.run import iree_run
from apportion.ir.kinds import KINDS, Category
from apportion.mlir.bodies import BODIES
from apportion.mlir.f64_math import F64_MATH, expand_f64_math
from apportion.planned import PlannedProgram
from apportion.runtime.kernels import XP
from apportion.runtime.reference import run_unplanned
from tests.helpers import program

SHAPE = [8, 128]
N = SHAPE[0] * SHAPE[1]
UNARY = ["tanh", "sin", "cos", "erf"]
NUMPY = {"tanh": np.tanh, "sin": np.sin, "cos": np.cos, "erf": XP.erf}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("iree")


def f64_module(op: str) -> str:
    """A module whose ``f`` applies ``op``'s f64 expansion to each of N float64 values."""
    body = F64_MATH[op].format(r="%r", a="%a", b="%a", p="e-", t="f64")
    lines = "\n".join(f"      {line}" for line in body.splitlines())
    return f"""#map = affine_map<(d0) -> (d0)>
module {{
  func.func @f(%x: tensor<{N}xf64>) -> tensor<{N}xf64> {{
    %init = tensor.empty() : tensor<{N}xf64>
    %y = linalg.generic {{indexing_maps = [#map, #map], iterator_types = ["parallel"]}}
        ins(%x : tensor<{N}xf64>) outs(%init : tensor<{N}xf64>) {{
    ^bb0(%a: f64, %o: f64):
{lines}
      linalg.yield %r : f64
    }} -> tensor<{N}xf64>
    return %y : tensor<{N}xf64>
  }}
}}
"""


def run_f64(op: str, x: np.ndarray, cache: Path) -> np.ndarray:
    compiled = iree.compile_mlir(f64_module(op), cache, lower=False)
    return iree.run_vmfb(compiled.vmfb, "f", [(x, "f64")], ["f64"]).outputs[0]


def planned_kinds(dtype: str, kinds: list[str], name: str) -> PlannedProgram:
    """One op per kind over ``x`` (a binary kind: ``x`` and ``y``), split over 4 cores."""
    ops = [{"name": f"k_{k.name}", "op": k.name, "out": f"o_{k.name}[i,j]",
            "ins": ["x[i,j]", "y[i,j]"][:k.arity]} for k in KINDS if k.name in kinds]
    tensors = {"x": (SHAPE, dtype), "y": (SHAPE, dtype)}
    return ap.plan(program(tensors, ops, [f"o_{k}" for k in kinds], name=name),
                   ap.targets.spyre(cores=4))


def edge_values(rng: np.random.Generator) -> np.ndarray:
    """0, -0, tiny values (not subnormal: IREE's CPU code flushes those to 0), tanh's and
    erf's branch points, where tanh and erf round to 1, multiples of pi/2 up to 1e5, and
    random values of every magnitude up to 1e5, of both signs."""
    fixed = [0.0, -0.0, 1e-300, 1e-20, 1e-8, 1e-5, 0.1, 0.46875, 0.5,
             0.99999999, 1.0, 1.0000001, 2.0, 4.0, 4.0000001, 5.9, 6.0, 18.0, 19.0, 19.1,
             20.0, 22.0, 26.5, 27.0, 30.0, 300.0, 400.0, 709.0, 800.0, 1e5]
    multiples = [k * math.pi / 2 for k in (1, 2, 3, 4, 5, 7, 100, 1001, 12345, 63661)]
    near = [np.nextafter(v, np.inf) for v in multiples] + [np.nextafter(v, 0.0)
                                                          for v in multiples]
    mags = 10.0 ** rng.uniform(-12, 5, N)
    values = np.concatenate([fixed, multiples, near, mags])
    signs = np.where(np.arange(len(values)) % 2 == 0, 1.0, -1.0)
    both = np.concatenate([values, -values[: len(fixed)]])
    both[: len(values)] *= np.where(np.arange(len(values)) < len(fixed), 1.0, signs)
    return both[:N]


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units in the last place of ``want`` (of the smallest normal near 0)."""
    spacing = np.spacing(np.maximum(np.abs(want), np.finfo(np.float64).tiny))
    return np.abs(got - want) / spacing


@pytest.mark.parametrize("op", UNARY)
def test_f64_expansion_in_iree_is_within_a_few_ulps_of_numpy(op, cache):
    x = edge_values(np.random.default_rng(0))
    got = run_f64(op, x, cache)
    want = NUMPY[op](x)
    err = ulps(got, want)
    worst = int(np.argmax(err))
    assert err.max() <= 4, (x[worst], got[worst], want[worst], err[worst])


@pytest.mark.parametrize("op", UNARY)
def test_f64_expansion_in_iree_gives_numpy_s_nan_and_infinities(op, cache):
    x = np.resize(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]), N)
    with np.errstate(invalid="ignore"):
        want = NUMPY[op](x)
    np.testing.assert_array_equal(run_f64(op, x, cache), want)


def test_f64_pow_of_whole_exponents_in_iree_is_exact_where_numpy_s_is(cache):
    x = np.resize(np.arange(-12.0, 13.0), N)  # x ** x: whole powers of both signs, 0 ** 0
    np.testing.assert_array_equal(run_f64("powf", x, cache), np.power(x, x))


#: kinds taking integers that compute them through f64 and use one of the expanded ops
F64_KINDS = sorted(k.name for k in KINDS if k.category is Category.POINTWISE
                   and "int64" in k.accepts and not k.exact_integers
                   and expand_f64_math(BODIES[k.name].float) != BODIES[k.name].float)


def libm_tanh(x: np.ndarray) -> np.ndarray:
    """tanh by the C library, element by element."""
    return np.vectorize(math.tanh, otypes=[np.float64])(x)


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except (ValueError, OverflowError):  # where numpy gives NaN or inf instead of raising
        return float(np.power(a, b))


def libm_power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """pow by the C library, element by element."""
    return np.vectorize(_pow, otypes=[np.float64])(a, b)


def _exact_pow(a: float, b: float) -> float:
    if a == int(a) and b == int(b) and (b >= 0 or a != 0):
        try:
            return float(Fraction(int(a)) ** int(b))  # the exact power rounded once
        except OverflowError:
            pass
    return float(np.power(a, b))


def exact_power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """pow of whole numbers correctly rounded (ties to even), element by element: neither
    numpy's nor glibc's pow rounds every exact tie to even (63 ** 9, 54 bits, gives
    ...822 there where the nearest even double is ...824; the expansion's double-double
    gives ...824)."""
    return np.vectorize(_exact_pow, otypes=[np.float64])(a, b)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_kinds_through_f64_in_iree_equal_the_reference_exactly(dtype, cache,
                                                                       monkeypatch):
    # tanh rounds to 1.0 from 20 (19 stays below 1): truncation shows any ulp off; whole
    # powers are exact (2 ** 3 is 8, not exp(3 log 2) = 7.999...)
    assert {"tanh", "pow"} <= set(F64_KINDS)
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    x = np.resize(np.concatenate([np.arange(-40, 41), rng.integers(-127, 128, 200),
                                  [info.min, info.max]]), N)
    y = np.resize(np.arange(-3, 12), N)
    planned = planned_kinds(dtype, F64_KINDS, f"int_math_{dtype}")
    inputs = {"x": x.astype(dtype).reshape(SHAPE), "y": y.astype(dtype).reshape(SHAPE)}
    got = iree_run(planned.lowered, inputs,
                   cache_dir=cache).tensors
    with np.errstate(all="ignore"):
        want = run_unplanned(planned.program, inputs)
        # numpy's SIMD tanh and power (AVX-512 builds) are an ulp off in places where the C
        # library's and the expansions round correctly (tanh at 19, so tanh(19) truncates to
        # 1 there and to 0 here; 101.0 ** 9), and both miss some exact ties of whole powers
        # past 2**53 (101 ** 8, 63 ** 9) that the expansion rounds to even: where the
        # references differ, any one is right
        monkeypatch.setattr(XP, "tanh", libm_tanh, raising=False)
        monkeypatch.setattr(XP, "power", libm_power, raising=False)
        libm = run_unplanned(planned.program, inputs)
        monkeypatch.setattr(XP, "power", exact_power, raising=False)
        exact = run_unplanned(planned.program, inputs)
    for k in F64_KINDS:
        a, b, c, d = got[f"o_{k}"], want[f"o_{k}"], libm[f"o_{k}"], exact[f"o_{k}"]
        bad = (a != b) & (a != c) & (a != d)
        assert not bad.any(), (k, inputs["x"][bad][:5], a[bad][:5], b[bad][:5])


def test_only_the_math_ops_are_rewritten_and_each_result_keeps_its_name():
    pow_f64 = expand_f64_math(BODIES["pow"].float)
    assert "%{p}m = " in pow_f64 and pow_f64.splitlines()[-1].startswith("{r} = ")
    for k in UNARY:
        text = expand_f64_math(BODIES[k].float)
        assert f"math.{k}" not in text and text.splitlines()[-1].startswith("{r} = ")
    mixed = "\n".join(["%{p}h = arith.constant 0.5 : {t}", "%{p}th = math.tanh %{p}h : {t}",
                        "{r} = arith.mulf %{p}th, %{p}h : {t}"])
    text = expand_f64_math(mixed)
    assert "math.tanh" not in text and "%{p}th = " in text and text.startswith("%{p}h = ")
    assert expand_f64_math(BODIES["exp"].float) == BODIES["exp"].float
