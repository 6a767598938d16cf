"""The picture of the layers in docs/architecture.md is the import contracts of
pyproject.toml drawn: one box per layer of the ``layers`` contract, top to bottom, the
packages of a layer side by side, and the backends of the ``backends-independent`` contract
inside theirs, importing ``mlir`` below and never one another. When a contract changes, the
test prints the picture to paste."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _contract(contracts: list[dict], id_: str) -> dict:
    return next(c for c in contracts if c.get("id") == id_)


def picture() -> str:
    """The mermaid flowchart of the layers the contracts declare."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"]
    layers = [[n.strip() for n in entry.split("|")] for entry in
              _contract(contracts, "layers")["layers"]]
    backends = [m.rsplit(".", 1)[1] for m in
                _contract(contracts, "backends-independent")["modules"]]
    lines = ["```mermaid", "flowchart TD"]
    ids = []
    for k, names in enumerate(layers):
        node = f"L{k}"
        ids.append(node)
        if names == ["backends"]:
            lines.append(f'  subgraph {node}["backends: none imports another"]')
            lines.append("    direction LR")
            lines += [f"    {node}_{b}[{b}]" for b in backends]
            lines.append("  end")
        else:
            lines.append(f'  {node}["{" · ".join(names)}"]')
    lines += [f"  {a} --> {b}" for a, b in zip(ids, ids[1:], strict=False)]
    lines.append("```")
    return "\n".join(lines)


def test_the_architecture_doc_draws_the_layers_the_import_contracts_declare():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    drawn = re.search(r"```mermaid\nflowchart TD\n.*?```", doc, re.S)
    want = picture()
    assert drawn is not None and drawn.group(0) == want, (
        "docs/architecture.md's picture of the layers differs from pyproject.toml's "
        f"contracts; paste:\n{want}")
