"""Measuring the host's split-K table (apportion/workflows/host_splitk.py): the timing rounds on a
fake clock, IREE's own unsplit matmul, the default shapes, and one tiny table measured for
real."""

from __future__ import annotations

import numpy as np
import pytest

from apportion.cost.noise import Rules
from apportion.target import host
from apportion.target.presets import cpu
from apportion.target.split_k import ReductionShape, table_slices
from apportion.workflows import host_splitk


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


def _rules(least: int, most: int, drop_after: int | None = None) -> Rules:
    return Rules(min_rounds=least, max_rounds=most, drop_after=drop_after)


def test_rounds_alternate_order_and_drop_factors_twice_as_slow_as_the_fastest():
    clock = FakeClock()
    costs = [1.0, 1.5, 2.5]
    calls = [clock.call(i, c) for i, c in enumerate(costs)]
    m = host_splitk.time_shape(calls, [1, 2, 4], warmup=1, rules=_rules(6, 6, drop_after=2),
                               clock=clock, load=lambda: 0.0)
    timed = [[v for v in col if not np.isnan(v)] for col in m.seconds]
    assert [len(t) for t in timed] == [6, 6, 2]  # factor 4 stops after the first two rounds
    assert list(m.least) == costs
    assert clock.order[len(costs):][:6] == [0, 1, 2, 2, 1, 0]  # every other round in reverse


def test_a_slow_first_call_drops_nothing():
    clock = FakeClock()
    costs = iter([20.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # a cold first call, then warm ones
    calls = [lambda: setattr(clock, "now", clock.now + next(costs)), clock.call(1, 1.1)]
    m = host_splitk.time_shape(calls, [1, 2], warmup=1, rules=_rules(4, 4, drop_after=2),
                               clock=clock, load=lambda: 0.0)
    assert m.rounds == 4 and not np.isnan(m.array).any() and m.least[0] == 1.0


def _noisy(clock: FakeClock, i: int, floor: float, jitter: float, seed: int):
    """A call taking ``floor`` plus up to ``jitter`` seconds, drawn from a seeded generator:
    noise that is the same on every run of the test."""
    rng = np.random.default_rng(seed)

    def run() -> None:
        clock.now += floor + jitter * float(rng.random())
        clock.order.append(i)
    return run


def test_a_quiet_shape_stops_as_soon_as_its_choice_is_stable():
    clock = FakeClock()
    calls = [_noisy(clock, 0, 1.0, 0.01, 1), _noisy(clock, 1, 0.5, 0.01, 2),
             _noisy(clock, 2, 0.9, 0.01, 3)]
    m = host_splitk.time_shape(calls, [1, 2, 4], warmup=0, rules=_rules(5, 100), clock=clock,
                               load=lambda: 0.0)
    assert m.stable and m.trusted and m.rounds == 5
    assert host_splitk.choice_key([1, 2, 4])(np.array(m.least)) == 2


def test_a_noisy_shape_is_timed_up_to_the_cap_and_reported_untrusted():
    # two factors 10% apart (the regret the table allows) under noise as wide as their times:
    # the rounds up to the cap do not tell whether the faster one is within it
    clock = FakeClock()
    calls = [_noisy(clock, 0, 1.0, 1.0, 3), _noisy(clock, 1, 0.9, 1.0, 4)]
    m = host_splitk.time_shape(calls, [1, 2], warmup=0, rules=_rules(5, 12), clock=clock,
                               load=lambda: 0.0)
    assert m.rounds == 12 and not m.stable and not m.trusted
    assert m.why.startswith("not stable after 12 rounds: factor ")
    assert "holds the bound 1.1" in m.untrusted_why


def test_a_shape_timed_under_a_load_over_the_cores_is_not_trusted():
    clock = FakeClock()
    calls = [clock.call(0, 1.0), clock.call(1, 0.5)]
    m = host_splitk.time_shape(calls, [1, 2], warmup=0, rules=_rules(5, 5), clock=clock,
                               load=lambda: 1e6)
    assert m.stable and not m.trusted
    assert m.untrusted_why.startswith("the load average 1000000.00 was over the machine's")


def test_one_untrusted_shape_makes_the_whole_measurement_untrusted():
    clock = FakeClock()
    quiet = host_splitk.time_shape([clock.call(0, 1.0), clock.call(1, 0.5)], [1, 2], warmup=0,
                                   rules=_rules(5, 5), clock=clock, load=lambda: 0.5)
    loaded = host_splitk.time_shape([clock.call(0, 1.0), clock.call(1, 0.5)], [1, 2],
                                    warmup=0, rules=_rules(5, 5), clock=clock, load=lambda: 1e6)
    shapes = [host.ShapeTimes(1, 64, 4096, ((1, 1.0), (2, 0.5))),
              host.ShapeTimes(1, 64, 8192, ((1, 1.0), (2, 0.5)))]
    assert host_splitk.trust(shapes, [quiet, quiet]).trusted
    answer = host_splitk.trust(shapes, [quiet, loaded])
    assert not answer.trusted and answer.why.startswith(
        "1 of 2 shapes could not be trusted (1x64x8192: the load average")
    assert answer.load == (0.5, 1e6)


def test_nothing_is_measured_where_the_load_is_already_over_the_cores(monkeypatch):
    def refuse() -> list:
        raise AssertionError("measured on a loaded machine")

    monkeypatch.setattr(host_splitk, "default_shapes", refuse)
    key = host.HostKey("cpu", 2, "3.13.0")
    answer = host_splitk.measure_host(key, load=lambda: 3.5)
    assert not answer.trusted and answer.shapes == ()
    assert answer.why == "the load average 3.50 is over this machine's 2 cores, so nothing " \
                         "was measured"


def test_a_shape_measured_records_its_rounds_and_the_spread_of_its_choice():
    clock = FakeClock()
    calls = [_noisy(clock, 0, 1.0, 0.02, 1), _noisy(clock, 1, 0.5, 0.02, 2)]
    m = host_splitk.time_shape(calls, [1, 2], warmup=0, rules=_rules(6, 6), clock=clock,
                               load=lambda: 0.0)
    timed = [host_splitk.Timed(1, 64, 4096, f, 0.0, True, 0.0, tuple(col))
             for f, col in zip([1, 2], m.seconds, strict=True)]
    s = host_splitk.shape_times(timed, m)
    assert (s.rounds, s.factor) == (6, 2) and 0 < s.spread < 0.1


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

    def tiny(key: host.HostKey) -> host.HostMeasurement:
        answer = host_splitk.measure(shapes, factors=(1, 2, 4), warmup=1, repeats=3)
        return host.HostMeasurement(answer.shapes)  # trusted: this test is not about noise

    with host.injected(tiny, tmp_path):
        table = host.host_table()
        assert table is not None and [(s.m, s.n, s.k) for s in table.shapes] == shapes
        assert all(sorted(dict(s.seconds)) == [1, 2, 4] for s in table.shapes)
        assert (tmp_path / f"{host.host_key().digest}.json").exists()
        target = cpu()
        picked = table_slices(target.split_k_table, ReductionShape(1, 1, 64, 2048))
        assert picked == table.shapes[0].factor
