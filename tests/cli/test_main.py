import json
from pathlib import Path

import pytest

from apportion.cli.main import main
from apportion.plans.serialize import from_json
from tests.helpers import runnable_examples

ROOT = Path(__file__).parents[2]
EXAMPLES = runnable_examples(ROOT, "lm_head_prime_vocab.json")


def test_plan_prints_a_table_and_a_summary(capsys):
    assert main(["plan", str(ROOT / "examples/mlp.json"), "--cores", "8"]) == 0
    out = capsys.readouterr().out
    assert "gate" in out and "mean utilization" in out


def test_plan_json_is_plan_format_v1(capsys):
    assert main(["plan", str(ROOT / "examples/mlp.json"), "--format", "json"]) == 0
    plan = from_json(capsys.readouterr().out)
    assert plan.cores == 32 and [o.name for o in plan.ops][0] == "gate"


def test_plan_coefficient_export(capsys):
    assert main(["plan", str(ROOT / "examples/mlp.json"), "--format", "coeffs"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc[0]["op"] == "gate" and set(doc[0]["dims"].values()) == {"m", "n", "k"}


def test_plot_writes_a_png(tmp_path, capsys):
    out = tmp_path / "gate.png"
    assert main(["plan", str(ROOT / "examples/mlp.json"), "--plot", str(out), "--op", "gate"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("strategy", ["greedy", "balanced"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_run_check_passes_on_every_example(path, strategy, capsys):
    assert main(["run", str(path), "--check", "--strategy", strategy, "--cores", "24"]) == 0
    assert "matches the unplanned program" in capsys.readouterr().out


@pytest.mark.slow
def test_prime_vocabulary_runs_greedy_in_a_loop_of_last_resort_and_balanced_uneven(capsys):
    path = str(ROOT / "examples/lm_head_prime_vocab.json")
    assert main(["plan", path, "--strategy", "greedy"]) == 0
    assert "added by the planner: no split keeps it within the span limit" in \
        capsys.readouterr().out
    assert main(["plan", path, "--strategy", "greedy", "--format", "json"]) == 0
    assert '"added": "span"' in capsys.readouterr().out
    assert main(["run", path, "--check", "--threads", "2"]) == 0


@pytest.mark.parametrize(("argv", "match"), [
    (["plan", "no-such-file.json"], "cannot read program file"),
    (["plan", "--cores", "33"], "cores must be in 1..32"),
    (["plan", "--target", "tpu"], "unknown target"),
])
def test_bad_input_exits_2_with_one_line_and_no_traceback(argv, match, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_sencores_is_honoured_by_the_cli(monkeypatch, capsys):
    monkeypatch.setenv("SENCORES", "4")
    assert main(["plan", str(ROOT / "examples/mlp.json"), "--format", "json"]) == 0
    assert from_json(capsys.readouterr().out).cores == 4


@pytest.mark.slow
def test_demo_program_plans_tiles_and_checks_the_default_program(capsys):
    assert main(["demo", "--program", "--cores", "16"]) == 0
    out = capsys.readouterr().out
    assert "llama3-8b" in out and "greedy for comparison" in out
    assert "loop group [0] (sq, ms, inv, norm)" in out and "loop group [1] (gate" in out
    assert "matches the unplanned program" in out


def test_bench_workdiv_reports_strategies_and_bound(capsys):
    assert main(["bench", "workdiv", "--limit", "12", "--cores", "24"]) == 0
    out = capsys.readouterr().out
    assert "bound" in out and "greedy" in out


def test_bench_tiling_reports_traffic_with_and_without_tiling(capsys):
    from apportion.bench import tiling as bench_tiling
    from apportion.frontend.models import load_models
    from apportion.target import spyre

    cfg = load_models()["models"]["gpt2-small"]
    small = bench_tiling.run_case("softmax", bench_tiling.softmax_block(cfg, 128, "float16"),
                                  spyre())
    # at 128 tokens the untiled plan keeps the intermediates in the scratchpad already
    assert small.count == 1 and small.tiled_bytes == small.untiled_bytes and small.scratchpad
    result = bench_tiling.run_case("softmax", bench_tiling.softmax_block(cfg, 2048, "float16"),
                                   spyre())
    # at 2048 they fit only tile by tile, so tiling moves less device memory
    assert result.count is not None and result.tiled_bytes < result.untiled_bytes


def test_plan_report_has_a_line_per_loop_group(capsys):
    assert main(["plan", str(ROOT / "examples/fused.json")]) == 0
    out = capsys.readouterr().out
    assert "loop group [0, 0] (add, mul)" in out and "in scratchpad: y" in out


def test_plan_summary_counts_every_iteration_with_tiles_on_chip(capsys):
    import apportion as ap
    from apportion.report.tables import predicted_total_us

    planned = ap.plan(ap.load(ROOT / "examples/softmax_tiled.json"), ap.targets.spyre())
    (g,) = planned.plan.groups
    alone = sum(planned.plan.op(n).predicted_time_us for n in g.ops)
    # the intermediates in the scratchpad move no device memory, so an iteration is cheaper
    assert g.lx_tensors and 0 < g.iteration_time_us < alone
    assert predicted_total_us(planned.plan) == (pytest.approx(4 * g.iteration_time_us), False)
    assert main(["plan", str(ROOT / "examples/softmax_tiled.json")]) == 0
    out = capsys.readouterr().out
    assert f"predicted {g.iteration_time_us:.2f} us per iteration" in out
    assert f"predicted {4 * g.iteration_time_us:.1f} us in all" in out
