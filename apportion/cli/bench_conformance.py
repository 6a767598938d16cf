"""``apportion bench conformance``: random programs run through every backend and compared
with the reference.

Case ``s`` (``s`` = 0 .. N-1, ``--n N``, default 100) is ``frontend.random_programs.case(s)``:
a random program (every op kind of the registry, tiled and not, writes through a merge of
dims, run-time sizes), a target and a strategy. It is planned (a program the planner refuses
counts as not planned), and the reference backend runs the plan on random inputs against the
unplanned program: the plans it runs exactly are the denominator. Each other backend then
either refuses up front (``supports`` names the documented limits that stop it,
``docs/limits.md``), or runs the plan on the same inputs (``bundle``: emits the loop bundle and
verifies it, as it does not run) and matches the reference, or refuses while running with an
error that cites a documented limit, or fails: wrong numbers, an error that cites no limit, or
a crash. Each failure is listed with its seed; ``apportion.frontend.random_programs.case(seed)``
gives the case back.

Goals: ``torch`` and ``iree`` run and match every plan the reference runs exactly (issue 18);
the reference itself matches the unplanned program on every plan.

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
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.backends import BACKENDS, Backend
from apportion.backends.limits import cited
from apportion.cli import goals as bench_goals
from apportion.cli.bench_harness import Outcome as SuiteOutcome
from apportion.cli.bench_harness import Suite
from apportion.errors import ApportionError, PlanningError, ProgramError
from apportion.frontend.random_programs import Case, case

#: cases run when ``--n`` is not given
DEFAULT_N = 100
#: the backends each plan goes through after the reference (dtensor runs sharding plans over
#: meshes, one process per device: its conformance is in tests/conformance, marked distributed)
CHECKED = ("torch", "iree", "bundle")
#: the backends whose goal is every plan the reference runs (issue 18)
GOAL_BACKENDS = ("torch", "iree")


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


def _outputs_match(c: Case, planned: Any, want: dict[str, np.ndarray],
                   got: dict[str, np.ndarray]) -> str:
    """Empty when every output of the program is within its dtype's tolerance, else which
    differ (the reference's ``compare``)."""
    from apportion.runtime import compare

    given = c.program.bind(dict(c.sizes)) if c.program.symbols else c.program
    bad = [f"{x.tensor} (max abs err {x.max_abs_err:.3g})"
           for x in compare(want, got, given) if not x.ok]
    return ", ".join(bad)


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
        got = backend.run(planned, inputs, params=None, sizes=dict(c.sizes) or None)
        bad = _outputs_match(c, planned, want, got)
    except Exception as e:  # a crash of a backend is a finding, not the end of the bench
        limit = cited(str(e)) if isinstance(e, ApportionError) else None
        took = time.perf_counter() - start
        if limit is not None:
            return Outcome(backend.name, "refused", limit.id, took)
        return Outcome(backend.name, "failed", _first_line(e), took)
    took = time.perf_counter() - start
    if bad:
        return Outcome(backend.name, "failed", f"wrong numbers: {bad}", took)
    return Outcome(backend.name, "match", seconds=took)


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


def run(n: int, console: Console, backends: tuple[str, ...] = CHECKED) -> list[Record]:
    """Cases 0 .. n-1; prints the table of backends, the limits they hit and every failure
    with its seed."""
    records: list[Record] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("conformance", total=n)
        for seed in range(n):
            progress.update(task, description=f"case {seed}")
            records.append(run_case(seed, backends))
            progress.advance(task)
    show(records, console, backends)
    return records


def tallies(records: list[Record], backends: tuple[str, ...] = CHECKED) -> dict[str, Tally]:
    """Each backend's row over the planned cases (the others over those the reference runs
    exactly)."""
    rows = {name: Tally(name) for name in ("reference", *backends)}
    for r in records:
        for o in r.outcomes:
            rows[o.backend].add(o)
    return rows


def show(records: list[Record], console: Console, backends: tuple[str, ...] = CHECKED) -> None:
    planned = [r for r in records if r.planned == "yes"]
    families = Counter(r.family for r in records)
    mix = ", ".join(f"{k} {v}" for k, v in sorted(families.items()))
    console.print(f"{len(records)} random programs ({mix}); {len(planned)} planned, "
                  f"{len(records) - len(planned)} refused by the planner", highlight=False,
                  soft_wrap=True)
    rows = tallies(records, backends)
    ref = rows["reference"].matched
    table = Table(title=f"conformance: {ref} plans the reference runs exactly")
    for col in ("backend", "plans", "claims", "runs and matches", "refused (limit)", "fails",
                "share matched"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for name, t in rows.items():
        share = f"{t.matched / t.plans:.1%}" if t.plans else "-"
        table.add_row(name + (" (emits)" if name == "bundle" else ""), str(t.plans),
                      str(t.claimed), str(t.matched), str(t.refused), str(t.failed), share)
    console.print(table)
    for name, t in rows.items():
        if t.limits:
            console.print(f"{name} refused by: " + ", ".join(
                f"{k} {v}" for k, v in t.limits.most_common()), highlight=False, soft_wrap=True)
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


def _suite(args: argparse.Namespace, console: Console) -> SuiteOutcome:
    n = getattr(args, "n", None) or DEFAULT_N
    if getattr(args, "limit", None) is not None:  # --limit N: the first N programs of --n
        n = min(n, args.limit)
    records = run(n, console)
    doc = [asdict(r) for r in records]
    return SuiteOutcome(doc, goals(records))


SUITE = Suite("conformance", frozenset({"n"}),
              "random programs through every backend, compared with the reference", _suite)
