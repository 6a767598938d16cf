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
  with the verdict against ``FORWARD_LIMIT_S``.

``--models`` names another models file, ``--limit N`` keeps its first N models, ``--json``
writes every row.

Goals (``goals``, checked by ``--check``): every block's plan on every mesh is predicted at
least ``EFFICIENCY_GOAL`` of perfect scaling (speedup over one device at least that fraction
of the mesh's devices), and the slowest forward solve takes under ``FORWARD_LIMIT_S``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.cli import goals as bench_goals
from apportion.cli.bench_harness import Outcome, Suite
from apportion.cli.usage import UsageError
from apportion.frontend.models import forward_program, load_models
from apportion.ir.program import Program
from apportion.sharding.mesh import Mesh, cards, cluster, parse
from apportion.sharding.search import search

TOKENS = 2048
FORWARD_LIMIT_S = 10.0
FORWARD_MODEL = "llama3-8b"
FORWARD_LAYERS = 32
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


def _matmuls(plan: Any) -> str:
    out = []
    for o in plan.ops:
        op = plan.program.op(o.op)
        if op.kind.name == "matmul":
            out.append(f"{o.op.removeprefix('l0_')} {o.strategy.label}")
    return ", ".join(out)


def run(models_path: str | None = None, limit: int | None = None,
        console: Console | None = None, forward: bool = True) -> tuple[list[BlockRow],
                                                                     list[ForwardRow]]:
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
    if forward and FORWARD_MODEL in doc["models"]:
        fwd = _forward(doc, console)
    return rows, fwd


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


def forward_goals(rows: list[ForwardRow]) -> list[bench_goals.Goal]:
    """The forward table's goal: the slowest solve under ``FORWARD_LIMIT_S``."""
    if not rows:
        return []
    worst = max(rows, key=lambda r: r.solve_s)
    return [bench_goals.at_most(
        f"the {FORWARD_MODEL} forward's search solves in under {FORWARD_LIMIT_S:g} s on every "
        f"mesh (slowest)", worst.solve_s, FORWARD_LIMIT_S, "{:.2f} s", worst.mesh)]


def goals(rows: list[BlockRow], fwd: list[ForwardRow]) -> list[bench_goals.Goal]:
    """Every goal of the suite over ``run``'s rows."""
    return block_goals(rows) + forward_goals(fwd)


def _forward(doc: dict[str, Any], console: Console) -> list[ForwardRow]:
    p = forward_program(FORWARD_MODEL, FORWARD_LAYERS, TOKENS, models=doc)
    rows = []
    table = Table(title=f"sharding search: {FORWARD_MODEL} forward, {FORWARD_LAYERS} layers, "
                        f"{TOKENS} tokens, 8 devices")
    for col in ("mesh", "ops", "classes", "predicted ms", "MiB recv", "collectives", "solve s"):
        table.add_column(col, justify="left" if col in ("mesh", "collectives") else "right")
    todo = (cards(8), cluster(2, 4))
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("searching", total=len(todo))
        plans = []
        for mesh in todo:
            progress.update(task, description=f"{FORWARD_MODEL} forward on {mesh.spec()}")
            progress.refresh()
            start = time.perf_counter()
            plans.append((mesh, search(p, mesh), time.perf_counter() - start))
            progress.advance(task)
    for mesh, plan, took in plans:
        stats = dict(plan.stats)
        row = ForwardRow(FORWARD_MODEL, FORWARD_LAYERS, mesh.spec(), len(p.ops),
                         int(stats["classes"]), plan.predicted_us, plan.comm_bytes,
                         plan.collectives_text(), took)
        rows.append(row)
        table.add_row(row.mesh, str(row.ops), str(row.classes), f"{row.predicted_us / 1e3:.1f}",
                      f"{row.comm_bytes / 2**20:.0f}", row.collectives, f"{took:.2f}")
    console.print(table)
    bench_goals.show(forward_goals(rows), console)
    return rows


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    try:
        rows, fwd = run(args.models, args.limit, console)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"--models {args.models!r} is not a models file like the packaged "
                         f"models.json: {e}") from None
    doc = {"blocks": [dataclasses.asdict(r) for r in rows],
           "forward": [dataclasses.asdict(r) for r in fwd]}
    return Outcome(doc, goals(rows, fwd))


SUITE = Suite("sharding", frozenset({"models"}),
              "the sharding search on the models' blocks and a forward over device meshes",
              _suite)
