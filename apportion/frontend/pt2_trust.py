"""What in a ``.pt2`` archive would run code when ``torch.export.load`` reads it.

A ``.pt2`` is code as much as data. torch 2.13's reader unpickles, with no restriction, every
weight and constant its config marks ``use_pickle`` (tensor subclasses, script and opaque
objects), and example inputs or an old format's state dict that its restricted loader
(``weights_only``) refuses; it loads the shared libraries AOTInductor packaged under
``data/aotinductor/``; it parses each symbolic size with ``sympy.sympify`` (Python's ``eval``);
and ``ExportedProgram.module()`` (which planning calls) ``exec``\\ s the input guards it
generates from the stored guard code and the inputs' constant values. ``unsafe_part`` reads the
archive as torch does (its own reader, so both see the same entries) and names the first part
of those kinds that is not what ``torch.export.save`` writes for an ordinary model: weights as
raw tensors, example inputs the restricted loader reads, expressions and guards in the forms
torch prints. ``unsafe_value`` does the same for the loaded program's input constants.

>>> _safe_expression("Mul(Integer(2), Symbol('s0', integer=True, positive=True))")
True
>>> _safe_expression("__import__('os').system('id')")
False
>>> _safe_guard("L['x'].size()[0] <= 128"), _safe_guard("L['x'].__class__")
(True, False)
"""

from __future__ import annotations

import ast
import io
import json
import re
import zipfile
from collections.abc import Iterator
from typing import IO, Any

#: what sympify may call in a symbolic size torch wrote (``sympy.srepr``): sympy's numbers,
#: arithmetic and relations, and torch's own functions (``torch.utils._sympy.functions``)
_SYMPY_CALLS = frozenset({
    "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Mod", "Abs",
    "floor", "ceiling", "Equality", "Unequality", "StrictLessThan", "StrictGreaterThan",
    "LessThan", "GreaterThan", "And", "Or", "Not", "Piecewise", "ExprCondPair",
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt",
    "FloorToInt", "CeilDiv", "IntTrueDiv", "FloatTrueDiv", "LShift", "RShift",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt",
    "RoundDecimal", "ToFloat", "FloatPow", "PowByNatural", "Identity",
})
#: sympy's singletons as ``srepr`` prints them
_SYMPY_NAMES = frozenset({"oo", "zoo", "nan", "true", "false", "pi", "E", "I"})
#: the restricted loader's complaint about a global it does not allow
_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?|[-+]?(inf|nan)", re.IGNORECASE)

#: what a guard may read of an input, and the functions of ``math`` it may call
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_GUARD_MATH = frozenset({"floor", "ceil", "trunc", "isnan", "isinf", "inf", "sqrt"})
_GUARD_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
              ast.USub, ast.UAdd, ast.Not, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt,
              ast.LtE, ast.Gt, ast.GtE)
#: a string torch puts between quotes in generated code (a graph name, an input's key or
#: constant value): nothing that could end the quotes or the line
_PLAIN = re.compile(r"[\w.:/+\- ,]*", re.ASCII)


def unsafe_part(f: IO[bytes]) -> str | None:
    """The first part of the archive open in ``f`` whose reading by ``torch.export.load`` would
    run code of the archive's: ``ENTRY: why``; None when there is none. A ``ValueError`` names
    what makes the archive unreadable."""
    import torch
    from torch.export.pt2_archive import PT2ArchiveReader
    from torch.export.pt2_archive import constants as c

    legacy = _legacy_format(f)  # torch.export.load falls back to it when its reader fails
    if legacy:
        return legacy
    f.seek(0)
    try:
        reader = PT2ArchiveReader(f)
    except Exception as e:  # noqa: BLE001 - torch's own reason, as one line
        raise ValueError(f"{type(e).__name__}: {_first_line(e)}") from None
    names = reader.get_file_names()
    for name in names:
        if name.startswith(c.AOTINDUCTOR_DIR):
            return f"{name}: a program compiled by AOTInductor, loaded and run as native code"
    prefix, suffix = c.MODELS_FILENAME_FORMAT.split("{}")
    for program in [n for n in names if n.startswith(c.MODELS_DIR)]:
        model = program[len(prefix):-len(suffix)]  # as torch names it
        restricted = [c.SAMPLE_INPUTS_FILENAME_FORMAT.format(model),
                      f"{c.WEIGHTS_DIR}{model}.pt", f"{c.CONSTANTS_DIR}{model}.pt"]
        for entry in [n for n in restricted if n in names]:
            why = _pickle_beyond_tensors(torch, reader.read_bytes(entry))
            if why:
                return f"{entry}: {why}"
        found = (_pickled(reader, c.WEIGHTS_CONFIG_FILENAME_FORMAT.format(model), c.WEIGHTS_DIR,
                          None, names)
                 or _pickled(reader, c.CONSTANTS_CONFIG_FILENAME_FORMAT.format(model),
                             c.CONSTANTS_DIR, c.TENSOR_CONSTANT_FILENAME_PREFIX, names)
                 or _code_in_program(program, _json(reader, names, program)))
        if found:
            return found
    return None


def unsafe_value(exported: Any) -> str | None:
    """An input of the loaded program whose constant value ``ExportedProgram.module()`` would
    write into the guard code it runs (a string holding a quote or a line break)."""
    for node in exported.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, str) and not _PLAIN.fullmatch(value):
            return f"input {node.name!r}: its constant value {value[:60]!r} would be run"
    return None


def _legacy_format(f: IO[bytes]) -> str | None:
    """The format ``torch.export.save`` wrote before torch 2.7 (a top-level ``version``),
    whose state dict, constants and example inputs torch unpickles without restriction when
    its restricted loader fails."""
    f.seek(0)
    try:
        with zipfile.ZipFile(f) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    if "version" not in names:
        return None
    pickles = [n for n in names if n.startswith(("serialized_state_dict", "serialized_constants",
                                                 "serialized_example_inputs"))]
    return (f"{(pickles or ['version'])[0]}: the format of torch before 2.7, whose weights, "
            "constants and example inputs torch may unpickle in full, run as they are read")


def _pickle_beyond_tensors(torch: Any, data: bytes) -> str | None:
    """Why ``data`` (what torch reads with ``weights_only=True``, falling back to a full
    unpickling) needs more than the restricted loader; None when it reads."""
    if not data:
        return None
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - any refusal: torch would unpickle it in full
        named = _GLOBAL.search(str(e))
        what = f" (it names {named.group(1)})" if named else ""
        return f"a pickle that torch's restricted loader refuses{what}, run when it is read"
    return None


def _json(reader: Any, names: list[str], entry: str) -> Any:
    if entry not in names:
        raise ValueError(f"{entry} is missing")
    try:
        return json.loads(reader.read_bytes(entry).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{entry} is not JSON: {_first_line(e)}") from None


def _pickled(reader: Any, config: str, folder: str, prefix: str | None,
             names: list[str]) -> str | None:
    """The first weight (``prefix`` None) or constant of ``config`` that torch unpickles."""
    if config not in names:  # torch reads the old format's single pickle instead (checked)
        return None
    entries = _json(reader, names, config)
    entries = entries.get("config") if isinstance(entries, dict) else None
    if not isinstance(entries, dict):
        raise ValueError(f"{config} holds no config")
    kind = "weight" if prefix is None else "constant"
    for fqn, meta in entries.items():
        path = meta.get("path_name") if isinstance(meta, dict) else None
        raw = isinstance(meta, dict) and meta.get("use_pickle") is False and \
            isinstance(path, str) and (prefix is None or path.startswith(prefix))
        if not raw:
            return f"{folder}{path}: {kind} {fqn!r} stored as a pickle, run when it is read"
    return None


def _code_in_program(entry: str, doc: Any) -> str | None:
    """The first symbolic size, guard or graph name of the program that is not in the form
    torch writes: sympify evaluates the first, the others end up in code torch runs."""
    for key, value in _items(doc):
        if key == "expr_str" and not (isinstance(value, str) and _safe_expression(value)):
            return f"{entry}: symbolic size {_shown(value)} is not one torch writes (sympy " \
                   "evaluates it as Python)"
        if key == "guards_code" and not (isinstance(value, list) and all(
                isinstance(g, str) and _safe_guard(g) for g in value)):
            return f"{entry}: guard {_shown(value)} is not one torch writes (it is run)"
        if key in ("name", "as_name") and not (isinstance(value, str)
                                               and _PLAIN.fullmatch(value)):
            return f"{entry}: name {_shown(value)} is not one torch writes (it is put into " \
                   "code torch runs)"
    return None


def _items(doc: Any) -> Iterator[tuple[str, Any]]:
    """Every key and value of every object in a JSON document."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                yield key, value
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


def _safe_expression(text: str) -> bool:
    """Whether ``text`` is a symbolic size as ``sympy.srepr`` writes one: calls of sympy's and
    torch's functions on numbers, with a string only as a symbol's name or a float's digits."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return _safe_sympy(tree.body)


def _safe_sympy(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float)
    if isinstance(node, ast.Name):
        return node.id in _SYMPY_NAMES
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub | ast.UAdd) and _safe_sympy(node.operand)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _SYMPY_CALLS):
        return False
    args = list(node.args)
    if node.func.id in ("Symbol", "Float") and args and isinstance(args[0], ast.Constant) \
            and isinstance(args[0].value, str):
        text = args.pop(0).value
        if not (text.isascii() and text.isidentifier() if node.func.id == "Symbol"
                else _NUMBER.fullmatch(text)):
            return False
    keywords_ok = all(k.arg is not None and isinstance(k.value, ast.Constant)
                      and isinstance(k.value.value, bool | int) for k in node.keywords)
    return keywords_ok and all(_safe_sympy(a) for a in args)


def _safe_guard(text: str) -> bool:
    """Whether ``text`` is a guard as torch prints one: arithmetic and comparisons of numbers,
    of the sizes and strides of inputs (``L['x'].size()[0]``) and of ``math``'s functions."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return _safe_guard_node(tree.body)


def _safe_guard_node(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) or node.value is None
    if isinstance(node, ast.Name):
        return node.id in ("L", "inf")
    if isinstance(node, ast.BinOp | ast.UnaryOp | ast.BoolOp | ast.Compare):
        ops = [node.op] if isinstance(node, ast.BinOp | ast.UnaryOp | ast.BoolOp) else node.ops
        kids = [c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.operator
                                                                      | ast.unaryop
                                                                      | ast.boolop | ast.cmpop)]
        return all(isinstance(o, _GUARD_OPS) for o in ops) and all(map(_safe_guard_node, kids))
    if isinstance(node, ast.Subscript):
        key = node.slice
        plain = isinstance(key, ast.Constant) and (
            isinstance(key.value, int) or isinstance(key.value, str) and _PLAIN.fullmatch(
                key.value) is not None)
        return plain and _safe_guard_node(node.value)
    if isinstance(node, ast.Attribute):  # math.inf, or a method called just below
        return isinstance(node.value, ast.Name) and node.value.id == "math" and \
            node.attr in _GUARD_MATH
    if isinstance(node, ast.Call) and not node.keywords and isinstance(node.func, ast.Attribute):
        func = node.func
        method = func.attr in _GUARD_METHODS and _safe_guard_node(func.value)
        return (method or _safe_guard_node(func)) and all(map(_safe_guard_node, node.args))
    return False


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
