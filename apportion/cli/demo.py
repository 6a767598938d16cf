"""``apportion demo``: a Llama-style model from ``transformers`` exported, planned for Spyre,
run and checked against PyTorch; ``--program``: the built-in program (no PyTorch needed), tiled
too."""

from __future__ import annotations

import argparse

from rich.console import Console

from apportion.errors import ApportionError, UsageError
from apportion.report.tables import print_checks
from apportion.target.presets import resolve

DEMO_MODEL = "apportion.frontend.torch_demo:tiny_llama"


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """A Llama-style model from ``transformers`` exported, planned for Spyre, run and checked
    against PyTorch; ``--program``: the built-in program (no PyTorch needed), tiled too."""
    if args.program:
        return _demo_program(args, console)
    from apportion.report.model import print_model_plan
    from apportion.report.tables import predicted_total_us
    from apportion.workflows.torch_model import check_model, load_model, plan_model

    try:
        tm = load_model(DEMO_MODEL)
    except ApportionError as e:
        if "No module named 'torch'" in str(e) or "No module named 'transformers'" in str(e):
            raise UsageError("the demo exports a PyTorch model: install the torch extra "
                             "(pip install -e '.[torch]'), or run apportion demo --program") \
                from None
        raise
    target = resolve("spyre", args.cores)
    console.print("model: a Llama-style decoder from Hugging Face transformers with random "
                  "weights (2 layers, hidden 256, 4 heads, 2 KV heads), 16 tokens, exported "
                  f"with torch.export and planned for spyre on {target.cores} cores",
                  highlight=False)
    planned = plan_model(tm, target, "balanced")
    print_model_plan(planned, tm.lowered, tm.model, "table", None, console)
    greedy = plan_model(tm, target, "greedy").plan
    console.print(f"greedy for comparison: mean utilization {greedy.mean_utilization:.1%}, "
                  f"predicted {predicted_total_us(greedy)[0]:.1f} us in all", highlight=False)
    return print_checks(check_model(tm, planned), "the planned model, run core slice by core "
                        "slice,", console, "the model run eagerly in PyTorch")


def _demo_program(args: argparse.Namespace, console: Console) -> int:
    from apportion.frontend.models import default_program, default_tiling
    from apportion.planned import plan
    from apportion.report.tables import group_lines, predicted_total_us, print_report, summary_line

    program = default_program()
    target = resolve("spyre", args.cores)
    console.print(f"program {program.name}: {len(program.ops)} ops "
                  "(RMS norm, gated MLP of llama3-8b at 128 tokens)")
    print_report(plan(program, target, "balanced").plan, target, console)
    greedy = plan(program, target, "greedy").plan
    console.print(f"greedy for comparison: mean utilization {greedy.mean_utilization:.1%}, "
                  f"predicted {predicted_total_us(greedy)[0]:.1f} us in all")
    tiled = plan(default_tiling(program), target, "balanced", auto_tile=True)
    console.print("\nthe norm and the MLP each as one loop group over tokens (auto-tiled):")
    for line in group_lines(tiled.plan):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(summary_line(tiled.plan), highlight=False)
    return print_checks(tiled.check(), "the tiled plan, run core by core and iteration by "
                        "iteration,", console)
