"""float32 sin and cos cases shared by the iree, openmp and cuda tests: the program, angles
over the whole float32 range (the hardest to reduce among them) and the check that a result is
the float64 sine rounded once to float32."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import apportion as ap
from apportion.ir.program import Program
from tests.helpers import program

SHAPE = [8, 256]
N = SHAPE[0] * SHAPE[1]
#: the output of each function, by name
FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"sin_x": np.sin, "cos_x": np.cos}

#: for each of these float32 values (hex), |sin| or |cos| is the smallest of its binade's
#: (found by a search of every float32 mantissa from 1 to 2**128): 1.6e-9 at 7.7e28
HARDEST = ["0x1.f37c8ap+95", "0x1.47d0fep+34", "0x1.f37c8ap+96", "0x1.47d0fep+35",
           "0x1.f9cbe2p+7", "0x1.f37c8ap+97", "0x1.32ede2p+85", "0x1.628d4cp+40",
           "0x1.130930p+76", "0x1.47d0fep+36", "0x1.f9cbe2p+8", "0x1.b08c4ap+111"]


def trig_program() -> Program:
    """``sin_x`` and ``cos_x`` of a float32 ``x`` of SHAPE."""
    ops = [{"name": f"k_{k}", "op": k, "out": f"{k}_x[i,j]", "ins": ["x[i,j]"]}
           for k in ("sin", "cos")]
    return program({"x": (SHAPE, "float32")}, ops, list(FUNCTIONS), name="trig")


def plan_trig(target: ap.Target) -> ap.PlannedProgram:
    return ap.plan(trig_program(), target)


def rotary_angles(seed: int = 0) -> np.ndarray:
    """Rotary angles: positions up to 1e5 times frequencies near 1, and random values of both
    signs in [1e3, 1e5]; float32 of SHAPE."""
    rng = np.random.default_rng(seed)
    positions = np.arange(N // 2) * (100000.0 / (N // 2))
    spread = rng.uniform(1e3, 1e5, N // 2) * np.where(rng.random(N // 2) < 0.5, -1.0, 1.0)
    return np.concatenate([positions, spread]).astype(np.float32).reshape(SHAPE)


def whole_range(seed: int = 1) -> np.ndarray:
    """The hardest angles, both sides of 2**20 (where the reduction switches to Payne-Hanek),
    the largest float32, multiples of pi/2, and random magnitudes from 1 to 3e38, of both
    signs; float32 of SHAPE."""
    rng = np.random.default_rng(seed)
    hardest = np.array([float.fromhex(h) for h in HARDEST])
    big = np.float32(2.0 ** 20)
    edges = np.array([big, np.nextafter(big, np.float32(0)), np.nextafter(big, np.float32(np.inf)),
                      np.finfo(np.float32).max, np.finfo(np.float32).tiny, 1e-30, 0.5,
                      np.pi / 2, np.pi, 3 * np.pi / 2, 16777216.0, 1e15, 3e15])
    x = np.concatenate([hardest, edges, 10.0 ** rng.uniform(0, 38.5, N)])[:N]
    return (x * np.where(np.arange(N) % 2 == 0, 1.0, -1.0)).astype(np.float32).reshape(SHAPE)


def worst_float32_ulps(got: np.ndarray, x: np.ndarray,
                       fn: Callable[[np.ndarray], np.ndarray]) -> tuple[float, float]:
    """The largest |got - fn(x)| in float32 ulps of the float64 result (numpy's float64 sin and
    cos reduce exactly at any size), and the x where it is."""
    want = fn(x.astype(np.float64)).ravel()
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    err = np.abs(got.astype(np.float64).ravel() - want) / spacing
    worst = int(np.argmax(err))
    return float(err[worst]), float(x.ravel()[worst])


#: rounded once from f64 (a tie within 2**-20 ulp could round either way)
ROUNDED_ONCE = 0.5 + 2.0 ** -20
