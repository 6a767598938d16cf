"""The report of a sharding plan: per op its strategy, the largest device's part of its
iteration space, its compute time and the resharding before it; then the outputs' resharding,
the inputs' placement, the plan's summary, the search's statistics and the per-device
programs (what ``apportion shard`` prints).

>>> import apportion as ap
>>> from rich.console import Console
>>> program, annotations = ap.sharding.load("examples/mlp.json")
>>> plan = ap.sharding.propagate(program, ap.sharding.parse_mesh("tp=2"), annotations=annotations)
>>> console = Console(width=200, record=True)
>>> with console.capture() as text:
...     print_sharding_plan(plan, console)
>>> "per-device programs: 2 devices" in text.get()
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from apportion.sharding.plan import ShardingPlan


def print_sharding_plan(plan: ShardingPlan, console: Console,
                        sizes: dict[str, int] | None = None) -> None:
    """The plan's table, summary and per-device programs (a symbolic mesh's at ``sizes``)."""
    from apportion.sharding.rules import DeviceFinish
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
    fins = sum(isinstance(s, DeviceFinish) for s in stages)
    at = f" at {', '.join(f'{k}={v}' for k, v in (sizes or {}).items())}" if sizes else ""
    console.print(f"per-device programs{at}: {len(u.devices)} devices, {len(stages)} stages "
                  f"each ({segs} compute segments, {len(stages) - segs - fins} collectives"
                  + (f", {fins} finishes" if fins else "") +
                  f"), {u.distinct_segments} distinct segment programs", highlight=False)
    for line in u.tiling_lines():
        console.print(line, highlight=False, soft_wrap=True, markup=False)
