"""`apportion bench upstream`: upstream MLIR 22 as a second opinion on apportion's sharding.

For every example program (its annotations, on a mesh of 2 devices per axis they name; ``tp=2``
where there are none) and ``--n`` random mesh cases (``frontend.random_meshes.mesh_case``, seeds
0..N-1, default ``DEFAULT_N``):

* propagation: upstream's ``--sharding-propagation`` on the annotated form against apportion's
  ``propagate`` from the same annotations, tensor by tensor (``sharding.upstream_check``);
* the search: for a case the search plans, upstream's propagation against the search's plan
  (where propagation agrees and the search does not, the search chose another strategy);
* partitioning: upstream's ``--shard-partition`` on the fully annotated form of apportion's
  plan (the case's chooser: propagation or the search) against the plan's collectives.

Each case agrees, differs (the kinds of differences named) or is refused by upstream (the op
and reason named). Where propagation differs, both choices are run: apportion's plan and one
pinned to upstream's shardings (``upstream_choice``), each per device against the unplanned
reference, with their predicted times. No goal: a difference is not a wrong result; a plan
that runs wrong is (exit status 1).

>>> [c.name for c in example_cases()][:1]
['attention']
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from apportion.bench.harness import Outcome, Suite
from apportion.errors import ApportionError, UsageError
from apportion.frontend.random_meshes import mesh_case
from apportion.ir.program import Program
from apportion.mlir.upstream import MISSING, available
from apportion.sharding import oracle
from apportion.sharding.mesh import Mesh, parse
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding, load
from apportion.sharding.unroll import unroll
from apportion.sharding.upstream_check import (
    PartitionReport,
    PropagationReport,
    against,
    compare_partition,
    compare_propagation,
    rates,
    refusal_class,
    upstream_choice,
)

#: random mesh cases when --n is not given
DEFAULT_N = 20
#: the example programs' folder: the repository's, beside the package (not the current
#: folder's, which outside the repository held none and the suite ran no example)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class Case:
    """One program to compare: its name, the mesh, the annotations, how apportion chooses the
    partitioned plan, and the sizes a symbolic mesh axis is bound to."""

    name: str
    program: Program
    mesh: Mesh
    annotations: Mapping[str, Sharding]
    chooser: str = "propagate"
    sizes: Mapping[str, int] | None = None


def example_cases(folder: Path | None = None) -> list[Case]:
    """Every example of ``folder`` (default ``EXAMPLES``) with its annotations on 2 devices per
    axis they name (``tp=2`` if none), run-time sizes bound at 256; a folder without any is
    refused (an installed package carries no examples: the suite runs from a source checkout)."""
    folder = EXAMPLES if folder is None else folder
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise UsageError(f"bench upstream compares the repository's example programs, and "
                         f"{str(folder)!r} holds none (a package installed without its "
                         "repository has no examples): run it from a source checkout")
    out = []
    for path in paths:
        prog, ann = load(path)
        if prog.symbols:
            prog = prog.bind({s.name: 256 for s in prog.symbols})
        axes = sorted({a for s in ann.values() for a in s.axes}) or ["tp"]
        out.append(Case(path.stem, prog, parse(",".join(f"{a}=2" for a in axes)), ann))
    return out


def random_cases(n: int) -> list[Case]:
    """Random mesh cases 0..n-1."""
    out = []
    for seed in range(n):
        c = mesh_case(seed)
        ann = {k: Sharding(v) for k, v in c.shardings.items()}
        out.append(Case(f"random {seed} ({c.family})", c.program, parse(c.mesh), ann,
                        c.chooser, dict(c.sizes) or None))
    return out


def compare(case: Case) -> tuple[PropagationReport, PartitionReport | None, str]:
    """Both comparisons of one case; the partition one is None (with the reason) where
    apportion refuses to plan the case."""
    try:
        prop = propagate(case.program, case.mesh, annotations=case.annotations)
        plan = prop if case.chooser == "propagate" else \
            search(case.program, case.mesh, annotations=case.annotations, time_limit=10)
        bound = plan.bind(dict(case.sizes) if case.sizes else None)
    except ApportionError as e:
        return PropagationReport(case.program.name, case.mesh.spec(), (), str(e)), None, str(e)
    return compare_propagation(case.program, case.mesh, case.annotations, prop), \
        compare_partition(bound), ""


def search_vs(case: Case, prop: PropagationReport) -> str:
    """For a case the search plans: upstream's propagation against the search's plan on the
    same annotations (``against``); a tensor where propagation agrees with upstream and the
    search does not is the search choosing another strategy than propagation."""
    if case.chooser != "search" or prop.verdict == "refused":
        return ""
    plan = search(case.program, case.mesh, annotations=case.annotations, time_limit=10)
    r = against(prop, plan)
    if r.verdict == "agree":
        return "agree"
    by = {t.tensor: t for t in prop.tensors}
    moved = sum(1 for t in r.tensors if not t.agrees and by[t.tensor].agrees)
    rest = r.kinds
    parts = [f"search chose another strategy than propagation x{moved}"] if moved else []
    parts += [f"{k} x{n}" for k, n in sorted(rest.items())] if not moved else []
    return "differ: " + ", ".join(parts)


def both_run(case: Case, prop: PropagationReport) -> str:
    """Where propagation differs: apportion's plan and one pinned to upstream's shardings
    (``upstream_choice``) each run per device against the unplanned reference, and their
    predicted times (``ok 10.1 / ok 28.1 us``: apportion's, then upstream's)."""
    mine = propagate(case.program, case.mesh, annotations=case.annotations)
    try:
        theirs = upstream_choice(case.program, case.mesh, case.annotations, prop)
    except ApportionError as e:
        return f"upstream's choice refused by apportion: {str(e)[:60]}"
    out = []
    for plan in (mine, theirs):
        bound = plan.bind(dict(case.sizes) if case.sizes else None)
        ok = all(c.ok for c in oracle.check(unroll(bound)))
        out.append(f"{'ok' if ok else 'WRONG'} {plan.predicted_us:.1f}")
    return " / ".join(out) + " us"


def _what(report: PropagationReport | PartitionReport | None) -> str:
    if report is None:
        return "-"
    if report.verdict == "refused":
        return f"refused: {refusal_class(report.refused)}"
    if report.verdict == "agree":
        slices = isinstance(report, PartitionReport) and report.slices_differ
        return "agree (local slices differ)" if slices else "agree"
    return "differ: " + ", ".join(f"{k} x{n}" for k, n in sorted(report.kinds.items()))


def run(args: argparse.Namespace, console: Console) -> Outcome:
    """The suite: every case compared, one table of cases and one of rates."""
    if not available():
        raise UsageError(MISSING)
    cases = example_cases()
    if args.limit is not None:
        cases = cases[:args.limit]
    cases += random_cases(args.n if args.n is not None else DEFAULT_N)
    table = Table(title="upstream MLIR 22 against apportion: propagation and partitioning")
    for col in ("case", "mesh", "propagation", "where it differs: run, predicted us "
                "(apportion / upstream)", "the search's plan", "partition"):
        table.add_column(col, overflow="fold")
    doc = []
    groups: dict[str, dict[str, list]] = {"examples": {"prop": [], "part": []},
                                         "random": {"prop": [], "part": []}}
    kinds: Counter[str] = Counter()
    failed = False
    for case in cases:
        prop, part, refused = compare(case)
        group = groups["random" if case.name.startswith("random") else "examples"]
        if refused:
            table.add_row(case.name, case.mesh.spec(), f"apportion refused: {refused[:80]}", "",
                          "", "-")
            continue
        group["prop"].append(prop)
        if part is not None:
            group["part"].append(part)
        for r, side in ((prop, "propagation"), (part, "partition")):
            if r is not None and r.verdict == "differ":
                for k, n in r.kinds.items():
                    kinds[f"{side}: {k}"] += n
            if r is not None and r.verdict == "refused":
                kinds[f"{side} refused: {refusal_class(r.refused)}"] += 1
        runs = both_run(case, prop) if prop.verdict == "differ" else ""
        failed |= "WRONG" in runs
        searched = search_vs(case, prop)
        if searched.startswith("differ: search"):
            kinds["search: chose another strategy than propagation"] += 1
        table.add_row(case.name, case.mesh.spec(), _what(prop), runs, searched, _what(part))
        doc.append({"case": case.name, "mesh": case.mesh.spec(), "propagation": _what(prop),
                    "runs": runs, "search": searched, "partition": _what(part)})
    console.print(table)
    summary = Table(title="agreement rates")
    for col in ("cases", "comparison", "agree", "differ", "upstream refused", "agreement"):
        summary.add_column(col)
    for name, g in groups.items():
        for side, key in (("propagation", "prop"), ("partition", "part")):
            r = rates(g[key])
            compared = r["agree"] + r["differ"]
            summary.add_row(name, side, str(r["agree"]), str(r["differ"]), str(r["refused"]),
                            f"{r['agree'] / compared:.0%} of {compared}" if compared else "-")
    console.print(summary)
    why = Table(title="kinds of differences and refusals (tensors or collectives)")
    why.add_column("kind", overflow="fold")
    why.add_column("count")
    for k, n in kinds.most_common():
        why.add_row(k, str(n))
    console.print(why)
    return Outcome({"cases": doc, "kinds": dict(kinds)}, [], failed)


SUITE = Suite("upstream", frozenset({"n"}),
              "upstream MLIR's propagation and partitioning against apportion's", run)
