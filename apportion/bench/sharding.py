"""`apportion bench sharding`: the strategy search on transformer blocks and a whole forward.

Two tables, each from ``sharding.search`` on Spyre devices (32 cores each, 128 GB of memory):

* **blocks**: the attention block (norm, q/k/v projections, scores, softmax, attention times V,
  output projection, residual) and the MLP block (norm, gate and up, activation, down,
  residual) of each model of ``frontend/data/models.json`` at 2048 prefill tokens
  (``frontend/models.forward_program``, one decoder block cut in two), searched on meshes of
  2, 4 and 8 cards in one machine (``tp``, PCIe links) and of 2 machines of 2 and 4 cards
  (``dp`` across machines over the network, ``tp`` inside). Per row: the matmuls' chosen
  strategies, the predicted time per device against one device's, the bytes each device
  receives, the collectives, and the solve time (wall-clock seconds of the search: cost
  evaluations, the integer program and the plan).
* **forward**: the 32-layer llama3-8b forward pass at 2048 tokens on 8 devices, both meshes:
  ops, search classes (identical layers share one solution), predicted time and solve time,
  with the verdict against ``FORWARD_LIMIT_S``. The two searches are timed in interleaved
  rounds (``cost/noise.py``; each from a cold cache of collective steps), at least
  ``FORWARD_ROUNDS`` and more until the verdict is settled over the resampled rounds, up to
  ``FORWARD_MAX_ROUNDS``; the solve time is the fastest round's, and a line under the table
  gives the rounds, the spread and the load average before and after.

``--models`` names another models file, ``--limit N`` keeps its first N models, ``--json``
writes every row.

Goals (``goals``, checked by ``--check``): every block's plan on every mesh is predicted at
least ``EFFICIENCY_GOAL`` of perfect scaling (speedup over one device at least that fraction
of the mesh's devices), and the slowest forward solve takes under ``FORWARD_LIMIT_S``: met or
missed only over its whole interval, else inconclusive (too noisy, ``--check`` exit status 3),
as it is where the load average went over the machine's cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.bench import goals as bench_goals
from apportion.bench.harness import Outcome, Suite
from apportion.cost import noise
from apportion.cost.timing import until_stable
from apportion.errors import UsageError
from apportion.frontend.models import forward_program, load_models
from apportion.ir.program import Program
from apportion.sharding.collectives import cached_steps
from apportion.sharding.mesh import Mesh, cards, cluster, parse
from apportion.sharding.search import search

TOKENS = 2048
FORWARD_LIMIT_S = 10.0
FORWARD_MODEL = "llama3-8b"
FORWARD_LAYERS = 32
#: timed rounds of the forward searches, at least and at most (more until the verdict settles)
FORWARD_ROUNDS, FORWARD_MAX_ROUNDS = 3, 6
#: a block's speedup over one device, as a fraction of the mesh's devices: at least this (a
#: sharding that buys less than half of each added device is not worth its devices)
EFFICIENCY_GOAL = 0.5


def meshes() -> list[Mesh]:
    return [cards(2), cards(4), cards(8), cluster(2, 2), cluster(2, 4)]


def block(program: Program, first: str, last: str, name: str) -> Program:
    """The ops from ``first`` to ``last`` as a program: what they read and nobody among them
    makes becomes an input, ``last``'s result the output."""
    names = [o.name for o in program.ops]
    ops = program.ops[names.index(first):names.index(last) + 1]
    made = {o.out.tensor for o in ops}
    inputs = tuple(dict.fromkeys(a.tensor for o in ops for a in o.ins if a.tensor not in made))
    used = set(inputs) | made
    return Program(name, tuple(t for t in program.tensors if t.name in used), inputs,
                   (ops[-1].out.tensor,), tuple(ops))


def blocks(model: str, models: dict[str, Any]) -> list[tuple[str, Program]]:
    p = forward_program(model, 1, TOKENS, models=models)
    return [("attention", block(p, "l0_attn_sq", "l0_res1", f"{model}-attention")),
            ("mlp", block(p, "l0_mlp_sq", "l0_res2", f"{model}-mlp"))]


@dataclass(frozen=True)
class BlockRow:
    model: str
    block: str
    mesh: str
    devices: int
    strategies: str
    predicted_us: float
    one_device_us: float
    comm_bytes: int
    collectives: str
    solve_s: float

    @property
    def speedup(self) -> float:
        return self.one_device_us / self.predicted_us if self.predicted_us else 0.0


@dataclass(frozen=True)
class ForwardRow:
    model: str
    layers: int
    mesh: str
    ops: int
    classes: int
    predicted_us: float
    comm_bytes: int
    collectives: str
    solve_s: float
    rounds: int = 1


def _matmuls(plan: Any) -> str:
    out = []
    for o in plan.ops:
        op = plan.program.op(o.op)
        if op.kind.name == "matmul":
            out.append(f"{o.op.removeprefix('l0_')} {o.strategy.label}")
    return ", ".join(out)


def run(models_path: str | None = None, limit: int | None = None,
        console: Console | None = None, forward: bool = True
        ) -> tuple[list[BlockRow], list[ForwardRow], noise.Measured | None]:
    """Search the blocks and the forward, print the tables and goals; the rows and the
    forward searches' measurement (None: no forward)."""
    console = console or Console()
    doc = load_models(models_path)
    names = list(doc["models"])[:limit]
    rows: list[BlockRow] = []
    table = Table(title=f"sharding search: blocks at {TOKENS} tokens on Spyre cards")
    for col in ("model", "block", "mesh", "matmul strategies", "us/device", "1 device us",
                "speedup", "MiB recv", "collectives", "solve s"):
        table.add_column(col, justify="right" if col in ("us/device", "1 device us", "speedup",
                                                          "MiB recv", "solve s") else "left")
    todo = meshes()
    # redrawn between searches only: a refresh thread would share the cores solve s times
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("searching", total=len(names) * 2 * len(todo))
        for model in names:
            for what, prog in blocks(model, doc):
                one = search(prog, parse("tp=1")).predicted_us
                for mesh in todo:
                    progress.update(task, description=f"{model} {what} on {mesh.spec()}")
                    progress.refresh()
                    start = time.perf_counter()
                    plan = search(prog, mesh)
                    took = time.perf_counter() - start
                    row = BlockRow(model, what, mesh.spec(), mesh.devices, _matmuls(plan),
                                   plan.predicted_us, one, plan.comm_bytes,
                                   plan.collectives_text(), took)
                    rows.append(row)
                    table.add_row(model, what, row.mesh, row.strategies,
                                  f"{row.predicted_us:.0f}", f"{one:.0f}", f"{row.speedup:.2f}",
                                  f"{row.comm_bytes / 2**20:.1f}", row.collectives,
                                  f"{row.solve_s:.2f}")
                    progress.advance(task)
    console.print(table)
    bench_goals.show(block_goals(rows), console)
    fwd: list[ForwardRow] = []
    measured = None
    if forward and FORWARD_MODEL in doc["models"]:
        fwd, measured = _forward(doc, console)
    return rows, fwd, measured


def block_goals(rows: list[BlockRow]) -> list[bench_goals.Goal]:
    """The blocks table's goal (see the module's docstring)."""
    if not rows:
        return []
    worst = min(rows, key=lambda r: r.speedup / r.devices)
    return [bench_goals.at_least(
        f"every block on every mesh at least {EFFICIENCY_GOAL:.0%} of perfect scaling "
        f"(worst speedup / devices)", worst.speedup / worst.devices, EFFICIENCY_GOAL,
        "{:.0%}", f"{worst.model} {worst.block} on {worst.mesh}: {worst.speedup:.2f}x on "
        f"{worst.devices}")]


def solve_criterion() -> noise.Criterion:
    """The forward table's goal as a figure of the searches' times: the slowest under
    ``FORWARD_LIMIT_S``."""
    return noise.Criterion("slowest solve", lambda t: t.max(axis=-1), FORWARD_LIMIT_S)


def forward_goals(rows: list[ForwardRow], measured: noise.Measured | None = None
                  ) -> list[bench_goals.Goal]:
    """The forward table's goal: the slowest solve under ``FORWARD_LIMIT_S``, judged over the
    resampled rounds of ``measured`` (the rows' searches; none: the solve times are exact)."""
    if not rows:
        return []
    worst = max(rows, key=lambda r: r.solve_s)
    samples = solve_criterion().figure(
        np.array([[r.solve_s for r in rows]]) if measured is None else measured.resampled())
    v = noise.verdict("slowest solve", worst.solve_s, samples, FORWARD_LIMIT_S,
                      noisy="" if measured is None else measured.noisy)
    return [bench_goals.judged(
        f"the {FORWARD_MODEL} forward's search solves in under {FORWARD_LIMIT_S:g} s on every "
        f"mesh (slowest)", v, "{:.2f} s", worst.mesh)]


def goals(rows: list[BlockRow], fwd: list[ForwardRow],
          measured: noise.Measured | None = None) -> list[bench_goals.Goal]:
    """Every goal of the suite over ``run``'s rows (``measured``: the forward searches')."""
    return block_goals(rows) + forward_goals(fwd, measured)


def time_solves(program: Program, meshes: Sequence[Mesh],
                solve: Callable[[Program, Mesh], Any] = search,
                clock: Callable[[], float] = time.perf_counter,
                load: Callable[[], float | None] = noise.load_average
                ) -> tuple[list[Any], noise.Measured]:
    """``program`` searched on every mesh in interleaved rounds until the solve-time goal is
    settled (see the module docstring), each search from a cold cache of collective steps;
    the plan of each mesh's fastest search, and the measurement."""
    timings, measured = until_stable(
        [lambda mesh=mesh: solve(program, mesh) for mesh in meshes],
        noise.Rules(min_rounds=FORWARD_ROUNDS, max_rounds=FORWARD_MAX_ROUNDS),
        lambda _: [solve_criterion()], clock=clock, before=cached_steps.cache_clear,
        names=[m.spec() for m in meshes], load=load)
    return [t.result for t in timings], measured


def _forward(doc: dict[str, Any], console: Console
             ) -> tuple[list[ForwardRow], noise.Measured]:
    p = forward_program(FORWARD_MODEL, FORWARD_LAYERS, TOKENS, models=doc)
    rows = []
    table = Table(title=f"sharding search: {FORWARD_MODEL} forward, {FORWARD_LAYERS} layers, "
                        f"{TOKENS} tokens, 8 devices (solve s: the fastest of the rounds)")
    for col in ("mesh", "ops", "classes", "predicted ms", "MiB recv", "collectives", "solve s"):
        table.add_column(col, justify="left" if col in ("mesh", "collectives") else "right")
    todo = (cards(8), cluster(2, 4))
    with console.status(f"{FORWARD_MODEL} forward: timing the search on {len(todo)} meshes in "
                        "rounds until settled"):
        plans, measured = time_solves(p, todo)
    for mesh, plan, took in zip(todo, plans, measured.least, strict=True):
        stats = dict(plan.stats)
        row = ForwardRow(FORWARD_MODEL, FORWARD_LAYERS, mesh.spec(), len(p.ops),
                         int(stats["classes"]), plan.predicted_us, plan.comm_bytes,
                         plan.collectives_text(), took, measured.rounds)
        rows.append(row)
        table.add_row(row.mesh, str(row.ops), str(row.classes), f"{row.predicted_us / 1e3:.1f}",
                      f"{row.comm_bytes / 2**20:.0f}", row.collectives, f"{took:.2f}")
    console.print(table)
    console.print(noise.summary([measured]), highlight=False)
    bench_goals.show(forward_goals(rows, measured), console)
    return rows, measured


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    try:
        rows, fwd, measured = run(args.models, args.limit, console)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"--models {args.models!r} is not a models file like the packaged "
                         f"models.json: {e}") from None
    doc = {"blocks": [dataclasses.asdict(r) for r in rows],
           "forward": [dataclasses.asdict(r) for r in fwd],
           "forward_noise": None if measured is None else measured.to_doc()}
    return Outcome(doc, goals(rows, fwd, measured))


SUITE = Suite("sharding", frozenset({"models"}),
              "the sharding search on the models' blocks and a forward over device meshes",
              _suite)
