"""``apportion bench upstream`` finds the repository's examples wherever it runs, and refuses
a folder without any rather than running no example."""

from __future__ import annotations

from pathlib import Path

import pytest

from apportion.bench import upstream as bench_upstream
from apportion.bench.upstream import example_cases
from apportion.cli.main import main
from apportion.errors import UsageError
from apportion.mlir.upstream import MISSING, available

ROOT = Path(__file__).resolve().parents[2]


def test_the_examples_are_found_from_any_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no examples/ here: the repository's are the ones compared
    names = [c.name for c in example_cases()]
    assert names == sorted(p.stem for p in (ROOT / "examples").glob("*.json"))
    assert "mlp" in names and "attention" in names


def test_a_folder_without_examples_is_refused_naming_it(tmp_path):
    with pytest.raises(UsageError, match=f"{str(tmp_path)!r} holds none"):
        example_cases(tmp_path)


@pytest.mark.skipif(not available(), reason=MISSING)
def test_bench_upstream_without_examples_exits_2_not_0_with_no_example_run(tmp_path,
                                                                           monkeypatch, capsys):
    monkeypatch.setattr(bench_upstream, "EXAMPLES", tmp_path)
    assert main(["bench", "upstream", "--n", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("apportion: error: bench upstream compares the repository's example "
                          "programs") and "run it from a source checkout" in err
