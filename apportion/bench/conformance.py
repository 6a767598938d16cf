"""``apportion bench conformance``: random programs run through every backend and compared
with the reference.

Case ``s`` (``s`` = S .. S+N-1, ``--seed S``, default 0, ``--n N``, default 100) is
``frontend.random_programs.case(s)``: a random program (every op kind of the registry, tiled
and not, writes through a merge of dims, run-time sizes), a target and a strategy. It is
planned (a program the planner refuses counts as not planned), and the reference backend runs
the plan on random inputs against the unplanned program: the plans it runs exactly are the
denominator. Each other backend then either refuses up front (``supports`` names the documented
limits that stop it, ``docs/limits.md``), or runs the plan on the same inputs (``bundle``:
emits the loop bundle and verifies it, as it does not run) and matches the reference, or
refuses while running with an error that cites a documented limit, or fails: wrong numbers, an
error that cites no limit, or a crash. Each failure is listed with its seed;
``apportion.frontend.random_programs.case(seed)`` gives the case back.

Mesh case ``s`` (the same ``s``) is ``frontend.random_meshes.mesh_case(s)``: a random program
(one of ``case``'s families, or one made for meshes) sharded over a random mesh of 1 or 2 axes
(sizes 2 to 4, uneven cuts included, sometimes a symbolic axis bound at run), its annotations
completed by propagation or the strategy search, and lowered (``sharding.lower.lower_plan``:
every device's segments planned for the case's target); a plan the planner refuses counts as
not planned. The reference's ``run_mesh`` runs the mesh schedule against the unplanned program,
then every other backend that runs meshes (``run_mesh``: ``torch``, ``iree``, ``openmp`` where
the ``mlir`` extra is installed, ``dtensor``) does, refusing (up front or while running, naming
a documented limit), matching, or failing as above; ``dtensor``, which starts
one process per device, runs only the first ``--dtensor N`` (default 2) the reference runs
exactly. The table counts each backend's rows as the programs' table does and says how many
plans hold each resharding step (``all_gather``, ``all_reduce``, ``reduce_scatter``,
``all_to_all``, ``slice``), each finish (a mean's, an argmax's) and uneven shards.

Goals: ``torch`` and ``iree`` run and match every plan the reference runs exactly (issue 18);
the reference itself matches the unplanned program on every plan and every sharded plan; no
mesh backend mismatches or crashes on a sharded plan it claims.

The ``--json`` document holds a ``Record`` per program case (``programs``) and a
``MeshRecord`` per mesh case (``meshes``).

>>> row = Tally("iree")
>>> row.add(Outcome("iree", "refused", "iree-host-op-in-loop-group"))
>>> row.refused, dict(row.limits)
(1, {'iree-host-op-in-loop-group': 1})
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.backends import BACKENDS, Backend
from apportion.bench import goals as bench_goals
from apportion.bench.harness import Outcome as SuiteOutcome
from apportion.bench.harness import Suite
from apportion.errors import ApportionError, PlanningError, ProgramError, TargetError
from apportion.frontend.random_meshes import MeshCase, mesh_case
from apportion.frontend.random_programs import Case, case
from apportion.ir.program import Program
from apportion.limits import cited
from apportion.mlir import upstream
from apportion.runtime.check import expect
from apportion.runtime.reference import OutputCheck
from apportion.schedule.mesh import Collective, MeshFinish, MeshSchedule, box_shape

#: cases run when ``--n`` is not given
DEFAULT_N = 100
#: the backends each plan goes through after the reference (dtensor runs sharding plans: the
#: mesh cases)
CHECKED = ("torch", "iree", "bundle")
#: the backends whose goal is every plan the reference runs (issue 18)
GOAL_BACKENDS = ("torch", "iree")
#: the mesh backends that run only the first few sharded plans (``--dtensor``): dtensor starts
#: one process per device, tens of seconds a plan
FIRST_FEW = ("dtensor",)
#: sharded plans the reference runs exactly that dtensor runs when ``--dtensor`` is not given
DEFAULT_DTENSOR = 2
#: the resharding steps and finishes a sharded plan may hold, as ``steps_of`` names them
MESH_STEPS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "slice",
              "mean finish", "argmax finish", "uneven")
#: the strategy search's time limit (seconds; a random program's solve takes milliseconds)
SEARCH_SECONDS = 20.0


@dataclass(frozen=True)
class Outcome:
    """What one backend did with one plan: ``match`` (ran and matched the reference; bundle:
    emitted and verified), ``refused`` (a documented limit, up front or while running) or
    ``failed`` (wrong numbers, an error citing no limit, a crash), with the limit's id or the
    failure's first line."""

    backend: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    #: refused by ``supports``, before any run
    up_front: bool = False


@dataclass
class Tally:
    """One backend's row: plans seen, claimed, matched, refused (by limit) and failed."""

    backend: str
    plans: int = 0
    claimed: int = 0
    matched: int = 0
    refused: int = 0
    failed: int = 0
    limits: Counter[str] = field(default_factory=Counter)

    def add(self, o: Outcome) -> None:
        self.plans += 1
        if o.status == "refused":
            self.refused += 1
            self.limits[o.detail] += 1
            if not o.up_front:
                self.claimed += 1  # it claimed the plan and refused while running
            return
        self.claimed += 1
        if o.status == "match":
            self.matched += 1
        else:
            self.failed += 1


@dataclass(frozen=True)
class Record:
    """One case: its seed, family, what it exercises, target, strategy, whether it planned and
    what the reference and each backend did (the ``--json`` document is a list of these)."""

    seed: int
    family: str
    features: tuple[str, ...]
    target: str
    cores: int
    strategy: str
    planned: str
    outcomes: tuple[Outcome, ...] = ()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:240]


def _mismatches(checks: list[OutputCheck]) -> str:
    """Empty when every output is within its dtype's tolerance, else which differ."""
    return ", ".join(f"{x.tensor} (max abs err {x.max_abs_err:.3g})"
                     for x in checks if not x.ok)


def _raised(backend: str, e: Exception, took: float) -> Outcome:
    """What ``backend`` raising ``e`` counts as: refused by the documented limit an apportion
    error cites, else failed with the error's first line."""
    limit = cited(str(e)) if isinstance(e, ApportionError) else None
    if limit is not None:
        return Outcome(backend, "refused", limit.id, took)
    return Outcome(backend, "failed", _first_line(e), took)


def run_backend(backend: Backend, c: Case, planned: Any, inputs: dict[str, np.ndarray],
                want: dict[str, np.ndarray]) -> Outcome:
    """``backend`` on one plan: refused up front, run (or emitted) and compared, refused while
    running, or failed."""
    start = time.perf_counter()
    try:
        limits = backend.supports(planned)
        if limits:
            return Outcome(backend.name, "refused", limits[0].id, up_front=True)
        if backend.emit is not None:
            backend.emit(planned)  # parses and verifies, or raises
            return Outcome(backend.name, "match", seconds=time.perf_counter() - start)
        assert backend.run is not None
        run = backend.run
        schedule = planned.schedule(dict(c.sizes))
        given = c.program.bind(dict(c.sizes)) if c.program.symbols else c.program
        expected = expect(given, inputs=inputs, expected=want)
        checks = expected.compare(run(schedule, expected.inputs))
        bad = _mismatches(checks)
    except Exception as e:  # a crash of a backend is a finding, not the end of the bench
        return _raised(backend.name, e, time.perf_counter() - start)
    return _compared(backend.name, bad, time.perf_counter() - start)


def _compared(backend: str, bad: str, took: float) -> Outcome:
    """A run that went through: failed on wrong numbers (``bad``), else a match."""
    if bad:
        return Outcome(backend, "failed", f"wrong numbers: {bad}", took)
    return Outcome(backend, "match", seconds=took)


def run_case(seed: int, backends: tuple[str, ...] = CHECKED) -> Record:
    """Case ``seed`` planned, run by the reference against the unplanned program, then by
    each of ``backends`` against the reference's run. numpy's warnings are silenced: a random
    program may take a square root of a negative number, and the reference defines the NaN
    every backend must give there too."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _run_case(seed, backends)


def _run_case(seed: int, backends: tuple[str, ...]) -> Record:
    import apportion as ap
    from apportion.runtime import random_inputs, run_unplanned

    c = case(seed)
    head = dict(seed=seed, family=c.family, features=c.features, target=c.target.name,
                cores=c.target.cores, strategy=c.strategy)
    try:
        planned = ap.plan(c.program, c.target, c.strategy)
    except (PlanningError, ProgramError) as e:
        return Record(**head, planned=f"refused: {_first_line(e)}")
    given = c.program.bind(dict(c.sizes)) if c.program.symbols else c.program
    inputs = random_inputs(given, seed)
    want = run_unplanned(given, inputs)
    outcomes = [run_backend(BACKENDS["reference"], c, planned, inputs, want)]
    if outcomes[0].status == "match":  # the others only on plans the reference runs exactly
        outcomes += [run_backend(BACKENDS[name], c, planned, inputs, want)
                     for name in backends]
    return Record(**head, planned="yes", outcomes=tuple(outcomes))


def run(n: int, console: Console, backends: tuple[str, ...] = CHECKED, first: int = 0
        ) -> list[Record]:
    """Cases first .. first+n-1; prints the table of backends, the limits they hit and every
    failure with its seed."""
    records: list[Record] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("conformance", total=n)
        for seed in range(first, first + n):
            progress.update(task, description=f"case {seed}")
            records.append(run_case(seed, backends))
            progress.advance(task)
    show(records, console, backends)
    return records


def tallies(records: Sequence[Record | MeshRecord], backends: tuple[str, ...] = CHECKED
            ) -> dict[str, Tally]:
    """Each backend's row over the planned cases (the others over those the reference runs
    exactly)."""
    rows = {name: Tally(name) for name in ("reference", *backends)}
    for r in records:
        for o in r.outcomes:
            rows[o.backend].add(o)
    return rows


def _show_rows(rows: dict[str, Tally], title: str, label: Callable[[str], str],
               console: Console) -> None:
    """The table of the backends' rows (each named by ``label``), then what refused each."""
    table = Table(title=title)
    for col in ("backend", "plans", "claims", "runs and matches", "refused (limit)", "fails",
                "share matched"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for name, t in rows.items():
        share = f"{t.matched / t.plans:.1%}" if t.plans else "-"
        table.add_row(label(name), str(t.plans), str(t.claimed), str(t.matched), str(t.refused),
                      str(t.failed), share)
    console.print(table)
    for name, t in rows.items():
        if t.limits:
            console.print(f"{name} refused by: " + ", ".join(
                f"{k} {v}" for k, v in t.limits.most_common()), highlight=False, soft_wrap=True)


def show(records: list[Record], console: Console, backends: tuple[str, ...] = CHECKED) -> None:
    planned = [r for r in records if r.planned == "yes"]
    families = Counter(r.family for r in records)
    mix = ", ".join(f"{k} {v}" for k, v in sorted(families.items()))
    console.print(f"{len(records)} random programs ({mix}); {len(planned)} planned, "
                  f"{len(records) - len(planned)} refused by the planner", highlight=False,
                  soft_wrap=True)
    rows = tallies(records, backends)
    _show_rows(rows, f"conformance: {rows['reference'].matched} plans the reference runs exactly",
               lambda name: name + (" (emits)" if name == "bundle" else ""), console)
    for r in records:
        for o in r.outcomes:
            if o.status == "failed":
                console.print(f"FAIL {o.backend} seed {r.seed} ({r.family}, {r.target} "
                              f"{r.cores} cores, {r.strategy}): {o.detail}", highlight=False,
                              soft_wrap=True, markup=False)
    bench_goals.show(goals(records, backends), console)


def goals(records: list[Record], backends: tuple[str, ...] = CHECKED) -> list[bench_goals.Goal]:
    """The reference matches the unplanned program on every plan; torch and iree run and
    match every plan the reference runs exactly."""
    planned = [r for r in records if r.planned == "yes"]
    exact = [r for r in planned if r.outcomes[0].status == "match"]
    out = [bench_goals.count("reference: the planned run matches the unplanned program",
                             [f"seed {r.seed}" for r in planned if r not in exact],
                             len(planned))]
    for name in GOAL_BACKENDS:
        if name not in backends:
            continue
        missed = [f"seed {r.seed} ({o.status}: {o.detail})" for r in exact for o in r.outcomes
                  if o.backend == name and o.status != "match"]
        out.append(bench_goals.count(f"{name} runs and matches every plan the reference runs "
                                     "exactly", missed, len(exact)))
    return out


# -- meshes ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MeshRecord:
    """One mesh case: its seed, family, what it exercises, mesh and bound sizes, chooser,
    target, whether it planned (and lowered), the resharding steps and finishes its schedule
    holds, and what the reference and each mesh backend did."""

    seed: int
    family: str
    features: tuple[str, ...]
    mesh: str
    sizes: dict[str, int]
    chooser: str
    target: str
    cores: int
    planned: str
    steps: tuple[str, ...] = ()
    outcomes: tuple[Outcome, ...] = ()


def mesh_backends() -> tuple[str, ...]:
    """The backends besides the reference that run a program sharded over a mesh (those with
    ``run_mesh``), in the registry's order; ``openmp`` only where the ``mlir`` extra (upstream
    MLIR and its OpenMP runtime) is installed: without it the backend runs nothing at all, a
    fact of this machine, not a finding about a plan."""
    return tuple(name for name in BACKENDS
                 if name != "reference" and BACKENDS[name].run_mesh is not None
                 and (name != "openmp" or _openmp_installed()))


def _openmp_installed() -> bool:
    return upstream.available() and upstream.openmp_library() is not None


def run_mesh_backend(backend: Backend, program: Program, schedule: MeshSchedule,
                     inputs: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> Outcome:
    """``backend`` on one mesh schedule: refused up front (``supports``), run (``run_mesh``)
    and compared with the unplanned program's outputs ``want``, refused while running (an
    error citing a documented limit), or failed (wrong numbers, an error citing none, a
    crash)."""
    run_mesh = backend.run_mesh
    assert run_mesh is not None
    start = time.perf_counter()
    try:
        limits = backend.supports(schedule)
        if limits:
            return Outcome(backend.name, "refused", limits[0].id, up_front=True)
        expected = expect(program, inputs=inputs, expected=want)
        checks = expected.compare(run_mesh(schedule, expected.inputs))
        bad = _mismatches(checks)
    except Exception as e:  # a crash of a backend is a finding, not the end of the bench
        return _raised(backend.name, e, time.perf_counter() - start)
    return _compared(backend.name, bad, time.perf_counter() - start)


def steps_of(schedule: MeshSchedule) -> tuple[str, ...]:
    """The kinds of resharding step and finish ``schedule`` holds (``mean finish``,
    ``argmax finish``), and ``uneven`` where some tensor's devices hold boxes of different
    shapes, in a fixed order."""
    seen: set[str] = set()
    layouts: list[tuple[Any, ...]] = []
    for stage in schedule.stages:
        if isinstance(stage, Collective):
            seen.add(stage.kind)
            layouts += [stage.src_boxes, stage.dst_boxes]
        elif isinstance(stage, MeshFinish):
            seen.add({"scale": "mean finish", "pack": "argmax finish"}[stage.parts[0].kind])
    for k in range(len(schedule.program.inputs)):
        layouts.append(tuple(dev.inputs[k].box for dev in schedule.devices))
    for k in range(len(schedule.program.outputs)):
        layouts.append(tuple(dev.outputs[k].box for dev in schedule.devices))
    if any(len({box_shape(b) for b in boxes}) > 1 for boxes in layouts):
        seen.add("uneven")
    return tuple(k for k in MESH_STEPS if k in seen)


def plan_mesh_case(c: MeshCase) -> MeshSchedule:
    """``c``'s sharding plan (propagated from its annotations, or searched within them) for
    its mesh, lowered at its bound sizes with every device's segments planned for its target;
    the planner's refusals propagate."""
    from apportion.sharding.lower import lower_plan
    from apportion.sharding.mesh import parse
    from apportion.sharding.propagate import propagate
    from apportion.sharding.search import search
    from apportion.sharding.spec import Sharding

    mesh = parse(c.mesh)
    ann = {name: Sharding(dims) for name, dims in c.shardings.items()}
    if c.chooser == "search":
        plan = search(c.program, mesh, c.target, annotations=ann, time_limit=SEARCH_SECONDS)
    else:
        plan = propagate(c.program, mesh, c.target, annotations=ann)
    return lower_plan(plan, dict(c.sizes) or None, c.target)


def run_mesh_case(seed: int, backends: tuple[str, ...] | None = None) -> MeshRecord:
    """Mesh case ``seed`` sharded and lowered, run by the reference against the unplanned
    program, then by each of ``backends`` (default: every backend that runs meshes) against
    it too; numpy's warnings silenced as ``run_case`` silences them."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _run_mesh_case(seed, mesh_backends() if backends is None else backends)


def _run_mesh_case(seed: int, backends: tuple[str, ...]) -> MeshRecord:
    from apportion.runtime import random_inputs, run_unplanned

    c = mesh_case(seed)
    head = dict(seed=seed, family=c.family, features=c.features, mesh=c.mesh,
                sizes=dict(c.sizes), chooser=c.chooser, target=c.target.name,
                cores=c.target.cores)
    try:
        schedule = plan_mesh_case(c)
    except (PlanningError, ProgramError, TargetError) as e:
        return MeshRecord(**head, planned=f"refused: {_first_line(e)}")
    inputs = random_inputs(c.program, seed)
    want = run_unplanned(c.program, inputs)
    outcomes = [run_mesh_backend(BACKENDS["reference"], c.program, schedule, inputs, want)]
    if outcomes[0].status == "match":  # the others only on plans the reference runs exactly
        outcomes += [run_mesh_backend(BACKENDS[name], c.program, schedule, inputs, want)
                     for name in backends]
    return MeshRecord(**head, planned="yes", steps=steps_of(schedule),
                      outcomes=tuple(outcomes))


def run_meshes(n: int, console: Console, dtensor: int = DEFAULT_DTENSOR,
               backends: tuple[str, ...] | None = None, first: int = 0) -> list[MeshRecord]:
    """Mesh cases first .. first+n-1 through the reference and every backend that runs meshes
    (``backends``, default ``mesh_backends()``), dtensor only on the first ``dtensor`` cases
    the reference runs exactly; prints their table."""
    names = mesh_backends() if backends is None else backends
    records: list[MeshRecord] = []
    exact = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("meshes", total=n)
        for seed in range(first, first + n):
            progress.update(task, description=f"mesh case {seed}")
            records.append(run_mesh_case(seed, tuple(
                name for name in names if name not in FIRST_FEW or exact < dtensor)))
            exact += bool(records[-1].outcomes) and records[-1].outcomes[0].status == "match"
            progress.advance(task)
    show_meshes(records, console, dtensor, names)
    return records


def show_meshes(records: list[MeshRecord], console: Console, dtensor: int = DEFAULT_DTENSOR,
                backends: tuple[str, ...] | None = None) -> None:
    """The mesh cases' table: one row per backend as the programs' table has, the steps the
    plans hold, the limits hit, every failure with its seed, and the goals."""
    planned = [r for r in records if r.planned == "yes"]
    families = Counter(r.family for r in records)
    mix = ", ".join(f"{k} {v}" for k, v in sorted(families.items()))
    console.print(f"{len(records)} random programs sharded over random meshes ({mix}); "
                  f"{len(planned)} planned, {len(records) - len(planned)} refused by the "
                  "planner", highlight=False, soft_wrap=True)
    steps = Counter(k for r in planned for k in r.steps)
    console.print("plans holding each step: " + (", ".join(
        f"{k} {steps[k]}" for k in MESH_STEPS if steps[k]) or "none"), highlight=False,
        soft_wrap=True)
    names = mesh_backends() if backends is None else backends
    rows = tallies(records, names)
    _show_rows(rows, f"mesh conformance: {rows['reference'].matched} sharded plans the "
               "reference runs exactly",
               lambda name: name + (f" (first {dtensor})" if name in FIRST_FEW else ""), console)
    for r in records:
        for o in r.outcomes:
            if o.status == "failed":
                console.print(f"FAIL {o.backend} mesh seed {r.seed} ({r.family} over {r.mesh}"
                              + "".join(f", {k}={v}" for k, v in r.sizes.items())
                              + f", {r.chooser}): {o.detail}", highlight=False, soft_wrap=True,
                              markup=False)
    bench_goals.show(mesh_goals(records, names), console)


def mesh_goals(records: list[MeshRecord], backends: tuple[str, ...] | None = None
               ) -> list[bench_goals.Goal]:
    """The reference's per-device run matches the unplanned program on every sharded plan;
    no mesh backend mismatches or crashes on a sharded plan it claims (a refusal naming a
    documented limit is no failure)."""
    planned = [r for r in records if r.planned == "yes"]
    exact = [r for r in planned if r.outcomes[0].status == "match"]
    out = [bench_goals.count("reference: the per-device run matches the unplanned program on "
                             "every sharded plan",
                             [f"mesh seed {r.seed}" for r in planned if r not in exact],
                             len(planned))]
    for name in mesh_backends() if backends is None else backends:
        given = [o for r in exact for o in r.outcomes if o.backend == name]
        if not given:
            continue
        missed = [f"mesh seed {r.seed} ({o.detail})" for r in exact for o in r.outcomes
                  if o.backend == name and o.status == "failed"]
        out.append(bench_goals.count(f"{name} matches or names a documented limit on every "
                                     "sharded plan the reference runs exactly", missed,
                                     len(given)))
    return out


def _suite(args: argparse.Namespace, console: Console) -> SuiteOutcome:
    n = getattr(args, "n", None) or DEFAULT_N
    if getattr(args, "limit", None) is not None:  # --limit N: the first N programs of --n
        n = min(n, args.limit)
    dtensor = getattr(args, "dtensor", None)
    first = getattr(args, "seed", None) or 0  # --seed S: cases S .. S+N-1, seeds not run before
    records = run(n, console, first=first)
    meshes = run_meshes(n, console, DEFAULT_DTENSOR if dtensor is None else dtensor,
                        first=first)
    doc = {"programs": [asdict(r) for r in records], "meshes": [asdict(r) for r in meshes]}
    return SuiteOutcome(doc, goals(records) + mesh_goals(meshes))


SUITE = Suite("conformance", frozenset({"n", "dtensor", "seed"}),
              "random programs, on one device and sharded over meshes, through every backend, "
              "compared with the reference", _suite)
