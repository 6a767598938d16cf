"""``apportion bench upstream``: a table of cases (agree / differ / upstream refused, with the
kinds of differences), the agreement rates, and the JSON document."""

from __future__ import annotations

import json

import pytest

from apportion.cli.main import main
from apportion.mlir.upstream import MISSING, available

pytestmark = pytest.mark.skipif(not available(), reason=MISSING)


@pytest.mark.slow
def test_bench_upstream_prints_cases_rates_and_kinds_and_writes_json(tmp_path, capsys):
    out = tmp_path / "up.json"
    # the first examples (attention: upstream refuses; big: agrees) and random cases 0..2
    assert main(["bench", "upstream", "--limit", "2", "--n", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "agreement rates" in text and "kinds of differences and refusals" in text
    assert "refused: tensor.expand_shape: sharding interface is not implemented" in text
    doc = json.loads(out.read_text())
    cases = {c["case"]: c for c in doc["cases"]}
    assert cases["big"]["propagation"] == "agree" and cases["big"]["partition"] == "agree"
    assert len(cases) == 5


def test_bench_upstream_refuses_options_it_does_not_take(capsys):
    assert main(["bench", "upstream", "--cores", "8"]) == 2
    assert "--cores is not an option of the upstream suite" in capsys.readouterr().err
