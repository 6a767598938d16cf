"""Run a test command and fail when its work would not fit the time budget on a quiet machine.

Wall time says little on a loaded machine (another job on the same cores doubles it), so the
verdict is judged on CPU time: the user and system seconds of the command and every process it
waited for (pytest's xdist workers and the CLIs the tests start), divided by the cores the suite
runs on. That is the least wall time the same work takes on a quiet machine of that many cores;
when it passes the budget the suite has grown too long, whatever the load. Both figures are
printed, with the load average before and after.

    .venv/bin/python tools/suite_time.py --budget 600 --cores 2 -- make test

Exit status: the command's own when it failed, 1 when it passed but over the budget, else 0.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time


def children_cpu_seconds() -> float:
    """User and system CPU seconds of every waited-for descendant so far."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=600.0,
                        help="seconds the suite may take on a quiet machine (default 600)")
    parser.add_argument("--cores", type=int, default=2,
                        help="cores the suite runs on (pytest -n; default 2)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    if args.budget <= 0 or args.cores < 1:
        parser.error("--budget must be positive and --cores at least 1")
    load_before = os.getloadavg()[0]
    cpu_before, start = children_cpu_seconds(), time.monotonic()
    status = subprocess.call(command)
    wall = time.monotonic() - start
    cpu = children_cpu_seconds() - cpu_before
    load_after = os.getloadavg()[0]
    least = cpu / args.cores
    print(f"suite time: wall {wall:.0f} s, CPU {cpu:.0f} s, so at least {least:.0f} s on a "
          f"quiet {args.cores}-core machine (budget {args.budget:.0f} s); load average "
          f"{load_before:.1f} before, {load_after:.1f} after", flush=True)
    if status != 0:
        return status
    if least > args.budget:
        print(f"suite time: over the budget: {least:.0f} s of CPU work per core against "
              f"{args.budget:.0f} s; mark the slowest tests slow (pytest --durations=30 shows "
              "them) or make them cheaper", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
