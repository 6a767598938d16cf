"""A program sharded over a device mesh, planned, lowered and run on a backend: what ``apportion
shard``, ``run --mesh`` and ``schedule --mesh`` do, as functions.

``shard_program`` binds the program's run-time sizes and symbolic loop counts (``params``, as
``--param`` gives them), then propagates the annotations or searches every op's strategy.
``lower_sharded`` lowers the plan, bound at its mesh sizes, to the ``MeshSchedule`` at its
loop counts (each one the program keeps must be given). ``run_sharded`` runs a schedule on a
backend of the registry that has ``run_mesh``; ``check_sharded`` runs it on random inputs and
compares every output with the unsharded program run by the reference executor.

>>> import apportion as ap
>>> program, annotations = ap.sharding.load("examples/mlp.json")
>>> plan = shard_program(program, ap.sharding.parse_mesh("tp=2"), ap.targets.spyre(cores=4),
...                      annotations)
>>> checks, outputs = check_sharded(lower_sharded(plan), backend="reference")
>>> all(c.ok for c in checks), sorted(outputs) == sorted(program.outputs)
(True, True)
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from apportion.errors import ApportionError, ProgramError, TargetError
from apportion.target.presets import resolve

if TYPE_CHECKING:
    import numpy as np

    from apportion.backends.dtensor.runner import DistRun
    from apportion.ir.program import Program
    from apportion.runtime.reference import OutputCheck
    from apportion.schedule.mesh import MeshSchedule
    from apportion.sharding.mesh import Mesh
    from apportion.sharding.plan import ShardingPlan
    from apportion.sharding.spec import Sharding
    from apportion.target.target import Target

#: how a sharding plan is made: every op's strategy searched (an integer program), or the
#: program's annotations propagated
METHODS = ("search", "propagate")


class ShardUsageError(ApportionError):
    """A bad sharding option: a mesh, a mesh size, a run-time size or loop count to bind."""


def mesh_of(mesh: str | None, target: str | None = None) -> Mesh:
    """The mesh ``mesh`` names (a spec like ``dp=2,tp=4``, a preset or a TOML file); without
    one, the ``[mesh]`` table of the ``target`` TOML file; neither is refused, naming both.

    >>> mesh_of("dp=2,tp=2").devices
    4
    """
    from apportion.sharding.mesh import load_toml
    from apportion.sharding.mesh import resolve as resolve_mesh

    if mesh is not None:
        return resolve_mesh(mesh)
    if isinstance(target, str) and target.endswith(".toml"):
        try:
            with open(target, "rb") as f:
                carries = "mesh" in tomllib.load(f)
        except (OSError, ValueError) as e:
            raise TargetError(f"cannot read target file {target!r}: {e}") from None
        if not carries:
            raise ShardUsageError(f"no --mesh given and target file {target!r} has no "
                                  "[mesh] table")
        return load_toml(target)
    raise ShardUsageError("give a device mesh with --mesh (like --mesh dp=2), or a --target "
                          "TOML file with a [mesh] table")


def device_target(mesh: Mesh, target: str, cores: int | None = None,
                  explicit: bool = False) -> Target:
    """The devices' target: ``target`` (a preset or a TOML file) where the mesh carries none or
    it is ``explicit`` (given by the user, so it wins over the mesh's own); else the mesh's,
    ``cores`` applied to either.

    >>> device_target(mesh_of("tp=2"), "spyre", cores=8).cores
    8
    """
    if mesh.target is None or explicit:
        return resolve(target, cores)
    if cores is None:
        return mesh.target
    return replace(mesh.target, cores=cores)


def loop_counts(program: Program) -> tuple[str, ...]:
    """The symbolic loop counts of ``program``'s tiling groups, in order of appearance.

    >>> from apportion.frontend.json_format import load
    >>> loop_counts(load("examples/softmax_symbolic.json")), loop_counts(load("examples/mlp.json"))
    (('T',), ())
    """
    return tuple(dict.fromkeys(lv.count for g in program.tiling for lv in g.loops
                               if isinstance(lv.count, str)))


def bind_counts(program: Program, values: Mapping[str, int]) -> Program:
    """``program`` with the symbolic loop counts named in ``values`` made those static counts
    (each within its level's bounds), so that every device's tiles are planned at the count
    the run takes; other counts stay symbolic.

    >>> from apportion.frontend.json_format import load
    >>> bound = bind_counts(load("examples/softmax_symbolic.json"), {"T": 16})
    >>> [lv.count for lv in bound.tiling[0].loops]
    [16]
    """
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


def bind_program(program: Program, params: Mapping[str, int], mesh: Mesh) -> Program:
    """``program`` with its run-time sizes bound by ``params``, and the symbolic loop counts
    it names made static (``bind_counts``); a name neither it nor the mesh has is refused, as
    is a run-time size left unbound (sharding needs static sizes)."""
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


def check_mesh_sizes(mesh: Mesh, params: Mapping[str, int]) -> None:
    """Refuse, before any planning, a ``--param`` outside the bounds of the symbolic mesh axis
    size it names, one given without the mesh's other sizes, or sizes making more devices than
    a mesh may have.

    >>> from apportion.sharding.mesh import parse
    >>> check_mesh_sizes(parse("tp=N~2..8"), {"N": 9})
    Traceback (most recent call last):
    ...
    apportion.workflows.sharded.ShardUsageError: --param N=9: mesh 'tp=N~2..8': axis 'tp': N=9 ...
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


def mesh_sizes(plan: ShardingPlan, params: Mapping[str, int]) -> dict[str, int]:
    """The values of ``params`` that size the plan's symbolic mesh axes."""
    return {n: v for n, v in params.items() if n in plan.mesh.symbols}


def shard_program(program: Program, mesh: Mesh, target: Target,
                  annotations: Mapping[str, Sharding] | None = None, method: str = "search",
                  outputs: str = "any", params: Mapping[str, int] | None = None
                  ) -> ShardingPlan:
    """The sharding plan of ``program`` over ``mesh`` (at the planning size of a symbolic
    mesh), each device planned for ``target``: its run-time sizes and the loop counts
    ``params`` names bound first (``bind_program``), then ``annotations`` propagated
    (``method="propagate"``) or every op's strategy searched, outputs in ``any`` sharding or
    ``replicated``."""
    from apportion.sharding.propagate import propagate
    from apportion.sharding.search import search

    if method not in METHODS:
        raise ShardUsageError(f"method {method!r}: one of {', '.join(METHODS)}")
    program = bind_program(program, dict(params or {}), mesh)
    ann = dict(annotations or {})
    if method == "propagate":
        if outputs != "any":
            raise ShardUsageError("--outputs applies to --method search")
        return propagate(program, mesh, target, ann)
    return search(program, mesh, target, ann, outputs=outputs)


def schedule_counts(program: Program, params: Mapping[str, int]) -> dict[str, int]:
    """The ``params`` values of ``program``'s symbolic loop counts, which its per-device
    programs keep in their tiling groups; one left out is refused, naming it."""
    counts = loop_counts(program)
    missing = [c for c in counts if c not in params]
    if missing:
        flags = " ".join(f"--param {c}=N" for c in missing)
        raise ShardUsageError(f"program {program.name!r} has symbolic loop count"
                              f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which "
                              f"its per-device programs keep: pass {flags}")
    return {c: params[c] for c in counts}


def lower_sharded(plan: ShardingPlan, params: Mapping[str, int] | None = None) -> MeshSchedule:
    """``plan``, bound at the mesh sizes ``params`` names, lowered to its mesh schedule at the
    loop counts ``params`` gives (each symbolic loop count the program keeps must be given:
    ``schedule_counts``)."""
    from apportion.sharding.lower import lower_plan

    given = dict(params or {})
    bound = plan.bind(mesh_sizes(plan, given))
    return lower_plan(bound, params=schedule_counts(bound.program, given))


def mesh_backends() -> tuple[str, ...]:
    """The backends of the registry that run a mesh schedule (they have ``run_mesh``).

    >>> "reference" in mesh_backends(), "bundle" in mesh_backends()
    (True, False)
    """
    from apportion.backends import BACKENDS

    return tuple(name for name, backend in BACKENDS.items() if backend.run_mesh is not None)


def run_sharded(schedule: MeshSchedule, inputs: Mapping[str, Any], backend: str = "reference",
                seed: int = 0, threads: int | None = None) -> dict[str, np.ndarray]:
    """``schedule`` run on ``inputs`` by ``backend`` through the registry's ``run_mesh``,
    refused up front naming the documented limit where the backend does not take it; the
    program's outputs by name."""
    from apportion.backends import get, require

    runner = get(backend)
    if runner.run_mesh is None:
        raise ShardUsageError(f"--backend {backend} does not run sharded programs; with "
                              f"--mesh: {', '.join(mesh_backends())}")
    require(runner, schedule)
    return runner.run_mesh(schedule, inputs, seed=seed, threads=threads)


def check_sharded(schedule: MeshSchedule, backend: str = "reference", seed: int = 0,
                  threads: int | None = None
                  ) -> tuple[list[OutputCheck], dict[str, np.ndarray]]:
    """``run_sharded`` on random inputs of ``seed``, every output compared with the unsharded
    program run by the reference executor; the checks and the outputs."""
    from apportion.runtime.check import expect

    want = expect(schedule.program, seed)
    got = run_sharded(schedule, want.inputs, backend, seed, threads)
    return want.compare(got), got


def run_distributed(schedule: MeshSchedule, inputs: Mapping[str, Any] | None = None,
                    seed: int = 0, timeout_s: float = 120.0, device: str = "auto") -> DistRun:
    """``schedule`` run on ``torch.distributed``, one process per device, on ``inputs`` (None:
    random ones of ``seed``); the run's outputs with its placement checks, the ops torch ran
    on DTensors and the wall time."""
    import numpy as np

    from apportion.backends.dtensor.runner import run_mesh

    # writable arrays: torch warns on every read-only one a rank unpickles (constants)
    given = None if inputs is None else \
        {n: np.require(v, requirements="W") for n, v in inputs.items()}
    return run_mesh(schedule, given, seed=seed, timeout_s=timeout_s, device=device)


def check_distributed(schedule: MeshSchedule, seed: int = 0, timeout_s: float = 120.0,
                      device: str = "auto") -> tuple[list[OutputCheck], DistRun]:
    """``run_distributed`` on random inputs of ``seed``, every output compared with the
    unsharded program run by the reference executor."""
    from apportion.backends.dtensor.runner import run_mesh
    from apportion.runtime.check import expect

    want = expect(schedule.program, seed)
    got = run_mesh(schedule, want.inputs, seed=seed, timeout_s=timeout_s, device=device)
    return want.compare(got), got
