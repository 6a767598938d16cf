"""`apportion bench fullsize`: full-size models without weights, from PyTorch to a plan.

Two cases, each the whole model built from its public config's sizes on torch's meta device
(``frontend/torch_models``: weights with shapes and dtypes only) at 2048 tokens:

* **llama3-8b**: Llama-3-8B planned on 32 Spyre cores (``balanced``);
* **llama3-70b**: Llama-3-70B sharded over 8 devices (``--mesh tp=8``: the strategy search,
  then every device's programs).

Each case runs in a fresh process of its own, so that its peak memory (``ru_maxrss``, the
resident set's high-water mark) is its own and nothing is cached from another case. Per stage
it reports wall-clock and CPU seconds: building the model (``transformers`` on the meta
device), ``torch.export``, the decomposition to core ATen ops, the lowering to an apportion
program, and planning (8B) or sharding and the per-device programs (70B).

Goals (``--check``): the 8B's export, lowering and planning in under ``GOAL_SECONDS`` (60) CPU
seconds and a peak under ``GOAL_BYTES`` (4 GiB) on this machine. CPU seconds: the stages run on
the calling thread, so their CPU time is their cost, which other work sharing the cores (a
loaded two-core machine) does not inflate the way it inflates wall-clock time; both are shown.
``--limit 1`` runs the 8B alone.

Rounds (``cost/noise.py``): the 8B, which the goals judge, runs in ``MIN_ROUNDS`` fresh processes
at least and more until its CPU seconds are settled against the goal (met or missed over the
whole interval of their least across the resampled rounds), up to ``MAX_ROUNDS``; where they are
not, the time goal is inconclusive (too noisy, ``--check`` exit status 3). A CPU-time measurement
records the load average before and after but is judged by its spread alone. The table shows
the round with the fewest CPU seconds and the highest peak of any round; a line under it gives
the noise. The 70B, reported and not judged, runs once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from apportion.bench import goals as bench_goals
from apportion.bench.harness import Outcome, Suite
from apportion.cost import noise
from apportion.errors import ApportionError
from apportion.runtime.isolated import python_command

#: the cases, in order: name -> (factory, what is done with the program)
CASES: dict[str, tuple[str, str]] = {
    "llama3-8b": ("apportion.frontend.torch_models:llama3_8b", "plan spyre 32"),
    "llama3-70b": ("apportion.frontend.torch_models:llama3_70b", "shard tp=8"),
}
#: the stages each case times, in order
STAGES = ("build", "export", "decompose", "lower", "plan")
#: the 8B's goals: export + decomposition + lowering + planning CPU seconds, peak bytes
GOAL_SECONDS = 60.0
GOAL_BYTES = 4 * 2**30
#: the case the goals judge
JUDGED = "llama3-8b"
#: its rounds, each a fresh process: at least MIN_ROUNDS (the fewest a verdict is drawn from),
#: more until its CPU seconds are settled against the goal, at most MAX_ROUNDS
MIN_ROUNDS, MAX_ROUNDS = noise.FEWEST, 8


@dataclass(frozen=True)
class FullSizeResult:
    """One case: the stages' wall-clock and CPU seconds (``plan`` is sharding and the per-device
    programs for a ``shard`` case), the program's ops, and the process's peak resident bytes
    (of ``rounds`` runs: the times of the one with the fewest CPU seconds, the highest peak)."""

    case: str
    action: str
    wall: dict[str, float]
    cpu: dict[str, float]
    ops: int
    peak_bytes: int
    detail: str = ""
    rounds: int = 1

    def total(self, times: dict[str, float]) -> float:
        """Export, decomposition, lowering and planning (the model's build aside)."""
        return sum(v for k, v in times.items() if k != "build")


@contextmanager
def _timed(stage: str, wall: dict[str, float], cpu: dict[str, float]) -> Iterator[None]:
    w, c = time.perf_counter(), time.process_time()
    yield
    wall[stage], cpu[stage] = time.perf_counter() - w, time.process_time() - c


def measure(case: str, factory: str, action: str) -> FullSizeResult:
    """Run one case in this process: build, export, decompose, lower, then plan (``plan TARGET
    CORES``) or shard (``shard MESH``); the times of each and this process's peak memory.

    >>> r = measure("tiny", "apportion.frontend.torch_models:llama3_tiny", "plan spyre 4")
    >>> list(r.cpu) == list(STAGES), r.ops > 100, r.peak_bytes > 0
    (True, True, True)
    """
    import warnings

    import torch

    from apportion.frontend.torch_graph import lower_exported
    from apportion.workflows.torch_model import load_factory

    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    with _timed("build", wall, cpu):
        model, inputs = load_factory(factory)
    with warnings.catch_warnings():  # torch.export's own deprecation notices
        warnings.simplefilter("ignore", FutureWarning)
        with _timed("export", wall, cpu):
            ep = torch.export.export(model, inputs)
        with _timed("decompose", wall, cpu):
            ep = ep.run_decompositions()
    with _timed("lower", wall, cpu):
        tp = lower_exported(ep, factory.partition(":")[2])
    kind, *how = action.split()
    with _timed("plan", wall, cpu):
        detail = _plan(tp.program, kind, how)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return FullSizeResult(case, action, wall, cpu, len(tp.program.ops), peak, detail)


def _plan(program: Any, kind: str, how: list[str]) -> str:
    """Plan on ``TARGET CORES`` or shard over ``MESH`` (search, then every device's programs);
    a line saying what came out."""
    from apportion.target.presets import resolve

    if kind == "plan":
        from apportion.planned import plan

        planned = plan(program, resolve(how[0], int(how[1])), "balanced")
        return (f"{len(planned.ops)} ops on {planned.plan.cores} cores, mean utilization "
                f"{planned.plan.mean_utilization:.1%}")
    from apportion.sharding import resolve_mesh, search
    from apportion.sharding.unroll import unroll

    mesh = resolve_mesh(how[0])
    sharding = search(program, mesh, resolve("spyre"))
    u = unroll(sharding)
    return (f"{len(program.ops)} ops over {mesh.devices} devices, {u.distinct_segments} distinct "
            "segment programs")


def run_case(case: str) -> FullSizeResult:
    """``case`` measured in a fresh Python process (its own peak memory, nothing cached)."""
    factory, action = CASES[case]
    done = subprocess.run(python_command("-m", "apportion.bench.fullsize", case, factory,
                                         action), capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ApportionError(f"bench fullsize: case {case} failed (exit {done.returncode}): "
                             f"{why}")
    return FullSizeResult(**json.loads(lines[-1]))


def cpu_criterion() -> noise.Criterion:
    """The judged case's export, lowering and planning CPU seconds (its one timed figure) at
    most ``GOAL_SECONDS``."""
    return noise.Criterion("CPU seconds", lambda t: t[..., 0], GOAL_SECONDS)


def measure_rounds(case: str, measure_case: Callable[[str], FullSizeResult],
                   load: Callable[[], float | None] = noise.load_average
                   ) -> tuple[FullSizeResult, noise.Measured]:
    """``case`` measured by ``measure_case`` (a fresh process each) in rounds: the judged case
    until its CPU seconds are settled (``MIN_ROUNDS`` to ``MAX_ROUNDS``), another once; the
    round with the fewest CPU seconds, with the highest peak of any round, and the
    measurement (CPU time: judged by its spread, the load recorded)."""
    runs: list[FullSizeResult] = []

    def once() -> float:
        r = measure_case(case)
        runs.append(r)
        return r.total(r.cpu)

    judged = case == JUDGED
    rules = noise.Rules(min_rounds=MIN_ROUNDS, max_rounds=MAX_ROUNDS) if judged else \
        noise.Rules(min_rounds=1, max_rounds=1)
    m = noise.until_stable([once], (lambda _: [cpu_criterion()]) if judged else None, rules,
                           wall_clock=False, names=(case,), load=load)
    fastest = min(runs, key=lambda r: r.total(r.cpu))
    return dataclasses.replace(fastest, peak_bytes=max(r.peak_bytes for r in runs),
                               rounds=len(runs)), m


def goals(rows: list[FullSizeResult], measured: list[noise.Measured] | None = None
          ) -> list[bench_goals.Goal]:
    """The 8B's goals (none without its row): export to plan within ``GOAL_SECONDS`` CPU
    seconds, judged over its resampled rounds (``measured``, in the rows' order; none: an
    exact figure), and peak memory within ``GOAL_BYTES``.

    >>> r = FullSizeResult("llama3-8b", "plan spyre 32", {}, {"build": 5.0, "export": 20.0,
    ...                    "plan": 30.0}, 2000, 2**30)
    >>> [(g.met, g.figure) for g in goals([r])]
    [(True, '50.0 s'), (True, '1.00 GiB')]
    """
    at = next((i for i, r in enumerate(rows) if r.case == JUDGED), None)
    if at is None:
        return []
    row = rows[at]
    seconds = row.total(row.cpu)
    v = measured[at].judge("CPU seconds", cpu_criterion().figure, GOAL_SECONDS) if measured \
        else noise.verdict("CPU seconds", seconds, np.array([seconds]), GOAL_SECONDS)
    return [
        bench_goals.judged(f"{JUDGED}: export, lowering and planning within {GOAL_SECONDS:g} "
                           "CPU seconds", v, "{:.1f} s"),
        bench_goals.at_most(f"{JUDGED}: peak memory within {GOAL_BYTES / 2**30:g} GiB",
                            row.peak_bytes / 2**30, GOAL_BYTES / 2**30, "{:.2f} GiB"),
    ]


def table(rows: list[FullSizeResult]) -> Table:
    t = Table(title="full-size models on the meta device, 2048 tokens: seconds per stage, wall "
                    "(CPU), of the round with the fewest CPU seconds", title_justify="left")
    for col in ("model", "to", "ops", *STAGES, "total (no build)", "peak memory", "rounds"):
        t.add_column(col, justify="left" if col in ("model", "to") else "right")
    for r in rows:
        stages = [f"{r.wall[s]:.1f} ({r.cpu[s]:.1f})" for s in STAGES]
        t.add_row(r.case, r.action, str(r.ops), *stages,
                  f"{r.total(r.wall):.1f} ({r.total(r.cpu):.1f})",
                  f"{r.peak_bytes / 2**30:.2f} GiB", str(r.rounds))
    return t


def run(cases: list[str], console: Console,
        measure_case: Callable[[str], FullSizeResult] | None = None
        ) -> tuple[list[FullSizeResult], list[noise.Measured]]:
    """Measure each case in rounds (``measure_rounds``; ``run_case``: each round in its own
    process), print the table, its details, the noise and the goals; the rows and each
    case's measurement."""
    rows, measured = [], []
    for case in cases:
        row, m = measure_rounds(case, measure_case or run_case)
        rows.append(row)
        measured.append(m)
    console.print(table(rows))
    for r in rows:
        console.print(f"{r.case}: {r.detail}", highlight=False, soft_wrap=True)
    console.print(noise.summary(measured, "case"), highlight=False)
    bench_goals.show(goals(rows, measured), console)
    return rows, measured


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    cases = list(CASES)[:args.limit]
    rows, measured = run(cases, console)
    return Outcome([asdict(r) | {"noise": m.to_doc()} for r, m in zip(rows, measured,
                                                                      strict=True)],
                   goals(rows, measured))


SUITE = Suite("fullsize", frozenset(), "Llama-3-8B planned and Llama-3-70B sharded from the "
              "meta device: time per stage and peak memory", _suite)


if __name__ == "__main__":  # one case, in the process run_case starts: its result as JSON
    _, name, spec, how = sys.argv
    print(json.dumps(asdict(measure(name, spec, how))))
