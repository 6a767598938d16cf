"""`apportion bench splitk`: each resolver's picks, the verdicts and goals on synthetic timings,
the shipped table against the shipped measurements (no timing), and one slow run of the
measuring bench."""

from __future__ import annotations

import io
import json

import pytest

import apportion as ap
from apportion.bench import goals as bench_goals
from apportion.bench import splitk as bench_splitk
from apportion.cli.main import main
from apportion.frontend.models import load_models
from apportion.target.presets import CPU_SPLIT_K
from apportion.target.split_k import ByTable, ReductionShape, table_slices
from apportion.workflows.host_splitk import Timed
from tests.helpers import program

SHAPES = bench_splitk.shapes_of(load_models())
#: (M, N, K) -> gpu factor
EXPECTED_GPU = {
    (32, 32, 40960): 128,
    (128, 128, 32768): 64,
    (128, 256, 131072): 32,
    (1, 4096, 14336): 128,
    (1, 6144, 4096): 64,
    (32, 4096, 14336): 1,
    (768, 768, 65536): 8,
    (4096, 4096, 8192): 1,
}


def test_the_models_file_lists_the_shapes_the_picks_table_expects():
    assert set(SHAPES) == set(EXPECTED_GPU)


@pytest.mark.parametrize("shape", [(32, 32, 40960), (128, 128, 32768), (1, 6144, 4096)])
def test_each_resolver_picks_its_factor(shape):
    m, n, k = shape
    gpu, cpu, spyre = (bench_splitk.pick(r, m, n, k) for r in ("gpu", "cpu", "spyre"))
    assert gpu.factor == EXPECTED_GPU[shape] and gpu.by == "gpu"
    # the suite runs with the shipped table (tests/conftest.py), capped at this machine's cores
    shipped = table_slices(CPU_SPLIT_K, ReductionShape(1, m, n, k))
    assert cpu.by in ("table", None)  # None: no row, the cost model's search
    if shipped is not None:
        assert cpu.factor == min(shipped, ap.targets.cpu().cores)
    assert spyre.by is None and spyre.factor >= 1  # spyre leaves it to the cost model
    assert all(p.predicted_us > 0 for p in (gpu, cpu, spyre))


def test_the_cpu_preset_resolves_split_k_by_its_table_and_caps_at_its_cores():
    target = ap.targets.cpu(cores=2)
    assert target.split_k == ByTable() and target.split_k_table == CPU_SPLIT_K
    planned = ap.plan(bench_splitk.matmul_program(1, 4096, 14336, "float32"), target)
    factor, by, _, _ = bench_splitk.split_of(planned)
    assert by == "table" and factor == 2


def test_no_cpu_table_row_holds_a_plain_reduction():
    p = program({"x": ([4, 65536], "float32")},
                [{"name": "s", "op": "sum", "out": "y[m,0]", "ins": ["x[m,k]"]}], ["y"])
    assert ap.plan(p, ap.targets.cpu()).op("s").split_k is None


def test_the_shipped_table_picks_within_90_percent_of_the_shipped_measurements():
    records = bench_splitk.shipped()
    assert records and all(r.check_ok for r in records)
    shapes: dict[tuple[int, int, int], dict[int, float]] = {}
    for r in records:
        shapes.setdefault((r.m, r.n, r.k), {})[r.factor] = r.median_s
    skinny = {(m, n, bench_splitk.measured_k(m, n, k)) for m, n, k in SHAPES
              if m * n <= bench_splitk.SKINNY_OUTPUT}
    assert set(shapes) == skinny
    for (m, n, k), times in shapes.items():
        picked = table_slices(CPU_SPLIT_K, ReductionShape(1, m, n, k)) or 1
        assert min(times.values()) / times[picked] >= bench_splitk.GOAL, (m, n, k)


def timed(factor: int, ms: float, m: int = 1, n: int = 64, k: int = 4096) -> Timed:
    return Timed(m, n, k, factor, 0.0, True, 0.0, (ms / 1e3, ms / 1e3 * 1.3))


def shape(ms: dict[int, float], k_full: int = 4096) -> bench_splitk.Shape:
    return bench_splitk.Shape(k_full, tuple(timed(f, t) for f, t in ms.items()))


def test_a_verdict_reads_the_least_times_the_pick_and_irees_unsplit_compile():
    v = bench_splitk.verdict(shape({1: 10.0, 2: 6.0, 4: 5.0, 0: 8.0}), lambda m, n, k: 2)
    assert (v.fastest, v.pick) == (4, 2)
    assert v.ratio == pytest.approx(5 / 6) and v.iree_ratio == pytest.approx(8 / 6)
    assert v.unsplit_s == pytest.approx(0.010)


def test_the_goals_are_met_by_a_pick_near_the_fastest_and_missed_otherwise():
    near = bench_splitk.verdict(shape({1: 10.0, 2: 5.2, 4: 5.0}), lambda m, n, k: 2)
    met = bench_splitk.goals([near])
    assert all(g.met for g in met) and len(met) == 2
    far = bench_splitk.verdict(shape({1: 10.0, 2: 12.0, 4: 5.0}), lambda m, n, k: 2)
    ratio, slower = bench_splitk.goals([near, far])
    assert not ratio.met and "pick 2, fastest 4" in ratio.figure
    assert not slower.met and "split 2 12.00 ms, no split 10.00 ms" in slower.figure


def test_a_split_within_the_tie_tolerance_of_no_split_is_no_slower():
    tie = bench_splitk.verdict(shape({1: 10.0, 2: 10.4}), lambda m, n, k: 2)
    slower = bench_splitk.verdict(shape({1: 10.0, 2: 10.6}), lambda m, n, k: 2)
    assert bench_splitk.goals([tie])[1].met and not bench_splitk.goals([slower])[1].met


def test_an_unmeasured_pick_misses_the_goal():
    v = bench_splitk.verdict(shape({1: 10.0, 2: 6.0}), lambda m, n, k: 8)
    assert v.ratio is None
    (goal,) = bench_splitk.goals([v])
    assert not goal.met and "pick 8" in goal.figure


def rounds(ms: dict[int, list[float]], k_full: int = 4096) -> bench_splitk.Shape:
    """A shape timed in rounds: each way's ms per round, the rounds interleaved."""
    return bench_splitk.Shape(k_full, tuple(
        Timed(1, 64, 4096, f, 0.0, True, 0.0, tuple(t / 1e3 for t in ts))
        for f, ts in ms.items()))


def test_a_pick_near_the_goal_under_noise_is_inconclusive_not_met_nor_missed():
    # the pick's one quiet round makes it 0.92 of the fastest; its other rounds 0.82: the
    # resampled rounds hold the goal 0.9, so it is too noisy to pass or fail
    s = rounds({1: [10.0] * 4, 2: [5.0, 5.6, 5.6, 5.6], 4: [5.6, 4.6, 4.6, 4.6]})
    v = bench_splitk.verdict(s, lambda m, n, k: 2)
    ratio = bench_splitk.goals([v], [s])[0]
    assert ratio.inconclusive and not ratio.met and ratio.state == "inconclusive"
    assert ratio.figure.startswith("0.92 [0.82, 0.92] (1x64x4096: pick 2, fastest 4")
    assert "too noisy: its interval 0.821 to 0.92 holds the bound 0.9" in ratio.figure
    goals = bench_splitk.goals([v], [s])
    assert bench_goals.status("splitk", goals, check=True, err=io.StringIO()) == \
        bench_goals.INCONCLUSIVE
    assert bench_goals.status("splitk", goals, check=False) == 0


def test_steady_rounds_judge_the_goals_and_a_missed_one_fails_whatever_is_inconclusive():
    steady = rounds({1: [10.0, 10.1, 10.0], 2: [5.2, 5.3, 5.2], 4: [5.0, 5.1, 5.0]})
    far = rounds({1: [10.0, 10.1, 10.0], 2: [12.0, 12.2, 12.0], 4: [5.0, 5.1, 5.0]})
    noisy = rounds({1: [10.0] * 4, 2: [5.0, 5.6, 5.6, 5.6], 4: [5.6, 4.6, 4.6, 4.6]})
    shapes = [steady, noisy, far]
    verdicts = [bench_splitk.verdict(s, lambda m, n, k: 2) for s in shapes]
    assert [g.met for g in bench_splitk.goals(verdicts[:1], shapes[:1])] == [True, True, True]
    goals = bench_splitk.goals(verdicts, shapes)
    assert [g.state for g in goals[:2]] == ["MISSED", "MISSED"]
    assert bench_goals.status("splitk", goals, check=True, err=io.StringIO()) == 1


def test_a_shape_timed_under_a_load_over_the_cores_decides_no_goal():
    from apportion.cost.noise import Load, Measured

    quiet = rounds({1: [10.0, 10.1, 10.0], 2: [5.2, 5.3, 5.2], 4: [5.0, 5.1, 5.0]})
    loaded = Measured(tuple(t.seconds for t in quiet.timed), (), True, "", Load(0.5, 9.0, 2))
    s = bench_splitk.Shape(4096, quiet.timed, loaded)
    ratio, slower, _ = bench_splitk.goals([bench_splitk.verdict(s, lambda m, n, k: 2)], [s])
    assert ratio.inconclusive and slower.inconclusive
    assert ratio.figure.endswith("too noisy: the load average 9.00 was over the machine's 2 "
                                 "cores")


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
    assert "fastest / pick" in text and "IREE / pick" in text and "goal" in text
    doc = json.loads(out.read_text())
    assert doc["format"] == bench_splitk.FORMAT
    (s,) = doc["shapes"]
    assert sorted(t["factor"] for t in s["timed"]) == [0, 1, 2, 4, 8, 16, 32, 64]
    (v,) = doc["verdicts"]
    assert v["pick"] >= 1 and v["iree_s"] > 0
