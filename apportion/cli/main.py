"""The `apportion` command: plan, run, emit, shard, bench, demo, calibrate.

Bad input ends in exit status 2 and one line on stderr, ``apportion: error: ...``, naming the
option, path, op, tensor, dim or limit at fault. Every value that can be checked before the work
is checked first: options, output paths (``--plot``, ``--json``), ``--param`` values against the
program's symbolic loop counts, and the memory a run needs at least.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console

from apportion.backends import BACKENDS
from apportion.cli import cuda as cuda_cli
from apportion.cli import options
from apportion.cli import shard as shard_cli
from apportion.cli.options import (
    DEFAULT,
    common,
    load_program,
    param_values,
    planned_program,
    plot_folder,
    torch_model,
)
from apportion.cli.params import (
    MAX_THREADS,
    check_params,
    int_in,
    loop_symbols,
    seconds,
    sizes_text,
)
from apportion.errors import ApportionError, UsageError
from apportion.ir.program import Program
from apportion.report.files import output_path
from apportion.report.tables import print_checks
from apportion.target.presets import resolve

if TYPE_CHECKING:
    from apportion.planned import PlannedProgram


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, ``apportion: error: ...``, with exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"apportion: error: {message} (see '{self.prog} --help')\n")


class _Console(Console):
    """A rich console that lets a closed pipe reach ``main`` (rich's own exits with 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def _check_memory(program: Program, check: bool) -> None:
    """Refuse, before any work, a run whose inputs and outputs alone exceed this machine's
    memory (``--check`` holds the outputs twice); a lower bound, so it never refuses a run
    that would fit."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf: the run finds out itself
        return
    whole = dict.fromkeys([*program.inputs, *program.outputs])
    need = sum(program.tensor(n).nbytes for n in whole)
    if check:
        need += sum(program.tensor(n).nbytes for n in program.outputs)
    if need > memory:
        big = max((program.tensor(n) for n in whole), key=lambda t: t.nbytes)
        raise UsageError(f"running program {program.name!r} needs at least "
                         f"{need / 2**30:.1f} GiB for its inputs and outputs; this machine has "
                         f"{memory / 2**30:.1f} GiB (largest: tensor {big.name!r} "
                         f"{list(big.shape)} {big.dtype})")


def _drawable(args: argparse.Namespace, program: Program) -> tuple[str, ...]:
    """The ops ``--plot`` may draw (a non-scalar output); checks ``--op`` is one of them."""
    drawable = tuple(o.name for o in program.ops if o.out.dims)
    if args.op is not None:
        if args.op not in program.op_map:
            raise UsageError(f"--op {args.op!r}: program {program.name!r} has no such op; "
                             f"ops: {', '.join(program.op_map)}")
        if args.op not in drawable:
            raise UsageError(f"--op {args.op!r} has a scalar output, nothing to draw; ops to "
                             f"draw: {', '.join(drawable) or 'none'}")
    elif not drawable:
        raise UsageError(f"--plot: every op of program {program.name!r} has a scalar output; "
                         "nothing to draw")
    return drawable


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from apportion.plans.export import coefficient_splits
    from apportion.report.tables import print_report

    if args.torch is not None:
        from apportion.cli.model import cmd_plan_torch

        return cmd_plan_torch(args, console)

    plot: Path | None = None
    plot_dir: Path | None = None
    if args.plot is not None:  # the path first: a bad one is refused before any loading
        from apportion.report.plot import check_plot_path, is_plot_file

        if is_plot_file(args.plot):
            check_plot_path(Path(args.plot))  # the extension before any folder is made
            plot = output_path("--plot", args.plot, make_folders=True)
        else:
            plot_dir = plot_folder(args.plot)
    elif args.op is not None:
        raise UsageError(f"--op {args.op!r} picks the op to draw: it needs --plot FILE or DIR")
    program = load_program(args.program)
    drawable = _drawable(args, program) if args.plot is not None else ()
    planned = options.plan_program(program, resolve(args.target, args.cores), args)
    if args.format == "json":
        print(planned.to_json())
    elif args.format == "coeffs":
        print(json.dumps([coefficient_splits(planned.program, planned.plan, o)
                          for o in planned.ops], indent=2))
    else:
        print_report(planned.plan, planned.target, console)
    if plot is not None:
        from apportion.report.plot import plot_op

        name = args.op or max((o for o in planned.ops if o.name in drawable),
                              key=lambda o: o.predicted_time_us).name
        path = plot_op(planned.op(name), planned.program.op(name).out.dims, plot)
        console.print(f"wrote {path} (op {name})", highlight=False)
    elif plot_dir is not None:  # one picture per op (the ops of a split-K rewrite included)
        from apportion.report.plot import plot_file_name, plot_op

        names = [args.op] if args.op else [o.name for o in planned.program.ops if o.out.dims]
        for name in names:
            plot_op(planned.op(name), planned.program.op(name).out.dims,
                    plot_dir / plot_file_name(name))
        console.print(f"wrote {len(names)} picture{'s' if len(names) != 1 else ''} to "
                      f"{plot_dir}{os.sep} (one per op: {plot_file_name(names[0])}"
                      f"{', ...' if len(names) > 1 else ''})", highlight=False)
    return 0


def _check_run_backend(args: argparse.Namespace) -> None:
    """Refuse, naming the documented limit, a ``--backend`` that cannot run this: ``bundle``
    emits, ``dtensor`` runs sharding plans (``--mesh``)."""
    from apportion.limits import cite

    if args.backend == "bundle":
        raise UsageError("--backend bundle emits, it does not run: apportion emit --bundle (or "
                         f"--unrolled, --loopspec) {cite('bundle-emits-only')}")
    if args.backend == "dtensor" and args.mesh is None:
        raise UsageError("--backend dtensor runs a program sharded over a mesh of devices: "
                         f"give --mesh (e.g. --mesh tp=2) {cite('dtensor-needs-mesh')}")


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    _check_run_backend(args)
    if args.mesh is not None:  # sharded over devices
        from apportion.cli.shard import cmd_run_sharded

        return cmd_run_sharded(args, console, print_checks)
    if args.torch is not None:
        from apportion.cli.model import cmd_run_torch

        return cmd_run_torch(args, console)
    params = param_values(args.param)
    program = load_program(args.program)
    target = resolve(args.target, args.cores)
    check_params(program, target, params, loop_symbols(program))
    _check_memory(program.bind({k: v for k, v in params.items() if k in program.symbol_map}),
                  args.check)
    planned = options.plan_program(program, target, args)
    check_params(program, target, params, planned.params)
    if program.symbols:
        sizes = {k: v for k, v in params.items() if k in program.symbol_map}
        console.print(f"run-time sizes: {sizes_text(program, sizes)}", highlight=False)
    if args.backend == "iree":
        return _run_iree(planned, args, params, console)
    with_torch = ", torch" if args.backend == "torch" else ""
    if not args.check:
        planned.run(threads=args.threads, params=params, backend=args.backend)
        console.print(f"ran {len(planned.ops)} ops of {planned.program.name} over "
                      f"{planned.plan.cores} cores" + (" with torch" if with_torch else ""))
        return 0
    checks = planned.check(seed=args.seed, threads=args.threads, params=params,
                           backend=args.backend)
    return print_checks(checks, f"planned run of {planned.program.name} ({args.strategy}, "
                        f"{planned.plan.cores} cores{with_torch})", console)


def _run_iree(planned: PlannedProgram, args: argparse.Namespace, params: dict[str, int],
              console: Console) -> int:
    """``run --backend iree``: the plan's parallel IR compiled (or taken from the cache) and run
    by IREE on the CPU; with ``--check``, the reference backend's check lines."""
    from apportion.cli.progress import progress
    from apportion.workflows.iree import run_in_iree

    if args.threads is not None:
        raise UsageError("--threads applies to the reference backend; IREE uses its own "
                         "task pool")
    p = planned.program
    doing = ("compiling {} with IREE, running it and the unplanned program" if args.check else
             "compiling {} with IREE and running it")
    with progress(console, doing.format(p.name)):
        run = run_in_iree(planned, params, args.seed, args.check)
    if run.checks is not None:
        status = print_checks(run.checks, f"IREE run of {p.name} ({args.strategy}, "
                              f"{planned.plan.cores} cores)", console)
    else:
        console.print(f"ran {len(planned.ops)} ops of {p.name} over {planned.plan.cores} cores "
                      "in IREE")
        status = 0
    how = "taken from the cache" if run.cached else f"compiled in {run.compile_s:.2f} s"
    console.print(f"IREE module (llvm-cpu) {how} ({_home_short(run.cache_dir)}); ran in "
                  f"{run.run_s:.3f} s", highlight=False)
    return status


def _home_short(path: Path) -> str:
    """``path`` with the home folder written ``~`` (``~/.cache/apportion/iree``)."""
    try:
        return str(Path("~") / path.relative_to(Path.home()))
    except (ValueError, RuntimeError):  # outside the home folder, or no home folder
        return str(path)


def cmd_emit(args: argparse.Namespace, console: Console) -> int:
    from apportion.backends.bundle.spec_text import to_json, to_source

    if args.mesh is not None or args.shard:  # the per-device programs of a sharding
        from apportion.cli.shard import cmd_emit_sharded

        return cmd_emit_sharded(args, console)

    if args.torch is not None:
        from apportion.workflows.torch_model import plan_model

        planned = plan_model(torch_model(args), resolve(args.target, args.cores),
                             args.strategy)
    else:
        planned = planned_program(args, param_values(args.param))
    params = param_values(args.param)
    check_params(planned.given, planned.target, params, ())
    sizes = {k: v for k, v in params.items() if k in planned.given.symbol_map}
    if set(params) - set(sizes):
        name = sorted(set(params) - set(sizes))[0]
        raise UsageError(f"--param {name}: emit takes run-time sizes only; symbolic loop "
                         "counts stay symbolic in the emitted loops")
    if args.forall:  # parses and verifies before it is printed; covers every size
        if sizes:
            raise UsageError("emit --forall covers every run-time size; --param applies to "
                             "--bundle, --unrolled and --loopspec")
        print(planned.forall_mlir(), end="")
        return 0
    if planned.symbols:
        missing = [n for n in planned.symbols if n not in sizes]
        if missing:
            flags = " ".join(f"--param {n}=N" for n in missing)
            raise UsageError(f"program {planned.given.name!r} has run-time sizes "
                             f"{', '.join(missing)}: the loop bundle and LoopSpec launch "
                             f"concrete slices, pass {flags} (emit --forall covers every size)")
        planned = planned.at(sizes)
    if args.loopspec:
        print(to_source(planned.loopspec()), end="")
    elif args.loopspec_json:
        print(to_json(planned.loopspec()))
    else:  # --bundle or --unrolled: the text parses and verifies before it is printed
        print(planned.bundle_mlir(unrolled=args.unrolled), end="")
    return 0


def cmd_schedule(args: argparse.Namespace, console: Console) -> int:
    """The plan lowered to its schedule (``schedule.lower``), as text: every launch's workers
    and boxes, loops, accumulator steps and buffers, at the ``--param`` sizes and counts."""
    if args.mesh is not None:  # sharded over devices: the mesh schedule
        from apportion.cli.shard import cmd_schedule_sharded

        return cmd_schedule_sharded(args, console)
    if args.torch is not None:
        from apportion.workflows.torch_model import plan_model

        planned = plan_model(torch_model(args), resolve(args.target, args.cores),
                             args.strategy)
    else:
        planned = planned_program(args, param_values(args.param))
    params = param_values(args.param)
    check_params(planned.given, planned.target, params, planned.params)
    sizes = {k: v for k, v in params.items() if k in planned.given.symbol_map}
    counts = {k: v for k, v in params.items() if k not in sizes}
    print(planned.schedule(sizes, counts))
    return 0


#: the bench suites, by name: each module's ``SUITE`` (``bench/harness.py``)
BENCH_SUITES = ("workdiv", "tiling", "costmodel", "scale", "splitk", "e2e", "sharding",
                "conformance", "fullsize", "forall", "upstream")


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    import importlib

    from apportion.bench.harness import run_suite

    suite = importlib.import_module(f"apportion.bench.{args.suite}").SUITE
    return run_suite(suite, args, console)


def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    """``apportion calibrate``: every option, path and the measurements checked before the fit."""
    from apportion.cli import calibrate

    if args.measure == (args.measurements is not None):
        raise UsageError("give a measurements file or --measure (time this machine), "
                         "one of the two")
    for flag, value in (("--save", args.save), ("--cores", args.cores)):
        if value is not None and not args.measure:
            raise UsageError(f"{flag} goes with --measure")
    out = output_path("-o", args.output) if args.output is not None else None
    save = output_path("--save", args.save) if args.save is not None else None
    here = os.cpu_count() or 1
    if args.cores is not None and args.cores > here:  # one thread per core: no more than here
        raise UsageError(f"--cores {args.cores}: --measure times this machine's cores, and it "
                         f"has {here}")
    spec = args.target or ("cpu" if args.measure else "spyre")
    target = resolve(spec)
    if args.measure and not target.host:  # a target of this machine, whatever its name
        raise UsageError(f"--measure times this machine's CPU, so it calibrates only a cpu "
                         f"target, not {target.name!r}: use --target cpu or a target file with "
                         f"preset = \"cpu\"")
    return calibrate.command(args.measurements, target, spec, args.fit, out, save, args.cores,
                             console)


def build_parser() -> argparse.ArgumentParser:
    """The ``apportion`` command's parser: one function per subcommand adds its options, in the
    order ``--help`` lists them."""
    parser = _Parser(prog="apportion", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_plan_parser, _run_parser, _emit_parser, _schedule_parser):
        add(sub)
    shard_cli.add_parser(sub, common)
    cuda_cli.add_parser(sub)
    for add in (_bench_parser, _calibrate_parser, _demo_parser):
        add(sub)
    return parser


def _plan_parser(sub: Any) -> None:
    """``apportion plan``: the report, plan JSON or coefficients, and the pictures."""
    p = sub.add_parser("plan", help="plan a program and print the report or plan JSON")
    common(p)
    p.add_argument("--format", choices=("table", "json", "coeffs"), default="table")
    p.add_argument("--plot", metavar="FILE.png|DIR",
                   help="draw which core computes which block: to FILE (the format follows "
                        "the extension: .png, .pdf, .svg, ...) the slowest op or --op; to a "
                        "folder DIR (a path without a picture extension) one OP.png per op; "
                        "with --torch, DIR/utilization.png and DIR/largest_op.png. Missing "
                        "folders are made")
    p.add_argument("--op", help="with --plot: the op to draw (default: the slowest)")
    p.set_defaults(func=cmd_plan)


def _run_parser(sub: Any) -> None:
    """``apportion run``: the plan run by a backend, checked with ``--check``."""
    r = sub.add_parser("run", help="execute the plan slice by slice")
    common(r)
    r.add_argument("--check", action="store_true", help="compare with the unplanned program")
    r.add_argument("--threads", type=int_in(1, MAX_THREADS), default=None,
                   help="run cores concurrently")
    r.add_argument("--seed", type=int_in(0), default=0,
                   help="seed of the random inputs (default 0)")
    r.add_argument("--param", action="append", metavar="NAME=COUNT",
                   help="value of a symbolic loop count, e.g. --param T=4 (repeatable); with "
                        "--mesh, a symbolic mesh axis size (dp=N~4) or run-time size to bind")
    r.add_argument("--backend", choices=tuple(BACKENDS), default="reference",
                   help="reference: numpy, core slice by core slice; torch: PyTorch kernels, "
                        "an op's core slices on --threads threads; iree: the parallel IR "
                        "(emit --forall) compiled and run by IREE on the CPU; openmp: the same IR "
                        "lowered by upstream MLIR, each forall an OpenMP loop on --threads "
                        "threads (the mlir extra); dtensor (with "
                        "--mesh): one process per device on torch.distributed; bundle emits "
                        "(emit --bundle) and is refused here. Limits: docs/limits.md")
    shard_cli.add_mesh_options(r)
    r.add_argument("--timeout", type=seconds, default=300.0,
                   help="--backend dtensor: seconds before every rank is stopped (default 300)")
    r.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="--backend dtensor: cpu (gloo), cuda (nccl, one GPU per device of the "
                        "mesh) or auto (cuda where there is a GPU per device; default)")
    r.set_defaults(func=cmd_run)


def _emit_parser(sub: Any) -> None:
    """``apportion emit``: the plan as MLIR (loop bundle, unrolled, parallel IR, shard forms)
    or LoopSpec."""
    e = sub.add_parser("emit", help="print the plan as a loop bundle (MLIR) or LoopSpec program")
    common(e)
    form = e.add_mutually_exclusive_group(required=True)
    form.add_argument("--bundle", action="store_true", help="MLIR: scf.for loops of launches")
    form.add_argument("--unrolled", action="store_true",
                      help="MLIR: every iteration's launch with constant addresses")
    form.add_argument("--loopspec", action="store_true", help="LoopSpec program as Python source")
    form.add_argument("--loopspec-json", action="store_true", help="LoopSpec program as JSON")
    form.add_argument("--forall", action="store_true",
                      help="MLIR: thread-first parallel IR on tensors (scf.forall per op); "
                           "with --mesh, every device's programs")
    form.add_argument("--shard-form", dest="shard", default=None,
                      choices=("annotated", "propagated", "partitioned", "unrolled", "dynamic"),
                      help="with --mesh: the sharded program in upstream MLIR's shard dialect, "
                           "verified by upstream MLIR 22 (the mlir extra): the user's "
                           "annotations, every tensor's sharding, the SPMD form with "
                           "collectives, one function per device with wrappers, or (a "
                           "symbolic mesh) per-shard functions looped over the run-time "
                           "device list")
    shard_cli.add_mesh_options(e)
    e.add_argument("--param", action="append", metavar="NAME=SIZE",
                   help="a run-time size to emit the loop bundle or LoopSpec at, e.g. "
                        "--param K=4096 (repeatable); with --mesh, a symbolic mesh axis size")
    e.set_defaults(func=cmd_emit)


def _schedule_parser(sub: Any) -> None:
    """``apportion schedule``: the plan lowered to its schedule, as text."""
    sc = sub.add_parser("schedule", help="print the plan lowered to its schedule: every "
                        "launch's workers, boxes and regions, loops and buffers")
    common(sc)
    sc.add_argument("--param", action="append", metavar="NAME=VALUE",
                    help="a symbolic loop count or run-time size to lower at, e.g. --param "
                         "T=4 (repeatable); with --mesh, a symbolic mesh axis size too")
    shard_cli.add_mesh_options(sc)
    sc.set_defaults(func=cmd_schedule)


def _bench_parser(sub: Any) -> None:
    """``apportion bench SUITE``: the options the suites take (``bench.harness.OPTIONS``)."""
    b = sub.add_parser("bench", help=f"benchmarks: {', '.join(BENCH_SUITES)}")
    b.add_argument("suite", choices=BENCH_SUITES)
    b.add_argument("--cores", type=int_in(1), nargs="+", default=None,
                   help="core counts (spyre: 1..32; default 32 24 for workdiv, 32 for tiling "
                        "and e2e; forall: the plans' workers, default 8)")
    b.add_argument("--models", default=None, help="models.json (default: the packaged copy)")
    b.add_argument("--limit", type=int_in(1), default=None,
                   help="only the first N op shapes (workdiv), blocks (tiling), rows (scale) "
                        "or models (e2e: mlp, llama, gpt2)")
    b.add_argument("--threads", type=int_in(1, MAX_THREADS), default=None,
                   help="e2e: threads of the torch executor and of eager PyTorch (default 1); "
                        "forall: OpenMP threads of the parallel run (default: the cores)")
    b.add_argument("--repeat", type=int_in(1), default=None,
                   help="e2e: timed runs per side, the fastest and median reported (default 5); "
                        "forall: timed rounds (default 5)")
    b.add_argument("--n", type=int_in(1), default=None,
                   help="conformance: random programs to run (seeds S..S+N-1 of --seed S; "
                        "default 100), on one device and sharded over a random mesh; upstream: "
                        "random mesh cases (default 20)")
    b.add_argument("--dtensor", type=int_in(0), default=None,
                   help="conformance: sharded plans the dtensor backend runs, the first N the "
                        "reference runs exactly (default 2; one process per device each)")
    b.add_argument("--seed", type=int_in(0), default=None,
                   help="conformance: the first seed (cases S..S+N-1; default 0), to fuzz on "
                        "seeds not run before")
    b.add_argument("--json", default=None, help="write every case's result here (JSON)")
    b.add_argument("--check", action="store_true",
                   help="exit status 1 when a goal the suite states is missed (one line each "
                        "on stderr, saying by how much), else 3 when a timed goal is too noisy "
                        "to judge (inconclusive)")
    b.add_argument("--measurements", default=None, metavar="FILE.json",
                   help="costmodel: measured kernels (default: the packaged Spyre ones)")
    b.add_argument("--target", default=None,
                   help="costmodel: spyre (default) or a .toml file: the measured kernels; cpu: "
                        "programs planned and timed on this machine (--cores: core counts)")
    b.set_defaults(func=cmd_bench)


def _calibrate_parser(sub: Any) -> None:
    """``apportion calibrate``: the cost model's coefficients fitted to measured times."""
    c = sub.add_parser("calibrate", help="fit the cost model's coefficients to measured times")
    c.add_argument("measurements", nargs="?", default=None,
                   help="measurements file (JSON), or --measure")
    c.add_argument("--measure", action="store_true",
                   help="time kernels on this machine with the planned executor instead")
    c.add_argument("--target", default=None,
                   help="spyre, cpu or a target .toml file (default spyre; cpu with --measure)")
    c.add_argument("--fit", default=None, metavar="NAME,NAME,...",
                   help="coefficients to fit (default spyre: overlap; "
                        "cpu: mac_rate,sfp_rate,reduce_rate,mem_bandwidth,core_bandwidth,"
                        "overlap)")
    c.add_argument("-o", "--output", default=None, metavar="FILE.toml",
                   help="write the fitted target here")
    c.add_argument("--save", default=None, metavar="FILE.json",
                   help="with --measure: write the measurements here")
    c.add_argument("--cores", type=int_in(1), default=None,
                   help="with --measure: the most cores to time on (default: this machine's)")
    c.set_defaults(func=cmd_calibrate)


def _demo_parser(sub: Any) -> None:
    """``apportion demo``: a small Llama (or the built-in program) planned, run and checked."""
    from apportion.cli.demo import cmd_demo

    d = sub.add_parser("demo", help="a small Llama exported from PyTorch, planned for spyre, "
                                    "run and checked")
    d.add_argument("--cores", type=int_in(1), default=None)
    d.add_argument("--program", action="store_true",
                   help="the built-in program instead (llama3-8b norm + MLP; no PyTorch needed)")
    d.set_defaults(func=cmd_demo)


def _fail(message: str) -> int:
    """Print ``message`` as one error line (an MLIR diagnostic may span several); status 2."""
    one = "; ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"apportion: error: {one}", file=sys.stderr)
    return 2


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null so that flushing at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (a test's capture): nothing to redo
        pass


#: errors of a write to a full, closed or failing stdout (``> /dev/full``): one line, status 2
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF})


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status.

    0: done; 1: ``run --check`` found a mismatch, or ``bench --check`` a missed goal; 2: bad input,
    with one line on stderr (``apportion: error: ...``) and never a traceback (argparse errors too,
    which exit with SystemExit(2)). Output into a reader that closes early (``apportion plan ... |
    head -1``) ends quietly with status 0, like many command-line tools: what the reader did not
    take is dropped, stdout is pointed at /dev/null (the Python documentation's recipe for SIGPIPE)
    and no BrokenPipeError is printed. A closed stdout (``>&-``) or one that fails a write (``>
    /dev/full``) ends with status 2 and one line. Ctrl-C ends with status 130 and one line, SIGTERM
    (a batch system's time limit) with 143 and one line, after the same cleanup.
    Status 3: a measurement too noisy to judge (``bench --check`` with a goal inconclusive and
    none missed, ``calibrate --measure`` on measurements that could not be trusted), one line on
    stderr each.
    Any other exception is a bug in apportion: its traceback, one line saying so, and status 70
    (``EX_SOFTWARE``), never 1, which means only that numbers differ.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    nul = next((a for a in argv if "\0" in a), None)
    if nul is not None:  # no path or value holds one; the file loaders would choke on it
        return _fail(f"argument {nul!r} contains a NUL character")
    args = build_parser().parse_args(argv)
    program = getattr(args, "program", None)
    if isinstance(program, str) and program.endswith(".pt2") and \
            getattr(args, "torch", None) is None:
        # a saved torch.export program is a PyTorch model: PROG.pt2 reads as --torch PROG.pt2
        args.torch, args.program = program, DEFAULT
    if sys.stdout is None:  # started with file descriptor 1 closed (``apportion ... >&-``)
        return _fail("standard output is closed; give the command somewhere to write")
    # Reports are wide tables: do not squeeze them to 80 columns when piped.
    probe = _Console()
    console = probe if probe.is_terminal else _Console(width=160)
    restore = _sigterm_as_interrupt()
    try:
        if getattr(args, "dynamic", None) and getattr(args, "torch", None) is None:
            raise UsageError(f"--dynamic {args.dynamic[0]!r}: applies to a --torch model (a "
                             "program file names its run-time sizes itself)")
        status = args.func(args, console)
        sys.stdout.flush()  # a closed pipe shows here rather than at interpreter exit
        return status
    except BrokenPipeError:
        _stdout_to_devnull()
        return 0
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            return _internal_error(e)
        _stdout_to_devnull()  # what is buffered would fail again at exit
        where = repr(e.filename) if e.filename else "standard output"
        return _fail(f"cannot write to {where}: {e.strerror or e}")
    except ApportionError as e:
        return _fail(str(e))
    except MemoryError as e:  # numpy: "Unable to allocate 8.00 GiB for an array with ..."
        return _fail(f"out of memory: {e or 'an allocation failed'}")
    except Terminated:
        print("apportion: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("apportion: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        return _internal_error(e)
    finally:
        restore()


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch system's time limit, ``kill``), raised where the command stands as
    Ctrl-C is: every cleanup Ctrl-C runs runs for it too (a distributed run's ranks stopped and
    its folder removed, a half-written cuda build removed)."""


def _sigterm_as_interrupt() -> Callable[[], None]:
    """Raise ``Terminated`` on SIGTERM until the returned function is called; nothing where a
    handler is set already or this is not the main thread (which alone takes one)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def terminated(signum: int, frame: object) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, terminated)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


#: the exit status of a bug (sysexits' EX_SOFTWARE): not 1 (numbers differ), not 2 (bad input)
INTERNAL_ERROR = 70


def _internal_error(e: Exception) -> int:
    """A bug: the traceback for a report, then one line naming it; ``INTERNAL_ERROR``."""
    import traceback

    traceback.print_exception(e)
    first = str(e).splitlines()[0] if str(e) else ""
    print(f"apportion: internal error: {type(e).__name__}{': ' + first if first else ''} (a bug "
          "in apportion; the traceback above helps a report)", file=sys.stderr)
    return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
