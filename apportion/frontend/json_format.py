"""Program format v1 (JSON): parse into the IR and print back.

The optional ``split_k`` object pins how ops' reductions are split (pass ``split_k``): per op
name, a slice count of the op's widest reduction dim (``{"mm": 8}``), ``"?"`` (the target's
resolver decides), a tile size of that dim in elements (``{"mm": {"tile": 512}}``), or slices
or tile sizes per reduction dim (``{"conv": {"slices": {"c": 4, "kh": 3}}}``, ``{"conv":
{"tile": {"c": 64}}}``). The dims must be the op's reduction dims; a tile must divide its dim.

>>> p = loads(open("examples/mlp.json").read())          # doctest: +SKIP
>>> dumps(p) == dumps(loads(dumps(p)))                    # doctest: +SKIP
True
"""

from __future__ import annotations

import difflib
import json
import math
import os
import reprlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from apportion.errors import ProgramError
from apportion.ir import jsondoc
from apportion.ir.kinds import KINDS
from apportion.ir.op import Access, Op
from apportion.ir.program import (
    SPLIT_K_AUTO,
    LoopLevel,
    Program,
    SplitKPin,
    Symbol,
    TensorType,
    TilingGroup,
)

FORMAT = "apportion.program/1"
#: the fields each object of a program document may have; any other key is an error
#: "shardings" (tensor -> per dim the mesh axes splitting it) is read beside the program by
#: ``apportion.sharding.spec.load``; ``from_dict`` accepts and ignores it, ``to_dict`` omits it
PROGRAM_FIELDS = ("format", "name", "tensors", "inputs", "outputs", "ops", "tiling",
                  "work_division", "split_k", "symbols", "shardings")
SYMBOL_FIELDS = ("min", "max")
TENSOR_FIELDS = ("shape", "dtype")
GROUP_FIELDS = ("ops", "loops", "count", "dims", "depths")
LOOP_FIELDS = ("count", "dims", "min", "max")
# a tensor name as the builder allows it: what an access string can spell before its "["
_NAME_CHARS_OUT = frozenset("[],")
_ACCESS_LIKE = 'an access string like "x[m,k]"'


def load(path: str | Path) -> Program:
    """Read a program file (UTF-8 JSON)."""
    if not isinstance(path, str | os.PathLike):
        raise ProgramError(f"ap.load: path must be a str or a path (a program file), got "
                           f"{type(path).__name__} {reprlib.repr(path)}")
    where = f"cannot read program file {str(path)!r}"
    try:
        p = Path(path)
        if p.is_dir():
            raise ProgramError(f"{where}: it is a directory")
        data = p.read_bytes()
    except OSError as e:
        raise ProgramError(f"{where}: {e.strerror or e}") from None
    except ValueError as e:  # e.g. an embedded NUL byte in the path
        raise ProgramError(f"{where}: {e}") from None
    try:
        text = data.decode("utf-8-sig")  # a leading byte-order mark is harmless; accept it
    except UnicodeDecodeError as e:
        raise ProgramError(f"{where}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                           f"{e.start})") from None
    return loads(text, source=str(path))


def loads(text: str | bytes, source: str = "<string>") -> Program:
    """Parse program format v1 from a JSON string."""
    try:
        doc = jsondoc.loads(text, ProgramError, source)
    except json.JSONDecodeError as e:
        raise ProgramError(f"{source}: not valid JSON: {e.msg} at line {e.lineno}") from None
    except UnicodeDecodeError:  # bytes given, and not UTF-8
        raise ProgramError(f"{source}: not UTF-8 text") from None
    except ValueError:  # an integer literal past Python's int-to-str digit limit
        raise ProgramError(f"{source}: not valid JSON: a number has more than "
                           f"{sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        raise ProgramError(f"{source}: not valid JSON: arrays or objects nested too deeply"
                           ) from None
    return from_dict(doc)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 48, 48
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = 4


def _show(value: Any) -> str:
    """``value`` for a one-line error message, short whatever its size or depth."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # the JSON spelling: null, true, false
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"  # repr of a huge int may raise
    try:
        return _REPR.repr(value)
    except Exception:  # a foreign object handed to from_dict whose repr fails
        return f"a {type(value).__name__}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not 1


def _is_positive_int(v: Any) -> bool:
    return _is_int(v) and v > 0


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_tensor_name(v: Any) -> bool:
    return (isinstance(v, str) and v != ""
            and not any(c in _NAME_CHARS_OUT or c.isspace() for c in v))


def _is_dim_name(v: Any) -> bool:
    # what an index expression can spell (see AffineExpr.parse)
    return (isinstance(v, str) and v.isascii() and v.isidentifier())


def _closest(key: str, valid: tuple[str, ...]) -> str | None:
    """The valid field ``key`` most likely misspells; on a tie, the one sharing its start."""
    close = difflib.get_close_matches(key, valid, n=len(valid))
    if not close:
        return None

    def ratio(c: str) -> float:
        return difflib.SequenceMatcher(None, c, key).ratio()

    tied = [c for c in close if ratio(c) == ratio(close[0])]
    return max(tied, key=lambda c: len(os.path.commonprefix([key, c])))


def _check_fields(doc: dict[Any, Any], valid: tuple[str, ...], where: str) -> None:
    """Refuse keys outside ``valid``: a misspelt field would otherwise be silently ignored."""
    for key in doc:
        if key in valid:
            continue
        close = _closest(key, valid) if isinstance(key, str) else None
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ProgramError(f"{where}: unknown field {_show(key)}{hint}; valid: {', '.join(valid)}")


def _object(value: Any, what: str, where: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ProgramError(f"{where} must be {what}, got {_show(value)}")
    return value


def _require(doc: dict[str, Any], key: str, ok: Callable[[Any], bool], what: str,
             where: str, default: Any = ...) -> Any:
    """``doc[key]`` if ``ok`` accepts it; ``what`` says what is allowed. ``...``: required."""
    if key not in doc:
        if default is ...:
            raise ProgramError(f"{where}: missing field {key!r} ({what})")
        return default
    if not ok(doc[key]):
        raise ProgramError(f"{where}: field {key!r} must be {what}, got {_show(doc[key])}")
    return doc[key]


def _require_list(doc: dict[str, Any], key: str, ok: Callable[[Any], bool], what: str,
                  item: str, where: str, default: Any = ...) -> list[Any]:
    """``doc[key]``, a list (``what``) whose every item ``ok`` accepts (``item``)."""
    items = _require(doc, key, lambda v: isinstance(v, list), what, where, default)
    for i, v in enumerate(items):
        if not ok(v):
            raise ProgramError(f"{where}: field {key!r} item {i} must be {item}, got {_show(v)}")
    return items


def _mapping(doc: dict[str, Any], key: str, ok_key: Callable[[Any], bool],
             ok_value: Callable[[Any], bool], what: str, where: str) -> dict[Any, Any]:
    """``doc[key]``, an object (``{}`` when absent) whose keys and values are checked."""
    value = _require(doc, key, lambda v: isinstance(v, dict), what, where, {})
    for k, v in value.items():
        if not ok_key(k) or not ok_value(v):
            raise ProgramError(f"{where}: field {key!r} must be {what}, got {_show(k)}: "
                               f"{_show(v)}")
    return value


def _access(text: str, where: str, field: str) -> Access:
    try:
        return Access.parse(text)
    except ProgramError as e:  # add the op and field; Access.parse knows neither
        raise ProgramError(f"{where}: field {field}: {e}") from None


def from_dict(doc: Any) -> Program:
    """Build a Program from the decoded JSON document."""
    doc = _object(doc, "a JSON object", "a program")
    _check_fields(doc, PROGRAM_FIELDS, "program")
    fmt = doc.get("format", FORMAT)
    if fmt != FORMAT:
        raise ProgramError(f"unsupported program format {_show(fmt)}; expected {FORMAT!r}")
    name = _require(doc, "name", _is_str, "a string", "program", "program")
    symbols = _symbols(doc)
    tensors: dict[str, TensorType] = {}
    entries = _require(doc, "tensors", lambda v: isinstance(v, dict),
                       "an object mapping tensor names to {\"shape\": [...], \"dtype\": ...}",
                       "program")
    for tname, spec in entries.items():
        if not _is_tensor_name(tname):
            raise ProgramError(f"program: tensor name {_show(tname)} must be a non-empty string "
                               "without spaces, brackets or commas")
        where = f"tensor {tname!r}"
        spec = _object(spec, 'an object like {"shape": [4, 8], "dtype": "float16"}', where)
        _check_fields(spec, TENSOR_FIELDS, where)
        shape = _require_list(spec, "shape", lambda v: _is_positive_int(v) or _is_symbol(v),
                              'a list of positive ints or symbol names like "K" ([] for a '
                              "rank-0 tensor)", 'a positive int or a symbol name like "K"', where)
        dtype = _require(spec, "dtype", _is_str, 'a dtype name like "float16"', where)
        dynamic = tuple((i, v) for i, v in enumerate(shape) if isinstance(v, str))
        for _, sym in dynamic:
            symbols.setdefault(sym, Symbol(sym))
        sizes = tuple(symbols[v].planning_size if isinstance(v, str) else v for v in shape)
        tensors[tname] = TensorType(tname, sizes, dtype, dynamic=dynamic)
    inputs = _require_list(doc, "inputs", _is_str, "a list of tensor names (strings)",
                           "a tensor name (a string)", "program")
    outputs = _require_list(doc, "outputs", _is_str, "a list of tensor names (strings)",
                            "a tensor name (a string)", "program")
    ops: list[Op] = []
    for i, od in enumerate(_require(doc, "ops", lambda v: isinstance(v, list),
                                    "a list of op objects", "program")):
        ops.append(_parse_op(od, i, tensors))
    groups = _require(doc, "tiling", lambda v: isinstance(v, list),
                      "a list of tiling groups ({\"ops\": [...], \"loops\": [...]})", "program",
                      [])
    tiling = tuple(_parse_group(g, i, ops) for i, g in enumerate(groups))
    wd = _mapping(doc, "work_division", _is_str, lambda v: isinstance(v, dict),
                  "an object mapping op names to {dim: splits}", "program")
    pins = []
    for op_name, splits in wd.items():
        where = f"work_division for op {op_name!r}"
        for d, n in splits.items():
            if not _is_str(d) or not _is_int(n):
                raise ProgramError(f"{where}: split of dim {_show(d)} must be an integer, "
                                   f"got {_show(n)}")
        pins.append((op_name, tuple(splits.items())))
    split_k = {op_name: _split_k_pin(v) for op_name, v in _mapping(
        doc, "split_k", _is_str, _is_split_k_pin,
        "an object mapping op names to slices of their reduction, \"?\" (the target decides), "
        "{\"tile\": n} or {\"slices\"|\"tile\": {dim: n}}", "program").items()}
    return Program(
        name=name,
        tensors=tuple(tensors.values()),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        ops=tuple(ops),
        tiling=tiling,
        work_division=tuple(pins),
        split_k=tuple(split_k.items()),
        symbols=tuple(symbols.values()),
    )


def _is_split_k_pin(v: Any) -> bool:
    """A split-K pin: slices (an int), "?", ``{"tile": n}`` or ``{"slices"|"tile": {dim: n}}``
    (the ints are checked with the op, by ``Program``)."""
    if _is_int(v) or v == SPLIT_K_AUTO:
        return True
    if not isinstance(v, dict) or len(v) != 1 or next(iter(v)) not in ("slices", "tile"):
        return False
    (key, inner), = v.items()
    if key == "tile" and _is_int(inner):
        return True
    return isinstance(inner, dict) and bool(inner) and all(
        _is_str(d) and _is_int(n) for d, n in inner.items())


def _split_k_pin(v: Any) -> int | str | SplitKPin:
    if not isinstance(v, dict):
        return v
    (key, inner), = v.items()
    given = (("", inner),) if not isinstance(inner, dict) else tuple(inner.items())
    return SplitKPin(tiles=given) if key == "tile" else SplitKPin(slices=given)


def _is_symbol(v: Any) -> bool:
    return isinstance(v, str) and v.isidentifier()


def _symbols(doc: dict[str, Any]) -> dict[str, Symbol]:
    """The ``symbols`` object: ``{"K": {"max": 1048576}}``; shapes may name others, unbounded."""
    entries = _mapping(doc, "symbols", _is_symbol, lambda v: isinstance(v, dict),
                       'an object mapping symbol names to bounds like {"max": 4096}', "program")
    out = {}
    for sym, spec in entries.items():
        where = f"symbol {sym!r}"
        _check_fields(spec, SYMBOL_FIELDS, where)
        lo = _require(spec, "min", _is_positive_int, "a positive int", where, 1)
        hi = _require(spec, "max", _is_positive_int, "a positive int", where, None)
        out[sym] = Symbol(sym, hi, lo)
    return out


def _parse_op(od: Any, i: int, tensors: dict[str, TensorType]) -> Op:
    od = _object(od, f"an object with fields {', '.join(OP_FIELDS)}", f"ops[{i}]")
    name = _require(od, "name", _is_str, "a string", f"ops[{i}]", f"op{i}")
    where = f"op {name!r}"
    _check_fields(od, OP_FIELDS, where)
    fn = _require(od, "op", _is_str, 'an op kind like "matmul"', where)
    out = _access(_require(od, "out", _is_str, _ACCESS_LIKE, where), where, "'out'")
    ins = tuple(_access(a, where, f"'ins' item {j}") for j, a in enumerate(
        _require_list(od, "ins", _is_str, 'a list of access strings like "x[m,k]"',
                      _ACCESS_LIKE, where)))
    declared = _mapping(od, "dims", _is_dim_name, _is_positive_int,
                        'an object mapping dim names to positive sizes like {"k": 128}', where)
    sizes: dict[str, int] = dict(declared)
    for acc in ins:
        if acc.tensor not in tensors:
            raise ProgramError(f"{where}: tensor {acc.tensor!r} is neither an input nor produced "
                               "by an earlier op")
        _sizes_from(acc, tensors[acc.tensor], sizes, where, declared)
    declared_out = tensors.get(out.tensor)
    if declared_out is not None:
        _sizes_from(out, declared_out, sizes, where)
    # an output dim indexed by a symbolic input dim takes its symbol
    dim_symbol = {e.single_dim: tensors[a.tensor].symbols[i] for a in ins
                  for i, e in enumerate(a.index)
                  if e.single_dim is not None and i in tensors[a.tensor].symbols}
    dynamic = tuple((i, dim_symbol[e.single_dim]) for i, e in enumerate(out.index)
                    if e.single_dim in dim_symbol)
    shape = []
    for e in out.index:
        d = e.single_dim
        unknown = [x for x in e.dims if x not in sizes]
        if d is None and unknown:
            raise ProgramError(f"{where}: size of output dim {unknown[0]!r} is unknown; declare "
                               "it in \"dims\" or index an input with it")
        if d is None:  # a literal 0: one element; a merge 64*h+d: every index it reaches
            shape.append(e.max_value(sizes) + 1)
        elif d not in sizes:
            raise ProgramError(f"{where}: size of output dim {d!r} is unknown; declare it in "
                               "\"dims\" or index an input with it")
        else:
            shape.append(sizes[d])
    try:
        op = Op.build(name, fn, out, ins, sizes, _attrs(od, where))
    except ProgramError as e:  # some IR checks (an unknown op kind) do not name the op
        if str(e).startswith(where):
            raise
        raise ProgramError(f"{where}: {e}") from None
    dtype = inferred_dtype(op, tensors)
    if declared_out is None:
        tensors[out.tensor] = TensorType(out.tensor, tuple(shape), dtype, dynamic=dynamic)
    return op


#: op fields that are attributes: names (``fn``, ``dtype``) and numbers (``min``, ``max``,
#: ``value``)
NAME_ATTRS = ("fn", "dtype")
#: every numeric attribute some op kind of the registry takes (each kind checks its own)
NUMBER_ATTRS = tuple(sorted({a for k in KINDS for a in k.attrs}))
#: every field an op may have: the structure, then the attributes
OP_FIELDS = ("name", "op", "out", "ins", "dims", *NAME_ATTRS, *NUMBER_ATTRS)


def _attrs(od: dict[str, Any], where: str) -> dict[str, str]:
    """An op's attributes as the IR keeps them: strings, numbers in one canonical spelling."""
    attrs = {}
    for k in NAME_ATTRS:
        if k in od:
            if not isinstance(od[k], str):
                raise ProgramError(f"{where}: field {k!r} must be a string, got {od[k]!r}")
            attrs[k] = od[k]
    for k in NUMBER_ATTRS:
        if k in od:
            v = od[k]
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ProgramError(f"{where}: field {k!r} must be a number, got {_show(v)}")
            if isinstance(v, int) and not _finite(v):  # an int too large for a float
                raise ProgramError(f"{where}: field {k!r} must be a finite number, got "
                                   f"{_show(v)}")
            # whether a kind takes infinities (a mask's -inf fill) is the kind's to say
            attrs[k] = number_attr(v)
    return attrs


def _finite(v: float) -> bool:
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an int too large for a float
        return False


def number_attr(value: float) -> str:
    """The canonical text of a numeric attribute (``repr`` of the float)."""
    return repr(float(value))


def inferred_dtype(op: Op, tensors: dict[str, TensorType]) -> str:
    """The dtype an op's output gets when no tensor entry declares it (the kind's dtype rule)."""
    return op.kind.out_dtype([tensors[a.tensor].dtype for a in op.ins], dict(op.attrs),
                             f"op {op.name!r}")


def _sizes_from(acc: Access, t: TensorType, sizes: dict[str, int], where: str,
                declared: Mapping[str, int] | None = None) -> None:
    """Sizes of the dims ``acc`` indexes alone, from ``t``'s shape; a dim ``declared`` smaller
    than an input's axis reads its leading part (``x[:, :n]``), which validation checks."""
    if len(acc.index) != t.rank:
        raise ProgramError(f"{where}: tensor {acc.tensor!r} has rank {t.rank} but is indexed with "
                           f"{len(acc.index)} indices")
    for axis, (e, size) in enumerate(zip(acc.index, t.shape, strict=True)):
        d = e.single_dim
        if d is None:
            continue
        if declared and declared.get(d, size) < size:
            continue
        if d in sizes and sizes[d] != size:
            raise ProgramError(f"{where}: dim {d!r} has size {sizes[d]} but indexes dim {axis} of "
                               f"tensor {acc.tensor!r} of size {size}")
        sizes[d] = size


def _parse_group(g: Any, i: int, ops: list[Op]) -> TilingGroup:
    g = _object(g, 'an object like {"ops": [...], "loops": [{"count": 2, "dims": ["m"]}]}',
                f"tiling[{i}]")
    _check_fields(g, GROUP_FIELDS, f"tiling[{i}]")
    names = tuple(_require_list(g, "ops", _is_str, "a non-empty list of op names (strings)",
                                "an op name (a string)", f"tiling[{i}]"))
    where = f"tiling group {list(names)}"
    if not names:
        raise ProgramError(f"tiling[{i}]: field 'ops' must name at least one op")
    known = {o.name: o for o in ops}
    for n in names:
        if n not in known:
            raise ProgramError(f"{where}: unknown op {n!r}")
    if "loops" in g:
        if "count" in g or "dims" in g:  # which would win is a guess; refuse both
            raise ProgramError(f"{where}: give either \"loops\" or \"count\" (with \"dims\"), "
                               "not both")
        loops = _require(g, "loops", lambda v: isinstance(v, list),
                         'a list of loops like {"count": 2, "dims": ["m"]}', where)
        levels = tuple(_parse_level(_object(lv, 'an object like {"count": 2, "dims": ["m"]}',
                                            f"{where}: loops[{j}]"), f"{where}: loops[{j}]")
                       for j, lv in enumerate(loops))
    else:
        if "count" not in g:
            raise ProgramError(f"{where}: needs \"loops\" or \"count\"")
        flat = {"count": g["count"]}
        if "dims" in g:
            flat["dims"] = g["dims"]
        else:  # flat form defaults to the dim indexing dim 0 of the first op's output
            first = known[names[0]].out.index
            d0 = first[0].single_dim if first else None
            if d0 is None:
                raise ProgramError(f"{where}: op {names[0]!r} has no dim 0 to tile; give "
                                   "\"dims\"")
            flat["dims"] = [d0]
        levels = (_parse_level(flat, where),)
    depths = g.get("depths", {})
    if not isinstance(depths, dict):
        raise ProgramError(f"{where}: field 'depths' must be an object like {{\"op\": 1}} "
                           "(the outer loop levels an op sits in)")
    return TilingGroup(names, levels, tuple(depths.items()))


def _parse_level(lv: dict[str, Any], where: str) -> LoopLevel:
    _check_fields(lv, LOOP_FIELDS, where)
    count = _require(lv, "count", lambda v: _is_int(v) or _is_str(v),
                     'a positive int or a symbol name like "T"', where)
    dims = _require_list(lv, "dims", _is_str, "a non-empty list of dim names (strings)",
                         "a dim name (a string)", where)
    bounds = {k: lv[k] for k in ("min", "max") if k in lv}  # a symbolic count's bounds
    try:
        return LoopLevel(count, tuple(dims), **bounds)
    except ProgramError as e:  # LoopLevel does not know which group it is in
        raise ProgramError(f"{where}: {e}") from None


def _level_dict(lv: LoopLevel) -> dict[str, Any]:
    d: dict[str, Any] = {"count": lv.count, "dims": list(lv.dims)}
    if lv.min != 1:
        d["min"] = lv.min
    if lv.max is not None:
        d["max"] = lv.max
    return d


def to_dict(p: Program) -> dict[str, Any]:
    """The JSON document of ``p``; ``from_dict(to_dict(p)) == p``."""
    implied = {o.out.tensor for o in p.ops
               if inferred_dtype(o, p.tensor_map) == p.tensor(o.out.tensor).dtype}
    tensors = {t.name: {"shape": t.shape_text(), "dtype": t.dtype}
               for t in p.tensors if t.name not in implied}
    ops = []
    for o in p.ops:
        # dims an input's axis sizes whole; a leading slice (x[:, :n]) needs its size written,
        # even where another input reads the dim whole (the reader takes the first size met)
        reads = [(e.single_dim, o.sizes[e.single_dim] == n) for a in o.ins
                 for e, n in zip(a.index, p.tensor(a.tensor).shape, strict=True)
                 if e.single_dim]
        alone = {d for d, whole in reads if whole} - {d for d, whole in reads if not whole}
        od: dict[str, Any] = {"name": o.name, "op": o.fn, "out": str(o.out),
                              "ins": [str(a) for a in o.ins]}
        extra = {d: n for d, n in o.dims if d not in alone}
        if extra:
            od["dims"] = extra
        od.update({k: float(v) if k in NUMBER_ATTRS else v for k, v in o.attrs})
        ops.append(od)
    doc: dict[str, Any] = {"format": FORMAT, "name": p.name, "tensors": tensors,
                           "inputs": list(p.inputs), "outputs": list(p.outputs), "ops": ops}
    if p.tiling:
        doc["tiling"] = [{"ops": list(g.ops),
                          "loops": [_level_dict(lv) for lv in g.loops],
                          **({"depths": dict(g.depths)} if g.depths else {})}
                         for g in p.tiling]
    if p.work_division:
        doc["work_division"] = {op: dict(s) for op, s in p.work_division}
    if p.split_k:
        doc["split_k"] = {op: v.to_doc() if isinstance(v, SplitKPin) else v
                          for op, v in p.split_k}
    if p.symbols:
        doc["symbols"] = {s.name: {k: v for k, v in (("min", s.min), ("max", s.max))
                                   if v is not None and (k, v) != ("min", 1)}
                          for s in p.symbols}
    return doc


def dumps(p: Program, indent: int | None = 2) -> str:
    """Print ``p`` as program format v1."""
    if not isinstance(p, Program):
        built = getattr(p, "program", None)  # a builder (``with ap.program(...) as p``)
        if not isinstance(built, Program):
            raise ProgramError(f"ap.dumps needs a Program or a builder's program, got "
                               f"{type(p).__name__} {reprlib.repr(p)}")
        p = built
    if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int)):
        raise ProgramError(f"ap.dumps: indent must be an int or None, got {indent!r}"[:200])
    return json.dumps(to_dict(p), indent=indent)
