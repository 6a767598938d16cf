"""Program format v1 (JSON): parse into the IR and print back.

>>> p = loads(open("examples/mlp.json").read())          # doctest: +SKIP
>>> dumps(p) == dumps(loads(dumps(p)))                    # doctest: +SKIP
True
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from apportion.errors import ProgramError
from apportion.ir.dtypes import check_dtype
from apportion.ir.op import Access, Op
from apportion.ir.program import LoopLevel, Program, TensorType, TilingGroup

FORMAT = "apportion.program/1"
_OUT_DTYPE = {"argmax": "int64", "any": "bool"}


def load(path: str | Path) -> Program:
    """Read a program file."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ProgramError(f"cannot read program file {str(path)!r}: {e.strerror}") from None
    return loads(text, source=str(path))


def loads(text: str, source: str = "<string>") -> Program:
    """Parse program format v1 from a JSON string."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProgramError(f"{source}: not valid JSON: {e.msg} at line {e.lineno}") from None
    return from_dict(doc)


def _require(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise ProgramError(f"{where}: missing field {key!r}")
    if not isinstance(doc[key], kind):
        raise ProgramError(f"{where}: field {key!r} must be a {kind.__name__}")
    return doc[key]


def from_dict(doc: dict[str, Any]) -> Program:
    """Build a Program from the decoded JSON document."""
    if not isinstance(doc, dict):
        raise ProgramError("a program must be a JSON object")
    fmt = doc.get("format", FORMAT)
    if fmt != FORMAT:
        raise ProgramError(f"unsupported program format {fmt!r}; expected {FORMAT!r}")
    name = str(doc.get("name", "program"))
    tensors: dict[str, TensorType] = {}
    for tname, spec in _require(doc, "tensors", dict, "program").items():
        where = f"tensor {tname!r}"
        if not isinstance(spec, dict):
            raise ProgramError(f"{where}: entry must be an object with shape and dtype")
        shape = _require(spec, "shape", list, where)
        tensors[tname] = TensorType(tname, tuple(shape), _require(spec, "dtype", str, where))
    ops: list[Op] = []
    for i, od in enumerate(_require(doc, "ops", list, "program")):
        ops.append(_parse_op(od, i, tensors))
    tiling = tuple(_parse_group(g, ops) for g in doc.get("tiling", []))
    wd = doc.get("work_division", {})
    if not isinstance(wd, dict):
        raise ProgramError("work_division must map op names to {dim: splits}")
    pins = []
    for op_name, splits in wd.items():
        if not isinstance(splits, dict):
            raise ProgramError(f"work_division for op {op_name!r} must map dims to split counts")
        for d, n in splits.items():
            if isinstance(n, bool) or not isinstance(n, int):
                raise ProgramError(f"work_division for op {op_name!r}: split of dim {d!r} must be "
                                   f"an integer, got {n!r}")
        pins.append((op_name, tuple(splits.items())))
    return Program(
        name=name,
        tensors=tuple(tensors.values()),
        inputs=tuple(_require(doc, "inputs", list, "program")),
        outputs=tuple(_require(doc, "outputs", list, "program")),
        ops=tuple(ops),
        tiling=tiling,
        work_division=tuple(pins),
    )


def _parse_op(od: Any, i: int, tensors: dict[str, TensorType]) -> Op:
    if not isinstance(od, dict):
        raise ProgramError(f"ops[{i}] must be an object")
    name = str(od.get("name", f"op{i}"))
    where = f"op {name!r}"
    fn = _require(od, "op", str, where)
    out = Access.parse(_require(od, "out", str, where))
    ins = tuple(Access.parse(a) for a in _require(od, "ins", list, where))
    declared = od.get("dims", {})
    if not isinstance(declared, dict):
        raise ProgramError(f"{where}: dims must map letters to sizes")
    sizes: dict[str, int] = {}
    for d, n in declared.items():
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ProgramError(f"{where}: declared dim {d!r} must have a positive size, got {n!r}")
        sizes[d] = n
    for acc in ins:
        if acc.tensor not in tensors:
            raise ProgramError(f"{where}: tensor {acc.tensor!r} is neither an input nor produced "
                               "by an earlier op")
        _sizes_from(acc, tensors[acc.tensor], sizes, where)
    declared_out = tensors.get(out.tensor)
    if declared_out is not None:
        _sizes_from(out, declared_out, sizes, where)
    shape = []
    for e in out.index:
        d = e.single_dim
        if d is None:
            shape.append(1)
        elif d not in sizes:
            raise ProgramError(f"{where}: size of output dim {d!r} is unknown; declare it in "
                               "\"dims\" or index an input with it")
        else:
            shape.append(sizes[d])
    attrs = {k: str(v) for k, v in od.items() if k in ("fn", "dtype")}
    op = Op.build(name, fn, out, ins, sizes, attrs)
    dtype = inferred_dtype(op, tensors)
    if declared_out is None:
        tensors[out.tensor] = TensorType(out.tensor, tuple(shape), dtype)
    return op


def inferred_dtype(op: Op, tensors: dict[str, TensorType]) -> str:
    """The dtype an op's output gets when no tensor entry declares it."""
    dtype = op.attr("dtype") or _OUT_DTYPE.get(op.fn) or (
        tensors[op.ins[0].tensor].dtype if op.ins else "float32")
    return check_dtype(dtype, f"op {op.name!r}")


def _sizes_from(acc: Access, t: TensorType, sizes: dict[str, int], where: str) -> None:
    if len(acc.index) != t.rank:
        raise ProgramError(f"{where}: tensor {acc.tensor!r} has rank {t.rank} but is indexed with "
                           f"{len(acc.index)} indices")
    for axis, (e, size) in enumerate(zip(acc.index, t.shape, strict=True)):
        d = e.single_dim
        if d is None:
            continue
        if d in sizes and sizes[d] != size:
            raise ProgramError(f"{where}: dim {d!r} has size {sizes[d]} but indexes dim {axis} of "
                               f"tensor {acc.tensor!r} of size {size}")
        sizes[d] = size


def _parse_group(g: Any, ops: list[Op]) -> TilingGroup:
    if not isinstance(g, dict) or not isinstance(g.get("ops"), list) or not g["ops"]:
        raise ProgramError("each tiling group needs a non-empty \"ops\" list")
    names = tuple(str(o) for o in g["ops"])
    known = {o.name: o for o in ops}
    for n in names:
        if n not in known:
            raise ProgramError(f"tiling group {list(names)}: unknown op {n!r}")
    if "loops" in g:
        if not isinstance(g["loops"], list):
            raise ProgramError(f"tiling group {list(names)}: loops must be a list")
        levels = tuple(_parse_level(lv, names) for lv in g["loops"])
    else:
        if "count" not in g:
            raise ProgramError(f"tiling group {list(names)}: needs \"loops\" or \"count\"")
        dims = g.get("dims")
        if dims is None:  # flat form defaults to the dim indexing dim 0 of the first op's output
            first = known[names[0]].out.index
            d0 = first[0].single_dim if first else None
            if d0 is None:
                raise ProgramError(f"tiling group {list(names)}: op {names[0]!r} has no dim 0 to "
                                   "tile; give \"dims\"")
            dims = [d0]
        levels = (_parse_level({"count": g["count"], "dims": dims}, names),)
    return TilingGroup(names, levels)


def _parse_level(lv: Any, names: tuple[str, ...]) -> LoopLevel:
    if not isinstance(lv, dict) or "count" not in lv or not isinstance(lv.get("dims"), list):
        raise ProgramError(f"tiling group {list(names)}: each loop needs \"count\" and \"dims\"")
    return LoopLevel(lv["count"], tuple(str(d) for d in lv["dims"]))


def to_dict(p: Program) -> dict[str, Any]:
    """The JSON document of ``p``; ``from_dict(to_dict(p)) == p``."""
    implied = {o.out.tensor for o in p.ops
               if inferred_dtype(o, p.tensor_map) == p.tensor(o.out.tensor).dtype}
    tensors = {t.name: {"shape": list(t.shape), "dtype": t.dtype}
               for t in p.tensors if t.name not in implied}
    ops = []
    for o in p.ops:
        alone = {e.single_dim for a in o.ins for e in a.index if e.single_dim}
        od: dict[str, Any] = {"name": o.name, "op": o.fn, "out": str(o.out),
                              "ins": [str(a) for a in o.ins]}
        extra = {d: n for d, n in o.dims if d not in alone}
        if extra:
            od["dims"] = extra
        od.update(dict(o.attrs))
        ops.append(od)
    doc: dict[str, Any] = {"format": FORMAT, "name": p.name, "tensors": tensors,
                           "inputs": list(p.inputs), "outputs": list(p.outputs), "ops": ops}
    if p.tiling:
        doc["tiling"] = [{"ops": list(g.ops),
                          "loops": [{"count": lv.count, "dims": list(lv.dims)} for lv in g.loops]}
                         for g in p.tiling]
    if p.work_division:
        doc["work_division"] = {op: dict(s) for op, s in p.work_division}
    return doc


def dumps(p: Program, indent: int | None = 2) -> str:
    """Print ``p`` as program format v1."""
    return json.dumps(to_dict(p), indent=indent)
