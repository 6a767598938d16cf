"""float32 sin and cos in IREE: MLIR's own f32 expansion reduces by a float32 pi/2 and drifts
by 2.8e-8 * |x| (1.1e-4 at 4096), so the emitter computes them in f64 (``f64_math.
widen_f32_math``). Compiled and run in IREE they equal the reference within float32 rounding
at rotary-embedding angles in the thousands to 1e5, and are the float64 sine rounded to
float32 over the whole float32 range: the values closest to a multiple of pi/2 (hardest to
reduce), both sides of the switch to the Payne-Hanek path at 2**20, zeros, infinities, NaN."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import apportion as ap
from apportion.backends.iree.run import iree_run
from apportion.mlir.bodies import BODIES
from apportion.mlir.f64_math import widen_f32_math
from apportion.mlir.forall import forall_mlir
from apportion.planned import PlannedProgram
from apportion.runtime.reference import compare, run_unplanned
from apportion.schedule.lower import lower
from tests.backends.iree.trig import (
    FUNCTIONS,
    ROUNDED_ONCE,
    N,
    plan_trig,
    rotary_angles,
    whole_range,
    worst_float32_ulps,
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("iree")


@pytest.fixture(scope="module")
def trig() -> PlannedProgram:
    return plan_trig(ap.targets.spyre(cores=4))


def run(planned: PlannedProgram, x: np.ndarray, cache: Path) -> dict[str, np.ndarray]:
    return iree_run(planned.lowered, {"x": x},
                    cache_dir=cache).tensors


def test_float32_sin_and_cos_in_the_thousands_to_1e5_on_iree_match_the_reference(trig, cache):
    # the old expansion was 1.1e-4 off at 4096 and 2.7e-3 at 1e5
    x = rotary_angles()
    got = run(trig, x, cache)
    want = run_unplanned(trig.program, {"x": x})
    checks = compare(want, got, trig.program)
    assert all(c.ok for c in checks), [str(c) for c in checks]
    for name in FUNCTIONS:
        # float32 rounding on both sides: each is within an ulp of the true value, |v| <= 1
        assert np.abs(got[name] - want[name]).max() <= 2.0 ** -23, name


def test_float32_sin_and_cos_on_iree_are_correctly_rounded_over_the_whole_float32_range(
        trig, cache):
    x = whole_range()
    got = run(trig, x, cache)
    for name, fn in FUNCTIONS.items():
        err, at = worst_float32_ulps(got[name], x, fn)
        assert err <= ROUNDED_ONCE, (name, at, err)


def test_float32_sin_and_cos_on_iree_give_numpy_s_zeros_nan_and_infinities(trig, cache):
    x = np.resize(np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32), N)
    x = x.reshape(trig.program.tensor("x").shape)
    got = run(trig, x, cache)
    with np.errstate(invalid="ignore"):
        for name, fn in FUNCTIONS.items():
            want = fn(x)
            np.testing.assert_array_equal(got[name], want)
            assert (np.signbit(got[name]) == np.signbit(want))[np.isfinite(want)].all(), name


def test_float32_sin_and_cos_are_emitted_through_f64_and_nothing_else_is(trig):
    text = forall_mlir(lower(trig.program, trig.plan, trig.target))
    assert "math.sin" not in text and "math.cos" not in text
    assert "arith.extf" in text and "arith.truncf" in text
    for kind in ("sin", "cos"):
        widened = widen_f32_math(BODIES[kind].float)
        assert widened.splitlines()[-1].startswith("{r} = arith.truncf")
    assert widen_f32_math(BODIES["tanh"].float) == BODIES["tanh"].float
