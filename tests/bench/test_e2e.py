"""`apportion bench e2e`: the table on a tiny setting (the MLP, one repeat), its JSON rows and
its options. No timed assertions: times depend on the machine."""

from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from apportion.bench import goals as bench_goals  # noqa: E402
from apportion.bench.e2e import (  # noqa: E402
    MODELS,
    SLOWDOWN_GOAL,
    E2EResult,
    compiled_table,
    goals,
    table,
)
from apportion.cli.main import main  # noqa: E402
from apportion.cost import noise  # noqa: E402


def test_bench_e2e_prints_the_table_and_writes_every_row_on_one_thread(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    # no --check: whether the executor keeps within its slowdown goal is a timing
    assert main(["bench", "e2e", "--limit", "1", "--repeat", "2", "--cores", "8", "32",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PyTorch models end to end" in text and "executor ms min/med" in text
    assert "gated MLP" in text and "torch.set_num_threads(1)" in text and "x eager" in text
    assert "through torch.compile(backend=ap.backend(...))" in text
    assert "compiled ms min/med" in text
    assert "goal met: the executor's and the compiled model's outputs equal eager's" in text
    assert "the executor at most" in text and "torch.compile through ap.backend at most" in text
    assert "noise: interleaved rounds per row " in text
    rows = json.loads(out.read_text())
    assert [(r["model"], r["cores"], r["threads"], r["repeat"]) for r in rows] == [
        ("mlp", 8, 1, 2), ("mlp", 32, 1, 2)]
    # at least --repeat rounds: more only while unsettled on a quiet machine (a loaded one
    # stops at the least, so the count depends on the load)
    assert all(r["rounds"] >= 2 and r["noise"]["rounds"] == r["rounds"] for r in rows)
    for r in rows:
        assert r["ops"] > 0 and r["max_abs_err"] < 1e-4
        assert r["compiled_err"] < 1e-4
        assert all(r[k] > 0 for k in ("export_s", "lower_s", "plan_s", "executor_ms",
                                      "executor_min_ms", "eager_ms", "eager_min_ms",
                                      "compiled_ms", "compiled_min_ms"))
        assert r["executor_min_ms"] <= r["executor_ms"] and r["eager_min_ms"] <= r["eager_ms"]
        assert r["compiled_min_ms"] <= r["compiled_ms"]


def test_the_models_are_the_mlp_llama_and_gpt2_cheapest_first():
    assert [m[0] for m in MODELS] == ["mlp", "llama", "gpt2"]


def _row(executor_min: float = 3.0, eager_min: float = 2.0, eager_med: float = 2.2,
         err: float = 1e-7, compiled_min: float = 3.5, compiled_err: float = 1e-7
         ) -> E2EResult:
    return E2EResult("m", "about", 3, 8, 1, 5, 0.1, 0.2, 0.01, executor_min * 1.1, executor_min,
                     eager_med, eager_min, err, compiled_min * 1.1, compiled_min, compiled_err)


def test_the_ratios_are_the_executors_and_the_compiled_models_fastest_run_over_eagers():
    row = _row()
    assert row.ratio == 1.5 and row.compiled_ratio == 1.75 and row.eager_spread == 1.1
    assert table([row]).row_count == 1 and compiled_table([row]).row_count == 1


def test_the_slowdown_goal_is_the_issues_two_times_eager():
    assert SLOWDOWN_GOAL == 2.0


def test_e2e_goals_are_met_by_a_matching_executor_and_compiled_model_within_the_slowdown():
    assert [g.met for g in goals([_row()])] == [True, True, True]


def test_e2e_misses_an_output_off_from_eager_and_a_slowdown_over_its_goal():
    err, slow, compiled = goals([_row(err=1e-3), _row(executor_min=2.0 * (SLOWDOWN_GOAL + 1))])
    assert not err.met and err.figure.startswith("1.0e-03 (m at 8 cores), over the goal by")
    assert not slow.met and slow.figure.startswith(f"{SLOWDOWN_GOAL + 1:.2f}x (m at 8 cores)")
    assert compiled.met


def test_e2e_misses_a_compiled_model_off_from_eager_or_over_the_slowdown():
    err, slow, compiled = goals([_row(compiled_err=1e-3),
                                 _row(compiled_min=2.0 * (SLOWDOWN_GOAL + 0.5))])
    assert not err.met and err.figure.startswith("1.0e-03 (m at 8 cores)")
    assert slow.met
    assert not compiled.met and compiled.figure.startswith(f"{SLOWDOWN_GOAL + 0.5:.2f}x")


def _rounds(executor: list[float], eager: list[float], compiled: list[float],
            load: float = 0.5) -> noise.Measured:
    return noise.Measured((tuple(executor), tuple(eager), tuple(compiled)), (), True, "",
                          noise.Load(load, load, 2))


def test_a_slowdown_the_rounds_cannot_tell_from_the_goal_is_inconclusive_and_exits_3():
    # the executor's one quiet round is 1.9x eager, its others 2.2x: too noisy to judge
    row = _row(executor_min=3.8, eager_min=2.0, compiled_min=2.4)
    m = _rounds([3.8, 4.4, 4.4, 4.4], [2.0] * 4, [2.4] * 4)
    err, slow, compiled = goals([row], [m])
    assert err.met and compiled.met and slow.inconclusive
    assert slow.figure.startswith("1.90x [1.90x, 2.20x] (m at 8 cores), too noisy: its "
                                  "interval 1.9 to 2.2 holds the bound 2")
    assert bench_goals.status("e2e", [err, slow, compiled], check=True,
                              err=io.StringIO()) == bench_goals.INCONCLUSIVE


def test_a_row_timed_under_a_load_over_the_cores_decides_no_slowdown_goal():
    row = _row()
    steady = ([3.0, 3.1, 3.0], [2.0, 2.1, 2.0], [3.5, 3.6, 3.5])
    assert [g.met for g in goals([row], [_rounds(*steady)])] == [True, True, True]
    err, slow, compiled = goals([row], [_rounds(*steady, load=5.2)])
    assert err.met  # an output is no timing
    assert slow.inconclusive and compiled.inconclusive
    assert slow.figure.endswith("too noisy: the load average 5.20 was over the machine's 2 "
                                "cores")


@pytest.mark.parametrize(("argv", "match"), [
    (["bench", "scale", "--threads", "2"], "--threads is not an option of the scale suite"),
    (["bench", "tiling", "--repeat", "2"], "--repeat is not an option of the tiling suite"),
    (["bench", "e2e", "--models", "m.json"], "--models is not an option of the e2e suite"),
    (["bench", "e2e", "--cores", "33"], "cores must be in 1..32"),
])
def test_options_of_other_suites_are_usage_errors(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


