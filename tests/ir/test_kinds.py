"""Tests of the op-kind registry: every kind's semantics against an independent numpy formula,
its dtype rule and attributes, and the kinds planned (both strategies, tiled where they can be)
and run core by core against the unplanned program."""

from __future__ import annotations

import math

import numpy as np
import pytest

import apportion as ap
from apportion.errors import ProgramError
from apportion.ir.affine import AffineExpr
from apportion.ir.kinds import KINDS, REDUCERS, Category, kind, names, resolve
from apportion.ir.op import Access, Op
from apportion.ir.program import Program, TensorType
from apportion.passes.pipeline import plan
from apportion.runtime import compare, random_inputs, run_unplanned
from apportion.target import spyre
from tests.helpers import program, run_planned

_erf = np.vectorize(math.erf)


def _softplus(a):
    return np.array([x if x > 20 else math.log1p(math.exp(x)) for x in a.ravel()]).reshape(a.shape)


# Written independently of the registry: what each elementwise kind must compute.
FORMULAS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "max": np.fmax, "min": np.fmin, "pow": lambda a, b: a ** b,
    "floor_div": lambda a, b: np.array([x // y for x, y in zip(a.ravel(), b.ravel(),
                                                              strict=True)]).reshape(a.shape),
    "remainder": lambda a, b: np.array([x % y for x, y in zip(a.ravel(), b.ravel(),
                                                             strict=True)]).reshape(a.shape),
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "logical_and": lambda a, b: (a != 0) & (b != 0), "logical_or": lambda a, b: (a != 0) | (b != 0),
    "logical_not": lambda a: a == 0, "where": lambda c, a, b: np.where(c != 0, a, b),
    "neg": lambda a: -a, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda a: a ** -0.5, "tanh": np.tanh, "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
    "relu": lambda a: np.where(a > 0, a, 0.0), "silu": lambda a: a / (1 + np.exp(-a)),
    "gelu": lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))),
    "square": lambda a: a * a, "reciprocal": lambda a: 1 / a, "sin": np.sin, "cos": np.cos,
    "erf": _erf, "softplus": _softplus, "copy": lambda a: a,
    "sign": lambda a: (a > 0).astype(float) - (a < 0),
    "clamp": lambda a: np.minimum(np.maximum(a, -0.5), 0.75),
    "relayout": lambda a: a, "fill": lambda: np.full((3, 7), 2.5),
}
FALLBACK_FORMULAS = {"sort": lambda a: np.sort(a, -1), "cumsum": lambda a: np.cumsum(a, -1),
                     "flip": lambda a: a[..., ::-1]}
# the whole-tensor fallbacks (PyTorch frontend): inputs and attributes, and the result
WHOLE_CASES = {
    "gather": ([np.arange(12.0).reshape(4, 3), np.array([[3, 0], [1, 1]])], {}, (2, 2, 3),
               lambda t, i: t[i]),
    "reshape": ([np.arange(12.0).reshape(3, 4)], {}, (2, 6), lambda a: a.reshape(2, 6)),
    "concat": ([np.ones((2, 3)), np.zeros((2, 1))], {"axis": 1}, (2, 4),
               lambda a, b: np.concatenate([a, b], 1)),
    "full": ([], {"value": -np.inf}, (2, 3), lambda: np.full((2, 3), -np.inf)),
    "arange": ([], {"start": 2, "step": 3}, (2, 2), lambda: np.array([[2.0, 5], [8, 11]])),
    "uniform": ([], {"low": 1, "high": 2, "seed": 7}, (3,),
                lambda: np.random.default_rng(7).uniform(1, 2, 3)),
    "normal": ([], {"seed": 7}, (3,), lambda: np.random.default_rng(7).normal(0, 1, 3)),
    "topk": ([np.array([[3.0, 1, 2], [0, 5, 4]])], {}, (2, 2),
             lambda a: np.array([[3.0, 2], [5, 4]])),
}
REDUCTION_FORMULAS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min,
                      "prod": np.prod, "any": lambda a, axis: np.any(a != 0, axis=axis),
                      "argmax": np.argmax, "max_pool": np.max, "avg_pool": np.mean}
ATTRS = {"clamp": {"min": -0.5, "max": 0.75}, "fill": {"value": 2.5}}
POSITIVE = {"log", "sqrt", "rsqrt", "pow", "div", "reciprocal"}

ELEMENTWISE = [k for k in KINDS if k.elementwise]


def test_every_kind_of_the_registry_has_a_formula_here():
    for k in KINDS:
        table = {Category.FALLBACK: WHOLE_CASES if k.whole else FALLBACK_FORMULAS,
                 Category.REDUCTION: REDUCTION_FORMULAS,
                 Category.MATMUL: {"matmul": None, "conv": None}}.get(k.category, FORMULAS)
        assert k.name in table, f"op kind {k.name!r} has no test formula"


def _inputs(k, rng, shape=(3, 7)):
    """Arrays for the kind's inputs in a domain it accepts, with their dtypes."""
    out = []
    for i in range(k.arity):
        if i in k.conditions:
            out.append(("bool", rng.random(shape) < 0.5))
        elif "float32" not in k.accepts:  # integer kinds: both signs, no zero divisor
            v = rng.integers(1, 9, shape) * rng.choice([-1, 1], shape)
            out.append(("int32", v.astype(np.int32)))
        else:
            lo = 0.5 if k.name in POSITIVE else -3.0
            v = rng.uniform(lo, 3.0, shape).astype(np.float32)
            if k.name in ("eq", "ne", "le", "ge") and i == 1:
                v[0] = out[0][1][0]  # some equal elements
            out.append(("float32", v))
    return out


@pytest.mark.parametrize("k", ELEMENTWISE, ids=[k.name for k in ELEMENTWISE])
def test_elementwise_kind_matches_its_numpy_formula_run_unplanned_and_planned(k):
    rng = np.random.default_rng(0)
    ins = _inputs(k, rng)
    names_ = [f"x{i}" for i in range(k.arity)]
    op = {"name": "f", "op": k.name, "out": "y[i,j]", "ins": [f"{n}[i,j]" for n in names_],
          **ATTRS.get(k.name, {}), **({"dims": {"i": 3, "j": 7}} if not k.arity else {})}
    p = program({n: ([3, 7], dt) for n, (dt, _) in zip(names_, ins, strict=True)}, [op], ["y"])
    xs = {n: a for n, (_, a) in zip(names_, ins, strict=True)}
    want = FORMULAS[k.name](*(a.astype(np.float64) if a.dtype != np.bool_ else a
                              for _, a in ins))
    got = run_unplanned(p, xs)["y"]
    values = k.value_inputs(k.arity)
    assert p.tensor("y").dtype == (k.result_dtype or (ins[values[0]][0] if values else
                                                      "float32"))
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64),
                               rtol=1e-6, atol=1e-6)
    for strategy in ("balanced", "greedy"):
        pl = plan(p, spyre(cores=8), strategy)
        assert all(c.ok for c in compare(run_unplanned(p, xs), run_planned(p, pl, xs), p))


@pytest.mark.parametrize("name", sorted(REDUCTION_FORMULAS))
def test_reduction_kind_matches_its_formula_when_split_across_cores(name):
    p = program({"x": ([4, 96], "float32")},
                [{"name": "r", "op": name, "out": "s[i]", "ins": ["x[i,k]"]}], ["s"])
    x = np.random.default_rng(1).uniform(-1, 1, (4, 96)).astype(np.float32)
    x[1] = 0.0
    want = REDUCTION_FORMULAS[name](x.astype(np.float64), axis=1)
    pl = plan(p, spyre(cores=8), "balanced")
    split = plan_with_split_k(p)
    for run in (run_unplanned(p, {"x": x}), run_planned(p, pl, {"x": x}),
                run_planned(p, split, {"x": x})):
        np.testing.assert_allclose(run["s"].astype(np.float64), want, rtol=1e-5, atol=1e-6)


def plan_with_split_k(p):
    """The program planned with its reduction dim pinned to 3 slices (a split reduction)."""
    from dataclasses import replace

    return plan(replace(p, work_division=(("r", (("k", 3),)),)), spyre(cores=8))


@pytest.mark.parametrize("name", sorted(FALLBACK_FORMULAS))
def test_fallback_kind_runs_whole_on_one_core_under_both_strategies(name):
    p = program({"x": ([3, 5], "float32")},
                [{"name": "f", "op": name, "out": "y[i,j]", "ins": ["x[i,j]"]}], ["y"])
    x = np.random.default_rng(2).uniform(-1, 1, (3, 5)).astype(np.float32)
    for strategy in ("balanced", "greedy"):
        pl = plan(p, spyre(cores=8), strategy)
        assert pl.op("f").cores == 1 and pl.op("f").kind == "fallback"
        np.testing.assert_allclose(run_planned(p, pl, {"x": x})["y"], FALLBACK_FORMULAS[name](x),
                                   rtol=1e-6)


@pytest.mark.parametrize("name", sorted(WHOLE_CASES))
def test_whole_tensor_fallback_runs_its_inputs_as_stored_into_the_output_shape(name):
    arrays, attrs, shape, want = WHOLE_CASES[name]
    letters = iter("abcdefgh")

    def access(tensor, dims):
        return Access(tensor, tuple(AffineExpr.dim(next(letters)) for _ in dims))

    ins = tuple(access(f"x{i}", a.shape) for i, a in enumerate(arrays))
    out = access("y", shape)
    sizes = {e.single_dim: n for acc, dims in ((out, shape), *((a, x.shape) for a, x in
                                                             zip(ins, arrays, strict=True)))
             for e, n in zip(acc.index, dims, strict=True)}
    text = {k: repr(float(v)) for k, v in attrs.items()}
    if not arrays:
        text["dtype"] = "float32"
    op = Op.build("w", name, out, ins, sizes, text)
    dtypes = ["int64" if a.dtype.kind == "i" else "float32" for a in arrays]
    tensors = [TensorType(f"x{i}", a.shape, d) for i, (a, d) in enumerate(zip(arrays, dtypes,
                                                                            strict=True))]
    out_dtype = op.kind.out_dtype(dtypes, dict(op.attrs), "w")
    p = Program("w", (*tensors, TensorType("y", shape, out_dtype)), tuple(t.name for t in tensors),
                ("y",), (op,))
    xs = {f"x{i}": a for i, a in enumerate(arrays)}
    for strategy in ("balanced", "greedy"):
        pl = plan(p, spyre(cores=8), strategy)
        assert pl.op("w").cores == 1 and pl.op("w").kind == "fallback"
        np.testing.assert_allclose(run_planned(p, pl, xs)["y"], want(*arrays), rtol=1e-6)


def test_whole_tensor_fallbacks_read_whole_axes_and_constants_take_a_dtype():
    x = Access.parse("x[i,j]")
    with pytest.raises(ProgramError, match="reshape indexes x.*through a sum or an offset"):
        Op.build("r", "reshape", Access.parse("y[k]"), (Access.parse("x[i,j+1]"),),
                 {"i": 2, "j": 3, "k": 6})
    with pytest.raises(ProgramError, match="full takes no attribute 'min'"):
        Op.build("f", "full", Access.parse("y[k]"), (), {"k": 2}, {"min": "1.0"})
    with pytest.raises(ProgramError, match="needs at least one of the attributes value"):
        Op.build("f", "full", Access.parse("y[k]"), (), {"k": 2}, {"dtype": "int64"})
    with pytest.raises(ProgramError, match="copy takes no attribute 'value'"):
        Op.build("c", "copy", Access.parse("y[i,j]"), (x,), {"i": 2, "j": 3}, {"value": "1.0"})
    full = Op.build("f", "full", Access.parse("y[k]"), (), {"k": 2},
                    {"dtype": "int64", "value": "-inf"})
    assert full.kind.out_dtype([], dict(full.attrs), "f") == "int64"
    with pytest.raises(ProgramError, match="'min' of clamp must be a finite number"):
        Op.build("c", "clamp", Access.parse("y[i,j]"), (x,), {"i": 2, "j": 3}, {"min": "-inf"})


def test_fallback_writes_through_its_output_index_map():
    p = program({"x": ([3, 5], "float32")},
                [{"name": "f", "op": "sort", "out": "y[n,m]", "ins": ["x[m,n]"]}], ["y"])
    x = np.random.default_rng(3).uniform(-1, 1, (3, 5)).astype(np.float32)
    assert p.tensor("y").shape == (5, 3)
    np.testing.assert_allclose(run_unplanned(p, {"x": x})["y"], np.sort(x, -1).T)
    np.testing.assert_allclose(run_planned(p, plan(p, spyre()), {"x": x})["y"], np.sort(x, -1).T)


def test_new_kinds_tile_in_a_loop_group_and_match_unplanned():
    rng_src = {"x": ([64, 256], "float16"), "c": ([64, 256], "bool")}
    ops = [
        {"name": "s", "op": "sin", "out": "a[m,n]", "ins": ["x[m,n]"]},
        {"name": "k", "op": "clamp", "out": "b[m,n]", "ins": ["a[m,n]"], "min": -0.5},
        {"name": "e", "op": "erf", "out": "e[m,n]", "ins": ["b[m,n]"]},
        {"name": "g", "op": "gt", "out": "g[m,n]", "ins": ["e[m,n]", "b[m,n]"]},
        {"name": "l", "op": "logical_or", "out": "l[m,n]", "ins": ["g[m,n]", "c[m,n]"]},
        {"name": "w", "op": "where", "out": "w[m,n]", "ins": ["l[m,n]", "e[m,n]", "x[m,n]"]},
        {"name": "sp", "op": "softplus", "out": "y[m,n]", "ins": ["w[m,n]"]},
    ]
    p = program(rng_src, ops, ["y"],
                tiling=[{"ops": [o["name"] for o in ops], "loops": [{"count": 4, "dims": ["m"]}]}])
    xs = random_inputs(p, seed=4)
    for strategy in ("balanced", "greedy"):
        pl = ap.plan(p, ap.targets.spyre(cores=16), strategy)
        assert pl.plan.groups and pl.plan.groups[0].lx_tensors
        assert all(c.ok for c in compare(run_unplanned(p, xs), pl.run(xs), p))


def test_integer_division_kinds_plan_and_run_exactly():
    p = program({"a": ([8, 64], "int32"), "b": ([8, 64], "int32")},
                [{"name": "q", "op": "floor_div", "out": "q[i,j]", "ins": ["a[i,j]", "b[i,j]"]},
                 {"name": "r", "op": "remainder", "out": "r[i,j]", "ins": ["q[i,j]", "b[i,j]"]}],
                ["r"])
    rng = np.random.default_rng(5)
    xs = {"a": rng.integers(-50, 50, (8, 64)).astype(np.int32),
          "b": (rng.integers(1, 7, (8, 64)) * rng.choice([-1, 1], (8, 64))).astype(np.int32)}
    want = (xs["a"] // xs["b"]) % xs["b"]
    for strategy in ("balanced", "greedy"):
        got = run_planned(p, plan(p, spyre(cores=8), strategy), xs)["r"]
        np.testing.assert_array_equal(got, want)


# --- dtype rules and attributes --------------------------------------------------------------

@pytest.mark.parametrize(("name", "dtype"), [("floor_div", "float16"), ("remainder", "float32"),
                                             ("sin", "int32"), ("erf", "int8"),
                                             ("softplus", "bool")])
def test_a_kind_refuses_dtypes_it_does_not_take_naming_op_and_dtype(name, dtype):
    k = kind(name, Category.POINTWISE)
    ins = [f"x{i}[i]" for i in range(k.arity)]
    with pytest.raises(ProgramError, match=rf"op 'f': {name} does not take {dtype}"):
        program({f"x{i}": ([4], dtype) for i in range(k.arity)},
                [{"name": "f", "op": name, "out": "y[i]", "ins": ins}], ["y"])


@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge", "logical_and",
                                  "logical_or", "logical_not"])
def test_comparisons_and_logic_give_bool(name):
    k = kind(name)
    p = program({f"x{i}": ([4], "float16") for i in range(k.arity)},
                [{"name": "f", "op": name, "out": "y[i]",
                  "ins": [f"x{i}[i]" for i in range(k.arity)]}], ["y"])
    assert p.tensor("y").dtype == "bool"


def test_where_takes_the_dtype_of_its_values_not_its_condition():
    p = program({"c": ([4], "bool"), "a": ([4], "bfloat16"), "b": ([4], "bfloat16")},
                [{"name": "w", "op": "where", "out": "y[i]", "ins": ["c[i]", "a[i]", "b[i]"]}],
                ["y"])
    assert p.tensor("y").dtype == "bfloat16"


@pytest.mark.parametrize(("attrs", "match"), [
    ({}, "clamp needs at least one of the attributes min, max"),
    ({"min": float("nan")}, "attribute 'min' of clamp must be a finite number"),
    ({"min": "low"}, "field 'min' must be a number"),
    ({"min": 0, "max": True}, "field 'max' must be a number"),
])
def test_clamp_attributes_are_checked(attrs, match):
    with pytest.raises(ProgramError, match=match):
        program({"x": ([4], "float32")},
                [{"name": "k", "op": "clamp", "out": "y[i]", "ins": ["x[i]"], **attrs}], ["y"])


def test_an_attribute_the_kind_does_not_take_is_an_error():
    with pytest.raises(ProgramError, match="exp takes no attribute 'min'"):
        program({"x": ([4], "float32")},
                [{"name": "e", "op": "exp", "out": "y[i]", "ins": ["x[i]"], "min": 1.0}], ["y"])


def test_builder_makes_one_function_per_registry_kind():
    for k in KINDS:
        if k.builder:
            assert callable(getattr(ap, k.builder)), k.builder
    x_dim = ap.dim("X", 8)
    with ap.program("b") as b:
        x = b.input("x", [x_dim], "float32")
        y = ap.clamp(ap.cos(x), min=0.0)
        b.output(ap.where(ap.ge(y, x), y, x), ap.cumsum(y))
    ops = [(o.fn, dict(o.attrs)) for o in b.program.ops]
    assert ops[:2] == [("cos", {}), ("clamp", {"min": "0.0"})]
    with pytest.raises(ProgramError, match="ap.where takes 3 tensors, got 2"):
        ap.where(x, x)


def test_max_and_min_resolve_by_inputs_and_reduction_dims():
    assert resolve("max", 2, False).category is Category.POINTWISE
    assert resolve("max", 1, True).reducer is REDUCERS["max"]
    assert "where" in names() and "fallback" in names()
    with pytest.raises(ProgramError, match="unknown op 'frobnicate'"):
        kind("frobnicate")


def test_reducers_carry_identity_accumulator_and_pairs():
    assert REDUCERS["prod"].identity == 1.0 and REDUCERS["max"].identity == -math.inf
    assert REDUCERS["sum"].accumulator_dtype("bfloat16") == "float32"
    assert REDUCERS["any"].accumulator_dtype("bool") == "bool"
    assert REDUCERS["argmax"].pairs and not REDUCERS["argmax"].tileable
    assert kind("matmul").reducer is REDUCERS["sum"] and kind("matmul").work_per_point == 2
