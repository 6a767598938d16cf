"""`apportion bench scale`: the forward and loop-group rows, the verdict and the JSON."""

from __future__ import annotations

import json

from apportion.cli.bench_scale import ScaleResult, group_program, verdict
from apportion.cli.main import main


def test_bench_scale_prints_both_tables_and_writes_every_row(tmp_path, capsys):
    out = tmp_path / "scale.json"
    assert main(["bench", "scale", "--limit", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "planning time of the forward pass" in text and "one loop group" in text
    assert "llama2-7b x8 layers @128" in text and "100-op loop group" in text
    assert "linear:" in text or "NOT linear:" in text
    rows = json.loads(out.read_text())
    assert [(r["suite"], r["ops"]) for r in rows] == [
        ("forward", 35), ("forward", 238), ("group", 50), ("group", 100)]
    first, eight = rows[0], rows[1]
    # one block's 29 ops and the final 6: 21 distinct, as many at 8 layers
    assert (first["planned"], first["reused"]) == (21, 14)
    assert (eight["planned"], eight["reused"]) == (21, 217)
    assert all(r["seconds"] > 0 for r in rows)
    assert all(r["auto_tile_seconds"] > 0 for r in rows if r["suite"] == "group")


def test_bench_scale_refuses_a_bad_models_file(tmp_path, capsys):
    path = tmp_path / "models.json"
    path.write_text('{"models": {}}')
    assert main(["bench", "scale", "--limit", "1", "--models", str(path)]) == 2
    assert "llama2-7b" in capsys.readouterr().err


def test_verdict_compares_the_time_per_op_with_the_8_layer_row():
    def row(layers: int, ops: int, seconds: float) -> ScaleResult:
        return ScaleResult("forward", f"m x{layers} layers @128", 32, ops, 1, ops - 1, seconds)

    flat = [row(1, 35, 0.1), row(8, 238, 0.1), row(32, 934, 0.35)]
    assert verdict(flat).startswith("linear: 934 ops take 0.89x the time per op of 238 ops")
    steep = [row(1, 35, 0.1), row(8, 238, 0.1), row(32, 934, 1.0)]
    assert verdict(steep).startswith("NOT linear")
    assert verdict(flat[:1]) == "one row: no growth to judge"


def test_group_program_is_one_loop_group_of_distinct_blocks():
    p = group_program(25)
    assert len(p.ops) == 25 and p.tiling[0].ops == tuple(o.name for o in p.ops)
    assert p.op("b0_gate").sizes["f0"] == 2816 and p.op("b1_gate").sizes["f1"] == 2880
    assert p.ops[-1].name == "b2_gate" and "b2_wu" not in p.tensor_map  # stops at its gate
