"""The command line's GPU runs: ``apportion cuda build | run | check``.

* ``apportion cuda build PROG --out DIR`` (target ``gpu`` by default): the plan's parallel IR
  lowered by upstream MLIR to CUDA kernels and a host library, written with random inputs as a
  build (``backends.cuda.build``); needs the ``mlir`` extra and a C compiler driver, no GPU.
* ``apportion cuda run DIR [--results OUT] [--repeat N]``: the build run on this machine's
  NVIDIA GPU (``device_main.py``, which needs only numpy and the driver; exit 2 without one).
* ``apportion cuda check DIR [--results OUT]``: the outputs of a run checked against the
  reference executor on the same inputs (exit 1 when they differ).

A GPU machine without apportion's dependencies runs ``python3
apportion/backends/cuda/device_main.py DIR OUT`` instead of ``cuda run``; ``cuda check`` then
reads OUT where the build was written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from apportion.cli.options import common, param_values, planned_program, torch_model
from apportion.cli.params import check_params, int_in
from apportion.errors import UsageError
from apportion.report.tables import print_checks

#: threads per block of ``cuda build``
DEFAULT_THREADS = 128
#: the most threads a CUDA block has
MAX_THREADS = 1024


def _folder(text: str) -> Path:
    """``--out``: an empty path (an unset ``"$OUTDIR"``) would name the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"the path {text!r} is empty (an unset variable?); "
                                         "name the build's folder")
    return Path(text)


def add_parser(sub: Any) -> None:
    """The ``cuda`` subcommand and its three actions."""
    c = sub.add_parser("cuda", help="build a plan's parallel IR for an NVIDIA GPU, run it there, "
                       "check its outputs")
    acts = c.add_subparsers(dest="action", required=True)
    b = acts.add_parser("build", help="lower the plan (target gpu) to CUDA kernels and a host "
                        "library: a build folder (the mlir extra, no GPU needed)")
    common(b)
    b.set_defaults(target="gpu")
    b.add_argument("--out", type=_folder, required=True,
                   help="the build's folder: new, empty, or a build (replaced once the new "
                        "one is complete); any other folder is refused")
    b.add_argument("--seed", type=int_in(0), default=None,
                   help="seed of the random inputs of a program file (default 0); a --torch "
                        "model runs on its example inputs and weights")
    b.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="a run-time size or symbolic loop count to run at (repeatable)")
    b.add_argument("--chip", default="sm_80", help="the PTX's GPU (default sm_80, which the "
                   "driver compiles for every later GPU too)")
    b.add_argument("--ptx", default="+ptx70", help="the PTX version feature (default +ptx70)")
    b.add_argument("--threads", type=int_in(1, MAX_THREADS), default=DEFAULT_THREADS,
                   help="threads per block: each block's work split over them where that is "
                        f"safe, else one thread (default {DEFAULT_THREADS}; 1..{MAX_THREADS})")
    b.set_defaults(func=_build)
    r = acts.add_parser("run", help="run a build on this machine's NVIDIA GPU")
    r.add_argument("build", type=Path)
    r.add_argument("--results", type=Path, default=None,
                   help="where the outputs go (default: BUILD/results)")
    r.add_argument("--repeat", type=int_in(1), default=1, help="calls to time (default 1)")
    r.set_defaults(func=_run)
    k = acts.add_parser("check", help="check a run's outputs against the reference executor")
    k.add_argument("build", type=Path)
    k.add_argument("--results", type=Path, default=None,
                   help="the run's outputs (default: BUILD/results)")
    k.set_defaults(func=_check)


def _build(args: argparse.Namespace, console: Console) -> int:
    from apportion.backends.cuda.build import build, check_out
    from apportion.backends.cuda.lowering import GpuArch
    from apportion.target.presets import resolve

    check_out(args.out)  # before any work: a folder that is not a build is not replaced
    params = param_values(args.param)
    inputs = None
    if args.torch is not None:
        planned, inputs = _torch_planned(args, resolve(args.target, args.cores), params)
    else:
        planned = planned_program(args)
        check_params(planned.given, planned.target, params, planned.params)
    sizes = {k: v for k, v in params.items() if k in planned.symbols}
    counts = {k: v for k, v in params.items() if k not in sizes}
    built = build(planned.schedule(sizes, counts), args.out, args.seed or 0,
                  GpuArch(args.chip, args.ptx), args.threads, inputs)
    console.print(f"built {built.path}: {planned.program.name}, {built.kernels} kernels of "
                  f"{planned.target.cores} blocks, {built.threaded} of them on "
                  f"{built.threads} threads a block, PTX for {args.chip} "
                  f"({built.build_s:.1f} s)", highlight=False)
    return 0


def _torch_planned(args: argparse.Namespace, target: Any, params: dict[str, int]
                   ) -> tuple[Any, dict[str, Any]]:
    """The ``--torch`` model (or ``.pt2`` program) planned, and its example inputs and
    weights at the ``--param`` sizes: what the build runs, as ``run --torch`` does."""
    from apportion.workflows.torch_model import at_sizes, failures, model_inputs, plan_model

    if args.seed is not None:
        raise UsageError(f"--seed {args.seed}: a --torch model's build runs on the model's "
                         "example inputs and weights, not random ones; leave --seed out")
    if args.partial:
        raise UsageError("cuda build --partial: a build runs every node of the model on the "
                         "GPU; --partial goes with plan, emit, schedule and shard")
    tm = torch_model(args)
    check_params(tm.lowered.program, target, params, ())
    if params:
        tm = at_sizes(tm, params)
    planned = plan_model(tm, target, args.strategy)
    check_params(planned.given, target, params, planned.params)
    with failures(tm, "reading the model's example inputs and weights"):
        inputs = model_inputs(tm)
    return planned, inputs


def _results(args: argparse.Namespace) -> Path:
    if not (args.build / "manifest.json").exists():
        raise UsageError(f"{args.build} is not a cuda build (no manifest.json): make one "
                         "with apportion cuda build")
    return args.results if args.results is not None else args.build / "results"


def _run(args: argparse.Namespace, console: Console) -> int:
    from apportion.backends.cuda.build import run_build

    record = run_build(args.build, _results(args), args.repeat)
    seconds: list[float] = list(record["run_s"])  # type: ignore[call-overload]
    console.print(f"ran {args.build} on {record['device']}: best of {len(seconds)} "
                  f"{min(seconds) * 1e3:.3f} ms", highlight=False)
    return 0


def _check(args: argparse.Namespace, console: Console) -> int:
    from apportion.backends.cuda.build import check_build

    checks = check_build(args.build, _results(args))
    return print_checks(checks, f"the build {args.build.name}, run on the GPU,", console)
