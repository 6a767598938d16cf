"""The parallel IR covers every op kind the reference executor runs: ``fill`` in its own dtype,
gathers and the other whole-tensor kinds as ``linalg.generic`` reading by computed index, dead
ops, host steps (random numbers) beside loop nests; the per-kind MLIR bodies are the iree
backend's own table. Each program is compiled and run in IREE against the reference."""

from __future__ import annotations

import importlib.util
import inspect
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import apportion as ap
import apportion.backends.bundle as bundle_backend
from apportion.backends.iree.run import IreeRun, iree_run, modules
from apportion.cli.main import main
from apportion.errors import EmitError, ExecutionError, PlanningError, ProgramError
from apportion.frontend.json_format import from_dict
from apportion.ir import kinds
from apportion.ir.kinds import KINDS, kind
from apportion.ir.op import Op
from apportion.mlir import bodies
from apportion.mlir.forall import forall_mlir, verify_mlir
from apportion.mlir.module import host_ops
from apportion.planned import PlannedProgram
from apportion.runtime.reference import random_inputs, run_unplanned
from apportion.schedule.parts import ops_in, segments
from apportion.schedule.values import Loop
from tests.backends.iree.emitting import emit
from tests.helpers import bound, checked, program

DTYPES = ["float16", "bfloat16", "float32", "int8", "int32", "int64", "bool"]


def check(planned: PlannedProgram, cache: Path, seed: int = 0) -> IreeRun:
    """Run ``planned`` in IREE and unplanned on the same random inputs; every output matches."""
    checks, run = checked(planned, lambda s, xs: iree_run(s, xs, cache), seed)
    bad = [c for c in checks if not c.ok]
    assert checks and not bad, bad
    return run


def plan(p: ap.Program, cores: int = 4) -> PlannedProgram:
    return ap.plan(p, ap.targets.spyre(cores=cores))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("iree")


# --- 1. fill in its own dtype --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_fill_runs_in_iree_in_every_dtype_split_over_cores(dtype, cache):
    value = {"bool": 1.0, "int8": -7.0, "int32": 123456.0, "int64": -2.0**40}.get(dtype, 2.75)
    p = program({"x": ([8, 64], dtype)},
                [{"name": "f", "op": "fill", "out": "c[i,j]", "ins": [], "value": value,
                  "dims": {"i": 8, "j": 64}, "dtype": dtype},
                 {"name": "a", "op": "max", "out": "y[i,j]", "ins": ["x[i,j]", "c[i,j]"]}],
                ["y", "c"], name=f"fill_{dtype}")
    planned = plan(p, cores=8)
    assert dict(planned.plan.op("f").splits) != {"i": 1, "j": 1}  # divided over cores
    run = check(planned, cache)
    want = np.asarray(value).astype(run.tensors["c"].dtype)
    assert np.all(run.tensors["c"] == want)


def test_fill_rounds_a_float_value_as_numpy_converts_it(cache):
    # 0.1 is not a float16 nor a bfloat16: each output rounds float64's 0.1 once, to nearest
    for dtype in ("float16", "bfloat16", "int32"):
        p = program({"x": ([4, 64], "float32")},
                    [{"name": "f", "op": "fill", "out": "c[i,j]", "ins": [], "value": -2.9,
                      "dims": {"i": 4, "j": 64}, "dtype": dtype},
                     {"name": "a", "op": "neg", "out": "y[i,j]", "ins": ["x[i,j]"]}],
                    ["y", "c"], name=f"round_{dtype}")
        planned = plan(p)
        run = iree_run(planned.lowered, random_inputs(planned.program), cache_dir=cache)
        want = run_unplanned(planned.program, random_inputs(planned.program))["c"]
        np.testing.assert_array_equal(run.tensors["c"], want)


# --- 2. gathers, embeddings and the other whole-tensor kinds -------------------------------------

def embedding_program(ids_dtype: str = "int64", table_dtype: str = "float32") -> ap.Program:
    """An embedding: rows of a table picked by integer ids, between two runs of divisible ops."""
    return program(
        {"ids": ([2, 3], ids_dtype), "table": ([10, 64], table_dtype),
         "w": ([64, 32], table_dtype)},
        [{"name": "scale", "op": "mul", "out": "t2[v,d]", "ins": ["table[v,d]", "table[v,d]"]},
         {"name": "emb", "op": "gather", "out": "e[b,s,d]", "ins": ["t2[v,d]", "ids[b,s]"]},
         {"name": "mm", "op": "matmul", "out": "y[b,s,n]", "ins": ["e[b,s,d]", "w[d,n]"]}],
        ["y", "e"], name="embedding")


@pytest.mark.parametrize("cores", [1, 8])
def test_an_embedding_is_parallel_ir_with_no_host_step(cores, cache):
    planned = plan(embedding_program(), cores)
    assert host_ops(planned.program) == ()
    assert segments(planned.lowered, host_ops(planned.program)) == [planned.lowered]
    text = emit(planned.program, planned.plan)
    assert re.search(r"= tensor\.extract %ids\[", text)  # the index, read by computed position
    assert re.search(r"= tensor\.extract %t2\w*\[", text)  # the table row it picks
    inputs = random_inputs(planned.program, seed=1)
    inputs["ids"] = np.array([[3, 0, 9], [-1, -10, 7]])  # negative: counted from the end
    run = iree_run(planned.lowered, inputs, cache_dir=cache)
    want = run_unplanned(planned.program, inputs)
    np.testing.assert_array_equal(run.tensors["e"], want["e"])
    np.testing.assert_allclose(run.tensors["y"], want["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ids_dtype", ["int8", "int32", "bool"])
def test_indices_of_any_integer_dtype_gather_as_numpy_takes_them(ids_dtype, cache):
    check(plan(embedding_program(ids_dtype, "bfloat16")), cache, seed=3)


@pytest.mark.parametrize("bad", [10, -11])
def test_an_index_outside_the_table_is_refused_as_the_reference_refuses_it(bad, cache):
    planned = plan(embedding_program())
    inputs = random_inputs(planned.program)
    inputs["ids"] = np.array([[1, 2, 3], [4, bad, 0]])
    with pytest.raises(ExecutionError) as reference:
        run_unplanned(planned.program, inputs)
    with pytest.raises(ExecutionError) as got:
        iree_run(planned.lowered, inputs, cache_dir=cache)
    assert str(got.value) == str(reference.value) == (
        f"op 'emb': gather failed: index {bad} is out of bounds for axis 0 with size 10")


def test_indices_the_program_computes_are_checked_after_the_run(cache):
    """The ids come from an integer add inside the module: the module returns them too."""
    p = program({"ids": ([6], "int32"), "k": ([6], "int32"), "table": ([5, 8], "float16")},
                [{"name": "shift", "op": "add", "out": "j[i]", "ins": ["ids[i]", "k[i]"]},
                 {"name": "emb", "op": "gather", "out": "e[i,d]", "ins": ["table[v,d]", "j[i]"]}],
                ["e"])
    planned = plan(p)
    inputs = random_inputs(planned.program, seed=2)
    inputs["ids"] = np.array([0, 1, 2, 3, 4, -5], dtype=np.int32)
    inputs["k"] = np.zeros(6, dtype=np.int32)
    run = iree_run(planned.lowered, inputs, cache_dir=cache)
    assert set(run.tensors) == {"ids", "k", "table", "e"}  # the checked indices stay inside
    np.testing.assert_array_equal(run.tensors["e"], run_unplanned(planned.program, inputs)["e"])
    inputs["k"] = np.array([0, 0, 0, 0, 1, 0], dtype=np.int32)
    with pytest.raises(ExecutionError, match="op 'emb': gather failed: index 5 is out of bounds "
                                             "for axis 0 with size 5"):
        iree_run(planned.lowered, inputs, cache_dir=cache)


def test_float_indices_are_refused_naming_the_op_and_tensor():
    planned = plan(embedding_program("float32"))
    with pytest.raises(EmitError, match=r"op 'emb': gather reads indices from tensor 'ids' of "
                                        r"dtype float32"):
        emit(planned.program, planned.plan)


def whole_kinds_program(dtype: str) -> ap.Program:
    """Every whole-tensor kind with a parallel IR: a reshape across digits, concatenations
    (negative axis, another dtype), constants (infinite where floats hold it), a range, top-k."""
    big = math.inf if dtype in ("float16", "bfloat16", "float32") else 5.0
    other = "int32" if dtype != "int32" else "float16"
    return program(
        {"x": ([4, 6], dtype), "y": ([4, 2], other)},
        [{"name": "rs", "op": "reshape", "out": "r[a,b]", "ins": ["x[i,j]"],
          "dims": {"a": 3, "b": 8}},
         {"name": "cat", "op": "concat", "out": "c[i,o]", "ins": ["x[i,j]", "y[i,k]"],
          "axis": -1, "dims": {"o": 8}},
         {"name": "cat0", "op": "concat", "out": "c0[o,j]", "ins": ["x[i,j]", "x[k,j]"],
          "axis": 0, "dims": {"o": 8}},
         {"name": "const", "op": "full", "out": "f[i,j]", "ins": [], "value": big,
          "dims": {"i": 2, "j": 3}, "dtype": dtype},
         {"name": "pos", "op": "arange", "out": "p[i,j]", "ins": [], "start": 1.0, "step": 0.5,
          "dims": {"i": 3, "j": 5}, "dtype": dtype},
         {"name": "top", "op": "topk", "out": "t[i,k]", "ins": ["x[i,j]"], "dims": {"k": 3}},
         {"name": "use", "op": "add", "out": "u[a,b]", "ins": ["r[a,b]", "r[a,b]"]}],
        ["r", "c", "c0", "f", "p", "t", "u"], name=f"whole_{dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_whole_tensor_kind_runs_in_iree_in_every_dtype(dtype, cache):
    planned = plan(whole_kinds_program(dtype))
    assert host_ops(planned.program) == ()
    check(planned, cache, seed=4)


def test_top_k_puts_nan_first_and_keeps_ties(cache):
    p = program({"x": ([2, 6], "float32")},
                [{"name": "top", "op": "topk", "out": "t[i,k]", "ins": ["x[i,j]"],
                  "dims": {"k": 4}}], ["t"])
    planned = plan(p)
    x = np.array([[1, np.nan, 3, 3, -np.inf, 2], [0, -0.0, 5, 5, 5, 1]], dtype=np.float32)
    got = iree_run(planned.lowered, {"x": x},
                   cache_dir=cache).tensors["t"]
    np.testing.assert_array_equal(got, run_unplanned(planned.program, {"x": x})["t"])


@pytest.mark.parametrize("size", [1, 5, 8])
def test_whole_tensor_kinds_over_run_time_sizes_run_at_any_size_in_one_module(size, cache):
    """An embedding of a run-time count of ids, a range over that count, a reshape, a
    concatenation and a top-k of the embedding: one function for every size, which the ids'
    shape gives."""
    p = from_dict({
        "format": "apportion.program/1", "name": "dyn", "symbols": {"B": {"max": 8}},
        "tensors": {"ids": {"shape": ["B"], "dtype": "int64"},
                    "table": {"shape": [10, 64], "dtype": "float16"},
                    "p": {"shape": ["B"], "dtype": "int64"},
                    "r": {"shape": ["B", 2, 32], "dtype": "float16"},
                    "c": {"shape": ["B", 128], "dtype": "float16"},
                    "t": {"shape": ["B", 3], "dtype": "float16"}},
        "inputs": ["ids", "table"], "outputs": ["e", "s", "r", "c", "t"], "ops": [
         {"name": "emb", "op": "gather", "out": "e[i,d]", "ins": ["table[v,d]", "ids[i]"]},
         {"name": "pos", "op": "arange", "out": "p[i]", "ins": [], "start": 2.0,
          "dtype": "int64"},
         {"name": "shift", "op": "add", "out": "s[i]", "ins": ["ids[i]", "p[i]"]},
         {"name": "rs", "op": "reshape", "out": "r[i,h,d]", "ins": ["e[j,c]"]},
         {"name": "cat", "op": "concat", "out": "c[i,o]", "ins": ["e[i,d]", "e[j,c]"],
          "axis": -1},
         {"name": "top", "op": "topk", "out": "t[i,k]", "ins": ["e[i,d]"]}]})
    planned = plan(p)
    assert host_ops(planned.program) == ()
    checks, run = checked(planned, lambda s, xs: iree_run(s, xs, cache), 2, {"B": size})
    assert checks and all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert run.tensors["e"].shape == (size, 64)


def test_random_numbers_are_refused_by_the_emitter_naming_kind_and_backend():
    p = program({"x": ([4, 8], "float32")},
                [{"name": "noise", "op": "normal", "out": "n[i,j]", "ins": [],
                  "dims": {"i": 4, "j": 8}, "dtype": "float32"},
                 {"name": "a", "op": "add", "out": "y[i,j]", "ins": ["x[i,j]", "n[i,j]"]}],
                ["y"])
    planned = plan(p)
    with pytest.raises(EmitError, match=r"op 'noise': kind 'normal' has no MLIR body in the "
                                        r"iree backend \(numpy's random generator runs on the "
                                        r"host\)"):
        emit(planned.program, planned.plan)
    assert host_ops(planned.program) == ("noise",)


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


torch_models = pytest.mark.skipif(not (_has("torch") and _has("transformers")),
                                  reason="needs torch and transformers")


@pytest.mark.slow
@torch_models
def test_emit_forall_covers_a_whole_model_with_embeddings(capsys):
    rc = main(["emit", "--torch", "apportion.frontend.torch_demo:tiny_gpt2", "--forall",
               "--cores", "8"])
    text = capsys.readouterr().out
    assert rc == 0
    verify_mlir(text)
    assert text.startswith("func.func @tiny_gpt2(")
    assert len(re.findall(r"tensor\.extract %\w+\[", text)) >= 2  # token and position rows


@torch_models
@pytest.mark.slow
def test_run_a_model_with_embeddings_in_iree_matches_eager(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    rc = main(["run", "--torch", "apportion.frontend.torch_demo:tiny_llama", "--backend",
               "iree", "--check", "--cores", "8"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "(balanced, 8 cores, iree) matches the model run eagerly in PyTorch" in out


@torch_models
@pytest.mark.slow
def test_a_model_at_a_run_time_sequence_length_runs_in_iree_and_matches_eager(cache):
    import torch

    from apportion.frontend import torch_demo

    model, (ids,) = torch_demo.tiny_gpt2()
    seq = torch.export.Dim("seq", min=2, max=64)
    tp = ap.from_torch(model, (ids,), kwargs={"attention_mask": torch.ones_like(ids)},
                       dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    planned = plan(tp.program, cores=8)
    assert host_ops(planned.program) == ()
    x = torch.randint(0, 1000, (1, 40))
    xs = tp.inputs(x, attention_mask=torch.ones_like(x))
    run = iree_run(bound(planned, inputs=xs), xs, cache_dir=cache)
    got, = tp.torch_outputs(run.tensors)
    with torch.no_grad():
        want = model(x, attention_mask=torch.ones_like(x)).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# --- 3. dead ops ---------------------------------------------------------------------------------

def dead_program(tiled: bool) -> ap.Program:
    """Dead ops (results nobody reads, not outputs) before and after a host step that reads a
    tensor (a sort, once the table lacks it), beside random numbers, and inside a loop
    group."""
    return program(
        {"x": ([8, 64], "float32")},
        [{"name": "dead0", "op": "exp", "out": "d0[i,j]", "ins": ["x[i,j]"]},
         {"name": "srt", "op": "fallback", "fn": "sort", "out": "o[i,j]", "ins": ["x[i,j]"]},
         {"name": "noise", "op": "uniform", "out": "n[i,j]", "ins": [], "dims": {"i": 8, "j": 64},
          "seed": 5, "dtype": "float32"},
         {"name": "add", "op": "add", "out": "s[i,j]", "ins": ["o[i,j]", "n[i,j]"]},
         {"name": "dead1", "op": "sum", "out": "d1[i,0]", "ins": ["s[i,j]"]},
         {"name": "act", "op": "relu", "out": "y[i,j]", "ins": ["s[i,j]"]},
         {"name": "dead2", "op": "fill", "out": "d2[i,j]", "ins": [], "value": 1.0,
          "dims": {"i": 8, "j": 64}, "dtype": "float16"}],
        ["y"], name="dead", tiling=[{"ops": ["add", "dead1", "act"],
                                     "loops": [{"count": 2, "dims": ["i"]}]}] if tiled else [])


def parts_of(planned: PlannedProgram) -> list[Any]:
    """The segments of a plan by name: a host op's name, a module's op names."""
    return [s.name if isinstance(s, Op) else [o.name for o in s.program.ops]
            for s in segments(planned.lowered, host_ops(planned.program))]


@pytest.mark.parametrize("tiled", [False, True])
def test_dead_ops_anywhere_give_valid_ir_and_run(tiled, cache, monkeypatch):
    monkeypatch.delitem(bodies.BODIES, "sort")  # a host step that reads a tensor
    planned = plan(dead_program(tiled))
    assert host_ops(planned.program) == ("srt", "noise")
    # random numbers first; the run of the dead op before the sort is left out: nothing
    # reads it
    assert parts_of(planned) == ["noise", "srt", ["add", "dead1", "act", "dead2"]]
    for part in modules(planned.lowered):
        text = forall_mlir(part.covering)
        verify_mlir(text)
        assert not re.search(r"return\s*:", text)
    check(planned, cache)


def test_a_program_of_dead_ops_and_outputs_it_takes_as_given_emits_valid_ir(cache):
    p = program({"x": ([4, 64], "float16")},
                [{"name": "dead", "op": "exp", "out": "d[i,j]", "ins": ["x[i,j]"]},
                 {"name": "out", "op": "neg", "out": "y[i,j]", "ins": ["x[i,j]"]}], ["y", "x"])
    check(plan(p), cache)


# --- 4. host steps beside loop nests -------------------------------------------------------------

def nests_program(noise_in_group: bool) -> ap.Program:
    """Two loop nests around a host step that reads a tensor (a sort, once the table lacks
    it), and random numbers outside the nests or inside the second."""
    noise = {"name": "noise", "op": "uniform", "out": "r[i,n]", "ins": [],
             "dims": {"i": 16, "n": 128}, "low": -0.1, "high": 0.1, "seed": 7,
             "dtype": "float16"}
    second = ["noise", "mix", "mx", "sub"] if noise_in_group else ["mix", "mx", "sub"]
    return program(
        {"x": ([16, 128], "float16"), "w": ([128, 128], "float16")},
        [{"name": "mm", "op": "matmul", "out": "h[i,n]", "ins": ["x[i,k]", "w[k,n]"]},
         {"name": "act", "op": "silu", "out": "a[i,n]", "ins": ["h[i,n]"]},
         {"name": "srt", "op": "fallback", "fn": "sort", "out": "o[i,n]", "ins": ["a[i,n]"]},
         noise,
         {"name": "mix", "op": "add", "out": "m[i,n]", "ins": ["o[i,n]", "r[i,n]"]},
         {"name": "mx", "op": "max", "out": "t[i,0]", "ins": ["m[i,n]"]},
         {"name": "sub", "op": "sub", "out": "y[i,n]", "ins": ["m[i,n]", "t[i,0]"]}],
        ["y"], name="nests",
        tiling=[{"ops": ["mm", "act"], "loops": [{"count": 2, "dims": ["i"]},
                                                 {"count": 2, "dims": ["n"]}]},
                {"ops": second, "loops": [{"count": 4, "dims": ["i"]}]}])


@pytest.mark.parametrize("noise_in_group", [False, True])
def test_host_steps_run_between_modules_that_keep_their_loop_nests(noise_in_group, cache,
                                                                     monkeypatch):
    monkeypatch.delitem(bodies.BODIES, "sort")
    planned = plan(nests_program(noise_in_group), cores=8)
    assert len(planned.plan.groups) == 2
    assert parts_of(planned) == ["noise", ["mm", "act"], "srt", ["mix", "mx", "sub"]]
    lifted, first, srt, last = segments(planned.lowered, host_ops(planned.program))
    assert [t.ops for t in first.program.tiling] == [("mm", "act")]
    assert [t.ops for t in last.program.tiling] == [("mix", "mx", "sub")]
    assert [[s.op for s in ops_in(lp)] for lp in first.steps if isinstance(lp, Loop)] == \
        [["mm", "act"]]
    assert [[s.op for s in ops_in(lp)] for lp in last.steps if isinstance(lp, Loop)] == \
        [["mix", "mx", "sub"]]
    assert "r" in last.program.inputs  # the random numbers, made on the host before the modules
    assert "scf.for" in forall_mlir(first) and "scf.for" in forall_mlir(last)
    check(planned, cache, seed=1)


def test_a_host_step_that_reads_a_tensor_inside_a_loop_group_is_refused(monkeypatch):
    monkeypatch.delitem(bodies.BODIES, "exp")
    p = program({"x": ([8, 64], "float32")},
                [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]},
                 {"name": "n", "op": "neg", "out": "z[i,j]", "ins": ["y[i,j]"]}], ["z"],
                tiling=[{"ops": ["e", "n"], "loops": [{"count": 2, "dims": ["i"]}]}])
    planned = plan(p)
    with pytest.raises(ExecutionError, match=r"op 'e' \(exp\) runs on the host but sits in "
                                             r"loop group \[0\] \['e', 'n'\]"):
        modules(planned.lowered)


# --- 5. the per-kind table is the backend's ------------------------------------------------------

def test_every_registry_kind_has_a_body_or_runs_on_the_host():
    missing = [k.name for k in KINDS if not bodies.supported(k)]
    assert missing == ["uniform", "normal"]
    assert host_ops(program({}, [{"name": "u", "op": "uniform", "out": "u[i]", "ins": [],
                                  "dims": {"i": 4}}], ["u"])) == ("u",)


def test_the_registry_and_the_bundle_backend_hold_no_mlir_bodies():
    assert not re.search(r"arith\.|MlirBody|mlir_body", inspect.getsource(kinds))
    for module in (kinds, bundle_backend):
        assert "bodies" not in {name for name, _ in inspect.getmembers(module)}
    for path in Path(bundle_backend.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) apportion\.backends\.iree", text, re.M), path
        assert "mlir_body" not in text and "MlirBody" not in text, path


def test_a_kind_the_table_lacks_is_refused_in_one_place_naming_kind_and_backend(monkeypatch):
    p = program({"x": ([4, 64], "float16")},
                [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]},
                 {"name": "r", "op": "sum", "out": "s[i,0]", "ins": ["x[i,j]"]},
                 {"name": "f", "op": "fallback", "fn": "sort", "out": "z[i,j]",
                  "ins": ["x[i,j]"]}], ["y", "s", "z"])
    planned = plan(p, cores=2)
    for table, key, op, name in [(bodies.BODIES, "exp", "e", "exp"),
                                 (bodies.REDUCER_OPS, "sum", "r", "sum"),
                                 (bodies.BODIES, "sort", "f", "sort")]:
        with monkeypatch.context() as m:
            m.delitem(table, key)
            assert not bodies.supported(kind(name))
            with pytest.raises(EmitError, match=rf"op '{op}': kind '{name}' has no MLIR body "
                                                r"in the iree backend"):
                emit(planned.program, planned.plan)


def test_the_integer_templates_follow_the_registry_s_exact_integers():
    for k in KINDS:
        if k.whole or not bodies.supported(k):
            continue
        found = [bodies.BODIES[k.name]] if k.category is not kinds.Category.REDUCTION else []
        found += [bodies.REDUCER_OPS[k.reducer.name].combine] if k.reducer is not None else []
        assert all(b.int is not None for b in found) == k.exact_integers, k.name


# --- the property: every plan the reference runs, IREE runs and matches --------------------------

@st.composite
def op_programs(draw: Any) -> tuple[ap.Program, int]:
    """Random programs of fills, gathers and dead ops among pointwise ops and reductions,
    tiled or not, with a host step (random numbers) outside the loops or inside them now and
    then."""
    dtype = draw(st.sampled_from(["float16", "bfloat16", "float32", "int32"]))
    m = draw(st.sampled_from([1, 2, 4, 6]))
    n = draw(st.sampled_from([1, 3, 64, 96]))
    rows = draw(st.integers(4, 9))
    tensors = {"ids": ([m], draw(st.sampled_from(["int64", "int32"]))),
               "table": ([rows, n], dtype), "x": ([m, n], dtype)}
    ops: list[dict[str, Any]] = [
        {"name": "emb", "op": "gather", "out": "e[i,d]", "ins": ["table[v,d]", "ids[i]"]}]
    if draw(st.booleans()):
        ops.append({"name": "dead_pre", "op": "neg", "out": "dp[i,d]", "ins": ["x[i,d]"]})
    # random numbers (a host step) outside the loop group or inside it
    host = draw(st.sampled_from(["none", "outside", "inside"])) if dtype != "int32" else "none"
    noise = {"name": "noise", "op": "uniform", "out": "nz[i,d]", "ins": [],
             "dims": {"i": m, "d": n}, "seed": draw(st.integers(0, 9)), "dtype": dtype}
    if host == "outside":
        ops.append(noise)
    body: list[dict[str, Any]] = [noise] if host == "inside" else []
    body += [
        {"name": "c", "op": "fill", "out": "c[i,d]", "ins": [], "dims": {"i": m, "d": n},
         "value": draw(st.sampled_from([0.5, -3.0, 2.0])), "dtype": dtype},
        {"name": "s", "op": draw(st.sampled_from(["add", "mul", "max", "sub"])),
         "out": "s[i,d]", "ins": ["e[i,d]", "c[i,d]"]}]
    cur = "s"
    if host != "none":
        body.append({"name": "h", "op": "add", "out": "h[i,d]", "ins": ["s[i,d]", "nz[i,d]"]})
        cur = "h"
    if draw(st.booleans()):
        body.append({"name": "dead_in", "op": "abs", "out": "di[i,d]", "ins": [f"{cur}[i,d]"]})
    body.append({"name": "r", "op": draw(st.sampled_from(["sum", "max", "min"])),
                 "out": "y[i,0]", "ins": [f"{cur}[i,d]"]})
    ops += body
    tiling = []
    if m > 1 and draw(st.booleans()):
        tiling = [{"ops": [o["name"] for o in body],
                   "loops": [{"count": draw(st.sampled_from([d for d in (2, m) if m % d == 0])),
                              "dims": ["i"]}]}]
    p = program(tensors, ops, ["y", cur] if draw(st.booleans()) else ["y"], tiling=tiling)
    return p, draw(st.integers(1, 8))


def _property(case: tuple[ap.Program, int], cache: Path, seed: int) -> None:
    p, cores = case
    try:
        planned = plan(p, cores)
    except (PlanningError, ProgramError):
        assume(False)
        return
    try:  # the plans the reference runs exactly
        run_unplanned(planned.program, random_inputs(planned.program, seed))
    except ExecutionError:
        assume(False)
    check(planned, cache, seed)


def _settings(n: int) -> Any:
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@_settings(4)
@given(op_programs(), st.integers(0, 3))
def test_random_programs_of_fills_gathers_and_dead_ops_run_in_iree(cache, case, seed):
    _property(case, cache, seed)


@pytest.mark.slow
@_settings(40)
@given(op_programs(), st.integers(0, 3))
def test_many_random_programs_of_fills_gathers_and_dead_ops_run_in_iree(cache, case, seed):
    _property(case, cache, seed)
