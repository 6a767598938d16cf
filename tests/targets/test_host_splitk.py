"""Measuring the host's split-K table (apportion/targets/host_splitk.py): the timing rounds on a
fake clock, IREE's own unsplit matmul, the default shapes, and one tiny table measured for
real."""

from __future__ import annotations

import numpy as np
import pytest

from apportion.target import host
from apportion.target.presets import cpu
from apportion.target.split_k import ReductionShape, table_slices
from apportion.targets import host_splitk


class FakeClock:
    """A clock each call advances by its own cost, and the order the calls ran in."""

    def __init__(self) -> None:
        self.now = 0.0
        self.order: list[int] = []

    def __call__(self) -> float:
        return self.now

    def call(self, i: int, cost: float):
        def run() -> None:
            self.now += cost
            self.order.append(i)
        return run


def test_rounds_alternate_order_and_drop_factors_twice_as_slow_as_the_fastest():
    clock = FakeClock()
    costs = [1.0, 1.5, 2.5]
    calls = [clock.call(i, c) for i, c in enumerate(costs)]
    times = host_splitk.time_rounds(calls, warmup=1, repeats=6, budget_s=0.0, clock=clock)
    assert [len(t) for t in times] == [6, 6, host_splitk.FIRST_ROUNDS]
    assert [min(t) for t in times] == costs
    timed = clock.order[len(costs):]  # after one warm-up call each
    assert timed[:6] == [0, 1, 2, 2, 1, 0]  # every other round in reverse


def test_a_slow_first_call_drops_nothing():
    clock = FakeClock()
    costs = iter([20.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # a cold first call, then warm ones
    calls = [lambda: setattr(clock, "now", clock.now + next(costs)), clock.call(1, 1.1)]
    times = host_splitk.time_rounds(calls, warmup=1, repeats=4, budget_s=0.0, clock=clock)
    assert [len(t) for t in times] == [4, 4] and min(times[0]) == 1.0


def test_short_calls_get_more_rounds_within_the_budget():
    clock = FakeClock()
    times = host_splitk.time_rounds([clock.call(0, 0.01)], warmup=0, repeats=3, budget_s=1.0,
                                    clock=clock)
    assert len(times[0]) == 100  # 100 rounds of 0.01 s fill the 1 s budget


def test_the_default_shapes_are_the_models_skinny_shapes_scaled_like_the_bench():
    assert host_splitk.default_shapes() == [(32, 32, 40960), (128, 128, 32768),
                                            (128, 256, 16384), (1, 4096, 14336),
                                            (1, 6144, 4096)]


def test_factors_need_whole_slices_of_at_least_the_least_slice():
    assert host_splitk.factors_of(64) == [1, 2, 4]
    assert host_splitk.factors_of(48) == [1, 2]


def test_the_factor_target_is_the_stock_cpu_on_this_machines_cores():
    target = host_splitk.factor_target()
    assert target.cores == cpu(split_k_table=host_splitk.CPU_SPLIT_K).cores
    assert target.split_k_table == host_splitk.CPU_SPLIT_K  # no host table to make this one


def test_the_fingerprint_follows_the_emitted_code():
    one = host_splitk.fingerprint([(1, 64, 2048)])
    assert one == host_splitk.fingerprint([(1, 64, 2048)])
    assert one != host_splitk.fingerprint([(1, 64, 4096)])


def test_irees_own_unsplit_matmul_matches_the_unplanned_program():
    p = host_splitk.prepare_unsplit_iree(4, 32, 256)
    assert p.factor == 0 and p.max_abs_err < 1e-3
    p.once()


def test_a_split_factor_is_planned_checked_and_timed_on_the_stock_target():
    ops = host_splitk.operands(2, 64, 1024)
    p = host_splitk.prepare(2, 64, 1024, 4, ops)
    assert p.factor == 4 and p.max_abs_err < 1e-3
    p.once()
    assert np.isfinite(p.max_abs_err)


@pytest.mark.slow
def test_a_tiny_host_table_is_measured_for_real_cached_and_read_by_the_cpu_target(
        monkeypatch, tmp_path):
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "host")
    shapes = [(1, 64, 2048), (16, 16, 1024)]

    def tiny(key: host.HostKey) -> list[host.ShapeTimes]:
        return host_splitk.measure(shapes, factors=(1, 2, 4), warmup=1, repeats=3)

    with host.injected(tiny, tmp_path):
        table = host.host_table()
        assert table is not None and [(s.m, s.n, s.k) for s in table.shapes] == shapes
        assert all(sorted(dict(s.seconds)) == [1, 2, 4] for s in table.shapes)
        assert (tmp_path / f"{host.host_key().digest}.json").exists()
        target = cpu()
        picked = table_slices(target.split_k_table, ReductionShape(1, 1, 64, 2048))
        assert picked == table.shapes[0].factor
