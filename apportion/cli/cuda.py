"""The command line's GPU runs: ``apportion cuda build | run | check``.

* ``apportion cuda build PROG --out DIR`` (target ``gpu`` by default): the plan's parallel IR
  lowered by upstream MLIR to CUDA kernels and a host library, written with random inputs as a
  bundle (``backends.cuda.bundle``); needs the ``mlir`` extra and a C compiler driver, no GPU.
* ``apportion cuda run DIR [--results OUT] [--repeat N]``: the bundle run on this machine's
  NVIDIA GPU (``device_main.py``, which needs only numpy and the driver; exit 2 without one).
* ``apportion cuda check DIR [--results OUT]``: the outputs of a run checked against the
  reference executor on the same inputs (exit 1 when they differ).

A GPU machine without apportion's dependencies runs ``python3
apportion/backends/cuda/device_main.py DIR OUT`` instead of ``cuda run``; ``cuda check`` then
reads OUT where the bundle was built.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from apportion.cli.report import print_checks
from apportion.cli.usage import UsageError

#: threads per block of ``cuda build``
DEFAULT_THREADS = 128


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None],
               planned: Callable[[argparse.Namespace], Any],
               params: Callable[[list[str] | None], dict[str, int]]) -> None:
    """The ``cuda`` subcommand and its three actions."""
    c = sub.add_parser("cuda", help="build a plan's parallel IR for an NVIDIA GPU, run it there, "
                       "check its outputs")
    acts = c.add_subparsers(dest="action", required=True)
    b = acts.add_parser("build", help="lower the plan (target gpu) to CUDA kernels and a host "
                        "library: a bundle folder (the mlir extra, no GPU needed)")
    common(b)
    b.set_defaults(target="gpu")
    b.add_argument("--out", type=Path, required=True, help="the bundle's folder (replaced)")
    b.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    b.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="a run-time size or symbolic loop count to run at (repeatable)")
    b.add_argument("--chip", default="sm_80", help="the PTX's GPU (default sm_80, which the "
                   "driver compiles for every later GPU too)")
    b.add_argument("--ptx", default="+ptx70", help="the PTX version feature (default +ptx70)")
    b.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help="threads per block: each block's work split over them where that is "
                        f"safe, else one thread (default {DEFAULT_THREADS}; 1..1024)")
    b.set_defaults(func=lambda a, con: _build(a, con, planned, params))
    r = acts.add_parser("run", help="run a bundle on this machine's NVIDIA GPU")
    r.add_argument("bundle", type=Path)
    r.add_argument("--results", type=Path, default=None,
                   help="where the outputs go (default: BUNDLE/results)")
    r.add_argument("--repeat", type=int, default=1, help="calls to time (default 1)")
    r.set_defaults(func=_run)
    k = acts.add_parser("check", help="check a run's outputs against the reference executor")
    k.add_argument("bundle", type=Path)
    k.add_argument("--results", type=Path, default=None,
                   help="the run's outputs (default: BUNDLE/results)")
    k.set_defaults(func=_check)


def _build(args: argparse.Namespace, console: Console, planned_of: Callable[..., Any],
           params_of: Callable[[list[str] | None], dict[str, int]]) -> int:
    from apportion.backends.cuda.bundle import build_bundle
    from apportion.backends.cuda.lowering import GpuArch

    planned = planned_of(args)
    params = params_of(args.param)
    bundle = build_bundle(planned.program, planned.plan, planned.target, args.out, args.seed,
                          params or None, planned.given if planned.symbols else None,
                          GpuArch(args.chip, args.ptx), args.threads)
    console.print(f"built {bundle.path}: {planned.program.name}, {bundle.kernels} kernels of "
                  f"{planned.target.cores} blocks, {bundle.threaded} of them on "
                  f"{bundle.threads} threads a block, PTX for {args.chip} "
                  f"({bundle.build_s:.1f} s)", highlight=False)
    return 0


def _results(args: argparse.Namespace) -> Path:
    if not (args.bundle / "manifest.json").exists():
        raise UsageError(f"{args.bundle} is not a cuda bundle (no manifest.json): build one "
                         "with apportion cuda build")
    return args.results if args.results is not None else args.bundle / "results"


def _run(args: argparse.Namespace, console: Console) -> int:
    from apportion.backends.cuda.bundle import run_bundle

    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    record = run_bundle(args.bundle, _results(args), args.repeat)
    seconds: list[float] = list(record["run_s"])  # type: ignore[call-overload]
    console.print(f"ran {args.bundle} on {record['device']}: best of {len(seconds)} "
                  f"{min(seconds) * 1e3:.3f} ms", highlight=False)
    return 0


def _check(args: argparse.Namespace, console: Console) -> int:
    from apportion.backends.cuda.bundle import check_bundle

    checks = check_bundle(args.bundle, _results(args))
    return print_checks(checks, f"the bundle {args.bundle.name}, run on the GPU,", console)
