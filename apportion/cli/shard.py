"""The command line's sharding: ``apportion shard``, ``run --mesh`` and ``emit --mesh``: the
options parsed and what ran printed; the planning, lowering and runs are
``apportion.workflows.sharded``'s, the report ``apportion.report.sharding``'s.

* ``apportion shard PROG --mesh SPEC``: the sharding plan's report: per op its strategy, the
  largest device's part of its iteration space, its compute time and the resharding before
  it; then the outputs' resharding, a summary line and the per-device programs. ``--method
  propagate`` completes the program file's ``"shardings"`` annotations without search;
  ``--format json`` prints the plan (format ``apportion.sharding/1``).
* ``apportion run PROG --mesh SPEC [--backend reference|torch|iree|openmp|dtensor] [--check]``:
  the plan lowered to its mesh schedule (``sharding.lower.lower_plan``: each device's segments
  planned for its cores and lowered) and run by the backend's ``run_mesh`` (each device's core
  schedule in numpy, with torch kernels, as IREE modules or as OpenMP modules, the data
  between devices moved on the host by the schedule), or on ``torch.distributed`` with one
  process per device (``dtensor``), and compared with the unsharded program.
* ``apportion emit PROG --mesh SPEC --forall``: the per-device programs as parallel IR (the
  mesh schedule emitted by ``mlir.mesh.mesh_mlir``); ``--shard-form FORM`` the
  program in upstream MLIR's shard dialect (``apportion.sharding.forms``), verified upstream.
* ``apportion schedule PROG --mesh SPEC``: the mesh schedule as text, each device's core
  schedule nested under it.

With ``--torch MODULE:FACTORY`` (a callable returning ``(model, example_inputs)``, as ``plan
--torch`` takes it) the model lowered by ``from_torch`` is sharded: its program's inputs are
the model's inputs and its weights (``TorchProgram.constants``), and the search places the
weights like any input (split where that pays, each device then holding only its shard; a
weight is placed once, so its placement costs no communication, only memory). ``shard
--torch`` prints the report with the ATen lowering line (``--format json`` adds each op's
PyTorch origin); ``run --torch --mesh`` runs the sharded model on the example inputs and
compares it with the model run eagerly in PyTorch (exit 1 when the numbers differ).

``--mesh`` takes a spec (``dp=2,tp=4``, ``tp=4@chiplet:peered``), a preset name or a TOML
file; without it a ``--target`` TOML file with a ``[mesh]`` table gives the mesh. An axis size
may be symbolic (``dp=N~4``: planned at 4): the plan is made at the planning size, and
``--param N=2`` binds it for the per-device programs (``run``, ``emit``; ``shard`` then
counts them at that size). ``--param`` also binds a program's run-time sizes before sharding,
and a symbolic loop count of its tiling groups (``--param T=16``: the per-device programs then
loop 16 times, their tiles planned at it); one left symbolic stays so in the per-device
programs and ``run`` needs its value. ``shard`` prints one line per tiling group: its counts
over each device's share.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console

from apportion.cli.params import parse_params
from apportion.workflows.sharded import (
    METHODS,
    ShardUsageError,
    bind_program,
    check_mesh_sizes,
    device_target,
    loop_counts,
    mesh_of,
    mesh_sizes,
    shard_program,
)

if TYPE_CHECKING:
    from apportion.ir.program import Program
    from apportion.schedule.mesh import MeshSchedule
    from apportion.sharding.mesh import Mesh
    from apportion.sharding.plan import ShardingPlan
    from apportion.sharding.spec import Sharding
    from apportion.target.target import Target
    from apportion.workflows.torch_model import TorchModel


def add_mesh_options(p: argparse.ArgumentParser) -> None:
    """``--mesh``, ``--method``, ``--outputs`` of the commands that shard."""
    p.add_argument("--mesh", default=None, metavar="SPEC",
                   help="shard over a device mesh: dp=2,tp=4 (an axis may add @node, "
                        "@device or @chiplet and :peered; a symbolic size dp=N~4 is planned "
                        "at 4 and bound by --param N=SIZE), a preset (spyre-x8, ...) or a "
                        "TOML file")
    p.add_argument("--method", choices=METHODS, default="search",
                   help="with --mesh: search every op's strategy (integer program) or "
                        "propagate the program's annotations")
    p.add_argument("--outputs", choices=("any", "replicated"), default="any",
                   help="with --mesh --method search: outputs in any sharding, or replicated")


def add_parser(sub: Any, common: Any) -> None:
    """The ``shard`` subcommand."""
    s = sub.add_parser("shard", help="shard a program over a device mesh and print the plan")
    common(s)
    add_mesh_options(s)
    s.add_argument("--format", choices=("table", "json"), default="table")
    s.add_argument("--param", action="append", metavar="NAME=SIZE",
                   help="a symbolic mesh axis size (dp=N~4) to unroll the per-device programs "
                        "at, or a run-time size of the program, e.g. --param N=2 (repeatable)")
    s.set_defaults(func=cmd_shard)


def _load(spec: str) -> tuple[Program, dict[str, Sharding]]:
    from apportion.frontend.models import default_program
    from apportion.sharding.spec import load

    if spec == "default":
        return default_program(), {}
    return load(spec)


def _target(args: argparse.Namespace, mesh: Mesh) -> Target:
    """The devices' target: an explicit ``--target`` wins over the mesh's own (a ``--mesh``
    file's ``target``); a mesh read from the ``--target`` file carries that file's target, or
    the preset its ``[mesh] target`` names; else the default, spyre. ``--cores`` applies to
    each."""
    from_target_file = args.mesh is None  # mesh_of read the mesh from the --target file
    explicit = getattr(args, "target_given", False) and not from_target_file
    return device_target(mesh, args.target, args.cores, explicit)


def _params(args: argparse.Namespace) -> dict[str, int]:
    """``--param NAME=SIZE`` values; the syntax only."""
    return parse_params(getattr(args, "param", None), ShardUsageError)


def _torch_model(args: argparse.Namespace) -> TorchModel | None:
    """The ``--torch`` model, lowered (None without ``--torch``); a program file given as
    well is refused."""
    spec = getattr(args, "torch", None)
    if spec is None:
        return None
    from apportion.workflows.torch_model import load_model

    if args.program != "default":
        raise ShardUsageError(f"give a program file or --torch, not both ({args.program!r} and "
                              f"--torch {spec!r})")
    return load_model(spec, partial=getattr(args, "partial", False),
                      run=getattr(args, "command", None) == "run",
                      dynamic=getattr(args, "dynamic", None) or (),
                      trust_pt2=getattr(args, "trust_pt2", False))


def sharding_plan(args: argparse.Namespace) -> ShardingPlan:
    """The plan the options ask for (at the planning size of a symbolic mesh)."""
    return sharded(args)[0]


def sharded(args: argparse.Namespace) -> tuple[ShardingPlan, TorchModel | None]:
    """The plan the options ask for (at the planning size of a symbolic mesh), and the
    ``--torch`` model it shards (None for a program file); a bad mesh or mesh size is refused
    before the model is exported."""
    if getattr(args, "auto_tile", False) or getattr(args, "strategy", "balanced") != "balanced":
        raise ShardUsageError("--strategy and --auto-tile do not apply with --mesh: each "
                              "device's programs are planned with the balanced strategy")
    if getattr(args, "torch", None) is None:
        program, ann = _load(args.program)
    mesh = mesh_of(args.mesh, args.target)
    check_mesh_sizes(mesh, _params(args))
    tm = _torch_model(args)
    if tm is not None:
        program, ann = tm.lowered.program, {}
    program = bind_program(program, _params(args), mesh)
    return shard_program(program, mesh, _target(args, mesh), ann, args.method,
                         args.outputs), tm


def cmd_shard(args: argparse.Namespace, console: Console) -> int:
    from apportion.report.sharding import print_sharding_plan

    plan, tm = sharded(args)
    sizes = mesh_sizes(plan, _params(args))
    if args.format == "json":
        plan.bind(sizes)  # a bad --param is refused here too
        doc = plan.to_dict()
        if tm is not None:  # where each op comes from in the model, as plan --torch says
            from apportion.report.model import origins_doc

            doc["torch"] = tm.spec
            doc["origins"] = origins_doc(tm.lowered, [o.op for o in plan.ops])
        print(json.dumps(doc, indent=1))
        return 0
    print_sharding_plan(plan, console, sizes)
    if tm is not None:
        from apportion.report.model import lowered_line

        console.print(lowered_line(tm.lowered), highlight=False, soft_wrap=True, markup=False)
    return 0


def _check_backend(args: argparse.Namespace) -> None:
    """Refuse, before any planning, a ``--backend`` without ``run_mesh`` (the registry's
    backends that run a mesh schedule) and ``--threads`` where the backend runs none."""
    from apportion.backends import get
    from apportion.workflows.sharded import mesh_backends

    if get(args.backend).run_mesh is None:
        raise ShardUsageError(f"--backend {args.backend} does not run sharded programs; with "
                              f"--mesh: {', '.join(mesh_backends())}")
    if args.backend in ("dtensor", "iree") and args.threads is not None:
        raise ShardUsageError("--threads applies to the reference and torch backends and to "
                              "openmp (its OpenMP team)")


def cmd_run_sharded(args: argparse.Namespace, console: Console,
                    print_checks: Callable[..., int]) -> int:
    """``run --mesh``: the per-device programs run and (``--check``) compared with the
    unsharded program, or for a ``--torch`` model with the model run eagerly in PyTorch on
    its example inputs; ``print_checks`` prints the comparison (``cli/main.py``'s)."""
    _check_backend(args)
    planned, tm = sharded(args)
    if tm is not None:  # a run-time size (--dynamic) bound by --param: the inputs at that size
        from apportion.workflows.torch_model import at_sizes

        bound = {k: v for k, v in _params(args).items() if k in tm.lowered.program.symbol_map}
        tm = at_sizes(tm, bound) if bound else tm
    sizes = mesh_sizes(planned, _params(args))
    plan = planned.bind(sizes)
    if planned.mesh.symbolic:
        console.print(f"mesh sizes: {', '.join(f'{k}={v}' for k, v in sizes.items())} "
                      f"(planned at {planned.mesh.planning_text()})", highlight=False)
    source = "" if tm is None else f" from --torch {tm.spec}"
    label = f"{plan.program.name}{source} over {plan.mesh} ({plan.method}, {args.backend})"
    if tm is None:
        return _run_program(args, plan, label, console, print_checks)
    from apportion.sharding.lower import lower_plan
    from apportion.workflows.sharded import run_distributed, run_sharded
    from apportion.workflows.torch_model import compare_eager, failures, model_inputs

    inputs = model_inputs(tm)
    eager = "the model run eagerly in PyTorch"
    if args.backend == "dtensor":
        with failures(tm, "the distributed run"):
            run = run_distributed(lower_plan(plan), inputs, seed=args.seed,
                                  timeout_s=args.timeout, device=args.device)
        _print_dist(plan, run, console)
        if not args.check:
            console.print(f"ran {label}", highlight=False)
            return 0
        return print_checks(compare_eager(tm, run.outputs), f"distributed run of {label}",
                            console, eager)
    schedule = _lowered(args, plan)
    with failures(tm, f"the per-device run ({args.backend})"), \
            _running(args, console, plan, schedule):
        outputs = run_sharded(schedule, inputs, args.backend, args.seed, args.threads)
    _print_mesh_run(args, plan, label, schedule, console)
    if not args.check:
        return 0
    return print_checks(compare_eager(tm, outputs), _verdict(args.backend, label), console,
                        eager)


def _print_dist(plan: ShardingPlan, run: Any, console: Console) -> None:
    """The line saying how a distributed run went."""
    console.print(f"{plan.mesh.devices} processes ({run.backend}), {run.placement_checks} "
                  "placement "
                  f"checks per rank, torch ran {len(run.native_ops)} of "
                  f"{len(plan.ops)} ops on DTensors ({', '.join(run.native_ops) or 'none'}), "
                  f"{run.wall_s:.1f} s", highlight=False, soft_wrap=True)


def _run_program(args: argparse.Namespace, plan: ShardingPlan, label: str, console: Console,
                 print_checks: Callable[..., int]) -> int:
    """``run PROG --mesh``: a program file's per-device programs against the unsharded
    program on random inputs."""
    from apportion.workflows.sharded import check_sharded, run_sharded

    if args.backend == "dtensor":
        from apportion.sharding.lower import lower_plan
        from apportion.workflows.sharded import check_distributed, run_distributed

        lowered = lower_plan(plan)
        checks = None
        if args.check:
            checks, run = check_distributed(lowered, seed=args.seed, timeout_s=args.timeout,
                                            device=args.device)
        else:
            run = run_distributed(lowered, seed=args.seed, timeout_s=args.timeout,
                                  device=args.device)
        _print_dist(plan, run, console)
        if checks is None:
            console.print(f"ran {label}", highlight=False)
            return 0
        return print_checks(checks, f"distributed run of {label}", console)
    from apportion.runtime.reference import random_inputs

    schedule = _lowered(args, plan)
    with _running(args, console, plan, schedule):
        if args.check:
            checks, _ = check_sharded(schedule, args.backend, args.seed, args.threads)
        else:
            run_sharded(schedule, random_inputs(plan.program, args.seed), args.backend,
                        args.seed, args.threads)
    _print_mesh_run(args, plan, label, schedule, console)
    if not args.check:
        return 0
    return print_checks(checks, _verdict(args.backend, label), console)


def _verdict(backend: str, label: str) -> str:
    """What ran, as the verdict line names it."""
    if backend == "iree":
        return f"per-device modules of {label} in IREE, collectives between them on the host,"
    if backend == "openmp":
        return (f"per-device parallel IR of {label} run with OpenMP, collectives between them "
                "on the host,")
    kernels = " with torch kernels" if backend == "torch" else ""
    return f"per-device programs of {label}, run core slice by core slice{kernels},"


def _lowered(args: argparse.Namespace, plan: ShardingPlan) -> MeshSchedule:
    """The bound plan lowered to its mesh schedule at the ``--param`` loop counts (each
    symbolic loop count the program keeps must be given)."""
    from apportion.workflows.sharded import lower_sharded

    return lower_sharded(plan, _params(args))


def _running(args: argparse.Namespace, console: Console, plan: ShardingPlan,
             schedule: MeshSchedule) -> Any:
    """The progress line while IREE or upstream MLIR (openmp) compiles the segments (other
    backends start at once)."""
    import contextlib

    compiler = {"iree": "IREE", "openmp": "upstream MLIR to OpenMP"}.get(args.backend)
    if compiler is None:
        return contextlib.nullcontext()
    from apportion.cli.progress import progress

    return progress(console, f"compiling {plan.program.name}'s segments with {compiler} and "
                             f"running them on {len(schedule.devices)} devices")


def _print_mesh_run(args: argparse.Namespace, plan: ShardingPlan, label: str,
                    schedule: MeshSchedule, console: Console) -> None:
    """The lines saying what ran (no times: they vary from run to run): for IREE, the
    schedule's summary and how many segment launches and distinct modules; without
    ``--check``, that the run is done."""
    if args.backend != "iree":
        if not args.check:
            console.print(f"ran {label}: {len(schedule.devices)} devices, each segment planned "
                          f"for {plan.target.cores} cores", highlight=False)
        return
    console.print(schedule.summary(), highlight=False, soft_wrap=True, markup=False)
    launches = sum(len(schedule.launches(d)) for d in range(len(schedule.devices)))
    n = schedule.distinct()
    console.print(f"{launches} segment launches in IREE ({n} distinct module"
                  f"{'s' if n != 1 else ''}), the steps between them on the host",
                  highlight=False)
    if not args.check:
        console.print(f"ran {label}", highlight=False)


#: the ``--shard-form`` forms that print a symbolic mesh as it is, for every size of its axes
SYMBOLIC_FORMS = ("annotated", "propagated", "dynamic")


def cmd_emit_sharded(args: argparse.Namespace, console: Console) -> int:
    """``emit --mesh``: the per-device programs (``--forall``: the plan lowered to its mesh
    schedule, rendered by ``mlir.mesh.mesh_mlir``), or
    ``--shard-form FORM``: the program in upstream MLIR's shard dialect (``sharding.forms``:
    ``annotated``, ``propagated``, ``partitioned``, ``unrolled``, ``dynamic``: over a symbolic
    mesh left unbound), verified upstream."""
    from apportion.sharding.lower import lower_plan

    if args.shard and args.mesh is None and not getattr(args, "target", None):
        raise ShardUsageError("--shard-form needs a mesh: give --mesh (e.g. --mesh tp=2)")
    plan = sharding_plan(args)  # a --torch model's program too
    sizes = mesh_sizes(plan, _params(args))
    if args.shard in SYMBOLIC_FORMS and sizes:  # a size given here would be dropped
        name, value = next(iter(sizes.items()))
        axis = plan.mesh.symbols[name]
        raise ShardUsageError(f"--param {name}={value}: --shard-form {args.shard} keeps the "
                              f"mesh symbolic, for every {name} in {axis.bounds} (axis "
                              f"{axis.name!r}); --param {name} binds it for --shard-form "
                              "partitioned or unrolled and --forall")
    if args.shard:
        from apportion.sharding import forms

        if args.shard == "annotated":
            text = forms.annotated_mlir(plan.program, plan.mesh, dict(plan.annotations))
        elif args.shard == "propagated":
            text = forms.propagated_mlir(plan)
        elif args.shard == "partitioned":
            text = forms.partitioned_mlir(plan.bind(sizes))
        elif args.shard == "dynamic":  # one text for every device count: never bound
            text = forms.dynamic_mlir(plan)
        else:
            bound = plan.bind(sizes)
            text = forms.unrolled_mlir(lower_plan(bound), bound.mesh)
        print(text, end="")
        return 0
    if not args.forall:
        raise ShardUsageError("with --mesh, emit --forall (the per-device programs as parallel "
                              "IR) or --shard-form FORM")
    from apportion.mlir.mesh import mesh_mlir

    print(mesh_mlir(lower_plan(plan, sizes)), end="")
    return 0


def cmd_schedule_sharded(args: argparse.Namespace, console: Console) -> int:
    """``schedule --mesh``: the plan lowered to its mesh schedule, as text: every device's
    placements, then every stage, a compute stage's core schedule nested under each device
    (``schedule.mesh.MeshSchedule``), at the ``--param`` mesh sizes and loop counts."""
    from apportion.sharding.lower import lower_plan

    planned = sharding_plan(args)  # a --torch model's program too
    sizes = mesh_sizes(planned, _params(args))
    plan = planned.bind(sizes)
    counts = {k: v for k, v in _params(args).items() if k in loop_counts(plan.program)}
    print(lower_plan(plan, params=counts or None))
    return 0
