"""`apportion calibrate` and `apportion bench costmodel`: the fit of the shipped Spyre data, the
ranks of the measured-best splits, the TOML written, and bad input refused in one line."""

from __future__ import annotations

import json
import math
import os
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from apportion.bench import costmodel as bench_costmodel
from apportion.cli import calibrate as cal_command
from apportion.cli.main import main
from apportion.cost import calibrate as cal_cost
from apportion.target import load_toml, spyre
from apportion.target.target import COST_FIELDS, Target
from apportion.workflows import calibration as cal_cli

ROOT = Path(__file__).parents[2]
SPYRE_DATA = str(ROOT / "apportion/frontend/data/spyre_measurements.json")


def status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *parts: str) -> str:
    assert status(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("apportion: error: "), err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the command fits or measures anything."""
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command started work before refusing its input")

    monkeypatch.setattr(cal_command, "fit", boom)
    monkeypatch.setattr(cal_cli, "measure", boom)
    monkeypatch.setattr(bench_costmodel, "program_rows", boom)


def test_the_shipped_spyre_data_fits_and_ranks_every_best_split_first(tmp_path, capsys):
    out = tmp_path / "fitted.toml"
    assert main(["calibrate", SPYRE_DATA, "--target", "spyre", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "overlap" in text  # the default fit: the published peaks stay, the overlap moves
    for shape in ("512x4096x4096", "512x4096x1024", "512x4096x12800"):
        assert f"{shape} on 32 cores: measured-best m8 n4 k1 ranks 1 of" in text
    assert "NOT first" not in text
    assert "left out: the fastest split picked on" in text
    fitted = load_toml(out)
    records = cal_cli.load(SPYRE_DATA)
    cal = cal_cost.fit(records, spyre(), cal_cli.predictor())
    assert all(abs(r.rel_error) <= 0.30 for r in cal.records)
    for f in COST_FIELDS:  # the file holds the fitted figures, exactly
        assert getattr(fitted, f) == getattr(cal.target, f), f
    assert out.read_text().splitlines()[1] == 'preset = "spyre"'


def test_a_target_file_base_writes_every_field(tmp_path, capsys):
    base = tmp_path / "lite.toml"
    base.write_text('preset = "spyre"\nname = "lite"\nmax_cores = 32\nsfp_rate = 1000.0\n')
    out = tmp_path / "fitted.toml"
    assert main(["calibrate", SPYRE_DATA, "--target", str(base), "--fit", "overlap",
                 "-o", str(out)]) == 0
    fitted = load_toml(out)
    assert fitted.name == "lite" and fitted.sfp_rate == 1000.0
    again = load_toml(base)
    assert {f.name: getattr(fitted, f.name) for f in fields(Target) if f.name != "overlap"} == \
        {f.name: getattr(again, f.name) for f in fields(Target) if f.name != "overlap"}
    assert "overlap" in capsys.readouterr().out


def test_every_measured_best_split_ranks_first_under_the_preset():
    for m in cal_cli.load(SPYRE_DATA):
        if m.best:
            r = cal_cli.rank_split(spyre(), m)
            assert r.first and r.pick == dict(m.splits), m.shape
            assert r.candidates > 100


def test_bench_costmodel_prints_one_row_per_measured_shape(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "costmodel", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ranked first on 7 of 7 shapes (ties counted against the model)" in text
    assert "left out: the fastest split picked on" in text
    rows = [r for r in json.loads(out.read_text()) if "balanced_split" in r]
    assert [r["shape"] for r in rows] == ["512x4096x4096", "512x4096x1024", "512x4096x12800",
                                          "8x128x2048x8192", "8x128x8192x2048",
                                          "8x512x4096x512", "8x512x64x512"]
    assert all(r["rank"] == 1 and r["balanced_split"] == r["measured_split"] for r in rows)
    assert [r["measured"] for r in rows] == [2, 1, 1, 1, 1, 1, 1]


def test_ties_count_against_the_model(monkeypatch):
    # a model that predicts every split the same time cannot pick the measured best: every
    # other candidate is tied with it, and each tie counts against it
    m = cal_cli.load(SPYRE_DATA)[2]
    monkeypatch.setattr(cal_cli.OpContext, "time_us", lambda self, splits, resident=None: 1.0)
    r = cal_cli.rank_split(spyre(), m)
    assert r.tied == r.candidates - 1 and r.rank == r.candidates and not r.first


def test_a_shape_with_one_measured_split_is_flagged(tmp_path, capsys):
    assert main(["bench", "costmodel", "--json", str(tmp_path / "b.json")]) == 0
    checks = [r for r in json.loads((tmp_path / "b.json").read_text()) if "loo_us" in r]
    assert [c["measured"] for c in checks] == [2, 1, 1, 1, 1, 1, 1]
    assert "6 shape(s) with only one measured split" in capsys.readouterr().out


def test_bench_costmodel_check_fails_when_a_left_out_shape_misses(tmp_path, capsys):
    # two shapes fitted well together, but the second, left out, is predicted from the first
    # alone: its time (tripled) is 68% off, and --check fails on the left-out goal
    doc = json.loads(Path(SPYRE_DATA).read_text())[:3]
    doc[2]["time_us"] *= 3
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    assert main(["bench", "costmodel", "--measurements", str(path), "--check"]) == 1
    assert "goal MISSED: left out of the fit, predicted within 30%" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "parts"), [
    (["calibrate", "MISSING"], ("cannot read measurements file", "No such file")),
    (["calibrate", "BADJSON"], ("is not valid JSON",)),
    (["calibrate", "BADRECORD"], ("record 0: field 'time_us' must be a finite number > 0",)),
    (["calibrate", SPYRE_DATA, "--fit", "mac_rate,warp"], ("cannot fit 'warp'",)),
    (["calibrate", SPYRE_DATA, "--fit", "pt_rows"], ("cannot fit 'pt_rows'",)),
    (["calibrate", SPYRE_DATA, "--fit", "overlap,,mac_rate"], ("--fit", "comma-separated")),
    (["calibrate", SPYRE_DATA, "-o", "NOFOLDER/x.toml"], ("-o", "does not exist")),
    (["calibrate", SPYRE_DATA, "-o", "FOLDER"], ("-o", "is a folder")),
    (["calibrate", SPYRE_DATA, "--target", "tpu"], ("unknown target 'tpu'",)),
    (["calibrate"], ("give a measurements file or --measure",)),
    (["calibrate", SPYRE_DATA, "--measure"], ("give a measurements file or --measure",)),
    (["calibrate", SPYRE_DATA, "--save", "m.json"], ("--save goes with --measure",)),
    (["calibrate", SPYRE_DATA, "--cores", "2"], ("--cores goes with --measure",)),
    (["calibrate", "--measure", "--target", "spyre"], ("--measure times this machine",)),
    (["calibrate", "--measure", "--target", "gpu"],
     ("--measure times this machine's CPU, so it calibrates only a cpu target, not 'gpu'",)),
    (["calibrate", "--measure", "--cores", "1000000"],
     ("--cores 1000000: --measure times this machine's cores, and it has",)),
    (["calibrate", "--measure", "--save", "NOFOLDER/m.json"], ("--save", "does not exist")),
    (["calibrate", "--measure", "--fit", "warp"], ("cannot fit 'warp'",)),
    (["calibrate", "BIGCORES"], ("record 0: field 'cores' 64 is more than the 32 cores "
                                 "(max_cores) of target 'spyre'",)),
    (["bench", "costmodel", "--measurements", "MISSING"], ("cannot read measurements file",)),
    (["bench", "costmodel", "--models", "m.json"],
     ("--models is not an option of the costmodel suite",)),
    (["bench", "costmodel", "--target", "tpu"], ("unknown target 'tpu'",)),
    (["bench", "workdiv", "--measurements", SPYRE_DATA],
     ("--measurements is not an option of the workdiv suite",)),
    (["bench", "costmodel", "--json", "NOFOLDER/b.json"], ("--json", "does not exist")),
])
def test_bad_input_exits_2_with_one_line_before_any_work(argv, parts, tmp_path, capsys, no_fit):
    files = {"MISSING": tmp_path / "missing.json", "BADJSON": tmp_path / "bad.json",
             "BADRECORD": tmp_path / "record.json", "NOFOLDER": tmp_path / "nowhere",
             "FOLDER": tmp_path, "BIGCORES": tmp_path / "big.json"}
    files["BADJSON"].write_text("[{")
    files["BADRECORD"].write_text(json.dumps([{"matmul": {"M": 64, "K": 64, "N": 64},
                                               "cores": 4, "splits": {}, "time_us": 0}]))
    files["BIGCORES"].write_text(json.dumps([{"matmul": {"M": 64, "K": 64, "N": 64},
                                              "cores": 64, "splits": {}, "time_us": 5}]))

    def real(a: str) -> str:
        for key, path in files.items():
            a = a.replace(key, str(path)) if a.startswith(key) else a
        return a

    refused([real(a) for a in argv], capsys, *parts)


#: timing splits over 2 cores needs a machine with 2 (more cores than the machine's are refused)
TWO_CORES = pytest.mark.skipif((os.cpu_count() or 1) < 2,
                               reason="times splits over 2 cores: this machine has fewer")


@pytest.mark.slow
@TWO_CORES
def test_measure_times_this_machine_and_writes_measurements_and_target(tmp_path, capsys):
    out, saved = tmp_path / "cpu.toml", tmp_path / "m.json"
    status = main(["calibrate", "--measure", "--cores", "2", "-o", str(out),
                   "--save", str(saved)])
    captured = capsys.readouterr()
    assert "sfp_rate" in captured.out and "reduce_rate" in captured.out
    assert "noise: interleaved rounds per kernel" in captured.out
    records = cal_cli.load(saved)
    # every split on 1 or 2 cores: 4 of a matmul (none, m, n, k), 3 of the others
    matmuls = sum(kind == "matmul" for kind, _ in cal_cli.KERNELS)
    assert len(records) == 4 * matmuls + 3 * (len(cal_cli.KERNELS) - matmuls)
    assert {m.cores for m in records} == {2}
    assert {math.prod(m.splits.values()) for m in records} == {1, 2}
    assert all(m.noise is not None and m.noise["rounds"] >= cal_cli.REPEATS for m in records)
    # this machine's load decides which: a target fitted, or none and why (both are right)
    if status == 0:
        assert load_toml(out).name == "cpu"
    else:
        assert status == cal_cli.INCONCLUSIVE and not out.exists()
        assert "could not be trusted" in captured.err and "not written" in captured.err


@pytest.mark.slow
@TWO_CORES
def test_bench_costmodel_times_cpu_programs(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "costmodel", "--target", "cpu", "--cores", "2", "--limit", "2",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "geometric mean of predicted/measured" in text
    assert "noise: interleaved rounds per core count " in text
    doc = json.loads(out.read_text())
    rows = [r for r in doc if "program" in r]
    assert [r["program"] for r in rows] == ["matmul_512x1024x1024", "matmul_256x2048x512"]
    # timed in rounds together, at least the least asked for, their noise in the JSON
    assert all(r["rounds"] >= bench_costmodel.MIN_ROUNDS and r["noise"]["rounds"] == r["rounds"]
               for r in rows)
    # the packaged every-split timings: each kernel's 2-core splits tie under the preset, and
    # the ties count against it
    shapes = [r for r in doc if "balanced_split" in r]
    assert len(shapes) == 13 and all(r["tied"] >= 1 and r["rank"] > 1 for r in shapes)
    assert len([r for r in doc if "loo_us" in r]) == 13
    assert all(r["measured_us"] > 0 and r["predicted_us"] > 0 for r in rows)


def _untrusted_measure(monkeypatch: pytest.MonkeyPatch) -> None:
    """``measure`` answering with two packaged kernels' records, timed under a load over the
    cores (no timing here)."""
    from apportion.cost import noise

    records = [m for m in cal_cli.load(cal_cli.packaged_path("cpu"))
               if m.shape in ("256x1024x1024", "exp_1024x2048/exp")]
    loaded = noise.Measured(((1.0, 1.0, 1.0),), (), True, "", noise.Load(6.8, 7.1, 2))

    def measure(*args: object, **kwargs: object):
        spread = {"rounds": 3, "spread": 0.0, "load": [6.8, 7.1]}
        return ([cal_cost.Measurement(m.program, m.op, m.cores, m.splits, m.time_us, False,
                                      m.spec, spread) for m in records],
                [loaded] * len(cal_cli.KERNELS))

    monkeypatch.setattr(cal_cli, "measure", measure)


def test_measurements_that_could_not_be_trusted_write_no_target_and_exit_3(
        tmp_path, capsys, monkeypatch):
    _untrusted_measure(monkeypatch)
    out, saved = tmp_path / "cpu.toml", tmp_path / "m.json"
    assert main(["calibrate", "--measure", "-o", str(out), "--save", str(saved)]) == \
        cal_cli.INCONCLUSIVE == 3
    assert not out.exists()
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"apportion: calibrate --measure: {len(cal_cli.KERNELS)} of "
                           f"{len(cal_cli.KERNELS)} kernels could not be trusted (matmul "
                           "256x1024x1024: the load average 7.10 was over the machine's 2 cores)"
                           f": {out} not written, the fit above is of noise")
    assert "noise: interleaved rounds per kernel 3 to 3" in captured.out
    # the measurements themselves are kept, their noise with them
    kept = cal_cli.load(saved)
    assert kept and all(m.noise == {"rounds": 3, "spread": 0.0, "load": [6.8, 7.1]}
                        for m in kept)


def test_a_kernels_tied_splits_settle_on_the_first_within_the_tolerance():
    # splits 1 and 2 within 1% of each other, which of them is faster changing every round:
    # the fastest split taken is the first of the tie, so the measurement still settles
    from apportion.cost import noise

    flip = iter([0.500, 0.505] * 10)
    flop = iter([0.505, 0.500] * 10)
    m = noise.until_stable([lambda: 1.0, lambda: next(flip), lambda: next(flop)],
                           cal_cli.fastest_criteria, noise.Rules(min_rounds=5, max_rounds=20),
                           key=cal_cli.fastest_index, load=lambda: 0.0, cores=2)
    assert m.stable and m.rounds == 5 and cal_cli.fastest_index(np.array(m.least)) == 1
