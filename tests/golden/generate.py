"""Write the golden plans: every example and built-in model program, planned as the CLI does.

Run from the repository root: ``python tests/golden/generate.py``. The files were first written
before the op-kind registry refactor; ``tests/golden/test_golden_plans.py`` holds today's plans
against them, so a refactor that changes a plan shows up as a diff here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "plans"


def cases() -> list[tuple[str, object, str, int, bool]]:
    """(file stem, program, strategy, cores, auto_tile) of every golden plan."""
    sys.path.insert(0, str(ROOT))
    from apportion.frontend.json_format import load
    from apportion.frontend.models import (
        attention_ops,
        default_program,
        default_tiling,
        load_models,
        token_ops,
    )

    out = []
    for path in sorted((ROOT / "examples").glob("*.json")):
        prog = load(path)
        for strategy in ("balanced", "greedy"):
            for cores in (32, 8):
                out.append((f"{path.stem}-{strategy}-{cores}", prog, strategy, cores, False))
        if prog.tiling:
            out.append((f"{path.stem}-autotile-32", prog, "balanced", 32, True))
    default = default_program()
    for strategy in ("balanced", "greedy"):
        out.append((f"default-{strategy}-32", default, strategy, 32, False))
    out.append(("default-tiled-autotile-32", default_tiling(default), "balanced", 32, True))
    models = load_models()
    for name, cfg in models["models"].items():
        for tokens in (1, 128):
            for what, prog in token_ops(cfg, tokens, "float16") + attention_ops(
                    cfg, tokens, 2048, "float16"):
                out.append((f"model-{name}-{tokens}-{what}", prog, "balanced", 32, False))
    return out


def plan_json(prog, strategy: str, cores: int, auto_tile: bool) -> dict:
    """The plan's JSON document, or ``{"error": message}`` where planning refuses."""
    from apportion.errors import ApportionError
    from apportion.passes.pipeline import plan
    from apportion.plans.serialize import to_json
    from apportion.target.presets import spyre

    try:
        return json.loads(to_json(plan(prog, spyre(cores=cores), strategy, auto_tile=auto_tile)))
    except ApportionError as e:
        return {"error": str(e)}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for stem, prog, strategy, cores, auto in cases():
        doc = plan_json(prog, strategy, cores, auto)
        (OUT / f"{stem}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(cases())} golden plans to {OUT}")


if __name__ == "__main__":
    main()
