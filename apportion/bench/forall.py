"""`apportion bench forall`: the plan's ``scf.forall`` IR run in parallel on this machine's cores
through upstream MLIR (``backends.openmp``) against the same IR run sequentially, in one run.

Each case is a program planned for ``spyre`` with ``--cores`` workers (default
``DEFAULT_WORKERS``: the forall grid, the workers a parallel loop shares out), emitted as parallel
IR once and lowered twice by upstream MLIR 22: each forall an OpenMP work-sharing loop
(``engine.PARALLEL``) and each forall an ``scf.for`` (``engine.SEQUENTIAL``). Three columns time
the same emitted IR: the ``scf.for`` lowering, the OpenMP module on one thread and the same
module on ``--threads`` threads (default: the OpenMP runtime's, the machine's cores). The
speed-up is one thread's time over N threads' (the same compiled code, only the team size
differs); "cores busy" is the N-thread call's CPU seconds (all its threads) over its seconds:
about N where the cores are free, less where other work holds them. Every case's parallel
output is checked against the unplanned program (a mismatch is a wrong result: exit status 1,
``--check`` or not).

Timing: interleaved rounds (``cost/noise.py``: every column of a case once per round, in
alternating order), one warm-up call each, at least ``--repeat`` rounds (default
``DEFAULT_REPEAT``) and, for a large case, more until its speed-up is settled against ``GOAL``
(met or missed over its whole interval across the resampled rounds), up to ``MAX_REPEAT``; the
fastest call is reported (a stall elsewhere only lengthens a call), the rounds beside it, and a
line under the table gives the noise (rounds, spread, load average before and after).

Goal (``--check``), stated where ``--threads`` is at least 2: on the large cases (tens of
milliseconds or more of work: ``Case.large``) the geometric mean of the speed-up is at least
``GOAL`` (parallel no slower than sequential), judged over the resampled rounds: inconclusive
(too noisy, ``--check`` exit status 3) where its interval holds the goal or the load average
went over the machine's cores. It is modest on purpose: the machine this is checked on has two
cores that other work shares, and the kernels are scalar loops whose speed is bound by memory
as much as by arithmetic.

>>> [c.name for c in cases()][:2]
['pointwise', 'softmax']
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from apportion.bench import goals as bench_goals
from apportion.bench.harness import Outcome, Suite
from apportion.cost import noise
from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program

#: workers of the plan (the forall grid) when --cores is not given
DEFAULT_WORKERS = 8
#: timed rounds (at least) when --repeat is not given, and at most for a large case's speed-up
DEFAULT_REPEAT, MAX_REPEAT = 5, 30
#: the least geometric-mean speed-up of the large cases, N threads over one
GOAL = 1.0
#: a forall's grid in the emitted IR: ``scf.forall (%i, %j) in (2, 4)``
_GRID = re.compile(r"scf\.forall \([^)]*\) in \(([^)]*)\)")


@dataclass(frozen=True)
class Case:
    """One program of the bench: its name, what it computes (for the table) and whether it is
    large enough for its speed-up to count towards the goal."""

    name: str
    what: str
    program: Program
    large: bool


def _program(name: str, tensors: dict[str, tuple[list[int], str]],
             ops: list[dict[str, Any]], outputs: list[str]) -> Program:
    return from_dict({"format": "apportion.program/1", "name": name,
                      "tensors": {n: {"shape": s, "dtype": d} for n, (s, d) in tensors.items()},
                      "inputs": list(tensors), "outputs": outputs, "ops": ops})


def cases() -> list[Case]:
    """The bench's programs, small ones first (their parallel loops are short: the OpenMP
    fork and join show), then the large ones the goal reads."""
    return [
        Case("pointwise", "a*b+c 256x1024 f16", _program(
            "pointwise", {"a": ([256, 1024], "float16"), "b": ([256, 1024], "float16"),
                          "c": ([256, 1024], "float16")},
            [{"name": "mul", "op": "mul", "out": "y[m,n]", "ins": ["a[m,n]", "b[m,n]"]},
             {"name": "add", "op": "add", "out": "z[m,n]", "ins": ["y[m,n]", "c[m,n]"]}],
            ["z"]), False),
        Case("softmax", "row softmax 128x2048 f32", _program(
            "softmax", {"x": ([128, 2048], "float32")},
            [{"name": "mx", "op": "max", "out": "m[r]", "ins": ["x[r,c]"]},
             {"name": "sub", "op": "sub", "out": "d[r,c]", "ins": ["x[r,c]", "m[r]"]},
             {"name": "exp", "op": "exp", "out": "e[r,c]", "ins": ["d[r,c]"]},
             {"name": "sum", "op": "sum", "out": "s[r]", "ins": ["e[r,c]"]},
             {"name": "div", "op": "div", "out": "y[r,c]", "ins": ["e[r,c]", "s[r]"]}],
            ["y"]), False),
        Case("gelu", "gelu 2048x4096 f32", _program(
            "gelu", {"x": ([2048, 4096], "float32")},
            [{"name": "g", "op": "gelu", "out": "y[r,c]", "ins": ["x[r,c]"]}], ["y"]), True),
        Case("rowsum", "sum(exp) 2048x4096 f32", _program(
            "rowsum", {"x": ([2048, 4096], "float32")},
            [{"name": "exp", "op": "exp", "out": "e[r,c]", "ins": ["x[r,c]"]},
             {"name": "sum", "op": "sum", "out": "s[r]", "ins": ["e[r,c]"]}], ["s"]), True),
        Case("matmul", "matmul 256x512x512 f32", _program(
            "matmul", {"a": ([256, 512], "float32"), "b": ([512, 512], "float32")},
            [{"name": "mm", "op": "matmul", "out": "c[m,n]", "ins": ["a[m,k]", "b[k,n]"]}],
            ["c"]), True),
    ]


@dataclass(frozen=True)
class Result:
    """One case: the forall grids of its launches, the fastest call of each column (ms), the
    speed-up (one thread / N threads) and how its parallel output compares with the
    unplanned program."""

    case: str
    what: str
    large: bool
    grids: tuple[str, ...]
    compile_s: float
    for_ms: float
    one_ms: float
    many_ms: float
    threads: int
    speedup: float
    busy: float
    ok: bool
    max_rel_err: float
    rounds: int = 1


def run_case(case: Case, workers: int, threads: int, repeat: int,
             load: Callable[[], float | None] = noise.load_average
             ) -> tuple[Result, noise.Measured]:
    """``case`` planned on ``workers`` spyre cores, lowered both ways, checked and timed until
    its speed-up is settled (a large case on two threads or more), with the noise."""
    from apportion.backends.openmp import engine
    from apportion.backends.openmp.run import prepare
    from apportion.planned import plan
    from apportion.runtime.check import expect
    from apportion.runtime.reference import random_inputs
    from apportion.target.presets import spyre

    planned = plan(case.program, spyre(cores=workers))
    p = planned.program
    inputs = random_inputs(p, 0)
    par = prepare(planned.lowered, inputs)
    seq = prepare(planned.lowered, inputs, lowering=engine.SEQUENTIAL)
    want = expect(p, inputs=inputs)
    checks = want.compare({**want.inputs, **dict(zip(par.outputs, par.call(threads).outputs,
                                                     strict=True))})
    cpu: list[float] = []

    def column(ready: Any, team: int, keep_cpu: bool = False) -> Callable[[], float]:
        def once() -> float:
            # the call's own clock: the time inside the module, not the descriptors made around
            call = ready.call(team)
            if keep_cpu:
                cpu.append(call.cpu_s)
            return float(call.run_s)
        return once

    judged = case.large and threads >= 2
    measured = noise.until_stable(
        [column(seq, 1), column(par, 1), column(par, threads, keep_cpu=True)],
        (lambda _: [speedup_criterion()]) if judged else None,
        noise.Rules(min_rounds=repeat, max_rounds=max(repeat, MAX_REPEAT) if judged else repeat),
        warmup=1, names=("scf.for", "1 thread", f"{threads} threads"), load=load)
    for_s, one_s, many_s = measured.least
    # the N-thread call's CPU seconds in its fastest round (the first call was the warm-up)
    many_cpu = cpu[1:][int(np.nanargmin(measured.array[:, 2]))]
    from apportion.backends.openmp.run import parallel_ir

    grids = tuple("x".join(g.split(", ")) for g in _GRID.findall(parallel_ir(planned.lowered)))
    worst = max((c.max_rel_err for c in checks), default=0.0)
    return Result(case.name, case.what, case.large, grids,
                  round(par.engine.compile_s + seq.engine.compile_s, 3),
                  for_s * 1e3, one_s * 1e3, many_s * 1e3, threads,
                  one_s / many_s if many_s > 0 else math.inf,
                  many_cpu / many_s if many_s > 0 else 0.0, all(c.ok for c in checks), worst,
                  measured.rounds), measured


def speedup_criterion() -> noise.Criterion:
    """One case's speed-up (one thread over N: columns 1 and 2) against ``GOAL``."""
    return noise.Criterion("speed-up", lambda t: t[..., 1] / t[..., 2], GOAL, at_most=False)


def run(cases_: Sequence[Case], workers: int, threads: int | None, repeat: int,
        console: Console) -> tuple[list[Result], list[noise.Measured]]:
    """Every case run and timed; prints the table, the noise and the goal's line."""
    from apportion.backends.openmp import engine

    team = threads if threads is not None else engine.max_threads()
    results, measured = [], []
    with console.status("") as status:
        for c in cases_:
            status.update(f"{c.name}: lowering with upstream MLIR, compiling, timing")
            result, m = run_case(c, workers, team, repeat)
            results.append(result)
            measured.append(m)
    console.print(table(results, workers))
    console.print(noise.summary(measured, "case"), highlight=False)
    bench_goals.show(goals(results, measured), console)
    return results, measured


def goals(results: Sequence[Result], measured: Sequence[noise.Measured] = ()
          ) -> list[bench_goals.Goal]:
    """The suite's goal (module docstring): stated where N threads is at least 2 and there is
    a large case; judged over each case's resampled rounds (``measured``, in the results'
    order; none: the speed-ups are exact)."""
    large = [i for i, r in enumerate(results) if r.large]
    if not large or results[large[0]].threads < 2:
        return []
    logs = []
    for i in large:
        if measured:
            logs.append(np.log(speedup_criterion().figure(measured[i].resampled())))
        else:
            logs.append(np.array([math.log(results[i].speedup)]))
    mean = math.exp(sum(math.log(results[i].speedup) for i in large) / len(large))
    noisy = next((measured[i].noisy for i in large if measured and measured[i].noisy), "")
    v = noise.verdict("geometric mean speed-up", mean, np.exp(np.mean(logs, axis=0)), GOAL,
                      at_most=False, noisy=noisy)
    worst = min((results[i] for i in large), key=lambda r: r.speedup)
    return [bench_goals.judged(
        f"{worst.threads} OpenMP threads no slower than one on the large cases (geometric "
        f"mean speed-up >= {GOAL:g}x; lowest {worst.speedup:.2f}x, {worst.case})", v, "{:.2f}x")]


def table(results: Sequence[Result], workers: int) -> Table:
    threads = results[0].threads if results else 0
    t = Table(title=f"scf.forall IR through upstream MLIR: sequential loops, OpenMP on 1 and "
                    f"{threads} threads (plans on {workers} workers; fastest of each case's "
                    "rounds)")
    for col in ("case", "program", "foralls (grids)", "scf.for ms", "1 thread ms",
                f"{threads} threads ms", "speed-up", "cores busy", "rounds", "vs unplanned"):
        t.add_column(col, justify="left" if col in ("case", "program", "foralls (grids)")
                     else "right")
    for r in results:
        shown = ", ".join(dict.fromkeys(r.grids))
        t.add_row(r.case + (" *" if r.large else ""), r.what, f"{len(r.grids)} ({shown})",
                  f"{r.for_ms:.1f}", f"{r.one_ms:.1f}", f"{r.many_ms:.1f}",
                  f"{r.speedup:.2f}x", f"{r.busy:.2f}", str(r.rounds),
                  "ok" if r.ok else f"WRONG ({r.max_rel_err:.2g})")
    return t


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    from apportion.errors import UsageError
    from apportion.mlir import upstream

    if args.cores and len(args.cores) > 1:
        raise UsageError("bench forall takes one --cores (the plans' workers)")
    workers = args.cores[0] if args.cores else DEFAULT_WORKERS
    upstream.require()  # the mlir extra, named, before any case
    chosen = cases()[:args.limit] if args.limit else cases()
    results, measured = run(chosen, workers, args.threads, args.repeat or DEFAULT_REPEAT,
                            console)
    console.print("* large: the cases the goal reads; cores busy: CPU seconds of the N-thread "
                  "call over its seconds (about N on an idle machine)", highlight=False)
    return Outcome([asdict(r) | {"noise": m.to_doc()} for r, m in zip(results, measured,
                                                                      strict=True)],
                   goals(results, measured), failed=not all(r.ok for r in results))


SUITE = Suite("forall", frozenset({"cores", "threads", "repeat"}),
              "the scf.forall IR run in parallel (OpenMP) against the same IR run sequentially",
              _suite)
