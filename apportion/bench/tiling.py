"""`apportion bench tiling`: device-memory traffic of norm, softmax and MLP blocks, tiled or not;
a tensor over the span limit planned by both strategies; tile-sized accumulators vs whole ones.

Each block of each model in the models file is planned twice for the same target: untiled (every
intermediate goes through device memory) and as one coarse-tiling group over the token dim whose
loop count auto-tiling picks (the smallest whose per-iteration working set fits the scratchpad).
Traffic counts, for every op execution, the bytes of each operand region that lives in device
memory (sticks padded); operands held in the scratchpad cost none, operands not indexed by the
tiled dim (weights) are read again every iteration. Each plan's predicted time is its whole
run (``cli/report.predicted_total_us``: loop bodies times their iterations).

Goals (``goals``, checked by ``--check``): for every block auto-tiling finds a count whose
per-iteration working set fits the target's scratchpad (less its reserve), or count 1 where the
untiled group is predicted faster (``passes/auto_tile.py``: a count that fits but re-reads the
weights every iteration loses to it; llama3-8b's MLP at 2048 tokens is one); every tiled plan's
scratchpad buffers fit the scratchpad; and no tiled plan moves more device memory or is
predicted slower than its untiled plan.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from apportion.bench import goals as bench_goals
from apportion.bench.harness import Outcome, Suite, core_counts, from_models
from apportion.errors import PlanningError
from apportion.frontend.json_format import from_dict
from apportion.frontend.models import load_models
from apportion.ir.dtypes import dtype_bytes
from apportion.ir.program import LoopLevel, Program, TilingGroup
from apportion.passes.pipeline import plan
from apportion.plans.plan import Plan
from apportion.report.tables import predicted_total_us
from apportion.target.layout import device_layout
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
    """Device-memory bytes all op executions and loop steps move (scratchpad operands cost
    nothing). An op in a loop group reads a tensor from its tile buffer of that group where it
    has one (else the full buffer) and writes its own output there; an accumulating op reads
    and writes its accumulator every iteration; a copy reads the tile and writes the full
    tensor's slice; an init writes the accumulator tile and a finish reads it and writes the
    result."""
    total = 0
    for op in program.ops:
        op_plan = result.op(op.name)
        runs = 1
        loop = op_plan.loop
        if loop is not None:
            runs = math.prod(c for c in loop.count if isinstance(c, int))
        group = None if loop is None else result.group(loop.group)
        accumulates = group is not None and any(c.op == op.name for c in group.combines)
        for acc in dict.fromkeys(op.operands):
            buf = _buffer_used(result, acc.tensor, loop, acc is op.out and accumulates)
            if buf is not None and buf.space == "lx":
                continue
            dtype = buf.dtype if buf is not None and buf.dtype else program.tensor(
                acc.tensor).dtype
            n = _region_bytes(acc, program.tensor(acc.tensor).shape, op_plan.sizes, dtype,
                              target)
            # an accumulator is read and written every iteration
            total += runs * n * (2 if acc is op.out and accumulates else 1)
    for g in result.groups:
        for step in (*g.copies, *g.inits, *g.finishes):
            op = program.op(step.op)
            op_plan = result.op(op.name)
            t = program.tensor(op.out.tensor)
            if step in g.copies:
                runs = math.prod(c for c in op_plan.loop.count if isinstance(c, int)) \
                    if op_plan.loop else 1
                tile = result.buffer(t.name, "tile")
                n = _region_bytes(op.out, t.shape, op_plan.sizes, t.dtype, target)
                total += runs * n * (1 if tile.space == "lx" else 2)
                continue
            acc = result.buffer(t.name, "accumulator")
            acc_bytes = 0 if acc.space == "lx" else device_layout(
                t.shape, acc.dtype or t.dtype, target).nbytes
            total += acc_bytes  # every init or finish touches each tile once: the whole
            if step in g.finishes:
                total += device_layout(t.shape, t.dtype, target).nbytes
    return total


def _buffer_used(result: Plan, tensor: str, loop: object, accumulator: bool):
    """The buffer an op at ``loop`` reaches ``tensor`` through (None: none placed)."""
    bufs = result.buffers_of(tensor)
    if accumulator:
        return next((b for b in bufs if b.kind == "accumulator"), None)
    if loop is not None:
        path = loop.group  # type: ignore[attr-defined]
        tile = next((b for b in bufs if b.kind == "tile" and b.group == path[:len(b.group)]),
                    None)
        if tile is not None:
            return tile
    return next((b for b in bufs if b.kind == "full"), None) or next(
        (b for b in bufs if b.kind == "accumulator"), None)


def _region_bytes(acc, shape: tuple[int, ...], sizes: dict[str, int], dtype: str,
                  target: Target) -> int:
    """Bytes of the region an access touches over a box of ``sizes`` (last axis in sticks)."""
    eps = target.elems_per_stick(dtype)
    n = 1
    for axis, (e, size) in enumerate(zip(acc.index, shape, strict=True)):
        ext = min(e.extent(sizes), size)
        n *= -(-ext // eps) * eps if axis == len(shape) - 1 else ext
    return n * dtype_bytes(dtype)


def scratchpad_used(result: Plan) -> int:
    """Bytes per core the plan's scratchpad buffers reach (the highest end over every group)."""
    return max((b.end for b in result.buffers if b.space == "lx"), default=0)


@dataclass(frozen=True)
class AccTraffic:
    """Device-memory bytes an accumulating op's accumulator moves (with its result's write):
    ``full_size`` with a whole-tensor float32 accumulator in device memory finished after the
    nest (apportion before tile-sized accumulators), ``tiled`` as the plan places it."""

    op: str
    full_size: int
    tiled: int

    @property
    def saved(self) -> int:
        return self.full_size - self.tiled


def accumulator_traffic(program: Program, result: Plan, target: Target) -> dict[str, AccTraffic]:
    """Per accumulating op of ``result``: its accumulator's device-memory traffic, whole-tensor
    against as planned. The whole accumulator is set once (W bytes), every iteration reads and
    writes its tile (2 r per run), and where the result needs a cast or a division it is read
    once more and the result written (W + O). As planned: nothing but the copy-out's write of
    the result (O) for an accumulator in the scratchpad; the same terms as whole for one in
    device memory (a tile-sized one moves the same bytes in less space)."""
    out: dict[str, AccTraffic] = {}
    for g in result.groups:
        finished = {f.tensor for f in g.finishes}
        for init in g.inits:
            op = program.op(init.op)
            op_plan = result.op(op.name)
            t = program.tensor(op.out.tensor)
            reducer = op.kind.reducer
            assert reducer is not None and op_plan.loop is not None
            acc = reducer.accumulator_dtype(t.dtype)
            whole = device_layout(t.shape, acc, target).nbytes
            result_bytes = device_layout(t.shape, t.dtype, target).nbytes
            sizes = op_plan.sizes
            tile = tuple(min(sizes[e.single_dim], n) if e.single_dim else 1
                         for e, n in zip(op.out.index, t.shape, strict=True))
            r = device_layout(tile, acc, target).nbytes
            runs = math.prod(c for c in op_plan.loop.count if isinstance(c, int))
            cast = reducer.finish is not None or acc != t.dtype
            full_size = whole + 2 * r * runs + ((whole + result_bytes) if cast else 0)
            buf = result.buffer(t.name, "accumulator")
            if buf.space == "lx":
                tiled = result_bytes
            else:
                tiled = whole + 2 * r * runs + (
                    (whole + result_bytes) if t.name in finished else 0)
            out[op.name] = AccTraffic(op.name, full_size, tiled)
    return out


@dataclass(frozen=True)
class TilingResult:
    case: str
    count: int | None  # None: no count made the working set fit
    working_set: int
    untiled_bytes: int
    tiled_bytes: int | None
    note: str = ""
    scratchpad: int = 0  # bytes per core the tiled plan's scratchpad buffers reach
    untiled_us: float = 0.0  # predicted time of the whole untiled plan
    tiled_us: float | None = None  # and of the tiled one
    capacity: int = 0  # the target's usable scratchpad bytes per core


def run_case(name: str, program: Program, target: Target) -> TilingResult:
    base = plan(program, target)
    untiled = traffic_bytes(program, base, target)
    untiled_us = predicted_total_us(base)[0]
    try:
        tp = plan(tiled(program), target, auto_tile=True)
    except PlanningError as e:
        return TilingResult(name, None, 0, untiled, None, str(e).split(";")[-1].strip(),
                            untiled_us=untiled_us, capacity=target.scratchpad_capacity)
    count = tp.groups[0].counts[0]
    return TilingResult(name, int(count), tp.groups[0].working_set_bytes, untiled,
                        traffic_bytes(program, tp, target), scratchpad=scratchpad_used(tp),
                        untiled_us=untiled_us, tiled_us=predicted_total_us(tp)[0],
                        capacity=target.scratchpad_capacity)


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
        limit: int | None = None, blocks: list[tuple[str, Program]] | None = None,
        extras: bool = True) -> list[TilingResult]:
    """Run the benchmark and print its table; returns every block's result.

    ``blocks`` (from ``cases``) replaces the models file, ``dtype``, ``tokens`` and ``limit``.
    ``extras`` adds the tables of a span-overflowing tensor planned by both strategies and of
    tile-sized accumulators against whole ones.
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
    bench_goals.show(goals(results), console)
    if extras:
        console.print(span_table(span_cases()))
        console.print(accumulator_table(accumulator_cases(models_path)))
    return results


def goals(results: list[TilingResult]) -> list[bench_goals.Goal]:
    """The suite's goals over ``results`` (see the module's docstring)."""
    done = [r for r in results if r.tiled_bytes is not None and r.tiled_us is not None]
    n = len(results)
    return [
        bench_goals.count("auto-tiling finds a count whose working set per iteration fits the "
                          "scratchpad, or count 1 (untiled predicted faster)",
                          [r.case if r.tiled_bytes is None else
                           f"{r.case} count {r.count}: {r.working_set / 1024:.0f} KiB > "
                           f"{r.capacity / 1024:.0f} KiB" for r in results
                           if r.tiled_bytes is None
                           or (r.count != 1 and r.working_set > r.capacity)], n),
        bench_goals.count("every tiled plan's scratchpad buffers fit the scratchpad",
                          [f"{r.case} {r.scratchpad / 1024:.0f} KiB" for r in done
                           if r.scratchpad > r.capacity], len(done)),
        bench_goals.count("no tiled plan moves more device memory than untiled",
                          [f"{r.case} {r.tiled_bytes / r.untiled_bytes:.3f}x" for r in done
                           if r.tiled_bytes is not None and r.tiled_bytes > r.untiled_bytes],
                          len(done)),
        bench_goals.count("no tiled plan is predicted slower than untiled",
                          [f"{r.case} {r.tiled_us / r.untiled_us:.3f}x" for r in done
                           if r.tiled_us is not None and r.tiled_us > r.untiled_us * (1 + 1e-9)],
                          len(done)),
    ]


def table(results: list[TilingResult]) -> Table:
    t = Table(title="device-memory traffic per block: untiled vs auto-tiled over tokens",
              title_justify="left")
    for col in ("block", "count", "working set / iter / core", "scratchpad used / core",
                "untiled MiB", "tiled MiB", "tiled / untiled", "untiled us", "tiled us"):
        t.add_column(col, justify="right" if col != "block" else "left")
    ratios = []
    for r in results:
        if r.tiled_bytes is None:
            t.add_row(r.case, "-", "-", "-", f"{r.untiled_bytes / 2**20:.1f}", "-",
                      f"no fit: {r.note}"[:60], f"{r.untiled_us:.1f}", "-")
            continue
        ratio = r.tiled_bytes / r.untiled_bytes
        ratios.append(ratio)
        t.add_row(r.case, str(r.count), f"{r.working_set / 1024:.1f} KiB",
                  f"{r.scratchpad / 1024:.1f} KiB",
                  f"{r.untiled_bytes / 2**20:.1f}", f"{r.tiled_bytes / 2**20:.1f}",
                  f"{ratio:.3f}x", f"{r.untiled_us:.1f}",
                  "-" if r.tiled_us is None else f"{r.tiled_us:.1f}")
    if ratios:
        t.caption = (f"{len(ratios)} of {len(results)} blocks tiled; geometric mean traffic "
                     f"ratio {statistics.geometric_mean(ratios):.3f}x")
    return t


# --- a tensor over the span limit, planned by both strategies --------------------------------

@dataclass(frozen=True)
class SpanResult:
    case: str
    strategy: str
    loop: str  # "-" or "count over dim" (a loop the planner added)
    splits: str
    max_span: int
    time_us: float
    traffic: int


def span_cases() -> list[tuple[str, Program, Target]]:
    """The issue's [1, 8195, 256, 64] float16 tensor (256.1 MiB) through an exp, on 4 cores
    and on 1."""
    p = from_dict({"name": "big", "tensors": {"x": {"shape": [1, 8195, 256, 64],
                                                    "dtype": "float16"}},
                   "inputs": ["x"], "outputs": ["y"],
                   "ops": [{"name": "e", "op": "exp", "out": "y[a,b,c,d]",
                            "ins": ["x[a,b,c,d]"]}]})
    return [("exp [1,8195,256,64] f16@4", p, spyre(cores=4)),
            ("exp [1,8195,256,64] f16@1", p, spyre(cores=1))]


def span_results(name: str, program: Program, target: Target) -> list[SpanResult]:
    out = []
    for strategy in ("greedy", "balanced"):
        result = plan(program, target, strategy)
        o = result.ops[0]
        loop = "-" if o.loop is None else " x ".join(
            f"{c} over {','.join(d)}" for c, d in zip(o.loop.count, o.loop.tiled_dims,
                                                       strict=True))
        runs = 1 if o.loop is None else math.prod(c for c in o.loop.count if isinstance(c, int))
        splits = " ".join(f"{d}:{n}" + ("" if o.is_even(d) else "~")
                          for d, n in o.splits if n > 1) or "-"
        out.append(SpanResult(name, strategy, loop, splits, max(s for _, s in o.span_bytes),
                              runs * o.predicted_time_us, traffic_bytes(program, result,
                                                                        target)))
    return out


def span_table(cases: list[tuple[str, Program, Target]]) -> Table:
    t = Table(title="a tensor over the span limit (256 MiB per core): greedy loops, balanced "
                    "splits unevenly where it can", title_justify="left")
    for col in ("case", "strategy", "loop (added)", "splits", "max span MiB", "predicted us",
                "traffic MiB"):
        t.add_column(col, justify="left" if col in ("case", "strategy", "loop (added)",
                                                     "splits") else "right")
    for name, program, target in cases:
        for r in span_results(name, program, target):
            t.add_row(r.case, r.strategy, r.loop, r.splits, f"{r.max_span / 2**20:.1f}",
                      f"{r.time_us:.0f}", f"{r.traffic / 2**20:.1f}")
    return t


# --- tile-sized accumulators against whole ones -----------------------------------------------

def matmul_block(name: str, m: int, k: int, n: int, loops: list[tuple[int, str]],
                 dtype: str = "float16") -> Program:
    """``y[m,n] = x[m,k] @ w[k,n]`` in one loop group, ``loops`` (count, dim) outermost first."""
    doc = {"name": name, "tensors": {"x": {"shape": [m, k], "dtype": dtype},
                                     "w": {"shape": [k, n], "dtype": dtype}},
           "inputs": ["x", "w"], "outputs": ["y"],
           "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
           "tiling": [{"ops": ["mm"], "loops": [{"count": c, "dims": [d]} for c, d in loops]}]}
    return from_dict(doc)


def accumulator_cases(models_path: str | None = None) -> list[tuple[str, Program, Target]]:
    """Matmuls of the models file's MLPs (up and down projections at 2048 tokens) tiled over M
    then K, and one tiled over K only."""
    models = load_models(models_path)
    out = []
    for m_name in ("llama3-8b", "gpt2-small"):
        cfg = models["models"][m_name]
        h, f = cfg["hidden"], cfg["ffn"]
        for what, k, n in (("up", h, f), ("down", f, h)):
            out.append((f"{m_name}/{what} 2048x{k}x{n} M4 K4",
                        matmul_block(what, 2048, k, n, [(4, "m"), (4, "k")]), spyre(cores=32)))
    out.append(("512x4096x1024 K8", matmul_block("k8", 512, 4096, 1024, [(8, "k")]),
                spyre(cores=32)))
    return out


def accumulator_table(cases: list[tuple[str, Program, Target]]) -> Table:
    t = Table(title="accumulators: tile-sized at the loop tiling K (scratchpad when it fits) vs "
                    "a whole float32 accumulator in device memory", title_justify="left")
    for col in ("matmul", "accumulator", "scratchpad used / core", "whole acc MiB moved",
                "tile-sized MiB moved", "saved MiB"):
        t.add_column(col, justify="left" if col in ("matmul", "accumulator") else "right")
    for name, program, target in cases:
        result = plan(program, target)
        (traffic,) = accumulator_traffic(program, result, target).values()
        buf = result.buffer("y", "accumulator")
        where = f"{buf.space} {'x'.join(map(str, buf.shape))} {buf.dtype or 'same'}"
        t.add_row(name, where, f"{scratchpad_used(result) / 1024:.1f} KiB",
                  f"{traffic.full_size / 2**20:.1f}", f"{traffic.tiled / 2**20:.1f}",
                  f"{traffic.saved / 2**20:.1f}")
    return t


def _suite(args: argparse.Namespace, console: Console) -> Outcome:
    cores = core_counts(args, [32])
    blocks = from_models(args.models, lambda: cases(models_path=args.models, limit=args.limit))
    results = run(cores, console=console, blocks=blocks)
    return Outcome([dataclasses.asdict(r) for r in results], goals(results))


SUITE = Suite("tiling", frozenset({"cores", "models"}),
              "coarse tiling: memory traffic, scratchpad fit and time, untiled vs tiled", _suite)
