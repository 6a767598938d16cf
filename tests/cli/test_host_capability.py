"""``calibrate --measure`` and ``bench costmodel``'s timed programs ask whether the target is this
machine (``Target.host``, the cpu preset's), not whether it is named ``cpu``: a file from the
cpu preset under a name of its own is timed here, a device target renamed ``cpu`` is not."""

from __future__ import annotations

import pytest

from apportion.bench.costmodel import check_options
from apportion.cli.main import main
from apportion.cost.calibrate import Measurement
from apportion.errors import CalibrationError, UsageError
from apportion.frontend.json_format import from_dict
from apportion.target.presets import resolve
from apportion.workflows.calibration import context


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "shipped")  # no host table measured
    mine = tmp_path / "mine.toml"
    mine.write_text('preset = "cpu"\nname = "mine"\n')
    renamed = tmp_path / "renamed.toml"
    renamed.write_text('preset = "spyre"\nname = "cpu"\n')
    return str(mine), str(renamed)


def test_calibrate_measure_refuses_a_device_target_named_cpu(files, capsys):
    _, renamed = files
    assert main(["calibrate", "--measure", "--target", renamed]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "--measure times this machine's CPU, so it calibrates only a cpu target, not 'cpu'" \
        in err


def test_bench_costmodel_times_programs_on_a_host_target_of_any_name(files):
    mine, renamed = files
    check_options(resolve(mine), [1], None)  # timed here: --cores is taken
    with pytest.raises(UsageError, match="--cores applies to bench costmodel --target cpu"):
        check_options(resolve(renamed), [1], None)


def test_a_host_target_of_any_name_widens_to_a_records_cores(files):
    mine, renamed = files
    record = Measurement(program=from_dict({
        "format": "apportion.program/1", "name": "mm",
        "tensors": {"x": {"shape": [64, 64], "dtype": "float32"},
                    "w": {"shape": [64, 64], "dtype": "float32"}},
        "inputs": ["x", "w"], "outputs": ["y"],
        "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}]}),
        op="mm", splits={"m": 1, "n": 1, "k": 1}, cores=64, time_us=10.0)
    assert context(resolve(mine), record).target.max_cores >= 64
    with pytest.raises(CalibrationError, match="64 is more than the 32 cores"):
        context(resolve(renamed), record)  # a device's max_cores is its limit, whatever its name
