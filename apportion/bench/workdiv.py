"""`apportion bench workdiv`: utilization of greedy, balanced and the exhaustive bound.

Over the operator shapes of the models file (linear layers, attention matmuls, norms, softmax at
prefill and decode token counts), for each core count: mean and worst utilization of each
strategy, failures, the bound found by exhaustive search, predicted time relative to greedy
(measured in the same run), the predicted time the bound's assignment would take relative to
balanced's, and planning time per op.

``balanced`` minimises predicted time, not idle cores: where the bound's assignment is slower
(a split reduction whose combine costs more than it saves, re-reads of a weight that fewer
cores avoid) it leaves cores idle on purpose, and the last-but-one column shows the price the
bound would pay.

Predicted times are whole ops: an op the planner loops over (greedy on the probe, a tensor past
the span limit) counts every iteration.

Goals (``goals``, checked by ``--check``): at every core count, balanced's predicted time is
never above greedy's on any shape (a greedy failure counts as met) and its geometric mean over
greedy's is at most ``MEAN_RATIO_GOAL``; and on every shape the assignment reaching the
utilization bound is predicted no faster than balanced's by more than ``BOUND_SLACK``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.bench import goals as bench_goals
from apportion.bench.harness import Outcome, Suite, core_counts, from_models
from apportion.errors import PlanningError
from apportion.frontend.models import OpCase, bench_cases, linear, load_models
from apportion.passes.geometry import OpContext
from apportion.passes.layouts import layouts, tensor_layouts
from apportion.passes.pipeline import plan
from apportion.passes.work_distribution import best_utilization
from apportion.plans.plan import OpPlan
from apportion.target.presets import spyre
from apportion.target.target import Target

#: balanced over greedy, geometric mean of predicted times at a core count: at most this (the
#: point of the cost-model search is a real gain, not a tie)
MEAN_RATIO_GOAL = 0.9
#: balanced is a search: the bound's assignment may be predicted faster by at most this fraction
BOUND_SLACK = 0.01
#: float noise allowed where balanced and greedy pick the same assignment
_EPS = 1e-9


@dataclass(frozen=True)
class CaseResult:
    case: str
    cores: int
    greedy: float | None  # None: greedy found no plan
    balanced: float
    bound: float
    bound_us: float  # predicted time of the assignment reaching the bound
    greedy_us: float | None
    balanced_us: float
    greedy_ms: float
    balanced_ms: float


def prime_probe(dtype: str) -> OpCase:
    """An lm_head over a 49216-wide vocabulary: 769 fp16 sticks, a prime, over the span limit."""
    return OpCase("probe", "prefill", 2048, "lm_head(769 sticks)",
                  linear("lm_head", 2048, 4096, 49216, dtype))


def whole_us(op: OpPlan) -> float:
    """The op's predicted time over every iteration of a loop the planner put it in."""
    runs = 1 if op.loop is None else math.prod(c for c in op.loop.count if isinstance(c, int))
    return runs * op.predicted_time_us


def run_case(case: OpCase, target: Target) -> CaseResult:
    p = case.program
    op = p.ops[0]
    t0 = time.perf_counter()
    try:
        g = plan(p, target, "greedy").ops[0]
        g_util, g_us = g.utilization, whole_us(g)
    except PlanningError:
        g_util = g_us = None
    t1 = time.perf_counter()
    b = plan(p, target, "balanced").ops[0]
    t2 = time.perf_counter()
    ctx = OpContext(op, p, target, layouts(p, target).ops[op.name], tensor_layouts(p, target),
                    dict(op.dims))
    bound, bound_splits = best_utilization(ctx, {d: 1 for d in op.sizes})
    name = f"{case.model}/{case.phase}/{case.tokens}/{case.what}"
    return CaseResult(name, target.cores, g_util, b.utilization, bound,
                      ctx.time_us(bound_splits), g_us,
                      whole_us(b), (t1 - t0) * 1e3, (t2 - t1) * 1e3)


def cases(dtype: str = "float16", models_path: str | None = None,
          limit: int | None = None) -> list[OpCase]:
    """The benchmark's op shapes: the first ``limit`` of the models file's, then the probe."""
    return bench_cases(load_models(models_path), dtype)[:limit] + [prime_probe(dtype)]


def run(cores: list[int], dtype: str = "float16", models_path: str | None = None,
        limit: int | None = None, console: Console | None = None,
        op_cases: list[OpCase] | None = None) -> list[CaseResult]:
    """Run the benchmark and print its table; returns every case's result.

    ``op_cases`` (from ``cases``) replaces the models file, ``dtype`` and ``limit``.
    """
    console = console or Console()
    todo = cases(dtype, models_path, limit) if op_cases is None else op_cases
    results: list[CaseResult] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("planning", total=len(todo) * len(cores))
        for n in cores:
            target = spyre(cores=n)
            for case in todo:
                results.append(run_case(case, target))
                progress.advance(task)
    console.print(table(results, cores, len(todo)))
    bench_goals.show(goals(results), console)
    return results


def goals(results: list[CaseResult]) -> list[bench_goals.Goal]:
    """The suite's goals over ``results`` (see the module's docstring)."""
    out = []
    for n in dict.fromkeys(r.cores for r in results):
        rs = [r for r in results if r.cores == n]
        timed = [r for r in rs if r.greedy_us]
        worst = max(timed, key=lambda r: r.balanced_us / r.greedy_us, default=None)
        if worst is not None and worst.greedy_us:
            out.append(bench_goals.at_most(
                f"{n} cores: balanced's predicted time <= greedy's on every shape (worst "
                f"balanced/greedy)", worst.balanced_us / worst.greedy_us, 1.0 + _EPS,
                "{:.3f}x", worst.case))
        mean = summarize(rs)["time_ratio"]
        if not math.isnan(mean):
            out.append(bench_goals.at_most(
                f"{n} cores: geometric mean of balanced/greedy predicted time <= "
                f"{MEAN_RATIO_GOAL:g}x", mean, MEAN_RATIO_GOAL, "{:.3f}x"))
    if results:
        worst_b = min(results, key=lambda r: r.bound_us / r.balanced_us)
        out.append(bench_goals.at_least(
            f"the bound's assignment never predicted more than {BOUND_SLACK:.0%} faster than "
            f"balanced's (lowest bound/balanced time)", worst_b.bound_us / worst_b.balanced_us,
            1 - BOUND_SLACK, "{:.4f}x", f"{worst_b.case} @{worst_b.cores}"))
    return out


def summarize(results: list[CaseResult]) -> dict[str, Any]:
    ok = [r for r in results if r.greedy is not None]
    ratios = [r.balanced_us / r.greedy_us for r in ok if r.greedy_us]
    return {
        "greedy_mean": statistics.fmean(r.greedy or 0.0 for r in results),
        "greedy_worst": min(r.greedy or 0.0 for r in results),
        "greedy_failures": len(results) - len(ok),
        "balanced_mean": statistics.fmean(r.balanced for r in results),
        "balanced_worst": min(r.balanced for r in results),
        "bound_mean": statistics.fmean(r.bound for r in results),
        "bound_worst": min(r.bound for r in results),
        "time_ratio": statistics.geometric_mean(ratios) if ratios else float("nan"),
        "bound_time_ratio": statistics.geometric_mean(r.bound_us / r.balanced_us
                                                      for r in results),
        "greedy_ms": statistics.fmean(r.greedy_ms for r in results),
        "balanced_ms": statistics.fmean(r.balanced_ms for r in results),
    }


def table(results: list[CaseResult], cores: list[int], n_cases: int) -> Table:
    t = Table(title=f"work division over {n_cases} op shapes (a greedy failure counts as 0)",
              title_justify="left")
    for col in ("cores", "greedy mean / worst", "fails", "balanced mean / worst",
                "bound mean / worst", "balanced vs bound", "time balanced/greedy",
                "time bound/balanced",
                "ms/op greedy", "ms/op balanced"):
        t.add_column(col, justify="right")
    for n in cores:
        s = summarize([r for r in results if r.cores == n])
        t.add_row(str(n), f"{s['greedy_mean']:.1%} / {s['greedy_worst']:.1%}",
                  str(s["greedy_failures"]),
                  f"{s['balanced_mean']:.1%} / {s['balanced_worst']:.1%}",
                  f"{s['bound_mean']:.1%} / {s['bound_worst']:.1%}",
                  f"{s['balanced_mean'] - s['bound_mean']:+.2%}",
                  f"{s['time_ratio']:.3f}x", f"{s['bound_time_ratio']:.3f}x",
                  f"{s['greedy_ms']:.2f}", f"{s['balanced_ms']:.2f}")
    return t


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    cores = core_counts(args, [32, 24])
    op_cases = from_models(args.models, lambda: cases(models_path=args.models, limit=args.limit))
    results = run(cores, console=console, op_cases=op_cases)
    return Outcome([dataclasses.asdict(r) for r in results], goals(results))


SUITE = Suite("workdiv", frozenset({"cores", "models"}),
              "balanced work division against the greedy rule on the models' op shapes", _suite)
