"""`apportion bench tiling`: device-memory traffic of norm, softmax and MLP blocks, tiled or not.

Each block of each model in the models file is planned twice for the same target: untiled (every
intermediate goes through device memory) and as one coarse-tiling group over the token dim whose
loop count auto-tiling picks (the smallest whose per-iteration working set fits the scratchpad).
Traffic counts, for every op execution, the bytes of each operand region that lives in device
memory (sticks padded); operands held in the scratchpad cost none, operands not indexed by the
tiled dim (weights) are read again every iteration.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.errors import PlanningError
from apportion.frontend.json_format import from_dict
from apportion.frontend.models import load_models
from apportion.ir.dtypes import dtype_bytes
from apportion.ir.program import LoopLevel, Program, TilingGroup
from apportion.passes.pipeline import plan
from apportion.plans.plan import Plan
from apportion.target.presets import spyre
from apportion.target.target import Target


def _block(name: str, tensors: dict[str, list[int]], ops: list[dict[str, Any]], out: str,
           dtype: str) -> Program:
    return from_dict({"name": name,
                      "tensors": {t: {"shape": s, "dtype": dtype} for t, s in tensors.items()},
                      "inputs": list(tensors), "outputs": [out], "ops": ops})


def norm_block(cfg: dict[str, Any], tokens: int, dtype: str) -> Program:
    """RMS norm (llama) or layer norm (gpt2, bert) over the hidden dim, with its gain."""
    h = cfg["hidden"]
    if cfg.get("norm") == "layer":
        ops = [{"name": "mu", "op": "mean", "out": "mu[t,0]", "ins": ["x[t,n]"]},
               {"name": "xc", "op": "sub", "out": "xc[t,n]", "ins": ["x[t,n]", "mu[t,0]"]},
               {"name": "sq", "op": "square", "out": "sq[t,n]", "ins": ["xc[t,n]"]},
               {"name": "var", "op": "mean", "out": "var[t,0]", "ins": ["sq[t,n]"]},
               {"name": "inv", "op": "rsqrt", "out": "inv[t,0]", "ins": ["var[t,0]"]},
               {"name": "xn", "op": "mul", "out": "xn[t,n]", "ins": ["xc[t,n]", "inv[t,0]"]}]
    else:
        ops = [{"name": "sq", "op": "square", "out": "sq[t,n]", "ins": ["x[t,n]"]},
               {"name": "ms", "op": "mean", "out": "ms[t,0]", "ins": ["sq[t,n]"]},
               {"name": "inv", "op": "rsqrt", "out": "inv[t,0]", "ins": ["ms[t,0]"]},
               {"name": "xn", "op": "mul", "out": "xn[t,n]", "ins": ["x[t,n]", "inv[t,0]"]}]
    ops.append({"name": "gain", "op": "mul", "out": "y[t,n]", "ins": ["xn[t,n]", "g[0,n]"]})
    return _block("norm", {"x": [tokens, h], "g": [1, h]}, ops, "y", dtype)


def softmax_block(cfg: dict[str, Any], tokens: int, dtype: str) -> Program:
    """Softmax over the keys of attention scores [heads, tokens, tokens]."""
    ops = [{"name": "mx", "op": "max", "out": "mx[t,b,0]", "ins": ["s[t,b,c]"]},
           {"name": "sh", "op": "sub", "out": "sh[t,b,c]", "ins": ["s[t,b,c]", "mx[t,b,0]"]},
           {"name": "ex", "op": "exp", "out": "ex[t,b,c]", "ins": ["sh[t,b,c]"]},
           {"name": "den", "op": "sum", "out": "den[t,b,0]", "ins": ["ex[t,b,c]"]},
           {"name": "p", "op": "div", "out": "p[t,b,c]", "ins": ["ex[t,b,c]", "den[t,b,0]"]}]
    return _block("softmax", {"s": [tokens, cfg["heads"], tokens]}, ops, "p", dtype)


def mlp_block(cfg: dict[str, Any], tokens: int, dtype: str) -> Program:
    """The MLP: gated (gate, up, act, mul, down) or plain (up, act, down)."""
    h, f, act = cfg["hidden"], cfg["ffn"], cfg.get("act", "silu")
    if cfg.get("gated_mlp"):
        ops = [{"name": "gate", "op": "matmul", "out": "g[t,f]", "ins": ["x[t,n]", "wg[n,f]"]},
               {"name": "up", "op": "matmul", "out": "u[t,f]", "ins": ["x[t,n]", "wu[n,f]"]},
               {"name": "act", "op": act, "out": "a[t,f]", "ins": ["g[t,f]"]},
               {"name": "glu", "op": "mul", "out": "m[t,f]", "ins": ["a[t,f]", "u[t,f]"]},
               {"name": "down", "op": "matmul", "out": "y[t,n]", "ins": ["m[t,f]", "wd[f,n]"]}]
        tensors = {"x": [tokens, h], "wg": [h, f], "wu": [h, f], "wd": [f, h]}
    else:
        ops = [{"name": "up", "op": "matmul", "out": "u[t,f]", "ins": ["x[t,n]", "wu[n,f]"]},
               {"name": "act", "op": act, "out": "m[t,f]", "ins": ["u[t,f]"]},
               {"name": "down", "op": "matmul", "out": "y[t,n]", "ins": ["m[t,f]", "wd[f,n]"]}]
        tensors = {"x": [tokens, h], "wu": [h, f], "wd": [f, h]}
    return _block("mlp", tensors, ops, "y", dtype)


BLOCKS = {"norm": norm_block, "softmax": softmax_block, "mlp": mlp_block}


def tiled(program: Program, dim: str = "t") -> Program:
    """The program as one tiling group over ``dim`` (count 1: auto-tiling picks the count)."""
    group = TilingGroup(tuple(o.name for o in program.ops), (LoopLevel(1, (dim,)),))
    return replace(program, tiling=(group,))


def traffic_bytes(program: Program, result: Plan, target: Target) -> int:
    """Device-memory bytes all op executions move (scratchpad operands cost nothing)."""
    lx = {b.tensor for b in result.buffers if b.space == "lx"}
    total = 0
    for op in program.ops:
        op_plan = result.op(op.name)
        runs = 1
        if op_plan.loop is not None:
            runs = math.prod(c for c in op_plan.loop.count if isinstance(c, int))
        for acc in dict.fromkeys(op.operands):
            if acc.tensor in lx:
                continue
            t = program.tensor(acc.tensor)
            eps = target.elems_per_stick(t.dtype)
            n = 1
            for axis, (e, size) in enumerate(zip(acc.index, t.shape, strict=True)):
                ext = min(e.extent(op_plan.sizes), size)
                n *= -(-ext // eps) * eps if axis == t.rank - 1 else ext
            total += runs * n * dtype_bytes(t.dtype)
    return total


@dataclass(frozen=True)
class TilingResult:
    case: str
    count: int | None  # None: no count made the working set fit
    working_set: int
    untiled_bytes: int
    tiled_bytes: int | None
    note: str = ""


def run_case(name: str, program: Program, target: Target) -> TilingResult:
    base = plan(program, target)
    untiled = traffic_bytes(program, base, target)
    try:
        tp = plan(tiled(program), target, auto_tile=True)
    except PlanningError as e:
        return TilingResult(name, None, 0, untiled, None, str(e).split(";")[-1].strip())
    count = tp.groups[0].counts[0]
    return TilingResult(name, int(count), tp.groups[0].working_set_bytes, untiled,
                        traffic_bytes(program, tp, target))


def cases(dtype: str = "float16", models_path: str | None = None,
          tokens: list[int] | None = None, limit: int | None = None
          ) -> list[tuple[str, Program]]:
    """The first ``limit`` (name, block program) pairs: every block of every model at each
    token count (default: the models file's prefill counts from 128 to 2048)."""
    models = load_models(models_path)
    toks = tokens or [t for t in models["prefill_tokens"] if 128 <= t <= 2048]
    blocks = [(f"{m}/{blk}/{t}", fn, cfg, t) for m, cfg in models["models"].items()
              for blk, fn in BLOCKS.items() for t in toks][:limit]
    return [(name, fn(cfg, t, dtype)) for name, fn, cfg, t in blocks]


def run(cores: list[int], dtype: str = "float16", models_path: str | None = None,
        tokens: list[int] | None = None, console: Console | None = None,
        limit: int | None = None, blocks: list[tuple[str, Program]] | None = None
        ) -> list[TilingResult]:
    """Run the benchmark and print its table; returns every block's result.

    ``blocks`` (from ``cases``) replaces the models file, ``dtype``, ``tokens`` and ``limit``.
    """
    console = console or Console()
    todo = cases(dtype, models_path, tokens, limit) if blocks is None else blocks
    results = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("planning", total=len(todo) * len(cores))
        for n in cores:
            target = spyre(cores=n)
            for name, program in todo:
                results.append(run_case(f"{name}@{n}", program, target))
                progress.advance(task)
    console.print(table(results))
    return results


def table(results: list[TilingResult]) -> Table:
    t = Table(title="device-memory traffic per block: untiled vs auto-tiled over tokens",
              title_justify="left")
    for col in ("block", "count", "working set / iter / core", "untiled MiB", "tiled MiB",
                "tiled / untiled"):
        t.add_column(col, justify="right" if col != "block" else "left")
    ratios = []
    for r in results:
        if r.tiled_bytes is None:
            t.add_row(r.case, "-", "-", f"{r.untiled_bytes / 2**20:.1f}", "-",
                      f"no fit: {r.note}"[:60])
            continue
        ratio = r.tiled_bytes / r.untiled_bytes
        ratios.append(ratio)
        t.add_row(r.case, str(r.count), f"{r.working_set / 1024:.1f} KiB",
                  f"{r.untiled_bytes / 2**20:.1f}", f"{r.tiled_bytes / 2**20:.1f}",
                  f"{ratio:.3f}x")
    if ratios:
        t.caption = (f"{len(ratios)} of {len(results)} blocks tiled; geometric mean traffic "
                     f"ratio {statistics.geometric_mean(ratios):.3f}x")
    return t
