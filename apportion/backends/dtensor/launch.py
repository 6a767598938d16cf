"""Launching the ranks of a distributed run and watching them: one spawned process per
device, meeting through a file store in the run's temporary folder, and what ends a run.

``launch(payload, world, ...)`` writes the payload, starts the ranks (each runs ``rank.worker``),
waits for them and returns what rank 0 handed back. A failure on one rank (an exception, a
killed process) ends the whole run with an ``ExecutionError`` naming the root-cause rank, where
it was and the error. A rank that raises writes a failure record (``RankFailure``: its
wall-clock time, where it was, the error, and whether the error is only a consequence of a peer
dying or hanging: a connection reset, closed or refused, a broken pipe, a timed-out collective,
``is_peer_error``); a rank that dies without one (a signal, an exit status) is dated when the
parent sees it exit. Once one rank has failed the parent keeps collecting until every rank has
exited or ``GRACE_S`` has passed (a rank SIGKILLed mid-collective leaves its peers a reset
connection, so they end promptly), then stops the rest and names ``root_cause``: the earliest
failure of a rank's own (an exception or a signal) over every peer that only saw a broken
connection, which is named only when nothing else failed, as torchrun's elastic agent picks
the first failure by timestamp. A run that outlives ``timeout_s`` is killed the same way; the
process group's own timeout is as long, so a rank blocked in a collective never waits for
ever. The ranks meet through a file store in the run's temporary folder (no TCP port is picked
and then raced for), and that folder is removed when the run ends, whether it succeeds, fails,
times out or is interrupted (Ctrl-C, or SIGTERM where the ``apportion`` command raises it as
Ctrl-C). Each rank ends with the parent: a parent killed outright (SIGKILL) takes its ranks with
it rather than leaving them to run on as orphans until their timeout (``end_with_parent``). The
ranks start without the current directory on their ``sys.path`` (``runtime.isolated``).

>>> root_cause([RankFailure(0, 2.0, error="RuntimeError: reset", peer=True),
...             RankFailure(1, 3.0, exitcode=-9)]).rank
1
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.errors import ExecutionError
from apportion.runtime.isolated import safe_path_children


def launch(payload: Any, world: int, timeout_s: float, name: str,
           worker: Callable[..., None], args: Sequence[Any] = ()) -> Any:
    """Run ``worker(rank, world, payload_path, folder, timeout_s, *args)`` in ``world``
    spawned processes and return what rank 0 wrote (``write_result``); ``name`` names the run
    in errors (see the module docstring for failures and timeouts)."""
    import torch.multiprocessing as mp

    tmp = Path(tempfile.mkdtemp(prefix="apportion-dtensor-"))
    procs: list[Any] = []
    start = time.monotonic()
    # everything after mkdtemp is inside the try: the folder goes whatever ends the run (an
    # error, the timeout, Ctrl-C while the ranks start or run)
    try:
        path = tmp / "payload.pkl"
        with path.open("wb") as f:
            pickle.dump(payload, f)
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank_main, args=(os.getpid(), worker, r, world, str(path),
                                                      str(tmp), timeout_s, *args), daemon=True)
                 for r in range(world)]
        with safe_path_children():
            for p in procs:
                p.start()
        _watch(procs, tmp, start + timeout_s, timeout_s, name)
        with (tmp / "result.pkl").open("rb") as f:
            return pickle.load(f)
    finally:
        try:
            _stop(procs)
        finally:  # a second Ctrl-C while the ranks are stopped still removes the folder
            shutil.rmtree(tmp, ignore_errors=True)


def _rank_main(parent: int, worker: Callable[..., None], *args: Any) -> None:
    """A rank's process: bound to end with ``parent``, then ``worker(*args)``."""
    end_with_parent(parent)
    worker(*args)


#: ``prctl``'s request for a signal when the parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int) -> None:
    """Make this process end when ``parent`` does: on Linux the kernel sends it SIGKILL
    (``prctl(PR_SET_PDEATHSIG)``), elsewhere a thread watches the parent. A parent that died
    before the request ends this process at once."""
    bound = sys.platform.startswith("linux") and ctypes.CDLL(None).prctl(
        PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0),
        ctypes.c_ulong(0)) == 0
    if not bound:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def write_result(outdir: str, result: Any) -> None:
    """Rank 0's result for the parent, written whole or not at all."""
    tmp = Path(outdir) / "result.tmp"
    with tmp.open("wb") as f:
        pickle.dump(result, f)
    tmp.rename(Path(outdir) / "result.pkl")


def mark_done(outdir: str, rank: int) -> None:
    """Mark ``rank`` past its last collective: what its teardown does now cannot change the
    result (gloo's threads have aborted a rank's exit under load), so the parent counts a rank
    with this mark as done whatever its exit status."""
    Path(outdir, f"rank{rank}.done").write_text("")


def mark_at(outdir: str, rank: int, where: str) -> None:
    """Where ``rank`` is now, read by the parent if the rank dies without a record."""
    _write_atomic(Path(outdir, f"rank{rank}.at"), where)


def _stop(procs: Sequence[Any]) -> None:
    """Kill and reap every started rank, so none writes into the run's folder once it is
    removed (a process never started has no pid and nothing to stop)."""
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.kill()
    for p in started:
        p.join(timeout=5)



#: seconds the parent keeps collecting the other ranks' failures after the first it sees: a
#: rank that raised has written its record before it exits, and its peers see the broken
#: connection at once, so this bounds only a peer busy outside any collective (then stopped)
GRACE_S = 5.0

#: what a rank raises when a peer died or hung rather than for a fault of its own (gloo's and
#: NCCL's texts for a closed or reset connection, a broken pipe, a timed-out collective)
_PEER_TEXT = re.compile(
    r"connection (reset|closed|refused|aborted)|closed by peer|broken pipe|tim(ed|ing) out|"
    r"socket closed|end of file|communicator was aborted|remote process exited", re.IGNORECASE)
_PEER_TYPES = frozenset({"ConnectionError", "TimeoutError", "DistNetworkError",
                         "DistStoreError"})


def is_peer_error(types: Sequence[str], message: str) -> bool:
    """Whether an exception (the names of its class and bases, its message) is only what a
    rank saw of a peer dying or hanging: a connection error, a store or network error, or a
    backend error whose text says the connection broke or a collective timed out."""
    return bool(_PEER_TYPES.intersection(types)) or bool(_PEER_TEXT.search(message))


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure as the parent collected it: from the rank's own record (``error``,
    ``peer``) or, for a rank that left none, from its exit status (``exitcode``, negative for
    a signal). ``time`` is wall-clock seconds: when the rank recorded it, or when the parent saw
    the rank exit (no later than that for a signal)."""

    rank: int
    time: float
    where: str = ""
    #: ``Type: message`` (its first line) of what the rank raised
    error: str | None = None
    #: the error is a consequence of a peer dying or hanging (``is_peer_error``)
    peer: bool = False
    exitcode: int | None = None

    def describe(self) -> str:
        """``failed at op 'x': Type: message``, ``was killed by signal SIGKILL at op 'x'`` or
        ``exited with status 3 at op 'x'``."""
        at = f" {self.where}" if self.where else ""
        if self.error is not None:
            return f"failed{at}: {self.error}"
        code = self.exitcode if self.exitcode is not None else 1
        if code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = str(-code)
            return f"was killed by signal {sig}{at}"
        return f"exited with status {code}{at}"


def root_cause(failures: Sequence[RankFailure]) -> RankFailure:
    """The failure to report: the earliest of those a rank had on its own (an exception of its
    own, a signal, an exit status), and only when there is none the earliest peer error; equal
    times go to the lower rank. A peer error dated before a kill still loses to it: the killed
    rank was dated when the parent saw it exit, and its peers broke because it did."""
    if not failures:
        raise ValueError("root_cause needs at least one failure")
    return min(failures, key=lambda f: (f.peer, f.time, f.rank))


def _watch(procs: list[Any], tmp: Path, deadline: float, timeout_s: float, name: str) -> None:
    """Wait for every rank; once one fails, collect the others' failures (every rank exited or
    ``GRACE_S`` passed), stop the rest and raise naming the root cause; at the deadline, stop
    every rank and raise."""
    from multiprocessing.connection import wait

    seen: dict[int, float] = {}  # failed rank -> wall-clock time the parent saw it exit
    first: float | None = None
    while True:
        codes = [0 if c not in (None, 0) and (tmp / f"rank{r}.done").exists() else c
                 for r, c in enumerate(p.exitcode for p in procs)]
        now = time.time()
        for r, c in enumerate(codes):
            if c not in (None, 0):
                seen.setdefault(r, now)
        if seen:
            first = time.monotonic() if first is None else first
            if all(c is not None for c in codes) or time.monotonic() > first + GRACE_S:
                _stop(procs)
                # a rank stopped here after writing its record (it was on its way out) counts
                recorded = {r for r in range(len(procs)) if (tmp / f"rank{r}.err").exists()}
                failures = [_failure(tmp, r, codes[r], seen.get(r, now))
                            for r in sorted(seen.keys() | recorded)]
                f = root_cause(failures)
                note = (" (an error of communication with a peer, and no rank failed on its "
                        "own)" if f.peer else "")
                raise ExecutionError(f"dtensor run of {name}: rank {f.rank} of {len(procs)} "
                                     f"{f.describe()}{note}; the other ranks were stopped")
        elif all(c == 0 for c in codes):
            return
        elif time.monotonic() > deadline:
            alive = [r for r, c in enumerate(codes) if c is None]
            _stop(procs)
            raise ExecutionError(f"dtensor run of {name} timed out after {timeout_s:g} s; "
                                 f"ranks {alive} were still running and were stopped")
        # woken at once when a rank exits (its time is then close to its death); the timeout
        # picks up the .done marks and the deadlines
        wait([p.sentinel for p, c in zip(procs, codes, strict=True) if c is None], 0.05)


def _failure(tmp: Path, rank: int, code: int | None, seen: float) -> RankFailure:
    """A rank's failure from its record, or else from its exit status and last position."""
    err = tmp / f"rank{rank}.err"
    if err.exists():
        rec = json.loads(err.read_text())
        return RankFailure(rank, float(rec["time"]), rec["where"], rec["error"],
                           is_peer_error(rec["types"], rec["message"]))
    where = tmp / f"rank{rank}.at"
    at = where.read_text().strip() if where.exists() else ""
    return RankFailure(rank, seen, at, exitcode=code)


def _write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: the parent reads it while the rank runs or dies."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)



def record_failure(outdir: str, rank: int, where: str, e: BaseException) -> None:
    """Write the rank's failure record (``rank{r}.err``, read by ``_failure``)."""
    # dated before anything else: the parent orders the ranks' failures by this time
    now = time.time()
    last = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
    record = {"time": now, "where": where, "error": last, "message": str(e),
              "types": [c.__name__ for c in type(e).__mro__],
              "traceback": "".join(traceback.format_exception(e))}
    _write_atomic(Path(outdir, f"rank{rank}.err"), json.dumps(record))

