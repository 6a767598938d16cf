"""`apportion bench scale`: how planning time grows with the size of the program.

Two tables, each planned with ``balanced`` on Spyre:

* **forward**: the whole forward pass of a model (``frontend/models.forward_program``,
  llama2-7b at 128 tokens by default) at 1, 8, 32 and 80 layers. Per row: layers, ops, ops
  planned and ops that took an identical op's plan (``Plan.reuse``), planning time, ops per
  second, and the time per op relative to the 8-layer row. Growth is linear when the time per
  op stays flat as layers are added (the fixed cost of planning each distinct op once makes
  the smallest rows dearer per op): the verdict line says so when the largest row's time per
  op is within ``LINEAR`` times the 8-layer row's.
* **group**: one loop group over tokens of 50, 100 and 200 ops (``group_program``: blocks of an
  RMS norm and a gated MLP with a residual add, each block's hidden size its own, so blocks
  differ), planned with group distribution, then auto-tiled against a 4 KiB scratchpad. Per
  row: the time of each and its ratio to the previous row's, next to the ratio of ops.

Times are wall-clock seconds of ``plan`` alone: the program is built first, and one small plan
runs before the first timed one so that imports are not counted.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from apportion.frontend.json_format import from_dict
from apportion.frontend.models import forward_program, load_models
from apportion.ir.program import Program
from apportion.passes.pipeline import plan
from apportion.target.presets import spyre

#: layer counts of the forward rows
LAYERS = (1, 8, 32, 80)
#: ops of the group rows
GROUP_OPS = (50, 100, 200)
#: the largest row's time per op may be this many times the 8-layer row's and still be linear
LINEAR = 1.5
#: the scratchpad of the group rows' auto-tiling, in bytes
SMALL_SCRATCHPAD = 4096


@dataclass(frozen=True)
class ScaleResult:
    """One row: what was planned, how many ops, planned vs reused, seconds."""

    suite: str  # "forward" or "group"
    case: str
    cores: int
    ops: int
    planned: int
    reused: int
    seconds: float
    auto_tile_seconds: float | None = None

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


def _timed(program: Program, cores: int, **kwargs: Any) -> tuple[float, Any]:
    target = kwargs.pop("target", None) or spyre(cores=cores)
    t0 = time.perf_counter()
    result = plan(program, target, "balanced", **kwargs)
    return time.perf_counter() - t0, result


def run_forward(model: str, layers: tuple[int, ...], tokens: int, cores: int,
                models: dict[str, Any] | None = None) -> list[ScaleResult]:
    """Plan ``model``'s forward program at each layer count; one row each."""
    rows = []
    for n in layers:
        program = forward_program(model, n, tokens, models=models)
        seconds, result = _timed(program, cores)
        reuse = result.reuse
        rows.append(ScaleResult("forward", f"{model} x{n} layers @{tokens}", cores,
                                len(program.ops), reuse.planned, reuse.reused, seconds))
    return rows


def run_groups(sizes: tuple[int, ...], cores: int) -> list[ScaleResult]:
    """Plan one loop group of each size in ``sizes``, then auto-tile it against a small
    scratchpad; one row each."""
    small = dataclasses.replace(spyre(cores=cores), scratchpad_bytes=SMALL_SCRATCHPAD)
    rows = []
    for n in sizes:
        program = group_program(n)
        seconds, result = _timed(program, cores)
        auto, _ = _timed(program, cores, target=small, auto_tile=True)
        rows.append(ScaleResult("group", f"{n}-op loop group", cores, n, result.reuse.planned,
                                result.reuse.reused, seconds, auto))
    return rows


def run(cores: list[int], model: str = "llama2-7b", tokens: int = 128,
        layers: tuple[int, ...] = LAYERS, groups: tuple[int, ...] = GROUP_OPS,
        models_path: str | None = None, console: Console | None = None) -> list[ScaleResult]:
    """Run the benchmark and print its tables; returns every row."""
    console = console or Console()
    models = load_models(models_path)
    plan(forward_program(model, 1, min(tokens, 16), models=models), spyre(cores=cores[0]))
    results: list[ScaleResult] = []
    for n in cores:
        forward = run_forward(model, layers, tokens, n, models)
        results += forward
        console.print(forward_table(forward))
        console.print(verdict(forward), highlight=False)
        if groups:
            grouped = run_groups(groups, n)
            results += grouped
            console.print(group_table(grouped))
    return results


def verdict(rows: list[ScaleResult]) -> str:
    """Whether the time per op stayed flat from the 8-layer row (or the second) to the last."""
    if len(rows) < 2:
        return "one row: no growth to judge"
    base = next((r for r in rows if r.case.split(" x")[-1].startswith("8 ")), rows[1])
    last = rows[-1]
    ratio = last.ms_per_op / base.ms_per_op
    word = "linear" if ratio <= LINEAR else "NOT linear"
    return (f"{word}: {last.ops} ops take {ratio:.2f}x the time per op of {base.ops} ops "
            f"({last.ms_per_op:.3f} vs {base.ms_per_op:.3f} ms/op; linear within {LINEAR}x)")


def forward_table(rows: list[ScaleResult]) -> Table:
    t = Table(title=f"planning time of the forward pass (balanced, {rows[0].cores} cores)",
              title_justify="left")
    for col in ("program", "ops", "planned / reused", "seconds", "ops/s", "ms/op"):
        t.add_column(col, justify="left" if col == "program" else "right")
    for r in rows:
        t.add_row(r.case, str(r.ops), f"{r.planned} / {r.reused}", f"{r.seconds:.3f}",
                  f"{r.ops_per_s:,.0f}", f"{r.ms_per_op:.3f}")
    return t


def group_table(rows: list[ScaleResult]) -> Table:
    t = Table(title=f"one loop group: group distribution, then auto-tiling against a "
                    f"{SMALL_SCRATCHPAD // 1024} KiB scratchpad ({rows[0].cores} cores)",
              title_justify="left")
    for col in ("group", "ops", "planned / reused", "seconds", "auto-tile seconds",
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
