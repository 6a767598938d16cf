"""Fuzzing program format v1: corrupt valid documents; the parser returns a Program or raises a
one-line ProgramError, never another exception and never a hang."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.errors import ProgramError
from apportion.frontend.json_format import from_dict, load, loads
from apportion.ir.program import Program

EXAMPLES = [json.loads(p.read_text())
            for p in sorted(Path(__file__).parents[2].joinpath("examples").glob("*.json"))]
SEEDS_MAX = 150  # examples per fuzz test: a few seconds in all on a 2-core CI machine

Path_ = tuple[Any, ...]


@st.composite
def small_programs(draw: st.DrawFn) -> dict[str, Any]:
    """A small valid program: a chain of pointwise, reduction and matmul ops over ``x``."""
    m, n = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2, 4, 16]))
    dtype = draw(st.sampled_from(["float16", "float32", "bfloat16"]))
    tensors: dict[str, Any] = {"x": {"shape": [m, n], "dtype": dtype}}
    ops: list[dict[str, Any]] = []
    cur = "x"
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "matmul"]))
        out = f"t{i}"
        if kind == "unary":
            fn = draw(st.sampled_from(["exp", "neg", "relu", "copy"]))
            ops.append({"name": f"o{i}", "op": fn, "out": f"{out}[m,n]", "ins": [f"{cur}[m,n]"]})
        elif kind == "binary":
            fn = draw(st.sampled_from(["add", "mul", "sub"]))
            ops.append({"name": f"o{i}", "op": fn, "out": f"{out}[m,n]",
                        "ins": [f"{cur}[m,n]", "x[m,n]"]})
        elif kind == "reduce":  # keep the reduced dim as size 1, then broadcast it back
            fn = draw(st.sampled_from(["sum", "max", "mean"]))
            ops.append({"name": f"o{i}", "op": fn, "out": f"r{i}[m,0]", "ins": [f"{cur}[m,n]"]})
            ops.append({"name": f"b{i}", "op": "sub", "out": f"{out}[m,n]",
                        "ins": [f"{cur}[m,n]", f"r{i}[m,0]"]})
        else:
            tensors[f"w{i}"] = {"shape": [n, n], "dtype": dtype}
            ops.append({"name": f"o{i}", "op": "matmul", "out": f"{out}[m,n]",
                        "ins": [f"{cur}[m,k]", f"w{i}[k,n]"]})
        cur = out
    doc: dict[str, Any] = {"format": "apportion.program/1", "name": "fuzz", "tensors": tensors,
                           "inputs": list(tensors), "outputs": [cur], "ops": ops}
    if draw(st.booleans()):
        group = [o["name"] for o in ops]
        doc["tiling"] = [draw(st.sampled_from([
            {"ops": group, "loops": [{"count": 1, "dims": ["m"]}]},
            {"ops": group, "count": 1},
            {"ops": group, "count": "T", "dims": ["m"]},
        ]))]
    if draw(st.booleans()):
        doc["work_division"] = {ops[0]["name"]: {"m": 1}}
    return doc


documents = st.one_of(st.sampled_from(EXAMPLES), small_programs())

# a value of each JSON type, and the awkward ones: huge, negative, nested, near-miss strings
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.just(2 ** 100), st.just(-(2 ** 100)),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["x[m,k]", "x[m,,k]", "s[]", "float16", "m", "", "[", "matmul", "T"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def paths(node: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every path to a value inside ``node``, the root included."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(paths(v, (*prefix, i)))
    return out


def corrupt(draw: st.DrawFn, doc: Any) -> Any:
    """``doc`` with one corruption at a random path: replaced, deleted, or a key added."""
    path = draw(st.sampled_from(paths(doc)))
    how = draw(st.sampled_from(["replace", "delete", "add-key"]))
    if not path:
        return draw(values) if how == "replace" else doc
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if how == "replace":
        parent[key] = draw(values)
    elif how == "delete":
        del parent[key]
    elif isinstance(parent[key], dict):
        parent[key][draw(st.sampled_from(["tilling", "shpe", "dim", "x", "", "count"]))] = \
            draw(values)
    return doc


@st.composite
def corrupted(draw: st.DrawFn) -> Any:
    doc = copy.deepcopy(draw(documents))
    for _ in range(draw(st.integers(1, 3))):
        doc = corrupt(draw, doc)
    return doc


def parses_or_refuses(parse: Any, arg: Any) -> None:
    """``parse(arg)`` gives a Program or a one-line ProgramError; anything else fails."""
    try:
        assert isinstance(parse(arg), Program)
    except ProgramError as e:
        assert "\n" not in str(e) and str(e)


@settings(max_examples=SEEDS_MAX)
@given(documents)
def test_uncorrupted_documents_parse(doc):
    assert isinstance(from_dict(copy.deepcopy(doc)), Program)


@settings(max_examples=SEEDS_MAX)
@given(corrupted())
def test_corrupted_document_gives_a_program_or_a_program_error(doc):
    text = json.dumps(doc)  # before from_dict, which must not matter but could mutate
    parses_or_refuses(from_dict, doc)
    parses_or_refuses(loads, text)


@settings(max_examples=SEEDS_MAX)
@given(documents, st.data())
def test_truncated_or_garbled_json_text_gives_a_program_or_a_program_error(doc, data):
    text = json.dumps(doc)
    cut = data.draw(st.integers(0, len(text)))
    parses_or_refuses(loads, text[:cut])
    at = data.draw(st.integers(0, len(text)))
    junk = data.draw(st.text(alphabet='{}[],:"0123456789-.eE \\tnul', max_size=4))
    parses_or_refuses(loads, text[:at] + junk + text[at:])


@settings(max_examples=SEEDS_MAX // 2, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents, st.data())
def test_file_with_non_utf8_bytes_is_a_program_error(tmp_path, doc, data):
    raw = json.dumps(doc).encode()
    at = data.draw(st.integers(0, len(raw)))
    bad = data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xe9", b"\xed\xa0\x80", b"\x80\x80"]))
    path = tmp_path / "p.json"
    path.write_bytes(raw[:at] + bad + raw[at:])
    try:
        load(path)
    except ProgramError as e:
        assert "\n" not in str(e)
    else:
        raise AssertionError("a file with invalid UTF-8 loaded")


@settings(max_examples=SEEDS_MAX // 2, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents)
def test_valid_file_loads_to_the_same_program_as_from_dict(tmp_path, doc):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert load(path) == from_dict(copy.deepcopy(doc))
