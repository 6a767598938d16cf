"""The command line's sharding: ``apportion shard``, ``run --mesh`` and ``emit --mesh``.

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
  program in upstream MLIR's shard dialect (``apportion.mlir.shard``), verified upstream.
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
from rich.markup import escape
from rich.table import Table

from apportion.cli.params import parse_params
from apportion.errors import ApportionError, TargetError
from apportion.target.presets import resolve
from apportion.target.target import Target

if TYPE_CHECKING:
    from apportion.cli.torch_models import TorchModel
    from apportion.ir.program import Program
    from apportion.schedule.mesh import MeshSchedule
    from apportion.sharding.mesh import Mesh
    from apportion.sharding.plan import ShardingPlan
    from apportion.sharding.spec import Sharding

METHODS = ("search", "propagate")


class ShardUsageError(ApportionError):
    """A bad sharding option on the command line."""


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


def _mesh(args: argparse.Namespace) -> Mesh:
    import tomllib

    from apportion.sharding.mesh import load_toml
    from apportion.sharding.mesh import resolve as resolve_mesh

    if args.mesh is not None:
        return resolve_mesh(args.mesh)
    if isinstance(args.target, str) and args.target.endswith(".toml"):
        try:
            with open(args.target, "rb") as f:
                carries = "mesh" in tomllib.load(f)
        except (OSError, ValueError) as e:
            raise TargetError(f"cannot read target file {args.target!r}: {e}") from None
        if not carries:
            raise ShardUsageError(f"no --mesh given and target file {args.target!r} has no "
                                  "[mesh] table")
        return load_toml(args.target)
    raise ShardUsageError("give a device mesh with --mesh (like --mesh dp=2), or a --target "
                          "TOML file with a [mesh] table")


def _target(args: argparse.Namespace, mesh: Mesh) -> Target:
    """The devices' target: an explicit ``--target`` wins over the mesh's own (a ``--mesh``
    file's ``target``); a mesh read from the ``--target`` file carries that file's target, or
    the preset its ``[mesh] target`` names; else the default, spyre. ``--cores`` applies to
    each."""
    from_target_file = args.mesh is None  # _mesh read the mesh from the --target file
    explicit = getattr(args, "target_given", False) and not from_target_file
    if mesh.target is None or explicit:
        return resolve(args.target, args.cores)
    if args.cores is None:
        return mesh.target
    from dataclasses import replace

    return replace(mesh.target, cores=args.cores)


def _params(args: argparse.Namespace) -> dict[str, int]:
    """``--param NAME=SIZE`` values; the syntax only."""
    return parse_params(getattr(args, "param", None), ShardUsageError)


def loop_counts(program: Program) -> tuple[str, ...]:
    """The symbolic loop counts of ``program``'s tiling groups, in order of appearance.

    >>> from apportion.frontend.json_format import load
    >>> loop_counts(load("examples/softmax_symbolic.json")), loop_counts(load("examples/mlp.json"))
    (('T',), ())
    """
    return tuple(dict.fromkeys(lv.count for g in program.tiling for lv in g.loops
                               if isinstance(lv.count, str)))


def bind_counts(program: Program, values: dict[str, int]) -> Program:
    """``program`` with the symbolic loop counts named in ``values`` made those static counts
    (each within its level's bounds), so that every device's tiles are planned at the count
    the run takes; other counts stay symbolic.

    >>> from apportion.frontend.json_format import load
    >>> bound = bind_counts(load("examples/softmax_symbolic.json"), {"T": 16})
    >>> [lv.count for lv in bound.tiling[0].loops]
    [16]
    """
    from dataclasses import replace

    from apportion.ir.program import LoopLevel

    groups = []
    for g in program.tiling:
        levels = []
        for lv in g.loops:
            v = values.get(lv.count) if isinstance(lv.count, str) else None
            if v is None:
                levels.append(lv)
                continue
            if v < lv.min or (lv.max is not None and v > lv.max):
                top = lv.max if lv.max is not None else "the target's max_loop_count"
                raise ShardUsageError(f"--param {lv.count}={v}: loop count {lv.count!r} of "
                                      f"tiling group {list(g.ops)} takes {lv.min}..{top}")
            levels.append(LoopLevel(v, lv.dims))
        groups.append(replace(g, loops=tuple(levels)))
    return replace(program, tiling=tuple(groups))


def _bind_program(program: Program, params: dict[str, int], mesh: Mesh) -> Program:
    """``program`` with its run-time sizes bound by ``params``, and the symbolic loop counts
    it names made static (``bind_counts``); a name neither it nor the mesh has is refused, as
    is a run-time size left unbound."""
    from apportion.errors import ProgramError

    syms = program.symbol_map
    counts = loop_counts(program)
    given = {n: v for n, v in params.items() if n in counts}
    if given:
        program = bind_counts(program, given)
    for name in params:
        if name not in syms and name not in mesh.symbols and name not in counts:
            mesh_syms = ", ".join(mesh.symbols) or "none"
            raise ShardUsageError(f"--param {name}: not a symbolic size of mesh {mesh.name!r} "
                                  f"(its symbolic sizes: {mesh_syms}) nor a run-time size of "
                                  f"program {program.name!r} (its: "
                                  f"{', '.join(syms) or 'none'})"
                                  + (f" nor one of its symbolic loop counts ({', '.join(counts)})"
                                     if counts else ""))
    if not syms:
        return program
    missing = [n for n in syms if n not in params]
    if missing:
        flags = " ".join(f"--param {n}=SIZE" for n in missing)
        raise ShardUsageError(f"program {program.name!r} has run-time sizes "
                              f"{', '.join(missing)}; sharding needs static sizes: pass {flags}")
    try:
        return program.bind({n: v for n, v in params.items() if n in syms})
    except ProgramError as e:
        raise ShardUsageError(f"--param: {e}") from None


def check_mesh_sizes(mesh: Mesh, params: dict[str, int]) -> None:
    """Refuse, before any planning, a ``--param`` outside the bounds of the symbolic mesh axis
    size it names, one given without the mesh's other sizes, or sizes making more devices than
    a mesh may have.

    >>> from apportion.sharding.mesh import parse
    >>> check_mesh_sizes(parse("tp=N~2..8"), {"N": 9})
    Traceback (most recent call last):
    ...
    apportion.cli.shard.ShardUsageError: --param N=9: mesh 'tp=N~2..8': axis 'tp': N=9 is outside...
    """
    syms = mesh.symbols
    sizes = {n: v for n, v in params.items() if n in syms}
    for name, value in sizes.items():
        try:
            syms[name].bind(value)
        except TargetError as e:  # "mesh axis 'tp': N=9 is outside its bounds 2..8"
            raise ShardUsageError(f"--param {name}={value}: mesh {mesh.name!r}: "
                                  f"{str(e).removeprefix('mesh ')}") from None
    if not sizes:
        return
    flags = " ".join(f"--param {n}={v}" for n, v in sizes.items())
    rest = [n for n in syms if n not in sizes]
    if rest:  # the per-device programs need every size; one bound alone is never used
        more = " ".join(f"--param {n}=SIZE" for n in rest)
        raise ShardUsageError(f"{flags}: mesh {mesh.name!r} has symbolic sizes "
                              f"{', '.join(syms)}, and its per-device programs need every one: "
                              f"give {more} too, or none")
    try:
        mesh.bind(sizes)
    except TargetError as e:  # more devices than a mesh may have
        raise ShardUsageError(f"{flags}: {e}") from None


def mesh_sizes(plan: ShardingPlan, args: argparse.Namespace) -> dict[str, int]:
    """The ``--param`` values that size the plan's mesh axes."""
    return {n: v for n, v in _params(args).items() if n in plan.mesh.symbols}


def _torch_model(args: argparse.Namespace) -> TorchModel | None:
    """The ``--torch`` model, lowered (None without ``--torch``); a program file given as
    well is refused."""
    spec = getattr(args, "torch", None)
    if spec is None:
        return None
    from apportion.cli.torch_models import load_model

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
    ``--torch`` model it shards (None for a program file)."""
    if getattr(args, "auto_tile", False) or getattr(args, "strategy", "balanced") != "balanced":
        raise ShardUsageError("--strategy and --auto-tile do not apply with --mesh: each "
                              "device's programs are planned with the balanced strategy")
    if getattr(args, "torch", None) is None:
        program, ann = _load(args.program)
        mesh = _mesh(args)
        check_mesh_sizes(mesh, _params(args))
        return _plan_for(args, program, ann, mesh), None
    mesh = _mesh(args)  # a bad mesh or mesh size is refused before the model is exported
    check_mesh_sizes(mesh, _params(args))
    tm = _torch_model(args)
    assert tm is not None
    return _plan_for(args, tm.lowered.program, {}, mesh), tm


def _plan_for(args: argparse.Namespace, program: Program, ann: dict[str, Sharding],
              mesh: Mesh) -> ShardingPlan:
    from apportion.sharding.propagate import propagate
    from apportion.sharding.search import search

    program = _bind_program(program, _params(args), mesh)
    target = _target(args, mesh)
    if args.method == "propagate":
        if args.outputs != "any":
            raise ShardUsageError("--outputs applies to --method search")
        return propagate(program, mesh, target, ann)
    return search(program, mesh, target, ann, outputs=args.outputs)


def cmd_shard(args: argparse.Namespace, console: Console) -> int:
    plan, tm = sharded(args)
    sizes = mesh_sizes(plan, args)
    if args.format == "json":
        plan.bind(sizes)  # a bad --param is refused here too
        doc = plan.to_dict()
        if tm is not None:  # where each op comes from in the model, as plan --torch says
            from apportion.cli.torch_models import origins_doc

            doc["torch"] = tm.spec
            doc["origins"] = origins_doc(tm.lowered, [o.op for o in plan.ops])
        print(json.dumps(doc, indent=1))
        return 0
    print_plan(plan, console, sizes)
    if tm is not None:
        from apportion.cli.torch_models import lowered_line

        console.print(lowered_line(tm.lowered), highlight=False, soft_wrap=True, markup=False)
    return 0


def print_plan(plan: ShardingPlan, console: Console, sizes: dict[str, int] | None = None
               ) -> None:
    """The plan's table, summary and per-device programs (a symbolic mesh's at ``sizes``)."""
    from apportion.sharding.rules import Finish
    from apportion.sharding.unroll import unroll

    p = plan.program
    table = Table(title=escape(f"{p.name} over {plan.mesh} ({plan.method}; "
                               f"{plan.target.name}, {plan.target.cores} cores per device)"))
    for col in ("op", "kind", "strategy", "output", "largest device's part", "compute us",
                "resharded before it", "comm us"):
        table.add_column(col, justify="right" if col.endswith("us") else "left")
    before: dict[int, list[Any]] = {}
    for t in plan.transfers:
        before.setdefault(t.at, []).append(t)
    for i, o in enumerate(plan.ops):
        op = p.op(o.op)
        moves = before.get(i, [])
        table.add_row(escape(o.op), op.kind.name, o.strategy.label, escape(str(o.strategy.out)),
                      " ".join(f"{d}={n}" for d, n in o.local_sizes), f"{o.compute_us:.2f}",
                      escape("; ".join(f"{t.tensor}: {', '.join(str(s) for s in t.steps)}"
                                       for t in moves)) or "-",
                      f"{sum(t.time_us for t in moves):.2f}" if moves else "-")
    console.print(table)
    for t in before.get(len(p.ops), []):
        console.print(f"output {t.tensor} handed back as {t.dst}: "
                      f"{', '.join(str(s) for s in t.steps)} ({t.time_us:.2f} us)",
                      highlight=False, markup=False)
    placed = ", ".join(f"{n} {s}" for n, s in plan.inputs)
    console.print(f"inputs placed: {placed}", highlight=False, soft_wrap=True, markup=False)
    console.print(plan.summary(), highlight=False, soft_wrap=True, markup=False)
    if plan.method == "search":
        stats = dict(plan.stats)
        console.print(f"search: {stats.get('nodes')} nodes in {stats.get('classes')} classes, "
                      f"{stats.get('columns')} variables, {stats.get('rows')} constraints, "
                      f"{stats.get('cost_evaluations')} cost evaluations; solved in "
                      f"{plan.solve_s:.3f} s (integer program {stats.get('ilp_s')} s, "
                      f"{stats.get('status')})", highlight=False, soft_wrap=True)
    if plan.mesh.symbolic and not sizes:
        flags = " ".join(f"--param {s}=SIZE" for s in plan.mesh.symbols)
        console.print(f"per-device programs: once the mesh's sizes are bound ({flags})",
                      highlight=False)
        return
    u = unroll(plan, sizes)
    stages = u.devices[0].stages
    segs = len(u.devices[0].segments)
    fins = sum(isinstance(s, Finish) for s in stages)
    at = f" at {', '.join(f'{k}={v}' for k, v in (sizes or {}).items())}" if sizes else ""
    console.print(f"per-device programs{at}: {len(u.devices)} devices, {len(stages)} stages "
                  f"each ({segs} compute segments, {len(stages) - segs - fins} collectives"
                  + (f", {fins} finishes" if fins else "") +
                  f"), {u.distinct_segments} distinct segment programs", highlight=False)
    for line in u.tiling_lines():
        console.print(line, highlight=False, soft_wrap=True, markup=False)


def cmd_run_sharded(args: argparse.Namespace, console: Console,
                    print_checks: Callable[..., int]) -> int:
    """``run --mesh``: the per-device programs run and (``--check``) compared with the
    unsharded program, or for a ``--torch`` model with the model run eagerly in PyTorch on
    its example inputs; ``print_checks`` prints the comparison (``cli/main.py``'s)."""
    if args.backend not in MESH_BACKENDS:
        raise ShardUsageError(f"--backend {args.backend} does not run sharded programs; with "
                              f"--mesh: {', '.join(MESH_BACKENDS)}")
    if args.backend in ("dtensor", "iree") and args.threads is not None:
        raise ShardUsageError("--threads applies to the reference and torch backends and to "
                              "openmp (its OpenMP team)")
    planned, tm = sharded(args)
    if tm is not None:  # a run-time size (--dynamic) bound by --param: the inputs at that size
        from apportion.cli.torch_models import at_sizes

        bound = {k: v for k, v in _params(args).items() if k in tm.lowered.program.symbol_map}
        tm = at_sizes(tm, bound) if bound else tm
    sizes = mesh_sizes(planned, args)
    plan = planned.bind(sizes)
    if planned.mesh.symbolic:
        console.print(f"mesh sizes: {', '.join(f'{k}={v}' for k, v in sizes.items())} "
                      f"(planned at {planned.mesh.planning_text()})", highlight=False)
    source = "" if tm is None else f" from --torch {tm.spec}"
    label = f"{plan.program.name}{source} over {plan.mesh} ({plan.method}, {args.backend})"
    if tm is None:
        return _run_program(args, plan, label, console, print_checks)
    from apportion.cli.torch_models import compare_eager, failures, model_inputs

    inputs = model_inputs(tm)
    eager = "the model run eagerly in PyTorch"
    if args.backend == "dtensor":
        import numpy as np

        from apportion.backends.dtensor.runner import run_mesh as run_dtensor
        from apportion.sharding.lower import lower_plan

        # writable arrays: torch warns on every read-only one a rank unpickles (constants)
        given = {n: np.require(v, requirements="W") for n, v in inputs.items()}
        with failures(tm, "the distributed run"):
            run = run_dtensor(lower_plan(plan), given, seed=args.seed, timeout_s=args.timeout,
                              device=args.device)
        _print_dist(plan, run, console)
        if not args.check:
            console.print(f"ran {label}", highlight=False)
            return 0
        return print_checks(compare_eager(tm, run.outputs), f"distributed run of {label}",
                            console, eager)
    schedule = _lowered(args, plan)
    with failures(tm, f"the per-device run ({args.backend})"), \
            _running(args, console, plan, schedule):
        outputs = _run_mesh(args, schedule, inputs)
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
    if args.backend == "dtensor":
        from apportion.backends.dtensor.runner import check_mesh, run_mesh
        from apportion.sharding.lower import lower_plan

        lowered = lower_plan(plan)
        if args.check:
            checks, run = check_mesh(lowered, seed=args.seed, timeout_s=args.timeout,
                                     device=args.device)
        else:
            run = run_mesh(lowered, seed=args.seed, timeout_s=args.timeout, device=args.device)
            checks = None
        _print_dist(plan, run, console)
        if checks is None:
            console.print(f"ran {label}", highlight=False)
            return 0
        return print_checks(checks, f"distributed run of {label}", console)
    from apportion.runtime.reference import compare, random_inputs, run_unplanned

    schedule = _lowered(args, plan)
    inputs = random_inputs(plan.program, args.seed)
    with _running(args, console, plan, schedule):
        outputs = _run_mesh(args, schedule, inputs)
        checks = compare(run_unplanned(plan.program, inputs), outputs, plan.program) \
            if args.check else None
    _print_mesh_run(args, plan, label, schedule, console)
    if checks is None:
        return 0
    return print_checks(checks, _verdict(args.backend, label), console)


#: the backends that run a mesh schedule (their ``run_mesh``)
MESH_BACKENDS = ("reference", "torch", "iree", "openmp", "dtensor")


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
    symbolic loop count the program keeps must be given: ``_counts``)."""
    from apportion.sharding.lower import lower_plan

    return lower_plan(plan, params=_counts(args, plan.program))


def _run_mesh(args: argparse.Namespace, schedule: MeshSchedule, inputs: dict[str, Any]
              ) -> dict[str, Any]:
    """``schedule`` run on ``inputs`` by ``--backend`` through the registry's ``run_mesh``,
    refused up front naming the documented limit where the backend does not take it."""
    from apportion.backends import get, require

    backend = get(args.backend)
    require(backend, schedule)
    assert backend.run_mesh is not None  # every backend of MESH_BACKENDS has one
    return backend.run_mesh(schedule, inputs, seed=args.seed, threads=args.threads)


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


def _counts(args: argparse.Namespace, program: Program) -> dict[str, int]:
    """The ``--param`` values of ``program``'s symbolic loop counts, which its per-device
    programs keep in their tiling groups; one left out is refused, naming it."""
    params = _params(args)
    counts = loop_counts(program)
    missing = [c for c in counts if c not in params]
    if missing:
        flags = " ".join(f"--param {c}=N" for c in missing)
        raise ShardUsageError(f"program {program.name!r} has symbolic loop count"
                              f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which "
                              f"its per-device programs keep: pass {flags}")
    return {c: params[c] for c in counts}


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
    ``--shard-form FORM``: the program in upstream MLIR's shard dialect (``apportion.mlir.shard``:
    ``annotated``, ``propagated``, ``partitioned``, ``unrolled``, ``dynamic``: over a symbolic
    mesh left unbound), verified upstream."""
    from apportion.sharding.lower import lower_plan

    if args.shard and args.mesh is None and not getattr(args, "target", None):
        raise ShardUsageError("--shard-form needs a mesh: give --mesh (e.g. --mesh tp=2)")
    plan = sharding_plan(args)  # a --torch model's program too
    sizes = mesh_sizes(plan, args)
    if args.shard in SYMBOLIC_FORMS and sizes:  # a size given here would be dropped
        name, value = next(iter(sizes.items()))
        axis = plan.mesh.symbols[name]
        raise ShardUsageError(f"--param {name}={value}: --shard-form {args.shard} keeps the "
                              f"mesh symbolic, for every {name} in {axis.bounds} (axis "
                              f"{axis.name!r}); --param {name} binds it for --shard-form "
                              "partitioned or unrolled and --forall")
    if args.shard:
        from apportion.mlir import shard as shard_mlir

        if args.shard == "annotated":
            text = shard_mlir.annotated_mlir(plan.program, plan.mesh, dict(plan.annotations))
        elif args.shard == "propagated":
            text = shard_mlir.propagated_mlir(plan)
        elif args.shard == "partitioned":
            text = shard_mlir.partitioned_mlir(plan.bind(sizes))
        elif args.shard == "dynamic":  # one text for every device count: never bound
            text = shard_mlir.dynamic_mlir(plan)
        else:
            bound = plan.bind(sizes)
            text = shard_mlir.unrolled_mlir(lower_plan(bound), bound.mesh)
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
    sizes = mesh_sizes(planned, args)
    plan = planned.bind(sizes)
    counts = {k: v for k, v in _params(args).items() if k in loop_counts(plan.program)}
    print(lower_plan(plan, params=counts or None))
    return 0
