"""tools/suite_time.py, the CI check that the default suite fits its time budget: judged on
CPU seconds per core, so a loaded machine does not fail it and a grown suite does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "suite_time.py"
# half a second of CPU work in a child process, whatever the machine's load
BURN = [sys.executable, "-c",
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"]


def budget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_command_whose_cpu_work_fits_the_budget_passes_and_reports_its_time() -> None:
    done = budget("--budget", "100000", "--cores", "2", "--", *BURN)
    assert done.returncode == 0, done.stderr
    assert "suite time: wall" in done.stdout and "budget 100000 s" in done.stdout


def test_a_command_whose_cpu_work_per_core_passes_the_budget_fails() -> None:
    done = budget("--budget", "0.01", "--cores", "1", "--", *BURN)
    assert done.returncode == 1
    assert "over the budget" in done.stderr


def test_a_failing_command_keeps_its_own_exit_status() -> None:
    done = budget("--budget", "100000", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert done.returncode == 3


def test_no_command_is_a_usage_error() -> None:
    assert budget("--budget", "5").returncode == 2
