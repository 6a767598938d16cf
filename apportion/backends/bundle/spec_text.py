"""LoopSpec programs as Python source and as JSON, both re-loading to equal values.

``from_source`` reads only calls of ``LoopSpec``, ``OpSpec`` and ``TensorArg`` with literal
arguments (numbers, strings, booleans, lists, tuples, dicts): it walks the syntax tree and never
evaluates the text.

>>> from apportion.schedule.loopspec_values import LoopSpec
>>> specs = (LoopSpec(count="N", body=[]),)
>>> from_source(to_source(specs)) == specs, from_json(to_json(specs)) == specs
(True, True)
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from typing import Any

from apportion.errors import EmitError
from apportion.ir import jsondoc
from apportion.schedule.loopspec_values import (
    LOOP_SPEC_FIELDS,
    OP_SPEC_FIELDS,
    TENSOR_ARG_FIELDS,
    LoopSpec,
    OpSpec,
    Spec,
    SpecProgram,
    TensorArg,
    call_text,
)

FORMAT = "apportion.loopspec/1"
_CLASSES: dict[str, tuple[type, tuple[str, ...]]] = {
    "LoopSpec": (LoopSpec, LOOP_SPEC_FIELDS),
    "OpSpec": (OpSpec, OP_SPEC_FIELDS),
    "TensorArg": (TensorArg, TENSOR_ARG_FIELDS),
}


def _specs(specs: Spec | Iterable[Spec]) -> tuple[Spec, ...]:
    return (specs,) if isinstance(specs, LoopSpec | OpSpec) else tuple(specs)


# --- Python source ---------------------------------------------------------------------------

def to_source(specs: Spec | Iterable[Spec], indent: int = 4) -> str:
    """The specs as an indented Python list literal of constructor calls."""
    lines = ["["]
    for s in _specs(specs):
        lines += _spec_lines(s, 1, indent)
    lines.append("]")
    return "\n".join(lines) + "\n"


def _spec_lines(s: Spec, level: int, indent: int) -> list[str]:
    pad, inner = " " * (indent * level), " " * (indent * (level + 1))
    if isinstance(s, LoopSpec):
        lines = [f"{pad}LoopSpec(count={s.count!r}, body=["]
        for b in s.body:
            lines += _spec_lines(b, level + 1, indent)
        return [*lines, f"{pad}]),"]
    head = ", ".join(f"{n}={getattr(s, n)!r}" for n in OP_SPEC_FIELDS if n != "args")
    lines = [f"{pad}OpSpec({head}, args=["]
    lines += [f"{inner}{call_text(a, TENSOR_ARG_FIELDS)}," for a in s.args]
    return [*lines, f"{pad}]),"]


def from_source(text: str) -> SpecProgram:
    """Parse what ``to_source`` printed: one spec, or a list or tuple of them."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise EmitError(f"loopspec source does not parse: {e.msg} at line {e.lineno}") from None
    value = _literal(tree.body)
    if isinstance(value, LoopSpec | OpSpec):
        return SpecProgram((value,))
    if isinstance(value, list | tuple) and all(isinstance(v, LoopSpec | OpSpec) for v in value):
        return SpecProgram(value)
    raise EmitError("loopspec source must be a LoopSpec, an OpSpec, or a list of them")


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | str | bool | type(None)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _literal(node.operand)
        if isinstance(v, int) and not isinstance(v, bool):
            return -v
    if isinstance(node, ast.List | ast.Tuple):
        items = [_literal(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in _CLASSES:
        cls, names = _CLASSES[node.func.id]
        if len(node.args) > len(names):
            raise EmitError(f"{node.func.id} takes at most {len(names)} arguments")
        kwargs = dict(zip(names, (_literal(a) for a in node.args), strict=False))
        for kw in node.keywords:
            if kw.arg not in names or kw.arg in kwargs:
                raise EmitError(f"{node.func.id}: unexpected or repeated argument {kw.arg!r}; "
                                f"valid: {', '.join(names)}")
            kwargs[kw.arg] = _literal(kw.value)
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise EmitError(f"{node.func.id}: {e}") from None
    raise EmitError(f"loopspec source may hold only literals and LoopSpec/OpSpec/TensorArg "
                    f"calls, not {ast.unparse(node)!r}")


# --- JSON ------------------------------------------------------------------------------------

def to_dict(s: Spec | TensorArg) -> dict[str, Any]:
    """One spec as a JSON-ready dict tagged with its ``kind``."""
    if isinstance(s, LoopSpec):
        return {"kind": "loop", "count": s.count, "body": [to_dict(b) for b in s.body]}
    if isinstance(s, OpSpec):
        return {"kind": "op", "name": s.name, "op": s.op, "is_reduction": s.is_reduction,
                "iteration_space": {d: list(v) for d, v in s.iteration_space.items()},
                "tiled_symbols": list(s.tiled_symbols), "args": [to_dict(a) for a in s.args]}
    return {n: (dict(v) if n == "allocation" else list(v) if isinstance(v, tuple) else v)
            for n in TENSOR_ARG_FIELDS for v in [getattr(s, n)]}


def from_dict(d: Any) -> Spec:
    """Inverse of ``to_dict`` for a LoopSpec or an OpSpec."""
    try:
        if d["kind"] == "loop":
            return LoopSpec(d["count"], tuple(from_dict(b) for b in d["body"]))
        if d["kind"] == "op":
            args = tuple(TensorArg(**{n: a[n] for n in TENSOR_ARG_FIELDS if n in a})
                         for a in d["args"])
            return OpSpec(d["op"], d["is_reduction"], d["iteration_space"], args,
                          d.get("tiled_symbols", ()), d.get("name", ""))
    except (KeyError, TypeError, AttributeError) as e:
        raise EmitError(f"malformed loopspec JSON entry: {e!r}") from None
    raise EmitError(f"loopspec JSON entry has kind {d.get('kind')!r}; valid: loop, op")


def to_json(specs: Spec | Iterable[Spec], indent: int | None = 2) -> str:
    """``{"format": "apportion.loopspec/1", "body": [...]}``."""
    return json.dumps({"format": FORMAT, "body": [to_dict(s) for s in _specs(specs)]},
                      indent=indent)


def from_json(text: str) -> SpecProgram:
    """Parse what ``to_json`` printed."""
    try:
        doc = jsondoc.loads(text, EmitError, "loopspec")
    except json.JSONDecodeError as e:
        raise EmitError(f"loopspec is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise EmitError(f"unsupported loopspec format; expected {FORMAT!r}")
    return SpecProgram(from_dict(d) for d in doc.get("body", []))
