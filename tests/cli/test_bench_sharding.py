"""`apportion bench sharding`: the search on model blocks over meshes of 2, 4 and 8 devices."""

from __future__ import annotations

import json

from rich.console import Console

from apportion.cli import bench_sharding
from apportion.cli.main import main
from apportion.frontend.models import load_models


def test_blocks_of_a_model_are_searched_on_every_mesh(tmp_path):
    doc = load_models()
    doc["models"] = {"gpt2-small": doc["models"]["gpt2-small"]}
    f = tmp_path / "models.json"
    f.write_text(json.dumps(doc))
    console = Console(record=True, width=200)
    rows, fwd = bench_sharding.run(str(f), console=console, forward=False)
    assert fwd == []
    assert [(r.block, r.devices) for r in rows] == [
        (b, n) for b in ("attention", "mlp") for n in (2, 4, 8, 4, 8)]
    for r in rows:
        assert 0 < r.predicted_us < r.one_device_us and r.solve_s > 0
    eight = [r for r in rows if r.devices == 8 and r.mesh == "tp=8"]
    assert all(r.speedup > 4 for r in eight)
    assert "sharding search: blocks" in console.export_text()


def test_the_sharding_suite_refuses_options_of_other_suites(capsys):
    assert main(["bench", "sharding", "--cores", "4"]) == 2
    assert "--cores is not an option of the sharding suite" in capsys.readouterr().err
