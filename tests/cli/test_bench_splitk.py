"""`apportion bench splitk`: each resolver's picks, the cpu split table against the shipped
measurements (no timing), and one slow run of the measuring bench."""

from __future__ import annotations

import json

import pytest

import apportion as ap
from apportion.cli import bench_splitk
from apportion.cli.main import main
from apportion.frontend.models import load_models
from apportion.target.presets import CPU_SPLIT_K
from tests.helpers import program

SHAPES = bench_splitk.shapes_of(load_models())
#: (M, N, K) -> (gpu factor, cpu factor)
EXPECTED = {
    (32, 32, 40960): (128, 1),
    (128, 128, 32768): (64, 8),
    (128, 256, 131072): (32, 8),
    (1, 4096, 14336): (128, 32),
    (1, 6144, 4096): (64, 8),
    (32, 4096, 14336): (1, 1),
    (768, 768, 65536): (8, 1),
    (4096, 4096, 8192): (1, 1),
}


def test_the_models_file_lists_the_shapes_the_picks_table_expects():
    assert set(SHAPES) == set(EXPECTED)


@pytest.mark.parametrize("shape", list(EXPECTED))
def test_each_resolver_picks_its_factor(shape):
    m, n, k = shape
    gpu, cpu, spyre = (bench_splitk.pick(r, m, n, k) for r in ("gpu", "cpu", "spyre"))
    assert (gpu.factor, cpu.factor) == EXPECTED[shape]
    assert gpu.by == "gpu" and cpu.by in ("table", None)  # None: no row, the cost model's search
    assert spyre.by is None and spyre.factor >= 1  # spyre leaves it to the cost model
    assert all(p.predicted_us > 0 for p in (gpu, cpu, spyre))


def test_the_cpu_preset_resolves_split_k_by_its_table_and_caps_at_its_cores():
    target = ap.targets.cpu(cores=2)
    assert target.split_k == "table" and target.split_k_table == CPU_SPLIT_K
    planned = ap.plan(bench_splitk.matmul_program(1, 4096, 14336, "float32"), target)
    factor, by, _, _ = bench_splitk.split_of(planned)
    assert by == "table" and factor == 2


def test_no_cpu_table_row_holds_a_plain_reduction():
    p = program({"x": ([4, 65536], "float32")},
                [{"name": "s", "op": "sum", "out": "y[m,0]", "ins": ["x[m,k]"]}], ["y"])
    assert ap.plan(p, bench_splitk.wide_cpu()).op("s").split_k is None


def test_the_cpu_table_picks_within_90_percent_of_the_fastest_measured_factor():
    records = bench_splitk.packaged()
    assert records and all(r.check_ok for r in records)
    measured = {(r.m, r.n, r.k_full) for r in records}
    skinny = {(m, n, k) for m, n, k in SHAPES if m * n <= bench_splitk.SKINNY_OUTPUT}
    assert measured == skinny
    for m, n, k in measured:
        factors = {r.factor for r in records if (r.m, r.n, r.k_full) == (m, n, k)}
        assert factors == set(bench_splitk.FACTORS)
    for v in bench_splitk.verdicts(records):
        assert v.ratio is not None and v.ratio >= bench_splitk.GOAL, v


def test_a_scaled_down_shape_keeps_its_listed_k():
    assert bench_splitk.measured_shape(128, 256, 131072) == 16384
    assert bench_splitk.measured_shape(32, 32, 40960) == 40960
    assert bench_splitk.measured_shape(32, 4096, 14336) is None


def test_bench_splitk_refuses_options_of_other_suites(capsys):
    assert main(["bench", "splitk", "--cores", "2"]) == 2
    assert "--cores is not an option of the splitk suite" in capsys.readouterr().err


def test_bench_splitk_refuses_a_bad_models_file(tmp_path, capsys):
    path = tmp_path / "models.json"
    path.write_text('{"models": {}, "split_k_shapes_MNK": [[1, 2]]}')
    assert main(["bench", "splitk", "--models", str(path)]) == 2
    assert "split_k_shapes_MNK" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_splitk_measures_a_tiny_shape_list(tmp_path, capsys):
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"models": {},
                                  "split_k_shapes_MNK": [[1, 64, 2048], [512, 512, 64]]}))
    out = tmp_path / "splitk.json"
    assert main(["bench", "splitk", "--models", str(models), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 x 64 x 2048" in text and "not measured: 512x512x64" in text
    assert "fastest / pick" in text and "goal" in text
    doc = json.loads(out.read_text())
    assert doc["format"] == bench_splitk.FORMAT
    records = bench_splitk.from_doc(doc)
    assert [r.factor for r in records] == list(bench_splitk.FACTORS)
    assert all(r.check_ok and len(r.times_s) == bench_splitk.REPEATS for r in records)
