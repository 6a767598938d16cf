"""The tolerance of a run against a model run eagerly in PyTorch follows the least precise float
dtype of everything an output is computed from, at the scale of the output's values."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.frontend.json_format import loads
from apportion.ir.dtypes import FLOAT_EPS, least_precise
from apportion.runtime.reference import (
    EAGER_EPS,
    TOLERANCES,
    Tolerance,
    compare,
    eager_tolerance,
)


def chain(first: str, second: str, out: str):
    """y = neg(exp(x)): x of dtype ``first``, the exp's result ``second``, y ``out``; and
    z = exp(w) beside it, all float32."""
    return loads(json.dumps({
        "format": "apportion.program/1", "name": "chain",
        "tensors": {"x": {"shape": [4, 8], "dtype": first},
                    "a": {"shape": [4, 8], "dtype": second},
                    "y": {"shape": [4, 8], "dtype": out},
                    "w": {"shape": [4, 8], "dtype": "float32"},
                    "z": {"shape": [4, 8], "dtype": "float32"}},
        "inputs": ["x", "w"], "outputs": ["y", "z"],
        "ops": [{"name": "e", "op": "exp", "out": "a[i,j]", "ins": ["x[i,j]"]},
                {"name": "n", "op": "neg", "out": "y[i,j]", "ins": ["a[i,j]"]},
                {"name": "f", "op": "exp", "out": "z[i,j]", "ins": ["w[i,j]"]}]}))


def test_least_precise_is_the_float_with_the_largest_epsilon():
    assert least_precise(["float32", "float16"]) == "float16"
    assert least_precise(["float16", "bfloat16", "int8"]) == "bfloat16"
    assert least_precise(["int64", "bool"]) is None
    assert FLOAT_EPS["bfloat16"] > FLOAT_EPS["float16"] > FLOAT_EPS["float32"]


@pytest.mark.parametrize(("first", "second", "out", "narrow"), [
    ("bfloat16", "bfloat16", "bfloat16", "bfloat16"),
    ("float16", "float16", "float16", "float16"),
    ("bfloat16", "float32", "float32", "bfloat16"),  # bfloat16 weights into a float32 norm
    ("float32", "float16", "float32", "float16"),    # a float16 tensor on the way
    ("float16", "float32", "bfloat16", "bfloat16"),
])
def test_an_output_is_held_to_the_least_precise_float_it_is_computed_from(first, second, out,
                                                                         narrow):
    p = chain(first, second, out)
    expected = np.array([[0.25, -3.0, 1.0, 0.0] * 2] * 4)
    tol = eager_tolerance(p, "y", expected)
    eps = EAGER_EPS * FLOAT_EPS[narrow]
    assert tol == Tolerance(eps * 3.0, eps, f"{EAGER_EPS} {narrow} eps; atol at max |expected| 3")
    assert f"(4 {narrow} eps; atol at max |expected| 3)" in str(tol)


def test_a_float32_output_computed_from_float32_only_keeps_the_float32_tolerance():
    p = chain("bfloat16", "bfloat16", "bfloat16")
    assert eager_tolerance(p, "z", np.ones((4, 8))) == TOLERANCES["float32"]


def test_an_infinite_expected_value_does_not_widen_the_tolerance():
    p = chain("bfloat16", "bfloat16", "bfloat16")
    expected = np.full((4, 8), 2.0)
    expected[0, 0], expected[1, 1] = np.inf, np.nan
    tol = eager_tolerance(p, "y", expected)
    assert tol.atol == EAGER_EPS * FLOAT_EPS["bfloat16"] * 2.0


def test_compare_uses_a_given_tolerance_and_says_so():
    p = chain("bfloat16", "bfloat16", "bfloat16")
    y = np.full((4, 8), 1e-3)
    y[0, 0] = 100.0  # the output's scale: a value near zero carries errors of this size
    expected = {"y": y, "z": np.ones((4, 8))}

    def off(ulps):  # the value near zero off by ulps of bfloat16 at the scale of 100
        moved = y.copy()
        moved[1, 1] += ulps * 2**-7 * 100
        return {"y": moved, "z": np.ones((4, 8))}

    tols = {"y": eager_tolerance(p, "y", y)}
    assert not compare(expected, off(3), p)[0].ok  # planned against unplanned: 5e-2 + 5e-2
    first, second = compare(expected, off(3), p, tols)
    assert first.ok and first.tolerance is tols["y"]
    assert second.tolerance == TOLERANCES["float32"]
    assert not compare(expected, off(5), p, tols)[0].ok  # past 4 eps


@given(scale=st.floats(1e-3, 1e3), ulps=st.integers(0, 3))
def test_a_few_ulps_at_the_outputs_scale_pass_wherever_the_value_is(scale, ulps):
    p = chain("bfloat16", "bfloat16", "bfloat16")
    expected = np.linspace(-1.0, 1.0, 32).reshape(4, 8) * scale
    tol = eager_tolerance(p, "y", expected)
    # an error of a few eps of the largest value, even on the values near zero
    actual = expected + ulps * FLOAT_EPS["bfloat16"] * scale
    (check, _) = compare({"y": expected, "z": np.ones((4, 8))},
                         {"y": actual, "z": np.ones((4, 8))}, p, {"y": tol})
    assert check.ok
