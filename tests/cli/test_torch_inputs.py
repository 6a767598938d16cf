"""``--torch``: keyword inputs (each return form of a factory), ``--dynamic`` run-time sizes
bound by ``run --param``, and programs saved by ``torch.export.save`` (``.pt2``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cli.main import main
from apportion.workflows.torch_model import (
    FactoryError,
    at_sizes,
    load_factory,
    load_inputs,
    load_model,
    parse_dynamic,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

F = "tests.cli.torch_input_factories"
MLP = "apportion.frontend.torch_demo:mlp"


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- keyword inputs -----------------------------------------------------------------------

def test_the_three_return_forms_give_args_kwargs_and_dynamic_shapes():
    _, pos = load_inputs(MLP)
    assert len(pos.args) == 1 and not pos.kwargs and pos.dynamic_shapes is None
    _, kw = load_inputs(f"{F}:gpt2_masked")
    assert len(kw.args) == 1 and list(kw.kwargs) == ["attention_mask"]
    _, keyed = load_inputs(f"{F}:llama_keyed")
    assert set(keyed.dynamic_shapes) == {"input_ids", "attention_mask"}
    _, only_kw = load_inputs(f"{F}:mlp_keyword")
    assert only_kw.args == () and list(only_kw.kwargs) == ["x"]


def test_load_factory_keeps_positional_inputs_and_refuses_keyword_ones():
    _, args = load_factory(MLP)
    assert len(args) == 1
    with pytest.raises(FactoryError, match="keyword inputs or dynamic shapes"):
        load_factory(f"{F}:gpt2_masked")


@pytest.mark.parametrize("factory", ["gpt2_masked", "llama_masked", "mlp_keyword"])
def test_run_check_with_keyword_inputs_matches_eager(factory, capsys):
    assert main(["run", "--torch", f"{F}:{factory}", "--check", "--cores", "8"]) == 0
    assert "matches the model run eagerly in PyTorch" in capsys.readouterr().out


@pytest.mark.parametrize(("factory", "message"), [
    ("four_things", "must return (model, example_inputs): (model, args), (model, args, "
                    "kwargs) or (model, {'args': ..., 'kwargs': ..., 'dynamic_shapes': ...}), "
                    "got a 4-tuple"),
    ("bad_key", "key 'shapes'; the keys are args, kwargs, dynamic_shapes"),
    ("bad_kwargs", "keyword inputs must be a dict of names to inputs, got list"),
])
def test_a_malformed_factory_result_is_one_error_line_and_exit_2(factory, message, capsys):
    assert main(["plan", "--torch", f"{F}:{factory}"]) == 2
    assert message in _one_error_line(capsys)


# --- dynamic sizes from the command line ---------------------------------------------------

@given(st.sampled_from(["x", "input_ids", "attention_mask"]), st.integers(0, 5),
       st.sampled_from(["seq", "rows", "b_1"]), st.integers(2, 100), st.integers(1, 100))
@settings(max_examples=50, deadline=None)
def test_a_well_formed_dynamic_spec_parses_to_its_parts(name, dim, symbol, lo, extra):
    d, again = parse_dynamic([f"{name}:{dim}={symbol}:{lo}..{lo + extra}",
                              f"other:{dim}={symbol}"])
    assert (d.input, d.dim, d.symbol, d.min, d.max) == (name, dim, symbol, lo, lo + extra)
    assert (again.input, again.min, again.max) == ("other", lo, lo + extra)


@pytest.mark.parametrize(("spec", "message"), [
    ("x", "expected INPUT:DIM=SYMBOL:MIN..MAX"),
    ("x:a=rows:2..8", "input 'x' dim a: the dim must be a non-negative integer"),
    ("x:0=2rows:2..8", "symbol '2rows' is not a name"),
    ("x:0=rows", "symbol 'rows' needs bounds where it is first named"),
    ("x:0=rows:8", "bounds '8' are not MIN..MAX"),
    ("x:0=rows:1..8", "bounds 1..8 need 2 <= MIN < MAX (torch specializes sizes 0 and 1)"),
    ("x:0=rows:9..8", "bounds 9..8 need 2 <= MIN < MAX (MIN is above MAX)"),
    # one size is refused, not taken as a static size the user did not ask for
    ("x:0=rows:64..64", "bounds 64..64 need 2 <= MIN < MAX (one size is a static size: leave "
                        "this --dynamic out for size 64)"),
    # other scripts' digits: str.isdigit takes them, int() fails on superscripts and reads
    # Arabic-Indic ones as 0-9
    ("x:0=rows:1..\u2076\u2074", "bounds '1..\u2076\u2074' are not MIN..MAX (two integers in "
                                 "digits 0-9"),
    ("x:0=rows:2..\u0666\u0664", "bounds '2..\u0666\u0664' are not MIN..MAX"),
    ("x:\u0660=rows:2..64", "dim \u0660: the dim must be a non-negative integer in digits 0-9"),
    ("x:\u2070=rows:2..64", "dim \u2070: the dim must be a non-negative integer in digits 0-9"),
    ("x:0=rows:-2..8", "bounds '-2..8' are not MIN..MAX"),
    ("x:0=rows:2..", "bounds '2..' are not MIN..MAX"),
    ("x:0=rows:2..8..16", "bounds '2..8..16' are not MIN..MAX"),
    ("x:0=rows:2..99999999999999999999", "MAX 99999999999999999999 is beyond "
                                         "9223372036854775807, the largest size of a torch dim"),
    ("x:0=:2..8", "symbol '' is not a name"),
    (":0=rows:2..8", "input '' is not a parameter name of the model's forward"),
    ("x:0=rows:2..8", "input 'x' dim 0: the example input's size 64 is outside rows's bounds"),
    ("y:0=rows:2..128", "input 'y' dim 0: apportion.frontend.torch_demo:mlp gives no input "
                        "'y' (its inputs: x)"),
    ("x:5=rows:2..128", "input 'x' dim 5: the input has 2 dims (shape (64, 256))"),
])
def test_a_malformed_dynamic_spec_is_one_error_line_and_exit_2(spec, message, capsys):
    assert main(["plan", "--torch", MLP, "--dynamic", spec]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"apportion: error: --dynamic {spec!r}") and message in line


# digits of several scripts (str.isdigit takes them all; int() reads the Arabic-Indic and
# fullwidth ones as 0-9 and fails on superscripts), with signs and blanks
_NUMBERS = st.lists(st.sampled_from(["0", "1", "2", "6", "4", "9", "\u2076", "\u2074",
                                     "\u00b9", "\u0666", "\u0660", "\uff18", "-", " ", "_"]),
                    max_size=4).map("".join) | st.sampled_from(["64", "99999999999999999999"])


@st.composite
def _dynamic_texts(draw: st.DrawFn) -> str:
    """``INPUT:DIM=SYMBOL[:MIN..MAX]`` with odd numbers, or loose pieces of it."""
    name, symbol = draw(st.sampled_from(["x", "seq", ""])), draw(st.sampled_from(["s", "x", ""]))
    bounds = draw(st.none() | st.tuples(_NUMBERS, _NUMBERS).map("..".join) | _NUMBERS)
    text = f"{name}:{draw(_NUMBERS)}={symbol}" + ("" if bounds is None else f":{bounds}")
    return draw(st.just(text) | st.lists(st.sampled_from(list(text) + [":", "=", ".."]),
                                         max_size=12).map("".join))


@given(st.lists(_dynamic_texts(), min_size=1, max_size=3))
@settings(max_examples=300, deadline=None)
def test_any_dynamic_text_parses_to_a_range_in_ascii_digits_or_is_a_factory_error(texts):
    try:
        dims = parse_dynamic(texts)
    except FactoryError as e:
        assert str(e).startswith("--dynamic ") and "\n" not in str(e)
        return
    for d, text in zip(dims, texts, strict=True):
        assert d.min is not None and d.max is not None and 2 <= d.min < d.max
        # the dim and bounds were written in ASCII digits (no other script's digit read as one)
        m = re.fullmatch(r"[^:=]*:([0-9]+)=[^:]*(?::([0-9]+)\.\.([0-9]+))?", text)
        assert m is not None and int(m[1]) == d.dim, text
        assert m[2] is None or (int(m[2]), int(m[3])) == (d.min, d.max), text


def test_a_symbol_given_two_bounds_is_refused():
    with pytest.raises(FactoryError, match="symbol 'seq' was given bounds 2..64 before, 2..32"):
        parse_dynamic(["a:1=seq:2..64", "b:1=seq:2..32"])


def test_dynamic_without_torch_is_refused(capsys):
    assert main(["plan", "--dynamic", "x:0=rows:2..8"]) == 2
    assert "applies to a --torch model" in _one_error_line(capsys)


def test_dynamic_with_a_factorys_own_dynamic_shapes_is_refused(capsys):
    assert main(["plan", "--torch", f"{F}:llama_keyed", "--dynamic",
                 "input_ids:1=seq:2..64"]) == 2
    assert "give the dynamic sizes one way" in _one_error_line(capsys)


def test_plan_shows_the_dynamic_size_its_bounds_and_the_inputs_it_sizes(capsys):
    assert main(["plan", "--torch", MLP, "--dynamic", "x:0=rows:2..128", "--cores", "8"]) == 0
    assert ("run-time sizes: rows in 2..128, planned at 128 (x dim 0); run --param rows=N"
            in capsys.readouterr().out)


@pytest.mark.parametrize("rows", [3, 64, 100])
def test_run_param_runs_at_that_size_against_eager_at_that_size(rows, capsys):
    assert main(["run", "--torch", MLP, "--dynamic", "x:0=rows:2..128", "--param",
                 f"rows={rows}", "--check", "--cores", "8"]) == 0
    out = capsys.readouterr().out
    assert f"rows={rows})" in out and "matches the model run eagerly in PyTorch" in out


@pytest.mark.slow
def test_hugging_face_llama_with_a_mask_runs_at_a_dynamic_sequence_length(capsys):
    assert main(["run", "--torch", f"{F}:llama_masked", "--dynamic", "input_ids:1=seq:2..64",
                 "--dynamic", "attention_mask:1=seq", "--param", "seq=40", "--check",
                 "--cores", "8"]) == 0
    out = capsys.readouterr().out
    assert "seq=40)" in out and "matches the model run eagerly in PyTorch" in out


@pytest.mark.slow
def test_a_factorys_dynamic_shapes_run_at_a_param_size(capsys):
    assert main(["run", "--torch", f"{F}:llama_keyed", "--param", "seq=5", "--check",
                 "--cores", "8"]) == 0
    assert "matches the model run eagerly in PyTorch" in capsys.readouterr().out


@pytest.mark.parametrize(("param", "message"), [
    ("rows=200", "--param rows=200: outside rows's bounds 2..128"),
    ("seq=4", "--param seq=4: 'seq' is not a run-time size of --torch"),
])
def test_a_param_outside_the_bounds_or_unknown_is_refused(param, message, capsys):
    assert main(["run", "--torch", MLP, "--dynamic", "x:0=rows:2..128", "--param", param,
                 "--check"]) == 2
    assert message in _one_error_line(capsys)


@given(st.integers(2, 200))
@settings(max_examples=20, deadline=None)
def test_inputs_at_a_size_are_the_example_values_cut_or_repeated(rows):
    tm = _mlp_rows()
    x = tm.example_inputs[0]
    got = at_sizes(tm, {"rows": rows}).example_inputs[0]
    assert got.shape == (rows, x.shape[1])
    assert torch.equal(got, x.repeat(-(-rows // x.shape[0]), 1)[:rows])


_CACHE: dict[str, object] = {}


def _mlp_rows():
    if "tm" not in _CACHE:  # one export for every hypothesis example
        _CACHE["tm"] = load_model(MLP, dynamic=["x:0=rows:2..256"])
    return _CACHE["tm"]


# --- .pt2 files ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pt2(tmp_path_factory) -> dict[str, Path]:
    """The demo MLP saved static, with a dynamic row count, and with no example inputs."""
    from apportion.frontend.torch_demo import mlp

    model, (x,) = mlp()
    folder = tmp_path_factory.mktemp("pt2")
    rows = torch.export.Dim("rows", min=2, max=128)
    dynamic = torch.export.export(model, (x,), dynamic_shapes=({0: rows},))
    torch.export.save(torch.export.export(model, (x,)), folder / "mlp.pt2")
    torch.export.save(dynamic, folder / "mlp_rows.pt2")
    dynamic._example_inputs = None  # as a program exported with no inputs kept is saved
    torch.export.save(dynamic, folder / "mlp_bare.pt2")
    return {p.stem: p for p in folder.iterdir()}


def test_a_static_pt2_runs_on_its_stored_inputs_against_eager(pt2, capsys):
    assert main(["run", "--torch", str(pt2["mlp"]), "--check", "--cores", "8"]) == 0
    assert "matches the model run eagerly in PyTorch" in capsys.readouterr().out


def test_a_pt2_file_given_as_the_program_reads_as_torch(pt2, capsys):
    assert main(["plan", str(pt2["mlp"]), "--cores", "8"]) == 0
    assert "6 ops on spyre (8 cores" in capsys.readouterr().out
    assert main(["run", str(pt2["mlp"]), "--check", "--cores", "8"]) == 0
    assert "matches the model run eagerly" in capsys.readouterr().out


def test_a_dynamic_pt2_keeps_its_symbol_and_runs_at_a_param_size(pt2, capsys):
    tm = load_model(str(pt2["mlp_rows"]))
    (sym,) = tm.lowered.program.symbols
    assert (sym.min, sym.max) == (2, 128)
    assert tm.lowered.program.tensor("x").symbols == {0: sym.name}
    assert main(["run", "--torch", str(pt2["mlp_rows"]), "--param", f"{sym.name}=37",
                 "--check", "--cores", "8"]) == 0
    assert "matches the model run eagerly in PyTorch" in capsys.readouterr().out


def test_a_pt2_without_example_inputs_plans_and_refuses_run(pt2, capsys):
    assert main(["plan", "--torch", str(pt2["mlp_bare"]), "--cores", "8"]) == 0
    assert "run-time sizes: " in capsys.readouterr().out
    assert main(["emit", "--torch", str(pt2["mlp_bare"]), "--forall", "--cores", "8"]) == 0
    capsys.readouterr()
    assert main(["run", "--torch", str(pt2["mlp_bare"]), "--check"]) == 2
    assert "the file stores no example inputs to run on" in _one_error_line(capsys)


def test_a_missing_or_unreadable_pt2_is_one_error_line(tmp_path, capsys):
    assert main(["plan", "--torch", str(tmp_path / "none.pt2")]) == 2
    assert "no such .pt2 file" in _one_error_line(capsys)
    (tmp_path / "bad.pt2").write_text("not a zip")
    assert main(["plan", "--torch", str(tmp_path / "bad.pt2")]) == 2
    assert "torch.export.load cannot read it" in _one_error_line(capsys)


def test_dynamic_with_a_pt2_is_refused(pt2, capsys):
    assert main(["plan", "--torch", str(pt2["mlp"]), "--dynamic", "x:0=r:2..64"]) == 2
    assert "is a saved program" in _one_error_line(capsys)


def test_run_mesh_binds_a_dynamic_size_and_checks_against_eager_at_that_size(capsys):
    assert main(["run", "--torch", MLP, "--dynamic", "x:0=rows:2..128", "--mesh", "dp=2",
                 "--param", "rows=40", "--check"]) == 0
    assert "matches the model run eagerly in PyTorch" in capsys.readouterr().out
