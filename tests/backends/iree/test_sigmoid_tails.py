"""sigmoid, silu and gelu in both tails: the registry writes sigmoid as 1 / (1 + e) or
e / (1 + e) with e = exp(-|x|), and gelu's tanh form as x * sigmoid(2u), so nothing cancels
where 0.5 * (1 + tanh(.)) did (sigmoid(-17) was 0 in float32, gelu(-5) too, silu(-12) 0.9%
off). The reference is checked against scipy's ``expit``; the emitted bodies, compiled by IREE
and by upstream MLIR for OpenMP, against the reference within a few float32 ulps relatively,
from -100 to 100 (results below float32's smallest normal number within that number: IREE's
CPU code flushes subnormals to zero); zeros, infinities and NaN as the reference gives them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.special

import apportion as ap
from apportion.backends.iree.run import iree_run
from apportion.ir.kinds import kind
from apportion.mlir import upstream
from apportion.runtime.kernels import pointwise
from apportion.runtime.reference import run_unplanned
from tests.helpers import program

SHAPE = [8, 256]
N = SHAPE[0] * SHAPE[1]
KINDS = ("sigmoid", "silu", "gelu")
#: float32 ulps of the reference a compiled result may be off
ULPS = 4
OPENMP = upstream.available() and upstream.openmp_library() is not None


@pytest.fixture(scope="module")
def planned() -> ap.PlannedProgram:
    ops = [{"name": f"k_{k}", "op": k, "out": f"{k}_x[i,j]", "ins": ["x[i,j]"]} for k in KINDS]
    return ap.plan(program({"x": (SHAPE, "float32")}, ops, [f"{k}_x" for k in KINDS],
                           name="tails"), ap.targets.spyre(cores=4))


def tails() -> np.ndarray:
    """-100 to -5 and 5 to 100 densely, and -5 to 5; float32 of SHAPE."""
    x = np.concatenate([np.linspace(-100.0, -5.0, N // 2), np.linspace(5.0, 100.0, N // 4),
                        np.random.default_rng(0).uniform(-5.0, 5.0, N - N // 2 - N // 4)])
    return x.astype(np.float32).reshape(SHAPE)


def specials() -> np.ndarray:
    return np.resize(np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32),
                     N).reshape(SHAPE)


def ulps(got: np.ndarray, want: np.ndarray, dtype: type[np.floating] = np.float32
         ) -> np.ndarray:
    """|got - want| in ulps of ``want`` in ``dtype``; where ``want`` is below the smallest
    normal number, in units of that number (a flushed subnormal is within 1)."""
    tiny = np.finfo(dtype).tiny
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: equal
        diff = np.where(got == want, 0.0, np.abs(got.astype(np.float64) - want))
    normal = np.abs(want) >= tiny
    return np.where(normal, diff / np.spacing(np.abs(want).astype(dtype)), diff / tiny)


def check_tails(got: dict[str, np.ndarray], x: np.ndarray, planned: ap.PlannedProgram) -> None:
    want = run_unplanned(planned.program, {"x": x})
    for k in KINDS:
        name = f"{k}_x"
        err = ulps(got[name], want[name])
        worst = int(np.argmax(err))
        assert err.max() <= ULPS, (k, x.ravel()[worst], got[name].ravel()[worst],
                                   want[name].ravel()[worst], err.ravel()[worst])


def check_specials(got: dict[str, np.ndarray], planned: ap.PlannedProgram) -> None:
    x = specials()
    with np.errstate(invalid="ignore"):
        want = run_unplanned(planned.program, {"x": x})
    for k in KINDS:
        np.testing.assert_array_equal(got[f"{k}_x"], want[f"{k}_x"], err_msg=k)


def test_the_reference_sigmoid_silu_and_gelu_are_accurate_in_both_tails():
    # float64 from -700 to 700 (exp(-700) is still normal), against scipy's expit
    x = np.linspace(-700.0, 700.0, 20001)
    want_sig = scipy.special.expit(x)
    c = 2.0 * np.sqrt(2.0 / np.pi)
    u2 = c * (x + 0.044715 * x * x * x)  # rounded as the registry's: exp magnifies it 2u times
    want = {"sigmoid": want_sig, "silu": x * want_sig, "gelu": x * scipy.special.expit(u2)}
    for name, w in want.items():
        err = ulps(pointwise(kind(name), x), w, np.float64)
        assert err.max() <= 4, (name, x[np.argmax(err)], err.max())
    # float32 results of the old tails: sigmoid(-17), silu(-12), gelu(-5)
    x32 = np.array([-17.0, -12.0, -5.0])
    assert pointwise(kind("sigmoid"), x32)[0] == pytest.approx(4.139937718785167e-08, rel=1e-12)
    assert pointwise(kind("silu"), x32)[1] == pytest.approx(-12 * scipy.special.expit(-12.0),
                                                           rel=1e-12)
    assert pointwise(kind("gelu"), x32)[2] == pytest.approx(-5 * scipy.special.expit(
        c * (-5.0 + 0.044715 * -125.0)), rel=1e-12)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("iree")


def test_sigmoid_silu_and_gelu_on_iree_match_the_reference_in_both_tails(planned, cache):
    x = tails()
    got = iree_run(planned.lowered, {"x": x},
                   cache_dir=cache).tensors
    check_tails(got, x, planned)
    check_specials(iree_run(planned.lowered, {"x": specials()},
                            cache_dir=cache).tensors, planned)


@pytest.mark.skipif(not OPENMP, reason="needs the mlir extra (upstream MLIR 22 and libiomp5)")
def test_sigmoid_silu_and_gelu_on_openmp_match_the_reference_in_both_tails(planned):
    from apportion.backends.openmp.run import openmp_run

    x = tails()
    got = openmp_run(planned.lowered, {"x": x}, threads=2).tensors
    check_tails(got, x, planned)
    check_specials(openmp_run(planned.lowered, {"x": specials()},
                              threads=2).tensors, planned)
