"""The Spyre preset against kernels measured on the device (fp16, 32 cores): balanced picks the
measured-best split and predicts its time within 30%."""

from __future__ import annotations

import pytest

import apportion as ap
from tests.helpers import program

# M x K x N, the fastest measured split (m, n, k) and its kernel time in microseconds
MEASURED = [((512, 4096, 4096), {"m": 8, "n": 4, "k": 1}, 326.0),
            ((512, 4096, 1024), {"m": 8, "n": 4, "k": 1}, 114.0),
            ((512, 4096, 12800), {"m": 8, "n": 4, "k": 1}, 1453.0)]


def matmul(m: int, k: int, n: int) -> ap.Program:
    return program({"x": ([m, k], "float16"), "w": ([k, n], "float16")},
                   [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
                   ["y"])


@pytest.mark.parametrize(("shape", "best", "time_us"), MEASURED,
                         ids=["x".join(map(str, s)) for s, _, _ in MEASURED])
def test_balanced_picks_the_measured_best_split_and_predicts_it_within_30_percent(
        shape, best, time_us):
    op = ap.plan(matmul(*shape), ap.targets.spyre(cores=32)).op("mm")
    assert op.split_map == best
    assert abs(op.predicted_time_us / time_us - 1) <= 0.30


def test_the_measured_runner_up_is_predicted_slower():
    # m 4, n 8 measured 6% slower than m 8, n 4 on 512x4096x4096
    pinned = matmul(512, 4096, 4096)
    from dataclasses import replace

    runner_up = ap.plan(replace(pinned, work_division=(("mm", (("m", 4), ("n", 8))),)))
    best = ap.plan(pinned)
    assert runner_up.op("mm").predicted_time_us > best.op("mm").predicted_time_us
