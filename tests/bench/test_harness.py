"""The one bench harness: interleaved timing, the options a suite takes, its JSON and goals."""

from __future__ import annotations

import argparse
import importlib
import json

import pytest
from rich.console import Console

from apportion.bench import goals
from apportion.bench.harness import OPTIONS, Outcome, Suite, run_suite
from apportion.cli.main import BENCH_SUITES, main
from apportion.cost.timing import interleaved
from apportion.errors import UsageError


def test_interleaved_calls_every_case_once_per_round_in_order():
    calls: list[str] = []
    interleaved([lambda: calls.append("a"), lambda: calls.append("b")], repeat=3)
    assert calls == ["a", "b"] * 3


def test_interleaved_alternate_reverses_every_other_round():
    calls: list[str] = []
    first, second = interleaved([lambda: calls.append("executor"),
                                 lambda: calls.append("eager")], 3, alternate=True)
    assert calls == ["executor", "eager", "eager", "executor", "executor", "eager"]
    assert len(first.seconds) == len(second.seconds) == 3


def test_warmup_calls_are_not_timed():
    calls: list[int] = []
    (t,) = interleaved([lambda: calls.append(1)], repeat=2, warmup=3)
    assert len(calls) == 5 and len(t.seconds) == 2


def test_the_fastest_call_gives_the_result_and_min_and_median_come_from_the_clock():
    # a fake clock: each reading advances by the next step, so call i takes durations[i]
    durations = iter([5.0, 2.0, 9.0])
    now = [0.0]

    def clock() -> float:
        return now[0]

    results = iter(["slow", "fast", "slowest"])

    def call() -> str:
        now[0] += next(durations)
        return next(results)

    (t,) = interleaved([call], repeat=3, clock=clock)
    assert t.seconds == (5.0, 2.0, 9.0)
    assert (t.min, t.median, t.result) == (2.0, 5.0, "fast")


def test_fresh_makes_each_calls_argument_outside_the_timed_span():
    now = [0.0]
    made: list[int] = []

    def fresh() -> int:
        now[0] += 100.0  # untimed work
        made.append(len(made))
        return made[-1]

    def call(x: int) -> int:
        now[0] += 1.0
        return x

    (t,) = interleaved([call], repeat=2, clock=lambda: now[0], fresh=[fresh])
    assert t.seconds == (1.0, 1.0) and made == [0, 1]


def test_before_runs_before_every_timed_call():
    log: list[str] = []
    interleaved([lambda: log.append("call")], repeat=2, before=lambda: log.append("gc"))
    assert log == ["gc", "call", "gc", "call"]


def test_bad_repeat_and_mismatched_fresh_are_refused():
    with pytest.raises(ValueError, match="repeat must be >= 1"):
        interleaved([lambda: None], repeat=0)
    with pytest.raises(ValueError, match="fresh has 2 makers for 1 calls"):
        interleaved([lambda x: x], repeat=1, fresh=[lambda: 1, lambda: 2])


def _args(**given: object) -> argparse.Namespace:
    base = {o: None for o in OPTIONS} | {"json": None, "check": False, "limit": None}
    return argparse.Namespace(**(base | given))


def _suite(outcome: Outcome, ran: list[bool] | None = None) -> Suite:
    def run(args: argparse.Namespace, console: Console) -> Outcome:
        if ran is not None:
            ran.append(True)
        return outcome

    return Suite("demo", frozenset({"cores"}), "a suite for tests", run)


def test_an_option_the_suite_does_not_take_is_refused_before_it_runs():
    ran: list[bool] = []
    with pytest.raises(UsageError, match=r"--threads is not an option of the demo suite "
                                         r"\(its options: --cores, --limit"):
        run_suite(_suite(Outcome([], []), ran), _args(threads=2), Console())
    assert ran == []


def test_the_json_document_is_written_once_and_goals_decide_the_exit_status(tmp_path):
    missed = goals.at_most("ratio", 2.0, 1.0)
    out = tmp_path / "r.json"
    suite = _suite(Outcome({"rows": [1, 2]}, [missed]))
    assert run_suite(suite, _args(json=str(out)), Console()) == 0
    assert json.loads(out.read_text()) == {"rows": [1, 2]}
    assert run_suite(suite, _args(check=True), Console()) == 1


def test_a_wrong_result_fails_with_or_without_check():
    suite = _suite(Outcome([], [], failed=True))
    assert run_suite(suite, _args(), Console()) == 1


def test_a_json_path_in_a_missing_folder_is_refused_before_the_suite_runs(tmp_path):
    ran: list[bool] = []
    with pytest.raises(UsageError, match="does not exist"):
        run_suite(_suite(Outcome([], []), ran), _args(json=str(tmp_path / "no" / "r.json")),
                  Console())
    assert ran == []


@pytest.mark.parametrize("name", BENCH_SUITES)
def test_every_bench_suite_runs_through_the_harness(name):
    suite = importlib.import_module(f"apportion.bench.{name}").SUITE
    assert isinstance(suite, Suite) and suite.name == name
    assert suite.options <= set(OPTIONS)


def test_the_cli_names_the_suites_options_in_its_refusal(capsys):
    assert main(["bench", "splitk", "--cores", "8"]) == 2
    assert "--cores is not an option of the splitk suite (its options: --models" in \
        capsys.readouterr().err
