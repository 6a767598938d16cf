"""`apportion bench e2e`: the table on a tiny setting (the MLP, one repeat), its JSON rows and
its options. No timed assertions: times depend on the machine."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from apportion.cli.bench_e2e import MODELS, E2EResult, table  # noqa: E402
from apportion.cli.main import main  # noqa: E402


def test_bench_e2e_prints_the_table_and_writes_every_row(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert main(["bench", "e2e", "--limit", "1", "--repeat", "1", "--cores", "8", "32",
                 "--threads", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PyTorch models end to end" in text and "executor ms" in text and "x eager" in text
    assert "gated MLP" in text and "torch.set_num_threads(1)" in text
    rows = json.loads(out.read_text())
    assert [(r["model"], r["cores"], r["threads"], r["repeat"]) for r in rows] == [
        ("mlp", 8, 1, 1), ("mlp", 32, 1, 1)]
    for r in rows:
        assert r["ops"] > 0 and r["max_abs_err"] < 1e-4
        assert all(r[k] > 0 for k in ("export_s", "lower_s", "plan_s", "executor_ms",
                                      "eager_ms"))


def test_the_models_are_the_mlp_llama_and_gpt2_cheapest_first():
    assert [m[0] for m in MODELS] == ["mlp", "llama", "gpt2"]


def test_the_table_shows_the_ratio_of_executor_to_eager():
    row = E2EResult("m", "about", 3, 8, 2, 5, 0.1, 0.2, 0.01, 6.0, 2.0, 1e-7)
    assert row.ratio == 3.0
    assert table([row]).row_count == 1


@pytest.mark.parametrize(("argv", "match"), [
    (["bench", "scale", "--threads", "2"], "--threads is an option of the e2e suite"),
    (["bench", "tiling", "--repeat", "2"], "--repeat is an option of the e2e suite"),
    (["bench", "e2e", "--models", "m.json"], "--models is not an option of the e2e suite"),
    (["bench", "e2e", "--cores", "33"], "cores must be in 1..32"),
])
def test_options_of_other_suites_are_usage_errors(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err
