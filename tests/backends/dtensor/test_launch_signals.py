"""A distributed run ended from outside: SIGTERM (a batch system's time limit) on ``apportion run
--mesh ... --backend dtensor`` stops its ranks and removes its folder, with exit status 143 and
one line, as Ctrl-C does; a parent killed outright (SIGKILL, nothing to clean up) takes its
ranks with it instead of leaving them to run as orphans until their timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)"),
]

ROOT = Path(__file__).parents[3]
RUN = ["run", str(ROOT / "examples/mlp.json"), "--mesh", "dp=2", "--backend", "dtensor",
       "--check"]
#: the environment variable that marks every process of one test's run (ranks inherit it)
MARK = "APPORTION_TEST_RUN"
#: generous: a loaded 2-core machine imports torch in each rank slowly; polls end early
DEADLINE_S = 300.0


def _marked(mark: str) -> list[tuple[int, bytes]]:
    """(pid, command line) of every live process whose environment holds ``MARK=mark`` (a
    zombie has neither and is not listed: it runs nothing)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours
            continue
        if f"{MARK}={mark}".encode() in env:
            found.append((int(entry.name), cmd))
    return found


def _ranks(mark: str, parent: int) -> list[int]:
    """The ranks: spawned interpreters (``spawn_main``), not the parent or helpers."""
    return [pid for pid, cmd in _marked(mark) if pid != parent and b"spawn_main" in cmd]


def _poll(what: str, done: Callable[[], bool]) -> None:
    end = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > end:
            raise AssertionError(f"not within {DEADLINE_S:g} s: {what}")
        time.sleep(0.05)


@contextmanager
def _run_with_ranks(tmp: Path) -> Iterator[tuple[subprocess.Popen[str], str, list[int]]]:
    """``apportion run ... --mesh dp=2 --backend dtensor`` started with its temporary folder
    ``tmp``, once both its ranks are running: (the process, its mark, the ranks' pids). Whatever
    the test leaves running is killed at the end."""
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "TMPDIR": str(tmp)}
    cmd = [sys.executable, "-m", "apportion.cli.main", *RUN]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _poll("both ranks running", lambda: len(_ranks(mark, proc.pid)) == 2
              or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()[1]
        yield proc, mark, _ranks(mark, proc.pid)
    finally:
        for pid, _ in _marked(mark):
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()


def _run_folders(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("apportion-dtensor-"))


def test_sigterm_stops_the_ranks_removes_the_run_folder_and_exits_143(tmp_path):
    with _run_with_ranks(tmp_path) as (proc, mark, ranks):
        assert len(_run_folders(tmp_path)) == 1
        for pid in ranks:  # held where they are: the run cannot finish before the signal
            os.kill(pid, signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 143, err
        assert err.strip().splitlines()[-1] == "apportion: terminated (SIGTERM)", err
        assert "Traceback" not in err, err
        _poll("every process of the run ended", lambda: not _marked(mark))
        assert _run_folders(tmp_path) == []


def test_ranks_end_with_a_parent_killed_outright(tmp_path):
    with _run_with_ranks(tmp_path) as (proc, mark, ranks):
        proc.kill()  # SIGKILL: the parent cleans nothing up, its ranks must still go
        proc.wait(timeout=DEADLINE_S)
        _poll(f"ranks {ranks} ended with their parent", lambda: not _ranks(mark, proc.pid))
