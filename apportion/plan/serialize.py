"""Plan format v1: ``to_json`` / ``from_json`` round-trip a Plan exactly."""

from __future__ import annotations

import json
from typing import Any

from apportion.errors import PlanningError
from apportion.plan.plan import LoopInfo, OpPlan, Plan

FORMAT = "apportion.plan/1"


def op_to_dict(o: OpPlan) -> dict[str, Any]:
    return {
        "name": o.name, "op": o.op, "kind": o.kind,
        "iteration_space": dict(o.iteration_space),
        "reduction_dims": list(o.reduction_dims), "stick_dims": list(o.stick_dims),
        "splits": dict(o.splits), "cores": o.cores, "utilization": o.utilization,
        "predicted_time_us": o.predicted_time_us, "span_bytes": dict(o.span_bytes),
        "loop": None if o.loop is None else {
            "group": list(o.loop.group), "count": list(o.loop.count),
            "tiled_dims": [list(t) for t in o.loop.tiled_dims]},
        "unit_elems": dict(o.unit_elems), "span_splits": dict(o.span_splits),
        "even": all(o.is_even(d) for d, _ in o.splits),
    }


def op_from_dict(d: dict[str, Any]) -> OpPlan:
    try:
        loop = d.get("loop")
        return OpPlan(
            name=d["name"], op=d["op"], kind=d["kind"],
            iteration_space=tuple(d["iteration_space"].items()),
            reduction_dims=tuple(d["reduction_dims"]), stick_dims=tuple(d["stick_dims"]),
            unit_elems=tuple(d.get("unit_elems", {k: 1 for k in d["iteration_space"]}).items()),
            splits=tuple(d["splits"].items()), utilization=d["utilization"],
            predicted_time_us=d["predicted_time_us"], span_bytes=tuple(d["span_bytes"].items()),
            loop=None if loop is None else LoopInfo(
                tuple(loop["group"]), tuple(loop["count"]),
                tuple(tuple(t) for t in loop["tiled_dims"])),
            span_splits=tuple(d.get("span_splits", {}).items()),
        )
    except (KeyError, AttributeError, TypeError) as e:
        raise PlanningError(f"malformed op in plan: {e!r}") from None


def to_dict(p: Plan) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": FORMAT, "program": p.program, "strategy": p.strategy,
        "target": {"name": p.target, "cores": p.cores},
        "ops": [op_to_dict(o) for o in p.ops],
    }
    for key, value in p.extras:
        doc[key] = value
    return doc


def from_dict(doc: dict[str, Any]) -> Plan:
    if doc.get("format") != FORMAT:
        raise PlanningError(f"unsupported plan format {doc.get('format')!r}; expected {FORMAT!r}")
    known = {"format", "program", "strategy", "target", "ops"}
    return Plan(
        program=doc.get("program", ""), target=doc["target"]["name"],
        cores=doc["target"]["cores"], strategy=doc.get("strategy", "balanced"),
        ops=tuple(op_from_dict(o) for o in doc["ops"]),
        extras=tuple((k, v) for k, v in doc.items() if k not in known),
    )


def to_json(p: Plan, indent: int | None = 2) -> str:
    """Plan format v1 text."""
    return json.dumps(to_dict(p), indent=indent)


def from_json(text: str) -> Plan:
    """Parse plan format v1; ``from_json(to_json(p)) == p``."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanningError(f"plan is not valid JSON: {e.msg} at line {e.lineno}") from None
    return from_dict(doc)
