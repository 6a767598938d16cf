"""`apportion bench forall`: the same scf.forall IR run sequentially and on OpenMP threads, every
case checked against the unplanned program, the goal stated only where it means something (no
timed assertion: the goal's arithmetic is checked on made-up results)."""

from __future__ import annotations

import io
import json

import pytest

from apportion.bench import forall as bench_forall
from apportion.bench import goals as bench_goals
from apportion.bench.forall import GOAL, Result, goals
from apportion.cli.main import main
from apportion.cost import noise
from apportion.mlir import upstream

needs_mlir = pytest.mark.skipif(not upstream.available() or
                                upstream.openmp_library() is None,
                                reason="needs the mlir extra (upstream MLIR 22 and libiomp5)")


def result(case: str, speedup: float, large: bool = True, threads: int = 2) -> Result:
    return Result(case, case, large, ("8",), 0.1, 10.0, 10.0, 10.0 / speedup, threads,
                  speedup, 1.5, True, 0.0)


def test_the_goal_reads_the_geometric_mean_of_the_large_cases_only():
    [g] = goals([result("a", 4.0), result("b", 0.5), result("tiny", 0.01, large=False)])
    assert g.met and g.figure.startswith("1.41x")  # sqrt(4 * 0.5); the small case left out
    [g] = goals([result("a", 0.8), result("b", 1.1)])
    assert not g.met and "lowest 0.80x, a" in g.what and f">= {GOAL:g}x" in g.what


def _rounds(one: list[float], many: list[float], load: float = 0.5) -> noise.Measured:
    """One case's rounds: scf.for, 1 thread, N threads (ms as seconds)."""
    return noise.Measured((tuple(one), tuple(one), tuple(many)), (), True, "",
                          noise.Load(load, load, 2))


def test_a_speedup_the_rounds_cannot_tell_from_the_goal_is_inconclusive():
    # b's one quiet N-thread round makes it 1.0x; its other rounds 0.8x: with a's 1.0x the
    # geometric mean's interval holds the goal
    a = _rounds([10.0] * 4, [10.0] * 4)
    b = _rounds([10.0] * 4, [10.0, 12.5, 12.5, 12.5])
    [g] = goals([result("a", 1.0), result("b", 1.0)], [a, b])
    assert g.inconclusive and g.figure.startswith("1.00x [0.89x, 1.00x]")
    assert bench_goals.status("forall", [g], check=True, err=io.StringIO()) == 3


def test_steady_rounds_judge_the_speedup_and_a_loaded_machine_judges_nothing():
    a = _rounds([10.0, 10.1, 10.0], [5.0, 5.1, 5.0])
    [g] = goals([result("a", 2.0)], [a])
    assert g.met and g.figure.startswith("2.00x [1.98x, 2.00x]")
    [g] = goals([result("a", 2.0)], [_rounds([10.0, 10.1, 10.0], [5.0, 5.1, 5.0], load=3.0)])
    assert g.inconclusive and "the load average 3.00 was over the machine's 2 cores" in g.figure


def test_no_goal_is_stated_on_one_thread_or_without_a_large_case():
    assert goals([result("a", 1.0, threads=1)]) == []
    assert goals([result("a", 0.5, large=False)]) == []


def test_the_cases_are_small_first_and_every_large_one_is_marked():
    cs = bench_forall.cases()
    assert [c.large for c in cs] == sorted(c.large for c in cs)
    assert {c.name for c in cs if c.large} == {"gelu", "rowsum", "matmul"}


@needs_mlir
def test_the_bench_times_three_columns_of_the_same_ir_and_checks_each_case(tmp_path, capsys):
    out = tmp_path / "forall.json"
    assert main(["bench", "forall", "--limit", "2", "--repeat", "1", "--threads", "2",
                 "--cores", "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "scf.for ms" in text and "1 thread ms" in text and "2 threads ms" in text
    doc = json.loads(out.read_text())
    assert [d["case"] for d in doc] == ["pointwise", "softmax"]
    assert all(d["ok"] and d["threads"] == 2 and d["grids"] for d in doc)
    assert all(d["for_ms"] > 0 and d["one_ms"] > 0 and d["many_ms"] > 0 for d in doc)
    assert all(d["busy"] >= 0 for d in doc)
    # small cases are timed the rounds asked for; their noise is in the JSON
    assert all(d["rounds"] == 1 and d["noise"]["rounds"] == 1 for d in doc)
    assert "noise: interleaved rounds per case 1 to 1, 2 of 2 stable" in text


def test_bench_forall_takes_one_core_count_and_no_foreign_options(capsys):
    assert main(["bench", "forall", "--cores", "4", "8"]) == 2
    assert main(["bench", "forall", "--n", "3"]) == 2
    assert "--n is not an option of the forall suite" in capsys.readouterr().err
