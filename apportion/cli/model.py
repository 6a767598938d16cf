"""The ``--torch`` commands: ``plan --torch`` (the model report, its pictures) and ``run
--torch`` (the plan run on the model's example inputs, ``--check`` against the model run
eagerly); the model's loading, planning and check are ``apportion.workflows.torch_model``'s, its
report ``apportion.report.model``'s."""

from __future__ import annotations

import argparse

from rich.console import Console

from apportion.cli.options import param_values, plot_folder, torch_model
from apportion.errors import UsageError
from apportion.report.tables import print_checks
from apportion.target.presets import resolve


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
        plot_dir = plot_folder(args.plot)
    tm = torch_model(args)
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

    params = param_values(args.param)
    with progress(console, f"exporting {args.torch} with torch.export and lowering it"):
        tm = torch_model(args)
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
