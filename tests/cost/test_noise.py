"""Measurements that know their noise (apportion/cost/noise.py): rounds until the criteria and
the decision settle, the cap, the intervals and verdicts, the load. Every case is a fake that
returns made-up seconds (drawn from seeded generators where noisy): nothing here is timed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from apportion.cost import noise
from apportion.cost.noise import Criterion, Load, Rules, until_stable, verdict


def steady(*seconds: float):
    """Cases that always take the same seconds."""
    return [lambda s=s: s for s in seconds]


def noisy(floor: float, jitter: float, seed: int):
    """A case taking ``floor`` plus up to ``jitter`` seconds, the same draws on every run."""
    rng = np.random.default_rng(seed)
    return lambda: floor + jitter * float(rng.random())


def ratio(bound: float, at_most: bool = True) -> Criterion:
    return Criterion("b / a", lambda t: t[..., 1] / t[..., 0], bound, at_most)


def quiet() -> float:
    return 0.25


def test_steady_cases_stop_at_the_least_rounds_once_the_decision_has_settled():
    m = until_stable(steady(1.0, 1.5), lambda _: [ratio(2.0)], Rules(min_rounds=3, max_rounds=50),
                     load=quiet, cores=2)
    assert m.stable and m.rounds == 3 and m.trusted and m.why == ""
    (v,) = m.verdicts
    assert (v.state, v.value, v.low, v.high, v.spread) == ("met", 1.5, 1.5, 1.5, 0.0)


def test_without_criteria_a_measurement_is_the_rounds_asked_for():
    m = until_stable(steady(1.0), None, Rules(min_rounds=41, max_rounds=41), load=quiet,
                     cores=2)
    assert m.stable and m.rounds == 41 and m.verdicts == ()


def test_a_decision_that_keeps_changing_is_timed_to_the_cap_and_reported_unstable():
    # each case in turn reaches a new least time: which one is faster changes every round
    a, b = iter([1.0, 0.8, 0.8, 0.6, 0.6, 0.4, 0.4, 0.2]), iter([0.9, 0.9, 0.7, 0.7, 0.5, 0.5,
                                                                0.3, 0.3])
    calls = [lambda: next(a), lambda: next(b)]
    m = until_stable(calls, None, Rules(min_rounds=3, max_rounds=8),
                     key=lambda t: int(np.argmin(t)), load=quiet, cores=2)
    assert not m.stable and m.rounds == 3 + 5 and not m.trusted
    assert m.why == "not stable after 8 rounds: the decision changed within the last 3 rounds"


def one_quiet_round(quiet_s: float, loaded_s: float):
    """A case whose first round is quiet and every later one loaded: whether a resample holds
    the quiet round decides its least time, so more rounds never settle it."""
    times = itertools.chain([quiet_s], itertools.repeat(loaded_s))
    return lambda: next(times)


def test_a_figure_whose_interval_holds_the_bound_is_inconclusive_up_to_the_cap():
    m = until_stable([lambda: 1.0, one_quiet_round(1.9, 2.2)], lambda _: [ratio(2.0)],
                     Rules(min_rounds=5, max_rounds=20), load=quiet, cores=2)
    assert not m.stable and m.rounds == 20
    (v,) = m.verdicts
    assert (v.state, v.value, v.low, v.high) == ("inconclusive", 1.9, 1.9, 2.2)
    assert m.why == "not stable after 20 rounds: b / a: 1.9, but its interval 1.9 to 2.2 " \
                    "holds the bound 2"


def test_noise_that_cannot_move_the_verdict_settles_early():
    m = until_stable([noisy(1.0, 0.2, 1), noisy(3.0, 0.2, 2)], lambda _: [ratio(2.0)],
                     Rules(min_rounds=5, max_rounds=50), load=quiet, cores=2)
    assert m.stable and m.rounds == 5 and m.verdicts[0].state == "missed"


def test_one_or_two_rounds_judge_nothing():
    m = until_stable(steady(1.0, 1.5), lambda _: [ratio(2.0)], Rules(min_rounds=1, max_rounds=2),
                     load=quiet, cores=2)
    assert not m.stable and m.verdicts[0].state == "inconclusive"
    assert "only 2 rounds, too few to judge" in m.why


def test_rounds_alternate_their_order_and_drop_cases_far_slower_than_the_fastest():
    order: list[int] = []

    def case(i: int, s: float):
        def run() -> float:
            order.append(i)
            return s
        return run

    m = until_stable([case(0, 1.0), case(1, 1.5), case(2, 3.0)], None,
                     Rules(min_rounds=4, max_rounds=4, drop_after=2), load=quiet, cores=2)
    assert order == [0, 1, 2, 2, 1, 0, 0, 1, 1, 0]
    assert np.isnan(m.array[2:, 2]).all() and m.least == (1.0, 1.5, 3.0)


def test_a_budget_of_timed_seconds_caps_the_rounds_after_the_least():
    m = until_stable([lambda: 1.0, one_quiet_round(1.9, 2.2)], lambda _: [ratio(2.0)],
                     Rules(min_rounds=5, max_rounds=1000, budget_s=30.0), load=quiet, cores=2)
    assert not m.stable and m.rounds == 10  # 3.2 s a round: 32 s timed after 10


def test_precision_asks_every_live_case_known_within_it():
    calls = [noisy(1.0, 0.5, 1), noisy(2.0, 0.001, 2)]
    m = until_stable(calls, None, Rules(min_rounds=5, max_rounds=6, precision=0.01),
                     names=("wide", "narrow"), load=quiet, cores=2)
    assert not m.stable and "wide's least time is known within" in m.why
    assert m.spread[1] < 0.01 < m.spread[0]


def test_a_wall_clock_measurement_under_a_load_over_the_cores_decides_nothing():
    m = until_stable(steady(1.0, 1.5), lambda _: [ratio(2.0)], Rules(min_rounds=3),
                     load=lambda: 3.5, cores=2)
    assert m.stable and not m.trusted and m.load == Load(3.5, 3.5, 2)
    assert m.verdicts[0].state == "inconclusive"
    assert m.untrusted_why == "the load average 3.50 was over the machine's 2 cores"


def test_a_wall_clock_measurement_begun_under_a_load_over_the_cores_takes_its_least_rounds():
    # unsettled rounds would go on to the cap; under such a load no number of them is trusted
    m = until_stable([lambda: 1.0, one_quiet_round(1.9, 2.2)], lambda _: [ratio(2.0)],
                     Rules(min_rounds=5, max_rounds=40), load=lambda: 3.5, cores=2)
    assert m.rounds == 5 and not m.stable and not m.trusted
    assert m.why.startswith("not settled after 5 rounds, the least asked for: b / a: 1.9")
    assert m.why.endswith("no more were timed under a load over the cores")


def test_a_cpu_time_measurement_is_judged_by_its_spread_whatever_the_load():
    m = until_stable(steady(1.0, 1.5), lambda _: [ratio(2.0)], Rules(min_rounds=3),
                     load=lambda: 3.5, cores=2, wall_clock=False)
    assert m.trusted and m.verdicts[0].state == "met"


def test_the_load_is_read_before_the_first_round_and_after_the_last():
    readings = iter([0.4, 1.9])
    calls: list[str] = []

    def load() -> float:
        calls.append("load")
        return next(readings)

    def case() -> float:
        calls.append("case")
        return 1.0

    m = until_stable([case], None, Rules(min_rounds=2, max_rounds=2), load=load, cores=2)
    assert calls == ["load", "case", "case", "load"] and m.load == Load(0.4, 1.9, 2)
    assert str(m.load) == "load average 0.40 before, 1.90 after, on 2 cores"


@pytest.mark.parametrize(("samples", "bound", "at_most", "state"), [
    ([1.0, 1.1, 1.2], 2.0, True, "met"),
    ([2.1, 2.2, 2.3], 2.0, True, "missed"),
    ([1.9, 2.0, 2.1], 2.0, True, "inconclusive"),
    ([0.95, 0.96], 0.9, False, "met"),
    ([0.8, 0.85], 0.9, False, "missed"),
    ([0.85, 0.95], 0.9, False, "inconclusive"),
])
def test_a_verdict_holds_at_both_ends_of_the_interval_or_is_inconclusive(samples, bound,
                                                                         at_most, state):
    assert verdict("f", float(np.median(samples)), np.array(samples), bound, at_most).state == \
        state


def test_a_noisy_verdict_is_inconclusive_whatever_its_interval():
    v = verdict("f", 1.0, np.array([1.0, 1.0]), 2.0, noisy="the load average 9 was over 2")
    assert v.state == "inconclusive" and v.why == "the load average 9 was over 2"


def test_resampling_keeps_rounds_whole_and_a_case_never_timed_in_a_resample_is_infinite():
    seconds = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, np.nan]])
    reps = noise.resampled_least(seconds, 200)
    finite = np.isfinite(reps[:, 1])
    assert np.all(reps[finite, 1] == reps[finite, 0] * 10)  # paired: the same rounds for both
    assert not finite.all() and np.all(reps[~finite, 0] == 3.0)
    assert np.array_equal(reps, noise.resampled_least(seconds, 200))  # the same every time


def test_a_load_across_measurements_keeps_the_first_before_and_the_highest_after():
    loads = [Load(0.5, 1.0, 2), Load(1.0, 4.0, 2), Load(4.0, 1.5, 2)]
    assert Load.across(loads) == Load(0.5, 4.0, 2) and Load.across(loads).over


def test_bad_rules_are_refused():
    with pytest.raises(ValueError, match="min_rounds <= max_rounds"):
        Rules(min_rounds=5, max_rounds=3)
    with pytest.raises(ValueError, match="confidence"):
        Rules(confidence=1.0)
