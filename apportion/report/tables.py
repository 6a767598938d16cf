"""The readable plan report: one table row per op and a summary line."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.table import Table

from apportion.frontend.torch_moe import DENSE_FORM, PARTS, MoeBlock
from apportion.ir.program import Program
from apportion.plans.plan import OpPlan, Plan
from apportion.runtime.reference import OutputCheck
from apportion.target.target import Target


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}"


#: span limits from here up mean "no limit" (the cpu and gpu presets' 2**62 bytes)
UNBOUNDED = 1 << 62


def span_limit_text(limit: int) -> str:
    """A per-core span limit in MiB, or ``unbounded`` for a target without one.

    >>> span_limit_text(256 << 20), span_limit_text(1 << 62)
    ('256.0', 'unbounded')
    """
    return "unbounded" if limit >= UNBOUNDED else _mib(limit)


def plan_table(plan: Plan, target: Target) -> Table:
    """A rich table of the plan, one row per op."""
    table = Table(title=f"{plan.program} on {target.name} ({plan.cores} cores, {plan.strategy})",
                  title_justify="left")
    for col, just in (("op", "left"), ("kind", "left"), ("iteration space", "left"),
                      ("stick dims", "left"), ("splits", "left"), ("cores", "right"),
                      ("util", "right"), ("max span MiB / limit", "right"),
                      ("time us", "right"), ("loop", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for o in plan.ops:
        space = " ".join(f"{d}={n}" for d, n in o.iteration_space)
        splits = " ".join(f"{d}:{n}" + ("" if o.is_even(d) else "~")
                          for d, n in o.splits if n > 1) or "-"
        if o.split_k is not None and o.split_k.factor > 1:  # who decided the reduction split
            splits += f" (k by {o.split_k.by})"
        worst = max((s for _, s in o.span_bytes), default=0)
        kind = o.kind + ("" if o.kind == o.op else f" ({o.op})")
        loop = "-" if o.loop is None else " x ".join(str(c) for c in o.loop.count)
        if o.loop is not None and o.loop.tile_sizes:  # tiles of run-time sizes: expressions
            loop += " (" + " ".join(f"{d}={e}" for d, e in o.loop.tile_sizes) + ")"
        table.add_row(o.name, kind, space, ",".join(o.stick_dims) or "-", splits, str(o.cores),
                      f"{o.utilization:.1%}",
                      f"{_mib(worst)} / {span_limit_text(target.span_limit)}",
                      f"{o.predicted_time_us:.2f}", loop)
    return table


def predicted_total_us(plan: Plan) -> tuple[float, bool]:
    """Predicted time of the whole plan: ops outside loops plus every loop body times its
    iterations (tiles in the scratchpad move no device memory). The flag is True when a
    symbolic count was taken as one iteration."""
    total = sum(o.predicted_time_us for o in plan.ops if o.loop is None)
    symbolic = False
    for g in plan.groups:
        per = g.iteration_time_us or sum(plan.op(n).predicted_time_us for n in g.ops)
        symbolic |= g.iterations is None
        total += per * (g.iterations or 1)
    return total, symbolic


def summary_line(plan: Plan) -> str:
    total, symbolic = predicted_total_us(plan)
    fallback = sum(1 for o in plan.ops if o.fallback)
    extra = f", {fallback} fallback op(s) on one core" if fallback else ""
    once = " (symbolic loop counts as one iteration)" if symbolic else ""
    reuse = "" if plan.reuse is None else \
        f" ({plan.reuse.planned} planned, {plan.reuse.reused} reused from identical ops)"
    return (f"{len(plan.ops)} ops{reuse}, mean utilization {plan.mean_utilization:.1%}, predicted "
            f"{total:.1f} us in all{once}{extra}  (~ marks an uneven split; op times are per "
            "loop iteration, without the scratchpad)")


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


#: why the planner added a loop group (``GroupPlan.added``), as the report says it
ADDED = {"span": ", added by the planner: no split keeps it within the span limit"}


def symbolic_text(name: str, lo: int, hi: int | None, planned: int) -> str:
    """How a symbolic loop count's tiles were planned: at its bound or its smallest value.

    >>> symbolic_text("T", 1, None, 1)
    'T planned at its smallest value 1 (no bound: the whole range per iteration)'
    >>> symbolic_text("T", 4, 64, 4)
    'T planned at its bound min=4 (runs take 4 <= T <= 64)'
    """
    runs = f"{planned} <= {name}" + (f" <= {hi}" if hi is not None else "")
    if planned == 1:
        return f"{name} planned at its smallest value 1 (no bound: the whole range per iteration)"
    if planned == lo:
        return f"{name} planned at its bound min={lo} (runs take {runs})"
    return (f"{name} planned at {planned}, its smallest value from min={lo} that divides the "
            f"tiled dims into whole sticks (runs take {runs})")


def group_lines(plan: Plan) -> list[str]:
    """One line per loop group: counts, working set per iteration vs scratchpad, savings."""
    lines = []
    for g in plan.groups:
        levels = " x ".join(f"{c} over {','.join(d) or '-'}"
                            for c, d in zip(g.counts, g.tiled_dims, strict=True))
        verdict = "fits" if g.fits else "does NOT fit"
        lx = ", ".join(g.lx_tensors) or "none"
        hbm = f"; tiles left in device memory: {', '.join(g.hbm_tiles)}" if g.hbm_tiles else ""
        why = ADDED.get(g.added, g.added)
        for name, lo, hi, planned in g.symbolic:
            levels += f"; {symbolic_text(name, lo, hi, planned)}"
        lines.append(
            f"loop group {list(g.path)} ({', '.join(g.ops)}){why}: {levels}; working set per "
            f"iteration {_kib(g.working_set_bytes)} per core vs scratchpad {_kib(g.capacity)}: "
            f"{verdict}; in scratchpad: {lx}{hbm}; device memory saved {_mib(g.saved_bytes)} "
            f"MiB; predicted {g.iteration_time_us:.2f} us per iteration")
    return lines


def scratchpad_lines(plan: Plan) -> list[str]:
    """The outputs of ops outside loop groups kept in the scratchpad (each core its part)."""
    kept = [b for b in plan.buffers if b.space == "lx" and b.kind == "full"]
    if not kept:
        return []
    what = ", ".join(f"{b.tensor} ({_kib(b.nbytes)} at {b.offset})" for b in kept)
    return [f"in scratchpad outside loop groups (per core): {what}"]


def symbol_lines(plan: Plan) -> list[str]:
    """For a program with run-time sizes: the sizes it was planned at, and each split-K select
    chain (the slices a run-time reduction size takes, first matching case)."""
    if not plan.symbols:
        return []
    sizes = ", ".join(f"{n}={v}" for n, v in plan.symbols)
    lines = [f"run-time sizes, planned at {sizes} (each op keeps its slices per dim at "
             "any size)"]
    for o in plan.ops:
        if o.split_k is not None and o.split_k.select is not None:
            lines.append(f"{o.name}: slices of {o.split_k.select.size} ({o.split_k.by}): "
                         f"{o.split_k.select}")
            # a case may pick more slices than the cores its slice dims are divided over
            # (the partial op's slice dim of a cut dim d is d_slice, see passes.split_k)
            parts = math.prod(n for x, n in o.splits
                              if any(x.rstrip("_") == f"{d}_slice" for d in o.split_k.dims))
            most = max(o.split_k.select.factors)
            if most > parts:
                lines.append(f"{o.name}: up to {most} slices over {parts} cores, up to "
                             f"{-(-most // parts)} a core")
    return lines


FAMILIES = ("matmul", "pointwise", "reduction", "layout", "fallback")


def _family(kind: str) -> str:
    """The op family of a plan op's ``kind`` (``reduction (sum)`` -> ``reduction``)."""
    return kind.split(" ", 1)[0]


def op_work(o: OpPlan, program: Program | None) -> int:
    """An op's iteration points; a whole-tensor fallback's output elements (it names each
    operand's dims apart, so its space is not its work)."""
    if program is not None:
        op = program.op(o.name)
        if op.kind.whole:
            return math.prod(op.sizes[d] for d in op.out.dims)
    return math.prod(n for _, n in o.iteration_space)


def family_table(plan: Plan, program: Program | None = None) -> Table:
    """Per op family: ops, share of the work (iteration points) and of the predicted time, and
    mean utilization; the model-level view of a plan (``program``: the program planned)."""
    table = Table(title=f"{plan.program} by op family", title_justify="left")
    for col in ("family", "ops", "work share", "time share", "mean util"):
        table.add_column(col, justify="left" if col == "family" else "right")
    work = sum(op_work(o, program) for o in plan.ops) or 1
    time = sum(o.predicted_time_us for o in plan.ops) or 1.0
    for fam in FAMILIES:
        ops = [o for o in plan.ops if _family(o.kind) == fam]
        if not ops:
            continue
        table.add_row(fam, str(len(ops)), f"{sum(op_work(o, program) for o in ops) / work:.1%}",
                      f"{sum(o.predicted_time_us for o in ops) / time:.1%}",
                      f"{sum(o.utilization for o in ops) / len(ops):.1%}")
    return table


def lowest_utilization(plan: Plan, labels: Mapping[str, str] | None = None, count: int = 5
                       ) -> list[str]:
    """The ``count`` ops with the lowest utilization (fallbacks, which run on one core by
    nature, after the others), each with its label (a PyTorch node name and source line).

    One op per source: the ops one node lowers to (the chunks of a ``cat``) share a label, and
    only the least utilized of them is listed, with the count of the others."""
    labels = labels or {}
    ranked = sorted(plan.ops, key=lambda o: (o.fallback, o.utilization, -o.predicted_time_us))
    per_source: dict[str, int] = {}
    for o in plan.ops:
        source = labels.get(o.name, o.name)
        per_source[source] = per_source.get(source, 0) + 1
    out: list[str] = []
    shown: set[str] = set()
    for o in ranked:
        source = labels.get(o.name, o.name)
        if source in shown:
            continue
        shown.add(source)
        label = labels.get(o.name)
        more = per_source[source] - 1
        others = f"; {more} more op{'s' if more > 1 else ''} of this node" if more else ""
        out.append(f"{o.name}{f' ({label})' if label else ''}: {o.kind}, {o.cores} cores, "
                   f"utilization {o.utilization:.1%}, {o.predicted_time_us:.2f} us{others}")
        if len(out) == count:
            break
    return out


def moe_lines(plan: Plan, program: Program | None, parts: Mapping[str, tuple[str, MoeBlock]]
              ) -> list[str]:
    """The mixture-of-experts lines of a model report: the blocks and their dispatch form, then
    the router's and the experts' ops, share of the work and of the predicted time, and what
    the experts' matmuls cost over the tokens actually routed. ``parts``: op name -> (part,
    block), as ``torch_moe.moe_parts`` gives them (a plan op split in two, ``.partial`` and
    ``.combine``, counts as its op); none without a mixture of experts."""
    if not parts:
        return []
    blocks = {b.path: b for _, b in parts.values()}
    work = sum(op_work(o, program) for o in plan.ops) or 1
    time = sum(o.predicted_time_us for o in plan.ops) or 1.0
    mine = {o.name: parts.get(o.name.removesuffix(".partial").removesuffix(".combine"))
            for o in plan.ops}
    shown = ", ".join(f"{b.block} ({b.experts} experts, top-{b.top_k})"
                      for b in list(blocks.values())[:2])
    more = f" and {len(blocks) - 2} more" if len(blocks) > 2 else ""
    out = [f"mixture of experts: {len(blocks)} block{'s' if len(blocks) > 1 else ''}, "
           f"{shown}{more}; dispatch {DENSE_FORM}"]
    names = {"router": "router", "experts": "experts", "shared": "shared experts and the rest"}
    for part in PARTS:
        ops = [o for o in plan.ops if (mine[o.name] or ("", None))[0] == part]
        if not ops:
            continue
        line = (f"  {names[part]}: {len(ops)} ops, "
                f"{sum(op_work(o, program) for o in ops) / work:.1%} of the work, "
                f"{sum(o.predicted_time_us for o in ops) / time:.1%} of the predicted time")
        if part == "experts":
            mm = [(o, mine[o.name][1]) for o in ops if _family(o.kind) == "matmul"]  # type: ignore[index]
            planned = sum(op_work(o, program) for o, _ in mm)
            routed = sum(op_work(o, program) / b.dense_factor for o, b in mm)
            factors = sorted({b.dense_factor for b in blocks.values()})
            ratio = f"{factors[0]:.1f}x" if len(factors) == 1 else \
                f"{factors[0]:.1f}x to {factors[-1]:.1f}x"
            line += (f"; their matmuls {planned:,} multiply-adds for {round(routed):,} on the "
                     f"tokens actually routed (experts / top-k = {ratio})")
        out.append(line)
    return out


def print_model_report(plan: Plan, target: Target, labels: Mapping[str, str] | None = None,
                       console: Console | None = None, lowered: str | None = None,
                       program: Program | None = None, moe: Sequence[str] = ()) -> None:
    """The report of a whole model: the family table, the five least utilized ops with their
    labels, ``lowered`` (a line on how many source nodes became planned ops), ``moe`` (the
    lines of ``moe_lines``) and the summary."""
    console = console or Console()
    console.print(family_table(plan, program))
    console.print("lowest utilization:", highlight=False)
    for line in lowest_utilization(plan, labels):
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    if lowered:
        console.print(lowered, highlight=False, soft_wrap=True)
    for line in moe:
        console.print(line, highlight=False, soft_wrap=True)
    total, _ = predicted_total_us(plan)
    console.print(f"{len(plan.ops)} ops on {target.name} ({plan.cores} cores, {plan.strategy}): "
                  f"predicted {total:.1f} us in all, mean utilization "
                  f"{plan.mean_utilization:.1%}", highlight=False)


def print_report(plan: Plan, target: Target, console: Console | None = None) -> None:
    """Print the table, one line per loop group, the run-time sizes and the summary line."""
    console = console or Console()
    console.print(plan_table(plan, target))
    for line in (*group_lines(plan), *scratchpad_lines(plan), *symbol_lines(plan)):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(summary_line(plan))


def print_checks(checks: list[OutputCheck], what: str, console: Console,
                 reference: str = "the unplanned program") -> int:
    """One line per output and a verdict against ``reference``; the exit status (1 on a
    mismatch)."""
    for c in checks:
        status = "[green]ok[/green]" if c.ok else "[red]MISMATCH[/red]"
        console.print(f"{c.tensor:>12} {c.dtype:>9}  max abs err {c.max_abs_err:.3g}  "
                      f"max rel err {c.max_rel_err:.3g}  tol {c.tolerance}  {status}")
    bad = [c.tensor for c in checks if not c.ok]
    if bad:
        console.print(f"[red]{what} differs from {reference} on {', '.join(bad)}[/red]",
                      soft_wrap=True)
        return 1
    # one line whatever its length: scripts grep the verdict
    console.print(f"{what} matches {reference}", soft_wrap=True)
    return 0
