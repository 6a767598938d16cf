"""`apportion bench scale`: the forward, chain and loop-group rows, the goals and the JSON."""

from __future__ import annotations

import json

import pytest

from apportion.bench import goals as bench_goals
from apportion.bench.scale import LAYERS, ScaleResult, chain_program, goals, group_program
from apportion.cli.main import main
from apportion.cost import noise


@pytest.mark.slow
def test_bench_scale_prints_its_tables_with_their_goals_and_writes_every_row(tmp_path, capsys):
    out = tmp_path / "scale.json"
    # without --check the goals only report: real timings decide nothing in a unit test
    assert main(["bench", "scale", "--limit", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "planning CPU time of the forward pass" in text and "one loop group" in text
    assert "planning CPU time of a chain of pointwise ops" in text
    assert "llama2-7b x8 layers @128" in text and "100-op loop group" in text
    assert "2,000-op pointwise chain" in text
    # two forward rows, the second the 8-layer base: nothing to judge; two chain rows: a goal
    assert any(f"goal {v}: chain (32 cores)" in text for v in ("met", "MISSED", "inconclusive"))
    assert text.count("noise: interleaved rounds per table ") == 2
    assert "goal" not in text.split("planning CPU time of a chain")[0]
    rows = json.loads(out.read_text())
    assert [(r["suite"], r["ops"]) for r in rows] == [
        ("forward", 35), ("forward", 238), ("chain", 500), ("chain", 2000), ("group", 50),
        ("group", 100)]
    first, eight = rows[0], rows[1]
    # one block's 29 ops and the final 6: 21 distinct, as many at 8 layers
    assert (first["planned"], first["reused"]) == (21, 14)
    assert (eight["planned"], eight["reused"]) == (21, 217)
    assert (rows[3]["planned"], rows[3]["reused"]) == (4, 1996)  # four kinds, cycled
    assert all(r["seconds"] > 0 for r in rows)
    assert all(r["rounds"] >= 3 for r in rows if r["suite"] != "group")
    assert all(r["auto_tile_seconds"] > 0 for r in rows if r["suite"] == "group")


def test_the_default_rows_reach_160_layers_and_a_20000_op_chain():
    from apportion.bench.scale import CHAIN_OPS

    assert LAYERS[-1] == 160 and 8 in LAYERS and CHAIN_OPS[-1] == 20000


def test_bench_scale_refuses_a_bad_models_file(tmp_path, capsys):
    path = tmp_path / "models.json"
    path.write_text('{"models": {}}')
    assert main(["bench", "scale", "--limit", "1", "--models", str(path)]) == 2
    assert "llama2-7b" in capsys.readouterr().err


def row(suite: str, ops: int, seconds: float, cores: int = 32) -> ScaleResult:
    case = f"m x{ops // 29} layers @128" if suite == "forward" else f"{ops}-op chain"
    return ScaleResult(suite, case, cores, ops, 1, ops - 1, seconds)


def test_flat_time_per_op_meets_the_goals_and_exits_0_under_check(capsys):
    rows = [row("forward", 29, 0.1), row("forward", 232, 0.1), row("forward", 4640, 1.9),
            row("chain", 500, 0.1), row("chain", 20000, 4.0), row("group", 50, 9.0)]
    found = goals(rows)
    assert [g.met for g in found] == [True, True]  # forward and chain; group rows have none
    # the forward pass is judged against its 8-layer row, not the first (fixed costs)
    assert found[0].figure.startswith("0.95x (4640 vs 232 ops: 0.409 vs 0.431 ms/op)")
    assert bench_goals.status("scale", found, check=True) == 0
    assert capsys.readouterr().err == ""


def test_super_linear_time_misses_the_goal_and_exits_1_under_check(capsys):
    # twice the layers costing 3.8x the time, as before the scratchpad pass was linear
    rows = [row("forward", 232, 0.1), row("forward", 928, 0.38 * 4), row("forward", 4640, 20.7),
            row("chain", 500, 0.1), row("chain", 20000, 120.0)]
    found = goals(rows)
    assert [g.met for g in found] == [False, False]
    assert bench_goals.status("scale", found, check=False) == 0  # without --check: a report
    assert bench_goals.status("scale", found, check=True) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("apportion: bench scale: goal MISSED: forward (32 cores): time per "
                             "op at 4640 ops within 2x of 232 ops' (linear): 10.35x")
    assert "over the goal by" in err[0] and "chain (32 cores)" in err[1]


def _measured(seconds: list[list[float]], load: float = 0.5, wall_clock: bool = False
              ) -> noise.Measured:
    return noise.Measured(tuple(tuple(c) for c in seconds), (), True, "",
                          noise.Load(load, load, 2), wall_clock=wall_clock)


def test_a_growth_the_rounds_cannot_tell_from_linear_is_inconclusive_and_exits_3(capsys):
    # the largest row's one quiet round is linear, its other rounds 2.1x: too noisy to judge
    rows = [row("chain", 500, 0.1), row("chain", 20000, 4.0)]
    m = _measured([[0.1, 0.1, 0.1], [4.0, 8.5, 8.5]])
    (goal,) = goals(rows, {("chain", 32): m})
    assert goal.inconclusive and goal.figure.startswith("1.00x [1.00x, 2.12x] (20000 vs 500")
    assert bench_goals.status("scale", [goal], check=True) == bench_goals.INCONCLUSIVE == 3
    err = capsys.readouterr().err
    assert err.startswith("apportion: bench scale: goal inconclusive: chain (32 cores)")
    assert "too noisy: its interval 1 to 2.12 holds the bound 2" in err


def test_steady_rounds_judge_the_growth_and_cpu_time_is_not_voided_by_load():
    rows = [row("chain", 500, 0.1), row("chain", 20000, 4.0)]
    steady = [[0.1, 0.101, 0.1], [4.0, 4.04, 4.02]]
    (goal,) = goals(rows, {("chain", 32): _measured(steady, load=9.0)})
    assert goal.met and goal.figure.startswith("1.00x [1.00x, 1.00x]")
    # the same rounds timed by the wall clock under a load over the cores decide nothing
    (goal,) = goals(rows, {("chain", 32): _measured(steady, load=9.0, wall_clock=True)})
    assert goal.inconclusive and goal.figure.endswith("the load average 9.00 was over the "
                                                      "machine's 2 cores")


def test_each_core_count_is_judged_on_its_own_rows():
    rows = [row("chain", 500, 0.1, cores=32), row("chain", 20000, 4.0, cores=32),
            row("chain", 500, 0.1, cores=8), row("chain", 20000, 40.0, cores=8)]
    assert [(g.met, g.what.split(":")[0]) for g in goals(rows)] == [
        (True, "chain (32 cores)"), (False, "chain (8 cores)")]


def test_one_row_or_a_base_that_is_the_last_row_has_no_goal():
    assert goals([row("chain", 500, 0.1)]) == []
    assert goals([row("forward", 29, 0.1), row("forward", 232, 0.1)]) == []


def test_chain_program_is_a_chain_of_pointwise_ops_each_reading_the_last():
    p = chain_program(9)
    assert len(p.ops) == 9 and p.inputs == ("t0",) and p.outputs == ("t9",)
    assert all(p.consumers(f"t{i}") == (p.ops[i],) for i in range(9))
    assert {o.kind.category for o in p.ops} == {"pointwise"}


def test_group_program_is_one_loop_group_of_distinct_blocks():
    p = group_program(25)
    assert len(p.ops) == 25 and p.tiling[0].ops == tuple(o.name for o in p.ops)
    assert p.op("b0_gate").sizes["f0"] == 2816 and p.op("b1_gate").sizes["f1"] == 2880
    assert p.ops[-1].name == "b2_gate" and "b2_wu" not in p.tensor_map  # stops at its gate
