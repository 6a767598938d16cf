"""`apportion bench scale`: how planning time grows with the size of the program.

Three tables, each planned with ``balanced`` on Spyre:

* **forward**: the whole forward pass of a model (``frontend/models.forward_program``,
  llama2-7b at 128 tokens by default) at 1, 8, 32, 80 and 160 layers. Per row: layers, ops, ops
  planned and ops that took an identical op's plan (``Plan.reuse``), planning time, ops per
  second and the time per op. Growth is linear when the time per op stays flat as layers are
  added; the smallest row is dearer per op (the fixed cost of planning each distinct op once),
  so the largest row is compared with the 8-layer row (or the second).
* **chain**: a chain of 500, 2,000 and 20,000 pointwise ops (``chain_program``), each reading
  the one before: nothing to reuse between layers' worth of distinct ops, only length. The
  largest row is compared with the smallest.
* **group**: one loop group over tokens of 50, 100 and 200 ops (``group_program``: blocks of an
  RMS norm and a gated MLP with a residual add, each block's hidden size its own, so blocks
  differ), planned with group distribution, then auto-tiled against a 4 KiB scratchpad. Per
  row: the time of each and its ratio to the previous row's, next to the ratio of ops.

Times are the CPU seconds of ``plan`` alone (``time.process_time``: planning runs on the calling
thread, so this is its cost, and other work sharing the cores does not add to it the way it adds
to wall-clock time, most to the longest rows): every program is built first, one small plan runs
before the first timed one so that imports are not counted, and a forward or chain row's time is
the fastest of its plans, the rows' runs interleaved, each of a fresh copy of the program
(nothing cached on it from the run before): at least ``REPEAT`` rounds, more until the table's
goal is settled (``cost/noise.py``: met or missed over the whole interval of its figure across
the resampled rounds, the same for the last rounds), up to ``MAX_REPEAT``. A line under each
table gives the rounds, the spread of the least times and the load average before and after (CPU
time is judged by its spread, not by the load).

Goals (``goals``, checked by ``--check``): per core count, the forward pass's time per op at
its largest row within ``LINEAR`` (2x) of the 8-layer row's, and the chain's at its largest row
within ``LINEAR`` of its smallest row's: planning linear in the program's size, measured in one
process; inconclusive (too noisy, ``--check`` exit status 3) where the interval holds the bound
after ``MAX_REPEAT`` rounds. The loop-group rows are shown, not checked (their auto-tiling's
trials grow with the group).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from apportion.bench import goals as bench_goals
from apportion.bench.harness import Outcome, Suite, core_counts, from_models
from apportion.cost import noise
from apportion.cost.timing import interleaved, until_stable
from apportion.frontend.json_format import from_dict
from apportion.frontend.models import forward_program, load_models
from apportion.ir.program import Program
from apportion.passes.pipeline import plan
from apportion.target.presets import spyre

#: layer counts of the forward rows
LAYERS = (1, 8, 32, 80, 160)
#: ops of the chain rows
CHAIN_OPS = (500, 2000, 20000)
#: ops of the group rows
GROUP_OPS = (50, 100, 200)
#: the largest row's time per op may be this many times the base row's and still be linear
LINEAR = 2.0
#: timed plans per forward and chain row, at least (the fastest reported), and at most: more
#: rounds until the goal is settled
REPEAT, MAX_REPEAT = 3, 9
#: the unary kinds a chain cycles through
CHAIN_KINDS = ("exp", "neg", "relu", "sigmoid")
#: the scratchpad of the group rows' auto-tiling, in bytes
SMALL_SCRATCHPAD = 4096


@dataclass(frozen=True)
class ScaleResult:
    """One row: what was planned, how many ops, planned vs reused, seconds."""

    suite: str  # "forward", "chain" or "group"
    case: str
    cores: int
    ops: int
    planned: int
    reused: int
    seconds: float
    auto_tile_seconds: float | None = None
    rounds: int = 1  # timed plans (the fastest is ``seconds``)
    spread: float = 0.0  # ``seconds`` known within this fraction of it (cost/noise.py)

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else float("inf")

    @property
    def ms_per_op(self) -> float:
        return self.seconds * 1e3 / self.ops


def group_program(n_ops: int, tokens: int = 256, hidden: int = 1024, ffn: int = 2816,
                  dtype: str = "float16") -> Program:
    """One loop group over tokens (count 1) of ``n_ops`` ops: blocks of ten, an RMS norm
    (``mul``, ``mean``, ``rsqrt``, ``mul``), a gated MLP (``gate``, ``up``, ``silu``, ``mul``,
    ``down``) and a residual ``add``; block ``b``'s hidden dim is ``f{b}`` of ``ffn + 64*b``
    elements, so no two blocks are identical. The last block may stop early.

    >>> p = group_program(12)
    >>> len(p.ops), p.ops[10].name, len(p.tiling[0].ops)
    (12, 'b1_sq', 12)
    """
    tensors: dict[str, Any] = {"x0": {"shape": [tokens, hidden], "dtype": dtype}}
    ops: list[dict[str, Any]] = []
    x, b = "x0", 0

    def add(name: str, fn: str, out: str, *ins: str) -> str:
        if len(ops) < n_ops:
            ops.append({"name": name, "op": fn, "out": out, "ins": list(ins)})
        return out.split("[")[0]

    while len(ops) < n_ops:
        p, f, size = f"b{b}_", f"f{b}", ffn + 64 * b
        for w, shape in (("wg", [hidden, size]), ("wu", [hidden, size]), ("wd", [size, hidden])):
            tensors[p + w] = {"shape": shape, "dtype": dtype}
        sq = add(p + "sq", "mul", f"{p}sq[t,n]", f"{x}[t,n]", f"{x}[t,n]")
        ms = add(p + "ms", "mean", f"{p}ms[t,0]", f"{sq}[t,n]")
        inv = add(p + "inv", "rsqrt", f"{p}inv[t,0]", f"{ms}[t,0]")
        xn = add(p + "norm", "mul", f"{p}xn[t,n]", f"{x}[t,n]", f"{inv}[t,0]")
        g = add(p + "gate", "matmul", f"{p}g[t,{f}]", f"{xn}[t,n]", f"{p}wg[n,{f}]")
        u = add(p + "up", "matmul", f"{p}u[t,{f}]", f"{xn}[t,n]", f"{p}wu[n,{f}]")
        a = add(p + "act", "silu", f"{p}a[t,{f}]", f"{g}[t,{f}]")
        m = add(p + "glu", "mul", f"{p}m[t,{f}]", f"{a}[t,{f}]", f"{u}[t,{f}]")
        y = add(p + "down", "matmul", f"{p}y[t,n]", f"{m}[t,{f}]", f"{p}wd[{f},n]")
        x = add(p + "res", "add", f"{p}out[t,n]", f"{x}[t,n]", f"{y}[t,n]")
        b += 1
    used = {a.split("[")[0] for o in ops for a in o["ins"]}
    inputs = [t for t in tensors if t in used]
    return from_dict({
        "name": f"group{n_ops}",
        "tensors": {t: tensors[t] for t in inputs}, "inputs": inputs,
        "outputs": [ops[-1]["out"].split("[")[0]], "ops": ops,
        "tiling": [{"ops": [o["name"] for o in ops], "loops": [{"count": 1, "dims": ["t"]}]}],
    })


def chain_program(n_ops: int, rows: int = 64, cols: int = 256,
                  dtype: str = "float16") -> Program:
    """A chain of ``n_ops`` pointwise ops over one ``rows x cols`` tensor, each reading the
    result of the one before, cycling through ``CHAIN_KINDS``.

    >>> p = chain_program(5)
    >>> [o.kind.name for o in p.ops], p.outputs
    (['exp', 'neg', 'relu', 'sigmoid', 'exp'], ('t5',))
    """
    ops = [{"name": f"o{i}", "op": CHAIN_KINDS[i % len(CHAIN_KINDS)], "out": f"t{i + 1}[i,j]",
            "ins": [f"t{i}[i,j]"]} for i in range(n_ops)]
    return from_dict({"name": f"chain{n_ops}",
                      "tensors": {"t0": {"shape": [rows, cols], "dtype": dtype}},
                      "inputs": ["t0"], "outputs": [f"t{n_ops}"], "ops": ops})


def best_of(programs: list[Program], cores: int, repeat: int,
            criteria: noise.Criterion | None = None,
            load: Callable[[], float | None] = noise.load_average
            ) -> tuple[list[tuple[float, Any]], noise.Measured]:
    """Per program, the fastest of its plans (CPU seconds) and that plan, and the measurement
    with its noise. The rounds are interleaved (``cost.timing.until_stable``), so a burst of
    load elsewhere slows one round of each rather than every round of one, at least ``repeat``
    of them and more until ``criteria`` (the table's goal) is settled, up to ``MAX_REPEAT``;
    each plan gets a fresh copy of its program, so none finds what an earlier run cached on
    it, and starts after a collection, so none pays for the garbage of the one before."""
    target = spyre(cores=cores)
    rules = noise.Rules(min_rounds=repeat, max_rounds=max(repeat, MAX_REPEAT), settle=repeat)
    timings, measured = until_stable(
        [lambda p: plan(p, target, "balanced")] * len(programs), rules,
        None if criteria is None else lambda _: [criteria], clock=time.process_time,
        before=gc.collect, fresh=[lambda p=p: dataclasses.replace(p) for p in programs],
        load=load)
    return [(t.min, t.result) for t in timings], measured


def goal_figure(rows: list[ScaleResult]) -> noise.Criterion | None:
    """The goal of one table's rows as a figure of their times (``(..., rows)`` seconds): the
    largest row's time per op over the base row's, at most ``LINEAR`` (None: nothing to
    judge, ``goals``)."""
    if len(rows) < 2 or base_row(rows) is rows[-1]:
        return None
    b = rows.index(base_row(rows))
    scale = rows[b].ops / rows[-1].ops
    return noise.Criterion("time per op, largest row over base row",
                           lambda t: t[..., -1] / t[..., b] * scale, LINEAR)


def _rows(suite: str, cases: list[str], programs: list[Program], cores: int,
          repeat: int) -> tuple[list[ScaleResult], noise.Measured]:
    shells = [ScaleResult(suite, case, cores, len(p.ops), 0, 0, 1.0)
              for case, p in zip(cases, programs, strict=True)]
    best, measured = best_of(programs, cores, repeat, goal_figure(shells))
    rows = []
    for shell, (seconds, result), spread in zip(shells, best, measured.spread, strict=True):
        reuse = result.reuse
        rows.append(dataclasses.replace(shell, planned=reuse.planned, reused=reuse.reused,
                                        seconds=seconds, rounds=measured.rounds,
                                        spread=round(spread, 4)))
    return rows, measured


def run_forward(model: str, layers: tuple[int, ...], tokens: int, cores: int,
                models: dict[str, Any] | None = None, repeat: int = REPEAT
                ) -> tuple[list[ScaleResult], noise.Measured]:
    """Plan ``model``'s forward program at each layer count; one row each (best of at least
    ``repeat``), and the measurement's noise."""
    programs = [forward_program(model, n, tokens, models=models) for n in layers]
    return _rows("forward", [f"{model} x{n} layers @{tokens}" for n in layers], programs, cores,
                 repeat)


def run_chains(sizes: tuple[int, ...], cores: int, repeat: int = REPEAT
               ) -> tuple[list[ScaleResult], noise.Measured]:
    """Plan a chain of pointwise ops of each length in ``sizes``; one row each (best of at
    least ``repeat``), and the measurement's noise."""
    programs = [chain_program(n) for n in sizes]
    return _rows("chain", [f"{n:,}-op pointwise chain" for n in sizes], programs, cores, repeat)


def run_groups(sizes: tuple[int, ...], cores: int) -> list[ScaleResult]:
    """Plan one loop group of each size in ``sizes``, then auto-tile it against a small
    scratchpad; one row each."""
    small = dataclasses.replace(spyre(cores=cores), scratchpad_bytes=SMALL_SCRATCHPAD)
    rows = []
    for n in sizes:
        program = group_program(n)
        once, auto = interleaved([lambda p=program: plan(p, spyre(cores=cores), "balanced"),
                                  lambda p=program: plan(p, small, "balanced", auto_tile=True)],
                                 repeat=1, clock=time.process_time)
        seconds, result = once.min, once.result
        rows.append(ScaleResult("group", f"{n}-op loop group", cores, n, result.reuse.planned,
                                result.reuse.reused, seconds, auto.min))
    return rows


def run(cores: list[int], model: str = "llama2-7b", tokens: int = 128,
        layers: tuple[int, ...] = LAYERS, groups: tuple[int, ...] = GROUP_OPS,
        models_path: str | None = None, console: Console | None = None,
        chains: tuple[int, ...] = CHAIN_OPS, repeat: int = REPEAT) -> list[ScaleResult]:
    """Run the benchmark and print its tables and goals; returns every row."""
    console = console or Console()
    models = load_models(models_path)
    plan(forward_program(model, 1, min(tokens, 16), models=models), spyre(cores=cores[0]))
    results: list[ScaleResult] = []
    for n in cores:
        forward, measured = run_forward(model, layers, tokens, n, models, repeat)
        results += forward
        console.print(forward_table(forward))
        console.print(noise.summary([measured]), highlight=False)
        bench_goals.show(goals(forward, {("forward", n): measured}), console)
        if chains:
            chained, measured = run_chains(chains, n, repeat)
            results += chained
            console.print(forward_table(chained))
            console.print(noise.summary([measured]), highlight=False)
            bench_goals.show(goals(chained, {("chain", n): measured}), console)
        if groups:
            grouped = run_groups(groups, n)
            results += grouped
            console.print(group_table(grouped))
    return results


def base_row(rows: list[ScaleResult]) -> ScaleResult:
    """The row the largest is compared with: a forward pass's 8-layer row (or its second; the
    first pays for planning each distinct op once over few ops), a chain's smallest."""
    if rows[0].suite == "forward":
        return next((r for r in rows if r.case.split(" x")[-1].startswith("8 ")), rows[1])
    return rows[0]


def goals(rows: list[ScaleResult],
          measured: Mapping[tuple[str, int], noise.Measured] | None = None
          ) -> list[bench_goals.Goal]:
    """Per suite and core count of ``rows`` (forward and chain rows; group rows have none):
    the largest row's time per op at most ``LINEAR`` times the base row's, judged over the
    resampled rounds of ``measured[suite, cores]`` (the rows' measurement; none: the figure is
    exact). A suite whose base row is its last (one row; two forward rows, the second 8
    layers) has nothing to judge.

    >>> r = [ScaleResult("chain", "500", 32, 500, 4, 496, 0.1),
    ...      ScaleResult("chain", "20000", 32, 20000, 4, 19996, 4.0)]
    >>> [(g.met, g.figure) for g in goals(r)]
    [(True, '1.00x (20000 vs 500 ops: 0.200 vs 0.200 ms/op)')]
    """
    out = []
    for suite in ("forward", "chain"):
        for cores in dict.fromkeys(r.cores for r in rows):
            mine = [r for r in rows if r.suite == suite and r.cores == cores]
            criterion = goal_figure(mine)
            if criterion is None:
                continue  # one row, or the base is the last: no growth to judge
            base, last = base_row(mine), mine[-1]
            seconds = np.array([r.seconds for r in mine])
            m = (measured or {}).get((suite, cores))
            samples = criterion.figure(seconds[None] if m is None else m.resampled())
            v = noise.verdict(criterion.name, float(criterion.figure(seconds)), samples,
                              LINEAR, noisy="" if m is None else m.noisy)
            out.append(bench_goals.judged(
                f"{suite} ({cores} cores): time per op at {last.ops} ops within {LINEAR:g}x "
                f"of {base.ops} ops' (linear)", v, "{:.2f}x",
                where=f"{last.ops} vs {base.ops} ops: {last.ms_per_op:.3f} vs "
                      f"{base.ms_per_op:.3f} ms/op"))
    return out


def forward_table(rows: list[ScaleResult]) -> Table:
    """A forward or chain table (times: the fastest of each row's plans), its goal in the
    title."""
    what = "the forward pass" if rows[0].suite == "forward" else "a chain of pointwise ops"
    goal = ""
    if len(rows) > 1 and base_row(rows) is not rows[-1]:
        goal = (f"; goal: ms/op of the last row within {LINEAR:g}x of the "
                f"{base_row(rows).ops}-op row's")
    repeat = rows[0].rounds
    best = f", fastest of {repeat} runs" if repeat > 1 else ""
    t = Table(title=f"planning CPU time of {what} (balanced, {rows[0].cores} cores{best}{goal})",
              title_justify="left")
    for col in ("program", "ops", "planned / reused", "CPU seconds", "ops/s", "ms/op"):
        t.add_column(col, justify="left" if col == "program" else "right")
    for r in rows:
        t.add_row(r.case, str(r.ops), f"{r.planned} / {r.reused}", f"{r.seconds:.3f}",
                  f"{r.ops_per_s:,.0f}", f"{r.ms_per_op:.3f}")
    return t


def group_table(rows: list[ScaleResult]) -> Table:
    t = Table(title=f"one loop group: group distribution, then auto-tiling against a "
                    f"{SMALL_SCRATCHPAD // 1024} KiB scratchpad ({rows[0].cores} cores)",
              title_justify="left")
    for col in ("group", "ops", "planned / reused", "CPU seconds", "auto-tile CPU seconds",
                "x ops", "x time", "x auto-tile time"):
        t.add_column(col, justify="left" if col == "group" else "right")
    prev: ScaleResult | None = None
    for r in rows:
        auto = r.auto_tile_seconds or 0.0
        if prev is None:
            grow = ("-", "-", "-")
        else:
            before = prev.auto_tile_seconds or 0.0
            grow = (f"{r.ops / prev.ops:.2f}", f"{r.seconds / prev.seconds:.2f}",
                    f"{auto / before:.2f}" if before else "-")
        t.add_row(r.case, str(r.ops), f"{r.planned} / {r.reused}", f"{r.seconds:.3f}",
                  f"{auto:.3f}", *grow)
        prev = r
    return t


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    cores = core_counts(args, [32])
    results = from_models(args.models, lambda: run(
        cores, models_path=args.models, layers=LAYERS[:args.limit], groups=GROUP_OPS[:args.limit],
        chains=CHAIN_OPS[:args.limit], console=console))
    return Outcome([dataclasses.asdict(r) for r in results], goals(results))


SUITE = Suite("scale", frozenset({"cores", "models"}),
              "planning time as programs grow: time per op, large against small", _suite)
