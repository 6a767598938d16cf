"""``bench costmodel``: --cores and --limit, which pick the programs timed on a cpu target, are
refused where they would be dropped, and core counts this machine lacks are refused; the
programs' goal is judged with the noise of their rounds (no timed assertion: the goal's
arithmetic is checked on made-up rounds)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from apportion.bench import costmodel as bench_costmodel
from apportion.bench import goals as bench_goals
from apportion.bench.costmodel import ProgramRow, program_goals
from apportion.cli.main import main
from apportion.cost import noise
from apportion.target.presets import resolve


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_costmodel.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "shipped")  # no host table measured


@pytest.mark.parametrize(("argv", "message"), [
    (["--cores", "8"], "--cores applies to bench costmodel --target cpu (programs timed on "
                       "this machine); target 'spyre' is compared with its measured kernels"),
    (["--limit", "2"], "--limit applies to bench costmodel --target cpu"),
    (["--target", "cpu", "--cores", "1", "3"], "--cores 3: bench costmodel --target cpu times "
                                               "programs on this machine, which has 2 cores"),
    (["--target", "cpu", "--cores", "99999999999999999999"], "--cores 99999999999999999999: "),
])
def test_an_option_the_suite_would_drop_or_cannot_time_is_one_error_line(argv, message, capsys,
                                                                        two_cores):
    assert main(["bench", "costmodel", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"apportion: error: {message}"), err


def _rounds(*us: list[float], load: float = 0.5) -> noise.Measured:
    """One core count's rounds, a list of microseconds per program."""
    return noise.Measured(tuple(tuple(t * 1e-6 for t in col) for col in us), (), True, "",
                          noise.Load(load, load, 2))


def _row(program: str, predicted: float, rounds: list[float]) -> ProgramRow:
    return ProgramRow(program, 2, predicted, min(rounds), len(rounds))


def test_a_factor_the_rounds_cannot_tell_from_the_goal_is_inconclusive_and_exits_3():
    # b's one quick round (95 us) puts its prediction (150 us) 1.58x over it, its other rounds
    # 1.36x and 1.5x: the worst factor's interval holds the goal
    a, b = [100.0, 101.0, 100.0, 100.0], [95.0, 110.0, 100.0, 110.0]
    [g] = program_goals([_row("a", 100.0, a), _row("b", 150.0, b)], [_rounds(a, b)])
    assert g.inconclusive and g.figure.startswith("1.58x [1.36x, 1.58x] (b@2: predicted/"
                                                  "measured 1.58), too noisy: its interval")
    assert bench_goals.status("costmodel", [g], check=True,
                              err=io.StringIO()) == bench_goals.INCONCLUSIVE


def test_steady_rounds_judge_the_worst_factor_and_a_loaded_machine_judges_nothing():
    a, b = [100.0, 101.0, 100.0], [200.0, 202.0, 200.0]
    [g] = program_goals([_row("a", 120.0, a), _row("b", 180.0, b)], [_rounds(a, b)])
    assert g.met and g.figure.startswith("1.20x [1.19x, 1.20x] (a@2")
    [g] = program_goals([_row("a", 400.0, a)], [_rounds(a)])
    assert not g.met and not g.inconclusive and "over the goal by 2.46x" in g.figure
    [g] = program_goals([_row("a", 120.0, a)], [_rounds(a, load=3.0)])
    assert g.inconclusive and g.figure.endswith("too noisy: the load average 3.00 was over "
                                                "the machine's 2 cores")


def test_programs_timed_under_a_load_over_the_cores_take_their_least_rounds_and_judge_nothing():
    # a real program planned and run on one core, the load average read as over the cores
    rows, [m] = bench_costmodel.program_rows(resolve("cpu"), [1],
                                             bench_costmodel.cpu_programs()[2:3], Console(),
                                             min_rounds=3, load=lambda: 9.0)
    assert [r.program for r in rows] == ["norm_2048x1024"] and m.rounds == 3 == rows[0].rounds
    assert rows[0].measured_us == pytest.approx(min(m.seconds[0]) * 1e6)
    [g] = program_goals(rows, [m])
    assert g.inconclusive and "the load average 9.00 was over" in g.figure
