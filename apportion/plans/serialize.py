"""Plan format v1: ``to_json`` / ``from_json`` round-trip a Plan exactly."""

from __future__ import annotations

import json
import math
from typing import Any

from apportion.errors import ApportionError, PlanningError
from apportion.ir import jsondoc
from apportion.plans.memory import Buffer, CombineOp, CopyOp, FinishOp, GroupPlan, InitOp
from apportion.plans.plan import LoopInfo, OpPlan, Plan, ReuseCounts, SplitK
from apportion.target.split_k import Case, SelectChain

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
            "tiled_dims": [list(t) for t in o.loop.tiled_dims],
            **({"tile_sizes": dict(o.loop.tile_sizes)} if o.loop.tile_sizes else {})},
        "unit_elems": dict(o.unit_elems), "span_splits": dict(o.span_splits),
        "even": all(o.is_even(d) for d, _ in o.splits),
        "split_k": None if o.split_k is None else {
            "dims": list(o.split_k.dims), "by": o.split_k.by,
            "factor": o.split_k.factor if o.split_k.select is None else
            select_to_dict(o.split_k.select, o.split_k.factor),
            **({"factors": list(o.split_k.factors)} if len(o.split_k.dims) > 1 else {})},
    }


def select_to_dict(chain: SelectChain, planned: int) -> dict[str, Any]:
    """A select chain as plan format v1 writes a run-time ``factor``: the cases in order
    (``if``: bounds and multiple of the size), the default, and the choice at the planning
    size."""
    return {"size": chain.size,
            "select": [{"if": {k: v for k, v in (("min", c.lo), ("max", c.hi),
                                                 ("multiple", c.multiple))
                               if v is not None and (k, v) != ("multiple", 1)},
                        "factor": c.factor} for c in chain.cases],
            "default": chain.default, "planned": planned}


def select_from_dict(d: dict[str, Any]) -> tuple[SelectChain, int]:
    cases = tuple(Case(c["factor"], c["if"].get("min"), c["if"].get("max"),
                       c["if"].get("multiple", 1)) for c in d["select"])
    return SelectChain(d["size"], cases, d["default"]), d["planned"]


def _split_k_from_dict(d: dict[str, Any]) -> SplitK:
    factor = d["factor"]
    if isinstance(factor, dict):
        chain, planned = select_from_dict(factor)
        return SplitK(tuple(d["dims"]), planned, d["by"], chain)
    return SplitK(tuple(d["dims"]), factor, d["by"], factors=tuple(d.get("factors", ())))


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
                tuple(tuple(t) for t in loop["tiled_dims"]),
                tuple(loop.get("tile_sizes", {}).items())),
            span_splits=tuple(d.get("span_splits", {}).items()),
            split_k=None if d.get("split_k") is None else _split_k_from_dict(d["split_k"]),
        )
    except (KeyError, AttributeError, TypeError, ValueError, ApportionError) as e:
        raise PlanningError(f"malformed op in plan: {e!r}") from None


def to_dict(p: Plan) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": FORMAT, "program": p.program, "strategy": p.strategy,
        "target": {"name": p.target, "cores": p.cores},
        "ops": [op_to_dict(o) for o in p.ops],
    }
    if p.groups:
        doc["groups"] = [group_to_dict(g) for g in p.groups]
    if p.buffers:
        doc["buffers"] = [buffer_to_dict(b) for b in p.buffers]
    if p.symbols:  # the sizes a program with run-time sizes was planned at
        doc["symbols"] = dict(p.symbols)
    if p.reuse is not None:  # optional: how the plan was made (ops planned vs reused)
        doc["reuse"] = {"planned": p.reuse.planned, "reused": p.reuse.reused}
    for key, value in p.extras:
        doc[key] = value
    return doc


def from_dict(doc: dict[str, Any]) -> Plan:
    if not isinstance(doc, dict):
        raise PlanningError(f"a plan must be a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise PlanningError(f"unsupported plan format {doc.get('format')!r}; expected {FORMAT!r}")
    target = doc.get("target")
    if not isinstance(target, dict) or not isinstance(target.get("name"), str) or isinstance(
            target.get("cores"), bool) or not isinstance(target.get("cores"), int):
        raise PlanningError("plan has no target: field 'target' must be "
                            "{\"name\": ..., \"cores\": ...} naming what it was planned for")
    if not isinstance(doc.get("ops"), list):
        raise PlanningError("plan has no field 'ops' (a list of op plans)")
    # the strategy's name, as the planner records it (``balanced``, ``greedy``, ...); plans
    # written before the field existed were balanced
    strategy = doc.get("strategy", "balanced")
    if not isinstance(strategy, str) or not strategy:
        raise PlanningError(f"malformed 'strategy' in plan: {strategy!r}; expected the name of "
                            "the strategy it was planned under (e.g. \"balanced\")")
    known = {"format", "program", "strategy", "target", "ops", "groups", "buffers", "reuse",
             "symbols"}
    symbols = doc.get("symbols", {})
    if not isinstance(symbols, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
            for k, v in symbols.items()):
        raise PlanningError(f"malformed 'symbols' in plan: {symbols!r}; expected "
                            "{\"K\": planning size}")
    try:
        groups = tuple(group_from_dict(g) for g in doc.get("groups", []))
        buffers = tuple(buffer_from_dict(b) for b in doc.get("buffers", []))
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        raise PlanningError(f"malformed loop group or buffer in plan: {e!r}") from None
    reuse = None
    if "reuse" in doc:
        r = doc["reuse"]
        counts = [r.get(k) for k in ("planned", "reused")] if isinstance(r, dict) else []
        if len(counts) != 2 or not all(isinstance(c, int) and not isinstance(c, bool)
                                       and c >= 0 for c in counts):
            raise PlanningError(f"malformed 'reuse' in plan: {r!r}; expected "
                                "{\"planned\": n, \"reused\": n}")
        reuse = ReuseCounts(*counts)
    return Plan(
        program=doc.get("program", ""), target=target["name"], cores=target["cores"],
        strategy=strategy,
        ops=tuple(op_from_dict(o) for o in doc["ops"]),
        extras=tuple((k, v) for k, v in doc.items() if k not in known),
        groups=groups, buffers=buffers, reuse=reuse, symbols=tuple(symbols.items()),
    )


def _number(x: float) -> float | str:
    # JSON has no infinities: the identities of max and min are written "inf" and "-inf".
    return x if math.isfinite(x) else str(x)


def group_to_dict(g: GroupPlan) -> dict[str, Any]:
    doc = {
        "group": list(g.path), "ops": list(g.ops), "count": list(g.counts),
        "tiled_dims": [list(t) for t in g.tiled_dims],
        "working_set_bytes": g.working_set_bytes, "capacity": g.capacity,
        "lx_tensors": list(g.lx_tensors), "hbm_tiles": list(g.hbm_tiles),
        "saved_bytes": g.saved_bytes, "iteration_time_us": g.iteration_time_us,
        "inits": [{"op": i.op, "tensor": i.tensor, "fn": i.fn, "identity": _number(i.identity),
                   "level": i.level} for i in g.inits],
        "combines": [{"op": c.op, "tensor": c.tensor, "fn": c.fn} for c in g.combines],
        "copies": [{"op": c.op, "tensor": c.tensor} for c in g.copies],
        "finishes": [{"op": f.op, "tensor": f.tensor, "fn": f.fn, "count": f.count,
                      "level": f.level} for f in g.finishes],
    }
    if g.added:  # a loop the planner added (``"span"``: no split fits the span limit)
        doc["added"] = g.added
    if g.symbolic:  # each symbolic count's bounds and the value its tiles were planned at
        doc["symbolic"] = [{"count": n, "min": lo, "max": hi, "planned": v}
                           for n, lo, hi, v in g.symbolic]
    return doc


def group_from_dict(d: dict[str, Any]) -> GroupPlan:
    path = tuple(d["group"])
    return GroupPlan(
        path=path, ops=tuple(d["ops"]), counts=tuple(d["count"]),
        tiled_dims=tuple(tuple(t) for t in d["tiled_dims"]),
        working_set_bytes=d["working_set_bytes"], capacity=d["capacity"],
        lx_tensors=tuple(d.get("lx_tensors", [])), hbm_tiles=tuple(d.get("hbm_tiles", [])),
        saved_bytes=d.get("saved_bytes", 0),
        iteration_time_us=d.get("iteration_time_us", 0.0),
        inits=tuple(InitOp(path, i["op"], i["tensor"], i["fn"], float(i["identity"]), i["level"])
                    for i in d.get("inits", [])),
        combines=tuple(CombineOp(path, c["op"], c["tensor"], c["fn"])
                       for c in d.get("combines", [])),
        copies=tuple(CopyOp(path, c["op"], c["tensor"]) for c in d.get("copies", [])),
        finishes=tuple(FinishOp(path, f["op"], f["tensor"], f["fn"], f["count"],
                                f.get("level", 0)) for f in d.get("finishes", [])),
        added=d.get("added", ""),
        symbolic=tuple((c["count"], c["min"], c["max"], c["planned"])
                       for c in d.get("symbolic", [])),
    )


def buffer_to_dict(b: Buffer) -> dict[str, Any]:
    d = {"tensor": b.tensor, "kind": b.kind, "space": b.space, "offset": b.offset,
         "nbytes": b.nbytes, "shape": list(b.shape), "group": list(b.group)}
    if b.dtype:
        d["dtype"] = b.dtype
    return d


def buffer_from_dict(d: dict[str, Any]) -> Buffer:
    return Buffer(d["tensor"], d["kind"], d["space"], d["offset"], d["nbytes"],
                  tuple(d["shape"]), tuple(d.get("group", [])), d.get("dtype", ""))


def to_json(p: Plan, indent: int | None = 2) -> str:
    """Plan format v1 text."""
    return json.dumps(to_dict(p), indent=indent)


def from_json(text: str) -> Plan:
    """Parse plan format v1; ``from_json(to_json(p)) == p``."""
    try:
        doc = jsondoc.loads(text, PlanningError, "plan")
    except json.JSONDecodeError as e:
        raise PlanningError(f"plan is not valid JSON: {e.msg} at line {e.lineno}") from None
    return from_dict(doc)
