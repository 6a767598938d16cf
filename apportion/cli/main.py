"""The `apportion` command: plan, run, emit, bench, demo."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from apportion.errors import ApportionError, ExecutionError
from apportion.ir.program import Program
from apportion.passes.work_distribution import STRATEGIES
from apportion.target.presets import resolve

if TYPE_CHECKING:
    from apportion.planned import PlannedProgram
    from apportion.runtime.reference import OutputCheck

DEFAULT = "default"


def _load_program(spec: str) -> Program:
    from apportion.frontend.json_format import load
    from apportion.frontend.models import default_program

    return default_program() if spec == DEFAULT else load(spec)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", nargs="?", default=DEFAULT,
                   help="program file (format v1), or 'default' for the built-in MLP block")
    p.add_argument("--target", default="spyre", help="spyre, cpu, or a target .toml file")
    p.add_argument("--cores", type=int, default=None,
                   help="cores to use (spyre: 1..32; default SENCORES or 32)")
    p.add_argument("--strategy", choices=STRATEGIES, default="balanced")
    p.add_argument("--auto-tile", action="store_true",
                   help="choose each tiling group's loop counts: the smallest that fit the "
                        "scratchpad")


def _planned(args: argparse.Namespace) -> PlannedProgram:
    from apportion.planned import plan

    program = _load_program(args.program)
    target = resolve(args.target, args.cores)
    return plan(program, target, args.strategy, auto_tile=args.auto_tile)


def _params(pairs: list[str] | None) -> dict[str, int]:
    """``--param T=4`` values (symbolic loop counts) as a dict."""
    out: dict[str, int] = {}
    for text in pairs or []:
        name, eq, value = text.partition("=")
        if not eq or not name.strip().isidentifier():
            raise ExecutionError(f"--param {text!r}: expected NAME=COUNT, like T=4")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise ExecutionError(f"--param {text!r}: count {value!r} is not an integer") from None
    return out


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from apportion.cli.report import print_report
    from apportion.plans.export import coefficient_splits

    planned = _planned(args)
    if args.format == "json":
        print(planned.to_json())
    elif args.format == "coeffs":
        print(json.dumps([coefficient_splits(planned.program, planned.plan, o)
                          for o in planned.ops], indent=2))
    else:
        print_report(planned.plan, planned.target, console)
    if args.plot:
        from apportion.cli.plot import plot_op

        name = args.op or max(planned.ops, key=lambda o: o.predicted_time_us).name
        path = plot_op(planned.op(name), planned.program.op(name).out.dims, args.plot)
        console.print(f"wrote {path} (op {name})", highlight=False)
    return 0


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    planned = _planned(args)
    params = _params(args.param)
    if not args.check:
        planned.run(threads=args.threads, params=params)
        console.print(f"ran {len(planned.ops)} ops of {planned.program.name} over "
                      f"{planned.plan.cores} cores")
        return 0
    checks = planned.check(seed=args.seed, threads=args.threads, params=params)
    return print_checks(checks, f"planned run of {planned.program.name} ({args.strategy}, "
                        f"{planned.plan.cores} cores)", console)


def print_checks(checks: list[OutputCheck], what: str, console: Console) -> int:
    """One line per output and a verdict; the exit status (1 on a mismatch)."""
    for c in checks:
        status = "[green]ok[/green]" if c.ok else "[red]MISMATCH[/red]"
        console.print(f"{c.tensor:>12} {c.dtype:>9}  max abs err {c.max_abs_err:.3g}  "
                      f"max rel err {c.max_rel_err:.3g}  tol {c.tolerance}  {status}")
    bad = [c.tensor for c in checks if not c.ok]
    if bad:
        console.print(f"[red]{what} differs from unplanned on {', '.join(bad)}[/red]")
        return 1
    console.print(f"{what} matches the unplanned program")
    return 0


def cmd_emit(args: argparse.Namespace, console: Console) -> int:
    from apportion.codegen.spec_text import to_json, to_source

    planned = _planned(args)
    if args.loopspec:
        print(to_source(planned.loopspec()), end="")
    elif args.loopspec_json:
        print(to_json(planned.loopspec()))
    else:  # --bundle or --unrolled: the text parses and verifies before it is printed
        print(planned.bundle_mlir(unrolled=args.unrolled), end="")
    return 0


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    if args.suite == "workdiv":
        from apportion.cli import bench_workdiv

        results = bench_workdiv.run(args.cores or [32, 24], models_path=args.models,
                                    limit=args.limit, console=console)
        if args.json:
            Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=1))
        return 0
    from apportion.cli import bench_tiling

    bench_tiling.run(args.cores or [32], models_path=args.models, console=console)
    return 0


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from apportion.cli.report import group_lines, predicted_total_us, print_report, summary_line
    from apportion.frontend.models import default_program, default_tiling
    from apportion.planned import plan

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
    parser = argparse.ArgumentParser(prog="apportion", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan a program and print the report or plan JSON")
    _common(p)
    p.add_argument("--format", choices=("table", "json", "coeffs"), default="table")
    p.add_argument("--plot", metavar="FILE.png", help="draw which core computes which block")
    p.add_argument("--op", help="the op to draw (default: the slowest)")
    p.set_defaults(func=cmd_plan)
    r = sub.add_parser("run", help="execute the plan slice by slice")
    _common(r)
    r.add_argument("--check", action="store_true", help="compare with the unplanned program")
    r.add_argument("--threads", type=int, default=None, help="run cores concurrently")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--param", action="append", metavar="NAME=COUNT",
                   help="value of a symbolic loop count, e.g. --param T=4 (repeatable)")
    r.set_defaults(func=cmd_run)
    e = sub.add_parser("emit", help="print the plan as a loop bundle (MLIR) or LoopSpec program")
    _common(e)
    form = e.add_mutually_exclusive_group(required=True)
    form.add_argument("--bundle", action="store_true", help="MLIR: scf.for loops of launches")
    form.add_argument("--unrolled", action="store_true",
                      help="MLIR: every iteration's launch with constant addresses")
    form.add_argument("--loopspec", action="store_true", help="LoopSpec program as Python source")
    form.add_argument("--loopspec-json", action="store_true", help="LoopSpec program as JSON")
    e.set_defaults(func=cmd_emit)
    b = sub.add_parser("bench", help="benchmarks: workdiv, tiling")
    b.add_argument("suite", choices=("workdiv", "tiling"))
    b.add_argument("--cores", type=int, nargs="+", default=None)
    b.add_argument("--models", default=None, help="models.json (default: the packaged copy)")
    b.add_argument("--limit", type=int, default=None, help="only the first N op shapes")
    b.add_argument("--json", default=None, help="write every case's result here")
    b.set_defaults(func=cmd_bench)
    d = sub.add_parser("demo", help="plan the built-in default program for spyre")
    d.add_argument("--cores", type=int, default=None)
    d.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; bad input exits 2 with one line on stderr, never a traceback."""
    args = build_parser().parse_args(argv)
    # Reports are wide tables: do not squeeze them to 80 columns when piped.
    probe = Console()
    console = probe if probe.is_terminal else Console(width=160)
    try:
        return args.func(args, console)
    except ApportionError as e:
        print(f"apportion: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
