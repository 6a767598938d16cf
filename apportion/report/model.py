"""The report of a PyTorch model's plan: where each op comes from in the model (``labels``,
``origins_doc``), how much of its ATen graph was lowered (``lowered_line``), its run-time sizes
(``sizes_line``) and the model report with its pictures (``print_model_plan``, what ``apportion
plan --torch`` prints).

>>> from apportion.frontend.torch_demo import mlp
>>> from apportion.frontend.torch_export import from_torch
>>> model, args = mlp()
>>> lowered_line(from_torch(model, args)).split(";")[0]
'ATen nodes: 9 lowered to non-fallback ops, 0 to fallbacks (none), 0 dropped'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from apportion.report.tables import moe_lines, print_model_report

if TYPE_CHECKING:
    from apportion.frontend.torch_program import TorchProgram
    from apportion.planned import PlannedProgram


def _origins(lowered: TorchProgram, ops: Sequence[str]) -> dict[str, Any]:
    """Op name -> its ``Origin`` (split-K's partial and combine ops take their op's)."""
    out = {}
    for name in ops:
        base = name.removesuffix(".partial").removesuffix(".combine")
        origin = lowered.origins.get(name) or lowered.origins.get(base)
        if origin is not None:
            out[name] = origin
    return out


def labels(lowered: TorchProgram, ops: Sequence[str]) -> dict[str, str]:
    """Op name -> where it comes from in the model."""
    return {name: str(o) for name, o in _origins(lowered, ops).items()}


def origins_doc(lowered: TorchProgram, ops: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Op name -> its origin as plan JSON carries it (``"origins"``)."""
    return {name: {k: v for k, v in dataclasses.asdict(o).items() if v is not None}
            for name, o in _origins(lowered, ops).items()}


def lowered_line(lowered: TorchProgram) -> str:
    """How much of the model's ATen graph was lowered: nodes lowered to non-fallback ops, to
    fallbacks, dropped and left out by ``--partial``, and weights with shapes only."""
    c = lowered.node_counts
    fallback = sorted({n.target for n in lowered.nodes if n.status == "fallback"})
    left = (f", {c['unsupported']} left out by --partial ("
            f"{', '.join(sorted({u.origin.target for u in lowered.unsupported}))})"
            if c["unsupported"] else "")
    weights = (f"; {len(lowered.shapes_only)} weights with shapes only (meta device)"
               if lowered.shapes_only else "")
    return (f"ATen nodes: {c['lowered']} lowered to non-fallback ops, {c['fallback']} to "
            f"fallbacks ({', '.join(fallback) or 'none'}), {c['dropped']} dropped{left}; "
            f"{lowered.lowered_share:.1%} lowered{weights}")


def sizes_line(lowered: TorchProgram) -> str:
    """The program's run-time sizes, their bounds, planning size and the inputs they size
    (empty for a static program): ``run-time sizes: seq in 2..64, planned at 64 (input_ids
    dim 1, attention_mask dim 1); run --param seq=N``."""
    program = lowered.program
    parts = []
    for sym in program.symbols:
        where = ", ".join(f"{n} dim {axis}" for n in lowered.user_inputs
                          for axis, s in program.tensor(n).symbols.items() if s == sym.name)
        top = "" if sym.max is None else str(sym.max)
        parts.append(f"{sym.name} in {sym.min}..{top}, planned at {sym.planning_size}"
                     + (f" ({where})" if where else ""))
    if not parts:
        return ""
    flags = " ".join(f"--param {s.name}=N" for s in program.symbols)
    return f"run-time sizes: {'; '.join(parts)}; run {flags}"


def print_model_plan(planned: PlannedProgram, lowered: TorchProgram, model: Any, fmt: str,
                     plot_dir: Path | None, console: Console) -> None:
    """The model report of ``planned``, the plan of ``lowered`` (from ``model``): op
    families, the least utilized ops with their PyTorch names, mixture-of-experts blocks, the
    share of ATen nodes lowered and the run-time sizes (``fmt`` ``json``: the plan JSON);
    ``plot_dir``: ``utilization.png`` and ``largest_op.png`` drawn there."""
    from apportion.frontend.torch_moe import moe_blocks, moe_parts

    if fmt == "json":
        print(planned.to_json())
    else:
        parts = moe_parts(lowered.origins, moe_blocks(model))
        print_model_report(planned.plan, planned.target,
                           labels(lowered, [o.name for o in planned.ops]), console,
                           lowered_line(lowered), planned.program,
                           moe_lines(planned.plan, planned.program, parts))
        line = sizes_line(lowered)
        if line:
            console.print(line, highlight=False)
    if plot_dir is not None:
        from apportion.report.plot import plot_op, plot_utilization
        from apportion.report.tables import op_work

        util = plot_utilization(planned.plan, plot_dir / "utilization.png")
        drawable = [o for o in planned.ops if planned.program.op(o.name).out.dims]
        largest = max(drawable, key=lambda o: op_work(o, planned.program))
        cores = plot_op(largest, planned.program.op(largest.name).out.dims,
                        plot_dir / "largest_op.png")
        console.print(f"wrote {util} and {cores} (op {largest.name})", highlight=False)
