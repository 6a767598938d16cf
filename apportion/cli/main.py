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
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from rich.console import Console

from apportion.backends import BACKENDS
from apportion.cli.params import MAX_THREADS, int_in, parse_params, seconds
from apportion.errors import ApportionError, ProgramError, UsageError
from apportion.ir.program import Program
from apportion.passes.strategy import STRATEGIES
from apportion.report.files import make_folder, output_path
from apportion.report.tables import print_checks
from apportion.target.presets import PRESETS, resolve
from apportion.target.target import Target

if TYPE_CHECKING:
    from apportion.planned import PlannedProgram

DEFAULT = "default"
T = TypeVar("T")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, ``apportion: error: ...``, with exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"apportion: error: {message} (see '{self.prog} --help')\n")


class _Console(Console):
    """A rich console that lets a closed pipe reach ``main`` (rich's own exits with 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


class _Given(argparse.Action):
    """``store``, and a note that the option was given (``args.<dest>_given``): an explicit
    ``--target`` wins over a mesh's device target, the default does not."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def _plot_folder(text: str) -> Path:
    """``--plot DIR``: the folder, made with its missing parents, and writable."""
    if not text:
        raise UsageError("--plot: the path is empty")
    folder = Path(text)
    make_folder("--plot", text, folder)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--plot {text!r}: not writable")
    return folder


def _load_program(spec: str) -> Program:
    from apportion.frontend.json_format import load
    from apportion.frontend.models import default_program

    return default_program() if spec == DEFAULT else load(spec)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", nargs="?", default=DEFAULT,
                   help="program file (format v1), or 'default' for the built-in MLP block")
    p.add_argument("--target", default="spyre", action=_Given,
                   help=f"a preset ({', '.join(PRESETS)}) or a target .toml file (default "
                        "spyre; with --mesh: the devices' target, over the mesh's own)")
    p.add_argument("--cores", type=int_in(1), default=None,
                   help="cores to use (spyre: 1..32; default SENCORES or 32)")
    p.add_argument("--strategy", choices=STRATEGIES, default="balanced",
                   help="balanced (default): the exact search, uneven splits included; greedy: "
                        "the reference design's rule; greedy-multiples: its older variant "
                        "(a span-forced split grows only to multiples of itself)")
    p.add_argument("--torch", metavar="MODULE:FACTORY|FILE.pt2", default=None,
                   help="a PyTorch model instead of a program file: a callable returning "
                        "(model, args), (model, args, kwargs) or (model, {'args': ..., "
                        "'kwargs': ..., 'dynamic_shapes': ...}), imported from the current "
                        "directory or PYTHONPATH (e.g. apportion.frontend.torch_demo:"
                        "tiny_llama); or a file torch.export.save wrote")
    p.add_argument("--dynamic", action="append", metavar="INPUT:DIM=SYMBOL:MIN..MAX",
                   help="with --torch: dim DIM of input INPUT (a parameter of forward) is a "
                        "run-time size SYMBOL in MIN..MAX, as torch.export.Dim; another input "
                        "of that size names the symbol again, bounds left out (e.g. --dynamic "
                        "input_ids:1=seq:2..64 --dynamic attention_mask:1=seq); run binds it "
                        "with --param seq=40")
    p.add_argument("--trust-pt2", action="store_true",
                   help="with a .pt2 file: read it even where it holds parts that run code as "
                        "they are read (pickles, native code, Python in its sizes or guards), "
                        "which are refused otherwise; only for a file whose source you trust")
    p.add_argument("--partial", action="store_true",
                   help="with --torch: plan the part of the model apportion can lower, the "
                        "results of the nodes it cannot are inputs (their table on stderr); "
                        "run refuses it")
    p.add_argument("--auto-tile", action="store_true",
                   help="choose each tiling group's loop counts: the lowest predicted time of "
                        "the group, weighing re-read weights against scratchpad savings")


def _plan(program: Program, target: Target, args: argparse.Namespace) -> PlannedProgram:
    from apportion.planned import plan

    return plan(program, target, args.strategy, auto_tile=args.auto_tile)


def _planned(args: argparse.Namespace, params: dict[str, int] | None = None
             ) -> PlannedProgram:
    """The program file's plan; ``params`` (``--param`` values) are checked before planning."""
    program = _load_program(args.program)
    target = resolve(args.target, args.cores)
    if params:
        _check_params(program, target, params, ())
    return _plan(program, target, args)


def _params(pairs: list[str] | None) -> dict[str, int]:
    """``--param T=4`` values (symbolic loop counts, run-time sizes) as a dict."""
    return parse_params(pairs, UsageError)


def _symbols(program: Program) -> tuple[str, ...]:
    """The program's symbolic loop counts, in order of appearance."""
    return tuple(dict.fromkeys(level.count for g in program.tiling for level in g.loops
                               if isinstance(level.count, str)))


def _check_params(program: Program, target: Target, params: dict[str, int],
                  needed: Sequence[str]) -> None:
    """Refuse a ``--param`` the program has no use for, out of range, or one ``needed``
    missing."""
    top = target.max_loop_count
    known = _symbols(program)
    for name, value in params.items():
        if name in program.symbol_map:  # a run-time size, within its bounds
            try:
                program.symbol_map[name].check(value)
            except ProgramError as e:
                raise UsageError(f"--param {name}={value}: {e}") from None
            continue
        if name not in known:
            sizes = ", ".join(program.symbol_map)
            raise UsageError(f"--param {name}={value}: {name!r} is not a symbolic loop count of "
                             f"program {program.name!r}; its symbolic counts: "
                             f"{', '.join(known) or 'none'}"
                             + (f"; its symbolic sizes: {sizes}" if sizes else ""))
        if not 1 <= value <= top:
            raise UsageError(f"--param {name}={value}: a loop count must be in 1..{top} "
                             f"(the max_loop_count of target {target.name!r})")
        for g in program.tiling:  # the bounds the program gives the count, before planning
            for lv in g.loops:
                high = top if lv.max is None else lv.max
                if lv.count == name and not lv.min <= value <= high:
                    raise UsageError(f"--param {name}={value}: loop count {name!r} of tiling "
                                     f"group {list(g.ops)} takes {lv.min}..{high}")
    missing = [n for n in needed if n not in params]
    if missing:
        flags = " ".join(f"--param {n}=N" for n in missing)
        raise UsageError(f"program {program.name!r} has symbolic loop count"
                         f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}: pass "
                         f"{flags} (N in 1..{top})")


def _sizes_text(program: Program, sizes: dict[str, int]) -> str:
    """``K=4096 (given), M=64 (planning size)``."""
    return ", ".join(f"{n}={sizes[n]} (given)" if n in sizes else
                     f"{n}={s.planning_size} (planning size)"
                     for n, s in program.symbol_map.items())


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


def _torch_model(args: argparse.Namespace) -> Any:
    """The ``--torch module:factory`` model, lowered; refuses a program file given as well."""
    from apportion.workflows.torch_model import load_model

    if args.program != DEFAULT:
        raise UsageError(f"give a program file or --torch, not both ({args.program!r} and "
                         f"--torch {args.torch!r})")
    # run and cuda build run the model: every value needed, nothing left out
    return load_model(args.torch, partial=args.partial, run=args.command in ("run", "cuda"),
                      dynamic=args.dynamic or (), trust_pt2=args.trust_pt2)


def cmd_plan_torch(args: argparse.Namespace, console: Console) -> int:
    from apportion.report.model import print_model_plan
    from apportion.workflows.torch_model import plan_model

    if args.format == "coeffs" or args.op is not None:
        raise UsageError("with --torch: --format table or json, and --plot DIR (no --op)")
    plot_dir = None
    if args.plot is not None:  # a folder for utilization.png and largest_op.png, made if missing
        from apportion.report.plot import is_plot_file

        if is_plot_file(args.plot):
            raise UsageError(f"--plot {args.plot!r}: with --torch, --plot names a folder (for "
                             "utilization.png and largest_op.png), not a picture file")
        plot_dir = _plot_folder(args.plot)
    tm = _torch_model(args)
    planned = plan_model(tm, resolve(args.target, args.cores), args.strategy)
    print_model_plan(planned, tm.lowered, tm.model, args.format, plot_dir, console)
    return 0


def cmd_run_torch(args: argparse.Namespace, console: Console) -> int:
    from apportion.cli.progress import progress
    from apportion.workflows.torch_model import (
        at_sizes,
        check_model,
        failures,
        model_inputs,
        plan_model,
    )

    params = _params(args.param)
    with progress(console, f"exporting {args.torch} with torch.export and lowering it"):
        tm = _torch_model(args)
    sizes = tm.lowered.program.symbol_map
    for name, value in params.items():
        if name not in sizes:
            raise UsageError(f"--param {name}={value}: {name!r} is not a run-time size of "
                             f"--torch {args.torch} (its sizes: {', '.join(sizes) or 'none'}"
                             "; --dynamic makes one)")
        sym = sizes[name]
        if value < sym.min or (sym.max is not None and value > sym.max):
            top = "" if sym.max is None else sym.max
            raise UsageError(f"--param {name}={value}: outside {name}'s bounds "
                             f"{sym.min}..{top}")
    if params:
        tm = at_sizes(tm, params)
    with progress(console, f"planning {len(tm.lowered.program.ops)} ops"):
        planned = plan_model(tm, resolve(args.target, args.cores), args.strategy)
    running = ("compiling the plan with IREE and running it" if args.backend == "iree" else
               f"running the plan ({args.backend})")
    at = "".join(f", {k}={v}" for k, v in params.items())
    label = (f"{planned.program.name} from --torch {args.torch} ({args.strategy}, "
             f"{planned.plan.cores} cores, {args.backend}{at})")
    if not args.check:
        with failures(tm, "the planned run"), progress(console, running):
            planned.run(model_inputs(tm), threads=args.threads, backend=args.backend,
                        params=params)
        console.print(f"ran {len(planned.ops)} ops of {label}", highlight=False)
        return 0
    with progress(console, f"{running}, then the model eagerly in PyTorch"):
        checks = check_model(tm, planned, args.backend, args.threads, params)
    return print_checks(checks, f"planned run of {label}", console,
                        "the model run eagerly in PyTorch")


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from apportion.plans.export import coefficient_splits
    from apportion.report.tables import print_report

    if args.torch is not None:
        return cmd_plan_torch(args, console)

    plot: Path | None = None
    plot_dir: Path | None = None
    if args.plot is not None:  # the path first: a bad one is refused before any loading
        from apportion.report.plot import check_plot_path, is_plot_file

        if is_plot_file(args.plot):
            check_plot_path(Path(args.plot))  # the extension before any folder is made
            plot = output_path("--plot", args.plot, make_folders=True)
        else:
            plot_dir = _plot_folder(args.plot)
    elif args.op is not None:
        raise UsageError(f"--op {args.op!r} picks the op to draw: it needs --plot FILE or DIR")
    program = _load_program(args.program)
    drawable = _drawable(args, program) if args.plot is not None else ()
    planned = _plan(program, resolve(args.target, args.cores), args)
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
        return cmd_run_torch(args, console)
    params = _params(args.param)
    program = _load_program(args.program)
    target = resolve(args.target, args.cores)
    _check_params(program, target, params, _symbols(program))
    _check_memory(program.bind({k: v for k, v in params.items() if k in program.symbol_map}),
                  args.check)
    planned = _plan(program, target, args)
    _check_params(program, target, params, planned.params)
    if program.symbols:
        sizes = {k: v for k, v in params.items() if k in program.symbol_map}
        console.print(f"run-time sizes: {_sizes_text(program, sizes)}", highlight=False)
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
    from apportion.backends.iree.run import iree_check, iree_run
    from apportion.backends.iree.runtime import default_cache_dir
    from apportion.cli.progress import progress
    from apportion.runtime.reference import random_inputs

    if args.threads is not None:
        raise UsageError("--threads applies to the reference backend; IREE uses its own "
                         "task pool")
    p = planned.program
    given = planned.given if planned.symbols else None  # one module for every run-time size
    if args.check:
        with progress(console, f"compiling {p.name} with IREE, running it and the unplanned "
                               "program"):
            checks, run = iree_check(p, planned.plan, planned.target, seed=args.seed,
                                     params=params, symbolic=given)
        status = print_checks(checks, f"IREE run of {p.name} ({args.strategy}, "
                              f"{planned.plan.cores} cores)", console)
    else:
        sizes = {k: v for k, v in params.items() if k in planned.symbols}
        xs = random_inputs(planned.bound(sizes)[0], args.seed)
        with progress(console, f"compiling {p.name} with IREE and running it"):
            run = iree_run(p, planned.plan, planned.target, xs, params, symbolic=given)
        console.print(f"ran {len(planned.ops)} ops of {p.name} over {planned.plan.cores} cores "
                      "in IREE")
        status = 0
    how = "taken from the cache" if run.cached else f"compiled in {run.compile_s:.2f} s"
    console.print(f"IREE module (llvm-cpu) {how} ({_home_short(default_cache_dir())}); ran in "
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

        planned = plan_model(_torch_model(args), resolve(args.target, args.cores),
                             args.strategy)
    else:
        planned = _planned(args, _params(args.param))
    params = _params(args.param)
    _check_params(planned.given, planned.target, params, ())
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
    from apportion.schedule.lower import lower

    if args.mesh is not None:  # sharded over devices: the mesh schedule
        from apportion.cli.shard import cmd_schedule_sharded

        return cmd_schedule_sharded(args, console)
    if args.torch is not None:
        from apportion.workflows.torch_model import plan_model

        planned = plan_model(_torch_model(args), resolve(args.target, args.cores),
                             args.strategy)
    else:
        planned = _planned(args, _params(args.param))
    params = _params(args.param)
    _check_params(planned.given, planned.target, params, planned.params)
    sizes = {k: v for k, v in params.items() if k in planned.given.symbol_map}
    counts = {k: v for k, v in params.items() if k not in sizes}
    program = planned.given if planned.symbols else planned.program
    print(lower(program, planned.plan, planned.target, sizes or None, counts or None))
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
    if args.measure and target.name != "cpu":
        raise UsageError(f"--measure times this machine's CPU, so it calibrates only a cpu "
                         f"target, not {target.name!r}: use --target cpu or a target file with "
                         f"preset = \"cpu\"")
    return calibrate.command(args.measurements, target, spec, args.fit, out, save, args.cores,
                             console)


DEMO_MODEL = "apportion.frontend.torch_demo:tiny_llama"


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """A Llama-style model from ``transformers`` exported, planned for Spyre, run and checked
    against PyTorch; ``--program``: the built-in program (no PyTorch needed), tiled too."""
    if args.program:
        return _demo_program(args, console)
    from apportion.report.model import print_model_plan
    from apportion.report.tables import predicted_total_us
    from apportion.workflows.torch_model import check_model, load_model, plan_model

    try:
        tm = load_model(DEMO_MODEL)
    except ApportionError as e:
        if "No module named 'torch'" in str(e) or "No module named 'transformers'" in str(e):
            raise UsageError("the demo exports a PyTorch model: install the torch extra "
                             "(pip install -e '.[torch]'), or run apportion demo --program") \
                from None
        raise
    target = resolve("spyre", args.cores)
    console.print("model: a Llama-style decoder from Hugging Face transformers with random "
                  "weights (2 layers, hidden 256, 4 heads, 2 KV heads), 16 tokens, exported "
                  f"with torch.export and planned for spyre on {target.cores} cores",
                  highlight=False)
    planned = plan_model(tm, target, "balanced")
    print_model_plan(planned, tm.lowered, tm.model, "table", None, console)
    greedy = plan_model(tm, target, "greedy").plan
    console.print(f"greedy for comparison: mean utilization {greedy.mean_utilization:.1%}, "
                  f"predicted {predicted_total_us(greedy)[0]:.1f} us in all", highlight=False)
    return print_checks(check_model(tm, planned), "the planned model, run core slice by core "
                        "slice,", console, "the model run eagerly in PyTorch")


def _demo_program(args: argparse.Namespace, console: Console) -> int:
    from apportion.frontend.models import default_program, default_tiling
    from apportion.planned import plan
    from apportion.report.tables import group_lines, predicted_total_us, print_report, summary_line

    program = default_program()
    target = resolve("spyre", args.cores)
    console.print(f"program {program.name}: {len(program.ops)} ops "
                  "(RMS norm, gated MLP of llama3-8b at 128 tokens)")
    print_report(plan(program, target, "balanced").plan, target, console)
    greedy = plan(program, target, "greedy").plan
    console.print(f"greedy for comparison: mean utilization {greedy.mean_utilization:.1%}, "
                  f"predicted {predicted_total_us(greedy)[0]:.1f} us in all")
    tiled = plan(default_tiling(program), target, "balanced", auto_tile=True)
    console.print("\nthe norm and the MLP each as one loop group over tokens (auto-tiled):")
    for line in group_lines(tiled.plan):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(summary_line(tiled.plan), highlight=False)
    return print_checks(tiled.check(), "the tiled plan, run core by core and iteration by "
                        "iteration,", console)


def build_parser() -> argparse.ArgumentParser:
    from apportion.cli import cuda as cuda_cli
    from apportion.cli import shard as shard_cli

    parser = _Parser(prog="apportion", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan a program and print the report or plan JSON")
    _common(p)
    p.add_argument("--format", choices=("table", "json", "coeffs"), default="table")
    p.add_argument("--plot", metavar="FILE.png|DIR",
                   help="draw which core computes which block: to FILE (the format follows "
                        "the extension: .png, .pdf, .svg, ...) the slowest op or --op; to a "
                        "folder DIR (a path without a picture extension) one OP.png per op; "
                        "with --torch, DIR/utilization.png and DIR/largest_op.png. Missing "
                        "folders are made")
    p.add_argument("--op", help="with --plot: the op to draw (default: the slowest)")
    p.set_defaults(func=cmd_plan)
    r = sub.add_parser("run", help="execute the plan slice by slice")
    _common(r)
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
    e = sub.add_parser("emit", help="print the plan as a loop bundle (MLIR) or LoopSpec program")
    _common(e)
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
    sc = sub.add_parser("schedule", help="print the plan lowered to its schedule: every "
                        "launch's workers, boxes and regions, loops and buffers")
    _common(sc)
    sc.add_argument("--param", action="append", metavar="NAME=VALUE",
                    help="a symbolic loop count or run-time size to lower at, e.g. --param "
                         "T=4 (repeatable); with --mesh, a symbolic mesh axis size too")
    shard_cli.add_mesh_options(sc)
    sc.set_defaults(func=cmd_schedule)
    shard_cli.add_parser(sub, _common)
    cuda_cli.add_parser(sub, cuda_cli.Shared(_common, _planned, _params, _check_params,
                                             _torch_model))
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
    d = sub.add_parser("demo", help="a small Llama exported from PyTorch, planned for spyre, "
                                    "run and checked")
    d.add_argument("--cores", type=int_in(1), default=None)
    d.add_argument("--program", action="store_true",
                   help="the built-in program instead (llama3-8b norm + MLP; no PyTorch needed)")
    d.set_defaults(func=cmd_demo)
    return parser


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
    its folder removed, a half-written bundle removed)."""


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
