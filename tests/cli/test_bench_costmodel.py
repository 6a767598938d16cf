"""``bench costmodel``: --cores and --limit, which pick the programs timed on a cpu target, are
refused where they would be dropped, and core counts this machine lacks are refused."""

from __future__ import annotations

import pytest

from apportion.cli import bench_costmodel
from apportion.cli.main import main


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_costmodel.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "shipped")  # no host table measured


@pytest.mark.parametrize(("argv", "message"), [
    (["--cores", "8"], "--cores applies to bench costmodel --target cpu (programs timed on "
                       "this machine); target 'spyre' is compared with its measured kernels"),
    (["--limit", "2"], "--limit applies to bench costmodel --target cpu"),
    (["--target", "cpu", "--cores", "1", "3"], "--cores 3: bench costmodel --target cpu times "
                                               "programs on this machine, which has 2 cores"),
    (["--target", "cpu", "--cores", "99999999999999999999"], "--cores 99999999999999999999: "),
])
def test_an_option_the_suite_would_drop_or_cannot_time_is_one_error_line(argv, message, capsys,
                                                                        two_cores):
    assert main(["bench", "costmodel", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"apportion: error: {message}"), err
