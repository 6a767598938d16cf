"""Program format v1 on bad input: every mistake is one ProgramError line naming where it is."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from apportion.backends.bundle import spec_text
from apportion.cost import calibrate
from apportion.errors import ApportionError, ProgramError
from apportion.frontend.json_format import (
    GROUP_FIELDS,
    LOOP_FIELDS,
    OP_FIELDS,
    PROGRAM_FIELDS,
    TENSOR_FIELDS,
    from_dict,
    load,
    loads,
)
from apportion.ir.op import Access
from apportion.ir.program import Program
from apportion.plans import serialize
from apportion.sharding import spec as sharding_spec

EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.json"))

Doc = dict[str, Any]


def base() -> Doc:
    """A small valid program touching every section: tensors, ops with dims, tiling, pins."""
    return {
        "format": "apportion.program/1",
        "name": "t",
        "tensors": {"x": {"shape": [8, 16], "dtype": "float16"},
                    "w": {"shape": [16, 4], "dtype": "float16"}},
        "inputs": ["x", "w"],
        "outputs": ["y"],
        "ops": [
            {"name": "gate", "op": "matmul", "out": "g[m,n]", "ins": ["x[m,k]", "w[k,n]"],
             "dims": {"k": 16}},
            {"name": "act", "op": "relu", "out": "y[m,n]", "ins": ["g[m,n]"]},
        ],
        "tiling": [{"ops": ["gate", "act"], "loops": [{"count": 2, "dims": ["m"]}]}],
        "work_division": {"gate": {"m": 2}},
    }


def refused(doc: Any, match: str) -> str:
    """The message of the ProgramError ``doc`` raises; it must match and be one line."""
    with pytest.raises(ProgramError, match=match) as info:
        from_dict(doc)
    text = str(info.value)
    assert "\n" not in text
    # the JSON text of the same document gives the same error
    with pytest.raises(ProgramError, match=match):
        loads(json.dumps(doc))
    return text


def with_(change: Callable[[Doc], None]) -> Doc:
    doc = copy.deepcopy(base())
    change(doc)
    return doc


def test_base_document_is_valid():
    assert isinstance(from_dict(base()), Program)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        node = doc
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return change


def _op(field: str, value: Any, i: int = 0) -> Callable[[Doc], None]:
    return _set(("ops", i, field), value)


# (what to change, what the error must say)
WRONG_TYPES: list[tuple[str, Callable[[Doc], None], str]] = [
    ("name-int", _set(("name",), 5), r"^program: field 'name' must be a string, got 5$"),
    ("name-null", _set(("name",), None), r"field 'name' must be a string, got null"),
    ("tensors-list", _set(("tensors",), []), r"program: field 'tensors' must be an object"),
    ("tensor-entry-list", _set(("tensors", "x"), [8, 16]), r"tensor 'x' must be an object"),
    ("tensor-entry-str", _set(("tensors", "x"), "float16"), r"tensor 'x' must be an object"),
    ("shape-str", _set(("tensors", "x", "shape"), "8x16"),
     r"tensor 'x': field 'shape' must be a list of positive ints"),
    ("shape-float", _set(("tensors", "x", "shape"), [8.0, 16]),
     r"tensor 'x': field 'shape' item 0 must be a positive int or a symbol name.*, got 8\.0"),
    ("shape-bool", _set(("tensors", "x", "shape"), [8, True]),
     r"tensor 'x': field 'shape' item 1 must be a positive int or a symbol name.*, got true"),
    ("shape-null", _set(("tensors", "x", "shape"), [None, 16]), r"item 0 .* got null"),
    ("shape-zero", _set(("tensors", "x", "shape"), [8, 0]), r"item 1 must be a positive int"),
    ("shape-negative", _set(("tensors", "x", "shape"), [-8, 16]), r"item 0 .* got -8"),
    ("shape-nested", _set(("tensors", "x", "shape"), [[8], 16]), r"item 0 .* got \[8\]"),
    ("shape-object", _set(("tensors", "x", "shape"), {"0": 8}), r"field 'shape' must be a list"),
    ("dtype-int", _set(("tensors", "x", "dtype"), 16),
     r"tensor 'x': field 'dtype' must be a dtype name like \"float16\", got 16"),
    ("dtype-list", _set(("tensors", "x", "dtype"), ["float16"]), r"tensor 'x': field 'dtype'"),
    ("inputs-str", _set(("inputs",), "x"), r"program: field 'inputs' must be a list of tensor"),
    ("inputs-nested", _set(("inputs",), [["x"], "w"]),
     r"program: field 'inputs' item 0 must be a tensor name \(a string\), got \['x'\]"),
    ("inputs-int", _set(("inputs",), ["x", 1]), r"field 'inputs' item 1 .* got 1"),
    ("outputs-object", _set(("outputs",), {"y": 1}), r"program: field 'outputs' must be a list"),
    ("outputs-null", _set(("outputs",), [None]), r"field 'outputs' item 0 .* got null"),
    ("ops-object", _set(("ops",), {}), r"program: field 'ops' must be a list of op objects"),
    ("op-not-object", _set(("ops", 1), "act"), r"^ops\[1\] must be an object with fields"),
    ("op-list", _set(("ops", 0), ["gate"]), r"^ops\[0\] must be an object"),
    ("op-name-int", _op("name", 5), r"^ops\[0\]: field 'name' must be a string, got 5$"),
    ("op-name-list", _op("name", ["gate"]), r"^ops\[0\]: field 'name' must be a string"),
    ("op-op-int", _op("op", 3), r"^op 'gate': field 'op' must be an op kind like \"matmul\""),
    ("op-op-null", _op("op", None), r"op 'gate': field 'op' .* got null"),
    ("out-list", _op("out", ["g[m,n]"]), r"op 'gate': field 'out' must be an access string"),
    ("ins-int", _op("ins", 5),
     r"^op 'gate': field 'ins' must be a list of access strings like \"x\[m,k\]\", got 5$"),
    ("ins-str", _op("ins", "x[m,k]"), r"op 'gate': field 'ins' must be a list of access"),
    ("ins-item-int", _op("ins", ["x[m,k]", 5]),
     r"op 'gate': field 'ins' item 1 must be an access string like \"x\[m,k\]\", got 5"),
    ("ins-item-list", _op("ins", [["x[m,k]"], "w[k,n]"]), r"op 'gate': field 'ins' item 0"),
    ("dims-list", _op("dims", [16]), r"op 'gate': field 'dims' must be an object mapping dim"),
    ("dims-str-size", _op("dims", {"k": "16"}), r"op 'gate': field 'dims' .* got 'k': '16'"),
    ("dims-float-size", _op("dims", {"k": 16.0}), r"field 'dims' .* got 'k': 16\.0"),
    ("dims-bool-size", _op("dims", {"k": True}), r"field 'dims' .* got 'k': true"),
    ("dims-zero-size", _op("dims", {"k": 0}), r"field 'dims' .* positive sizes .* got 'k': 0"),
    ("dims-bad-name", _op("dims", {"1k": 16}), r"field 'dims' must be an object mapping dim"),
    ("fn-int", _op("fn", 5), r"op 'gate': field 'fn' must be a string"),
    ("dtype-attr-int", _op("dtype", 32), r"op 'gate': field 'dtype' must be a string"),
    ("tiling-object", _set(("tiling",), {"ops": ["gate"], "count": 2}),
     r"program: field 'tiling' must be a list of tiling groups"),
    ("tiling-str", _set(("tiling",), "gate"), r"program: field 'tiling' must be a list"),
    ("group-int", _set(("tiling", 0), 5), r"^tiling\[0\] must be an object"),
    ("group-list", _set(("tiling", 0), ["gate"]), r"^tiling\[0\] must be an object"),
    ("group-ops-str", _set(("tiling", 0, "ops"), "gate"),
     r"tiling\[0\]: field 'ops' must be a non-empty list of op names"),
    ("group-ops-int-item", _set(("tiling", 0, "ops"), ["gate", 1]),
     r"tiling\[0\]: field 'ops' item 1 must be an op name"),
    ("group-ops-empty", _set(("tiling", 0, "ops"), []), r"tiling\[0\]: field 'ops' must name"),
    ("loops-object", _set(("tiling", 0, "loops"), {"count": 2, "dims": ["m"]}),
     r"tiling group \['gate', 'act'\]: field 'loops' must be a list of loops"),
    ("loop-int", _set(("tiling", 0, "loops", 0), 2),
     r"tiling group \['gate', 'act'\]: loops\[0\] must be an object"),
    ("count-float", _set(("tiling", 0, "loops", 0, "count"), 2.0),
     r"loops\[0\]: field 'count' must be a positive int or a symbol name .* got 2\.0"),
    ("count-bool", _set(("tiling", 0, "loops", 0, "count"), True), r"field 'count' .* true"),
    ("count-null", _set(("tiling", 0, "loops", 0, "count"), None), r"field 'count' .* null"),
    ("count-list", _set(("tiling", 0, "loops", 0, "count"), [2]), r"field 'count' .* \[2\]"),
    ("loop-dims-str", _set(("tiling", 0, "loops", 0, "dims"), "m"),
     r"loops\[0\]: field 'dims' must be a non-empty list of dim names"),
    ("loop-dims-int-item", _set(("tiling", 0, "loops", 0, "dims"), [0]),
     r"loops\[0\]: field 'dims' item 0 must be a dim name"),
    ("work-division-list", _set(("work_division",), [["gate", 2]]),
     r"program: field 'work_division' must be an object mapping op names"),
    ("work-division-int", _set(("work_division", "gate"), 2),
     r"program: field 'work_division' must be an object mapping op names .* got 'gate': 2"),
    ("split-float", _set(("work_division", "gate"), {"m": 2.0}),
     r"work_division for op 'gate': split of dim 'm' must be an integer, got 2\.0"),
    ("split-bool", _set(("work_division", "gate"), {"m": True}), r"dim 'm' .* got true"),
    ("split-str", _set(("work_division", "gate"), {"m": "2"}), r"dim 'm' .* got '2'"),
]


@pytest.mark.parametrize(("change", "match"), [c[1:] for c in WRONG_TYPES],
                         ids=[c[0] for c in WRONG_TYPES])
def test_wrong_json_type_is_one_program_error_line_naming_the_field(change, match):
    refused(with_(change), match)


@pytest.mark.parametrize("doc", [[], "program", None, 5, [base()]], ids=repr)
def test_a_document_that_is_not_an_object_is_refused(doc):
    refused(doc, r"^a program must be a JSON object")


@pytest.mark.parametrize("key", [1, None, ("x",)], ids=repr)
def test_a_tensor_name_that_is_not_a_string_is_refused_by_from_dict(key):
    doc = base()
    doc["tensors"][key] = doc["tensors"].pop("x")
    with pytest.raises(ProgramError, match=r"program: tensor name .* must be a non-empty string"):
        from_dict(doc)


@pytest.mark.parametrize("name", ["", "x y", "x[0]", "x,y"])
def test_a_tensor_name_no_access_could_spell_is_refused(name):
    refused(with_(_set(("tensors", name), {"shape": [2], "dtype": "float16"})),
            r"program: tensor name .* must be a non-empty string without spaces")


def test_a_huge_value_is_shown_short_in_the_message():
    text = refused(with_(_set(("tensors", "x", "shape"), [8, list(range(1000))])), r"item 1")
    assert len(text) < 200


def test_a_huge_int_from_from_dict_does_not_break_the_message():
    # repr() of an int past Python's 4300-digit limit raises ValueError; the message must not
    with pytest.raises(ProgramError, match=r"item 0 must be .*, got an integer"):
        from_dict(with_(_set(("tensors", "x", "shape"), [-(10 ** 5000), 16])))


def test_huge_ints_where_ints_belong_are_accepted():
    doc = with_(_set(("tensors", "x", "shape"), [2 ** 100, 16]))
    assert from_dict(doc).tensor("g").shape == (2 ** 100, 4)


def test_an_unsupported_format_is_refused():
    refused(with_(_set(("format",), 1)), r"unsupported program format 1; expected")


# -- unknown fields ------------------------------------------------------------------------------

UNKNOWN: list[tuple[str, Callable[[Doc], None], str]] = [
    ("top", _set(("tilling",), []),
     r"^program: unknown field 'tilling' \(did you mean 'tiling'\?\); valid: format, name, "
     r"tensors, inputs, outputs, ops, tiling, work_division, split_k, symbols, shardings$"),
    ("top-input", _set(("input",), ["x"]), r"program: unknown field 'input' .*'inputs'"),
    ("tensor", _set(("tensors", "x", "shpe"), [8, 16]),
     r"^tensor 'x': unknown field 'shpe' \(did you mean 'shape'\?\); valid: shape, dtype$"),
    ("op", _op("dim", {"k": 16}), r"^op 'gate': unknown field 'dim' \(did you mean 'dims'\?\)"),
    ("op-ins", _op("inz", []), r"op 'gate': unknown field 'inz' \(did you mean 'ins'\?\)"),
    ("group", _set(("tiling", 0, "loop"), []),
     r"^tiling\[0\]: unknown field 'loop' \(did you mean 'loops'\?\); valid: ops, loops, count, "
     r"dims, depths$"),
    ("loop", _set(("tiling", 0, "loops", 0, "counts"), 2),
     r"^tiling group \['gate', 'act'\]: loops\[0\]: unknown field 'counts' \(did you mean "
     r"'count'\?\); valid: count, dims, min, max$"),
    ("no-suggestion", _set(("zzzzzz",), 1), r"^program: unknown field 'zzzzzz'; valid: format"),
]


@pytest.mark.parametrize(("change", "match"), [c[1:] for c in UNKNOWN], ids=[c[0] for c in UNKNOWN])
def test_unknown_field_is_an_error_suggesting_the_closest_valid_one(change, match):
    refused(with_(change), match)


def test_unknown_field_key_that_is_not_a_string_is_refused_by_from_dict():
    doc = base()
    doc[3] = "x"
    with pytest.raises(ProgramError, match=r"program: unknown field 3; valid:"):
        from_dict(doc)


@pytest.mark.parametrize("field", OP_FIELDS)
def test_every_op_field_listed_in_op_fields_is_known(field):
    # whatever its value, a listed field is never reported as unknown
    doc = with_(_op(field, "relu"))
    try:
        from_dict(doc)
    except ProgramError as e:
        assert "unknown field" not in str(e)


def test_field_lists_are_the_documented_ones():
    assert PROGRAM_FIELDS == ("format", "name", "tensors", "inputs", "outputs", "ops", "tiling",
                              "work_division", "split_k", "symbols", "shardings")
    assert TENSOR_FIELDS == ("shape", "dtype")
    assert GROUP_FIELDS == ("ops", "loops", "count", "dims", "depths")
    assert LOOP_FIELDS == ("count", "dims", "min", "max")
    assert {"name", "op", "out", "ins", "dims", "fn", "dtype"} <= set(OP_FIELDS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_use_only_known_fields(path):
    assert isinstance(load(path), Program)


def test_builtin_model_programs_use_only_known_fields():
    from apportion.frontend.models import bench_cases, default_program, load_models

    assert isinstance(default_program(), Program)
    models = load_models()
    one = {"models": dict(list(models["models"].items())[:1]), "prefill_tokens": [16],
           "decode_batch": [1], "decode_context": [64]}
    assert all(isinstance(c.program, Program) for c in bench_cases(one))


def test_loops_together_with_a_flat_count_is_refused():
    refused(with_(_set(("tiling", 0, "count"), 2)),
            r"tiling group \['gate', 'act'\]: give either \"loops\" or \"count\"")


def test_flat_tiling_group_with_count_and_dims_still_parses():
    doc = with_(_set(("tiling",), [{"ops": ["gate", "act"], "count": 2, "dims": ["m"]}]))
    assert from_dict(doc).tiling[0].loops[0].dims == ("m",)


def test_nonpositive_loop_count_names_the_group():
    refused(with_(_set(("tiling", 0, "loops", 0, "count"), 0)),
            r"tiling group \['gate', 'act'\]: loops\[0\]: loop count must be positive")


def test_unknown_op_kind_names_the_op():
    refused(with_(_op("op", "matmull")), r"^op 'gate': unknown op 'matmull'")


# -- files and JSON text -------------------------------------------------------------------------

def test_a_file_that_is_not_utf8_is_a_program_error_naming_it(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(ProgramError, match=r"bad\.json.*not UTF-8 text \(byte 0xe9 at offset 13\)"):
        load(path)


def test_a_directory_is_a_program_error_naming_it(tmp_path):
    with pytest.raises(ProgramError, match=r"cannot read program file .*: it is a directory"):
        load(tmp_path)


def test_a_path_with_a_nul_byte_is_a_program_error():
    with pytest.raises(ProgramError, match=r"cannot read program file"):
        load("ex\0amples/mlp.json")


def test_a_utf8_file_with_a_byte_order_mark_loads(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(base()).encode())
    assert load(path) == from_dict(base())


@pytest.mark.parametrize(("text", "match"), [
    ("[" * 100_000, "nested too deeply"),
    ("1" * 5000, "a number has more than"),
    ('{"tensors": {', "not valid JSON: Expecting"),
    ("", "not valid JSON"),
    (b"\xff\xfe\x00", "not UTF-8|not valid JSON"),
], ids=["deep", "long-number", "truncated", "empty", "bad-bytes"])
def test_text_that_is_not_json_is_a_program_error(text, match):
    with pytest.raises(ProgramError, match=match):
        loads(text)


# -- access strings ------------------------------------------------------------------------------

BAD_ACCESSES = ["x[m,,k]", "x[m", "[m]", "x[m]]", "x y[m]", "", "x", "x[m,]", "x[,m]",
                "x[m][k]", "x]y[m]", "x,y[m]", "x[m k]", "x[-1]", "x[m*2]", "x[m-1]",
                "x[\u0663]", "x[[m]]", "  [ ]", "x[m]y"]


@pytest.mark.parametrize("text", BAD_ACCESSES, ids=repr)
def test_malformed_access_is_a_program_error(text):
    with pytest.raises(ProgramError, match=r"cannot parse access") as info:
        Access.parse(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", BAD_ACCESSES, ids=repr)
def test_malformed_access_in_a_program_names_the_op_and_field(text):
    refused(with_(_op("ins", [text, "w[k,n]"])),
            r"^op 'gate': field 'ins' item 0: cannot parse access")


@pytest.mark.parametrize("value", [5, None, ["x[m]"]], ids=repr)
def test_access_parse_refuses_non_strings(value):
    with pytest.raises(ProgramError, match="an access must be a string"):
        Access.parse(value)


def test_empty_brackets_are_a_rank_zero_access():
    assert Access.parse("s[]") == Access("s", ()) and str(Access.parse("s[]")) == "s[]"
    assert Access.parse(" s [ ] ").index == ()


def test_spaces_inside_an_access_are_allowed():
    a = Access.parse("  x [ m , 128 * h + d ] ")
    assert a.tensor == "x" and str(a) == "x[m, 128*h+d]"


def test_huge_constants_and_coefficients_in_an_index_parse_as_python_ints():
    a = Access.parse(f"x[{2 ** 100}*m+{3 ** 90}]")
    assert a.index[0].terms == (("m", 2 ** 100),) and a.index[0].const == 3 ** 90


def test_an_index_number_past_the_int_digit_limit_is_a_program_error():
    with pytest.raises(ProgramError, match="digits"):
        Access.parse("x[" + "9" * 5000 + "]")


def test_a_huge_index_constant_in_a_program_is_out_of_range_not_a_crash():
    refused(with_(_op("ins", [f"x[m,k+{2 ** 100}]", "w[k,n]"])), r"op 'gate'.*beyond its size")


def test_rank_zero_tensors_parse_and_round_trip():
    from apportion.frontend.json_format import dumps

    doc = {"tensors": {"x": {"shape": [8], "dtype": "float32"},
                       "c": {"shape": [], "dtype": "float32"}},
           "inputs": ["x", "c"], "outputs": ["s"],
           "ops": [{"name": "scale", "op": "mul", "out": "y[i]", "ins": ["x[i]", "c[]"]},
                   {"name": "total", "op": "sum", "out": "s[]", "ins": ["y[i]"]}]}
    p = from_dict(doc)
    assert p.tensor("c").shape == () and p.tensor("s").shape == ()
    assert loads(dumps(p)) == p


DUPLICATED = '{"name": "t", "name": "u", "tensors": {}, "inputs": [], "outputs": [], "ops": []}'


@pytest.mark.parametrize("read", [
    pytest.param(loads, id="program"),
    pytest.param(sharding_spec.loads, id="sharded program"),
    pytest.param(serialize.from_json, id="plan"),
    pytest.param(spec_text.from_json, id="loopspec"),
    pytest.param(lambda text: calibrate.loads_measurements(text, from_dict), id="measurements"),
])
def test_a_key_given_twice_in_one_json_object_is_refused_naming_it(read):
    with pytest.raises(ApportionError, match="key 'name' appears twice"):
        read(DUPLICATED)


def test_a_key_given_twice_deep_inside_a_program_is_refused():
    text = json.dumps(base()).replace('"dtype": "float16"}', '"dtype": "float16", '
                                      '"dtype": "float32"}', 1)
    with pytest.raises(ProgramError, match="key 'dtype' appears twice"):
        loads(text)


def test_a_declared_symbol_no_tensor_uses_is_refused():
    doc = {"name": "s", "symbols": {"K": {"max": 64}, "Z": {}},
           "tensors": {"x": {"shape": ["K", 8], "dtype": "float32"}}, "inputs": ["x"],
           "outputs": ["y"], "ops": [{"name": "e", "op": "exp", "out": "y[k,n]",
                                      "ins": ["x[k,n]"]}]}
    with pytest.raises(ProgramError, match="declares symbol 'Z' but no tensor's shape uses it"):
        from_dict(doc)
