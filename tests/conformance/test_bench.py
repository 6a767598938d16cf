"""``apportion bench conformance``: seeded cases through every backend, a table, goals, and a
``--json`` record per case with its seed."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from apportion.bench import conformance as bench_conformance
from apportion.bench.conformance import Outcome, Record, goals, tallies
from apportion.cli.main import main


def record(seed: int, *outcomes: Outcome) -> Record:
    return Record(seed, "chain", (), "spyre", 8, "balanced", "yes", outcomes)


def test_goals_count_what_torch_and_iree_miss_of_the_reference_exact_plans():
    ok = Outcome("reference", "match")
    records = [record(0, ok, Outcome("torch", "match"), Outcome("iree", "match")),
               record(1, ok, Outcome("torch", "match"),
                      Outcome("iree", "refused", "iree-accumulate-kind", up_front=True)),
               record(2, Outcome("reference", "failed", "wrong numbers: y"))]
    met = {g.what.split(":")[0].split(" ")[0]: g for g in goals(records, ("torch", "iree"))}
    assert not met["reference"].met and "seed 2" in met["reference"].figure
    assert met["torch"].met and met["torch"].figure == "all 2"
    assert not met["iree"].met and "seed 1 (refused: iree-accumulate-kind)" in met["iree"].figure
    rows = tallies(records, ("torch", "iree"))
    assert (rows["iree"].plans, rows["iree"].claimed, rows["iree"].refused) == (2, 1, 1)
    assert rows["reference"].failed == 1


def test_the_bench_runs_seeded_cases_writes_json_and_meets_its_goals(tmp_path, capsys):
    out = tmp_path / "conf.json"
    assert main(["bench", "conformance", "--n", "4", "--dtensor", "0", "--json", str(out),
                 "--check"]) == 0
    text = capsys.readouterr().out
    assert "conformance:" in text and "goal met: torch runs and matches every plan" in text
    doc = json.loads(out.read_text())
    assert [r["seed"] for r in doc["programs"]] == [0, 1, 2, 3]
    assert {o["backend"] for r in doc["programs"] for o in r["outcomes"]} <= {
        "reference", "torch", "iree", "bundle"}
    assert [r["seed"] for r in doc["meshes"]] == [0, 1, 2, 3]


def test_the_bench_lists_a_failure_with_its_seed():
    records = [record(7, Outcome("reference", "match"), Outcome("torch", "failed", "boom"))]
    console = Console(record=True, width=160)
    bench_conformance.show(records, console, ("torch",))
    text = console.export_text()
    assert "FAIL torch seed 7 (chain, spyre 8 cores, balanced): boom" in text
    assert "goal MISSED: torch runs and matches every plan" in text


@pytest.mark.parametrize("argv, message", [
    (["bench", "conformance", "--n", "0"], "--n: must be an integer >= 1"),
    (["bench", "workdiv", "--n", "3"], "--n is not an option of the workdiv suite"),
    (["bench", "conformance", "--dtensor", "x"], "--dtensor: expected an integer >= 0"),
    (["bench", "workdiv", "--dtensor", "1"], "--dtensor is not an option of the workdiv suite"),
    (["bench", "conformance", "--cores", "8"], "--cores is not an option of the conformance"),
])
def test_bad_options_are_one_line_and_status_2(argv, message, capsys):
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
