"""The threaded torch executor against the reference executor: every example, the generated
programs of the other executors' tests (small programs of every dtype, redrawn uneven and split
reductions, tiled programs with symbolic counts, the newer kinds), 1, 8 and 32 cores, 1 and 4
threads."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import apportion as ap  # noqa: E402
from apportion.backends.torch import executor as torch_exec  # noqa: E402
from apportion.backends.torch.executor import GRAIN, TorchExecutor, run_torch  # noqa: E402
from apportion.backends.torch.kernels import XP  # noqa: E402
from apportion.backends.torch.steps import Step  # noqa: E402
from apportion.backends.torch.tensors import from_torch_storage, to_torch_storage  # noqa: E402
from apportion.errors import ExecutionError, PlanningError, ProgramError  # noqa: E402
from apportion.frontend.json_format import from_dict  # noqa: E402
from apportion.planned import PlannedProgram  # noqa: E402
from apportion.runtime.reference import compare, random_inputs, run_unplanned  # noqa: E402
from tests.backends.reference.test_loops_properties import tiled_programs  # noqa: E402
from tests.helpers import (  # noqa: E402
    bound,
    edge_accesses_program,
    program,
    run_planned,
    runnable_examples,
    schedule_of,
)
from tests.mlir.test_forall import (  # noqa: E402
    golden,
    plan_small,
    resplit,
    resplit_programs,
    small_programs,
)
from tests.passes.test_kinds_properties import kind_programs  # noqa: E402

ROOT = Path(__file__).parents[3]
EXAMPLES = runnable_examples(ROOT)
CORES = (1, 8, 32)
THREADS = (1, 4)

#: the kinds a model's hot path is made of: they must run as torch kernels, never numpy
HOT = {"matmul", "add", "sub", "mul", "div", "exp", "sum", "max", "mean", "silu", "rsqrt",
       "copy", "where", "neg", "gather"}


def numpy_outputs(ys: dict) -> dict[str, np.ndarray]:
    return {name: from_torch_storage(y) for name, y in ys.items()}


def check(planned: PlannedProgram, threads: int, seed: int = 0,
          params: dict[str, int] | None = None) -> dict:
    """run_torch against the reference executor run of the same plan, every output; every op
    with more than one core on the pool (grain 0), however small."""
    xs = random_inputs(planned.program, seed)
    want = run_planned(planned.program, planned.plan, xs, params=params)
    ys = run_torch(bound(planned, params), xs, threads, grain=0)
    assert set(ys) == set(planned.program.outputs)
    for name, y in ys.items():
        t = planned.program.tensor(name)
        assert isinstance(y, torch.Tensor) and tuple(y.shape) == t.shape
        assert y.dtype == getattr(torch, t.dtype)
    checks = compare(want, numpy_outputs(ys), planned.program)
    bad = [c for c in checks if not c.ok]
    assert checks and not bad, bad
    return ys


# --- programs --------------------------------------------------------------------------------

@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("cores", CORES)
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow)
                                  if "lm_head" in p.name else p for p in EXAMPLES],
                         ids=lambda p: p.stem)
def test_every_example_matches_the_reference_executor(path, cores, threads):
    check(ap.plan(ap.load(path), ap.targets.spyre(cores=cores)), threads)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_hot_kinds_run_as_torch_kernels(path):
    planned = ap.plan(ap.load(path), ap.targets.spyre(cores=8))
    ex = TorchExecutor(planned.lowered)
    modes = {s.op.kind.name: s.mode for s in ex.steps}
    assert not {k for k, m in modes.items() if k in HOT and m == "numpy"}, modes


def test_uneven_splits_and_split_reductions():
    check(golden(), threads=4)  # exp over rows 4, 3, 3; a row sum split over its reduction
    p = program({"x": ([10, 96], "float32"), "y": ([10, 96], "float32"),
                 "w": ([96, 40], "float16")},
                [{"name": "d", "op": "sub", "out": "d[i,j]", "ins": ["x[i,j]", "y[i,j]"]},
                 {"name": "m", "op": "max", "out": "m[i,0]", "ins": ["d[i,j]"]},
                 {"name": "a", "op": "argmax", "out": "a[i]", "ins": ["d[i,j]"]},
                 {"name": "mm", "op": "matmul", "out": "mm[i,n]", "ins": ["x[i,j]", "w[j,n]"]}],
                ["d", "m", "a", "mm"])
    planned = resplit(ap.plan(p, ap.targets.spyre(cores=4)),
                      {"d": {"i": 3, "j": 2}, "m": {"i": 3, "j": 2}, "a": {"j": 3},
                       "mm": {"i": 2, "j": 3}})
    for threads in THREADS:
        check(planned, threads)


def test_edge_accesses():
    """Rank-0 tensors, literal indices, a diagonal, strided and offset reads, a window of sums
    (64*h+d), a transposed write, a reduction dim no input reads, an input returned as is."""
    p = edge_accesses_program()
    for cores in CORES:
        for threads in THREADS:
            check(ap.plan(p, ap.targets.spyre(cores=cores)), threads)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int8", "int32", "int64"])
def test_every_dtype_keeps_its_storage_and_integers_stay_exact(dtype):
    p = program({"x": ([6, 128], dtype), "y": ([6, 128], dtype), "w": ([128, 32], dtype)},
                [{"name": "a", "op": "add", "out": "a[i,j]", "ins": ["x[i,j]", "y[i,j]"]},
                 {"name": "d", "op": "div", "out": "d[i,j]", "ins": ["a[i,j]", "y[i,j]"]},
                 {"name": "s", "op": "sum", "out": "s[i,0]", "ins": ["a[i,j]"]},
                 {"name": "k", "op": "argmax", "out": "k[i]", "ins": ["d[i,j]"]},
                 {"name": "mm", "op": "matmul", "out": "mm[i,n]", "ins": ["x[i,j]", "w[j,n]"]},
                 {"name": "lt", "op": "lt", "out": "lt[i,j]", "ins": ["x[i,j]", "y[i,j]"]}],
                ["a", "d", "s", "k", "mm", "lt"])
    ys = check(ap.plan(p, ap.targets.spyre(cores=8)), threads=4)
    if dtype.startswith("int"):  # exact: the reference's integers, not within a tolerance
        xs = random_inputs(p)
        want = run_unplanned(p, xs)
        for name in ("a", "d", "s", "mm"):
            np.testing.assert_array_equal(from_torch_storage(ys[name]), want[name])
    assert ys["k"].dtype == torch.int64 and ys["lt"].dtype == torch.bool


def test_fallbacks_and_whole_tensor_kinds():
    """cumsum, sort and flip along the last axis (sort through numpy), a gather of rows, a reshape,
    a concat, constants and random numbers, each whole on one core."""
    p = program({"x": ([4, 64], "float32"), "ids": ([3], "int64"), "t": ([10, 8], "float16")},
                [{"name": "cs", "op": "cumsum", "out": "cs[i,j]", "ins": ["x[i,j]"]},
                 {"name": "so", "op": "sort", "out": "so[j,i]", "ins": ["x[i,j]"]},
                 {"name": "fl", "op": "flip", "out": "fl[i,j]", "ins": ["x[i,j]"]},
                 {"name": "g", "op": "gather", "out": "g[a,b]", "ins": ["t[r,b]", "ids[a]"],
                  "dims": {"r": 10}},
                 {"name": "e", "op": "exp", "out": "e[i,j]", "ins": ["cs[i,j]"]}],
                ["cs", "so", "fl", "g", "e"])
    for threads in THREADS:
        check(ap.plan(p, ap.targets.spyre(cores=8)), threads)


def test_float64_and_int64_scans_run_in_torch_with_the_references_numbers():
    """cumsum and flip of float32 (computed in float64) and int64 run in torch, equal to the
    reference bit for bit, also read and written through a transpose; a float16 cumsum, which
    the reference adds in float32 (torch would add in float64), stays with the reference."""
    p = program({"x": ([4, 64], "float32"), "n": ([5, 9], "int64"), "h": ([3, 16], "float16")},
                [{"name": "cs", "op": "cumsum", "out": "cs[i,j]", "ins": ["x[i,j]"]},
                 {"name": "ct", "op": "cumsum", "out": "ct[j,i]", "ins": ["x[i,j]"]},
                 {"name": "ci", "op": "cumsum", "out": "ci[a,b]", "ins": ["n[a,b]"]},
                 {"name": "fl", "op": "flip", "out": "fl[a,b]", "ins": ["n[a,b]"]},
                 {"name": "ch", "op": "cumsum", "out": "ch[c,d]", "ins": ["h[c,d]"]}],
                ["cs", "ct", "ci", "fl", "ch"])
    planned = ap.plan(p, ap.targets.spyre(cores=8))
    modes = {s.op.name: s.mode for s in TorchExecutor(planned.lowered).steps}
    assert modes == {"cs": "scan", "ct": "scan", "ci": "scan", "fl": "scan", "ch": "numpy"}
    xs = random_inputs(p, 3)
    want = run_unplanned(p, xs)
    got = numpy_outputs(run_torch(planned.lowered, xs))
    for name in ("cs", "ct", "ci", "fl"):
        np.testing.assert_array_equal(got[name], want[name])
    check(planned, 1)


def test_a_power_by_a_scalar_operand_takes_torchs_scalar_power_and_matches_the_reference(
        monkeypatch):
    """pow(x, s) with s a one-element tensor (GPT-2's gelu: x ** 3): the exponent is cast
    once and passed as a number (torch's x * x * x), not a power per element; the numbers
    stay within the float32 tolerance of the reference's."""
    from apportion.backends.torch import kernels

    p = program({"x": ([16, 512], "float32"), "s": ([], "float32")},
                [{"name": "p", "op": "pow", "out": "y[i,j]", "ins": ["x[i,j]", "s[]"]}], ["y"])
    planned = ap.plan(p, ap.targets.spyre(cores=8))
    xs = random_inputs(p, 1)
    xs["s"] = np.asarray(3.0, dtype=np.float32)
    seen = []
    real = torch.pow

    def spy(a, b):
        seen.append(type(b))
        return real(a, b)

    monkeypatch.setattr(torch, "pow", spy)
    got = numpy_outputs(run_torch(planned.lowered, xs))
    monkeypatch.undo()
    assert seen and all(t is float for t in seen), seen
    assert all(c.ok for c in compare(run_unplanned(p, xs), got, p))
    x = torch.randn(64, dtype=torch.float64)
    three = torch.tensor(3.0, dtype=torch.float64).expand(64)
    assert torch.equal(kernels.direct("pow")(x, three), x * x * x)


def test_inputs_that_need_gradients_are_read_detached():
    planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8))
    xs = {n: to_torch_storage(x, planned.program.tensor(n).dtype)
          for n, x in random_inputs(planned.program).items()}
    with_grad = {n: (x.float().requires_grad_().to(x.dtype) if x.is_floating_point() else x)
                 for n, x in xs.items()}
    a, b = run_torch(planned.lowered, xs), run_torch(planned.lowered, with_grad)
    assert all(torch.equal(a[n], b[n]) and not b[n].requires_grad for n in a)


def test_fill_conv_pooling_topk_and_relayout():
    """A constant over cores, 1-d and strided 2-d convolutions (windows read through index
    sums: overlapping strided views), max and average pooling, top-k on one core, and the
    planner's re-layout copy of a transposed read."""
    L, C, F, K = ap.dim("L", 130), ap.dim("C", 64), ap.dim("F", 128), ap.dim("K", 3)
    H, W, C2, F2 = ap.dim("H", 17), ap.dim("W", 17), ap.dim("C2", 32), ap.dim("F2", 64)
    R, N = ap.dim("R", 64), ap.dim("N", 256)
    with ap.program("kinds") as b:
        x = b.input("x", [L, C], "float32")
        w = b.input("w", [K, C, F], "float32")
        img = b.input("img", [H, W, C2], "float32")
        w2 = b.input("w2", [ap.dim("KH", 3), ap.dim("KW", 3), C2, F2], "float32")
        y = b.input("y", [R, N], "float16")
        b.output(ap.conv(x, w))
        b.output(ap.conv(img, w2, stride=2))
        b.output(ap.max_pool(x, [L], 4, 2))
        b.output(ap.avg_pool(x, [L], 4, 2))
        b.output(ap.topk(y, 5))
        b.output(y * ap.fill([R, N], 0.25, "float16"))
    for cores in CORES:
        planned = ap.plan(b.program, ap.targets.spyre(cores=cores))
        assert {s.mode for s in TorchExecutor(planned.lowered).steps} >= {
            "mm", "reduce", "elementwise", "numpy"}  # numpy: top-k only
        for threads in THREADS:
            check(planned, threads)
    relayout = program({"x": ([64, 256], "float16"), "y": ([256, 64], "float16")},
                       [{"name": "a", "op": "add", "out": "z[m,n]", "ins": ["x[m,n]", "y[n,m]"]}],
                       ["z"])
    planned = ap.plan(relayout, ap.targets.spyre(cores=8))
    assert [o.name for o in planned.program.ops] == ["y.relayout0", "a"]
    check(planned, threads=4)


# --- outputs written through a merge of dims ---------------------------------------------------

def declared(tensors: dict, inputs: list[str], ops: list[dict], outputs: list[str],
             **extra) -> ap.Program:
    """A program with every tensor declared, a merged write's output too."""
    return from_dict({"format": "apportion.program/1", "name": extra.pop("name", "merged"),
                      "tensors": {n: {"shape": s, "dtype": d} for n, (s, d) in tensors.items()},
                      "inputs": inputs, "outputs": outputs, "ops": ops, **extra})


def merged_program(case: str, cores: int) -> ap.Program:
    """One kind of op writing its output through a merge of dims, then a reader of it."""
    f32 = "float32"
    if case == "pointwise":  # heads side by side: a reshape of x, exp'd
        return declared({"x": ([8, 4, 64], f32), "y": ([8, 256], f32), "z": ([8, 256], f32)},
                        ["x"], [{"name": "m", "op": "exp", "out": "y[t,64*h+d]",
                                 "ins": ["x[t,h,d]"]},
                                {"name": "e", "op": "neg", "out": "z[t,j]", "ins": ["y[t,j]"]}],
                        ["z"])
    if case in ("matmul", "einsum", "split-k"):  # per head q @ w, the heads merged
        q = ([8, 4, 256, 2], f32) if case == "einsum" else ([8, 4, 256], f32)
        qa = "q[t,h,k,e]" if case == "einsum" else "q[t,h,k]"  # e: only q reads it
        extra = {"split_k": {"mm": 4}} if case == "split-k" and cores >= 4 else {}
        return declared({"q": q, "w": ([4, 256, 64], f32), "o": ([8, 256], f32)}, ["q", "w"],
                        [{"name": "mm", "op": "matmul", "out": "o[t,64*h+d]",
                          "ins": [qa, "w[h,k,d]"]},
                         {"name": "e", "op": "relu", "out": "r[t,j]", "ins": ["o[t,j]"]}],
                        ["o", "r"], **extra)
    if case == "reductions":  # each merged: a split reduction combines per output slice
        x = {"x": ([8, 4, 64, 96], f32)}
        outs = {f"{fn}": ([8, 256], "int64" if fn == "argmax" else f32)
                for fn in ("sum", "mean", "max", "argmax")}
        return declared({**x, **outs}, ["x"],
                        [{"name": fn, "op": fn, "out": f"{fn}[t,64*h+d]", "ins": ["x[t,h,d,k]"]}
                         for fn in outs], list(outs))
    if case == "several-axes":  # y[16*c+d, 8*a+b]: both axes merged, the digits permuted
        return declared({"x": ([4, 8, 2, 16], f32), "y": ([32, 32], f32),
                         "z": ([32, 32], f32)}, ["x"],
                        [{"name": "m", "op": "sigmoid", "out": "y[16*c+d,8*a+b]",
                          "ins": ["x[a,b,c,d]"]},
                         {"name": "e", "op": "neg", "out": "z[i,j]", "ins": ["y[j,i]"]}], ["z"])
    assert case == "size-one-digits"  # u of size 1 in a merge, any coefficient; a literal 0
    return declared({"x": ([8, 1, 4, 64], f32), "y": ([1, 8, 256], f32)}, ["x"],
                    [{"name": "m", "op": "copy", "out": "y[0,t,7*u+64*h+d]",
                      "ins": ["x[t,u,h,d]"]},
                     {"name": "s", "op": "sum", "out": "s[t,0]", "ins": ["y[0,t,j]"]}],
                    ["y", "s"])


MERGED = ("pointwise", "matmul", "einsum", "split-k", "reductions", "several-axes",
          "size-one-digits")


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("cores", CORES)
@pytest.mark.parametrize("case", MERGED)
def test_merged_writes_match_the_reference_executor(case, cores, threads):
    planned = ap.plan(merged_program(case, cores), ap.targets.spyre(cores=cores))
    merged = [op for op in planned.program.ops if op.merges_output]
    assert merged, planned.program.ops
    if case == "split-k" and cores >= 4:  # the partials and their sum both write merged
        assert {op.name for op in merged} == {"mm.partial", "mm.combine"}
    modes = {s.op.name: s.mode for s in TorchExecutor(planned.lowered).steps}
    want = {"matmul": "mm", "einsum": "matmul", "reductions": "reduce", "pointwise":
            "elementwise", "several-axes": "elementwise", "size-one-digits": "copy"}
    for op in merged:  # torch kernels, never numpy
        assert modes[op.name] == want.get(case, modes[op.name]) != "numpy", modes
    check(planned, threads)


@pytest.mark.parametrize("case", ["pointwise", "matmul", "reductions", "several-axes",
                                  "size-one-digits"])
def test_merged_writes_over_uneven_splits_of_their_digits(case):
    """Every split dim of the merged op redrawn: uneven (4 heads over 3 cores: 2, 1, 1), the
    inner digit split (a core's piece of the merged axis is no range of it), the reduction
    split (partials combined per output slice)."""
    planned = ap.plan(merged_program(case, 8), ap.targets.spyre(cores=32))
    splits: dict[str, dict[str, int]] = {}
    for o in planned.plan.ops:
        if planned.program.op(o.name).merges_output:
            used = 1
            for d, u in o.unit_map.items():  # up to 3 slices a dim, within the 32 cores
                splits.setdefault(o.name, {})[d] = n = min(u, 3, 32 // used)
                used *= n
    planned = resplit(planned, splits)
    assert all(o.cores > 1 for o in planned.plan.ops if o.name in splits)
    for threads in THREADS:
        check(planned, threads)


@st.composite
def merged_programs(draw) -> ap.Program:
    """One op writing through merges of dims (digits of random sizes, size 1 among them, in any
    order, grouped into merged axes, maybe a literal 0 axis): pointwise, a reduction or a
    matmul; then an op reading its output plainly. Its splits are pinned at random half the
    time (uneven, inner digits, the reduction)."""
    dt = draw(st.sampled_from(["float16", "bfloat16", "float32"]))
    kind = draw(st.sampled_from(["pointwise", "reduction", "matmul"]))
    names = "abcd"[:draw(st.integers(2, 4))]
    sizes = {d: draw(st.sampled_from([1, 2, 3, 4, 8, 64])) for d in names}
    dims = dict(sizes)
    par = list(names)
    fn = draw(st.sampled_from({"pointwise": ["exp", "neg", "relu", "copy", "silu"],
                               "reduction": ["sum", "mean", "max", "argmax"],
                               "matmul": ["matmul"]}[kind]))
    x = [f"x[{','.join(names)}]"]
    tensors = {"x": ([sizes[d] for d in names], dt)}
    if kind == "reduction":
        par.remove(draw(st.sampled_from(names)))
        assume(par)
    elif kind == "matmul":
        dims["k"], dims["n"] = draw(st.sampled_from([16, 64])), draw(st.sampled_from([1, 8, 64]))
        tensors = {"x": ([*tensors["x"][0], dims["k"]], dt), "w": ([dims["k"], dims["n"]], dt)}
        x = [f"x[{','.join(names)},k]", "w[k,n]"]
        par.append("n")
    assume(len(par) >= 2 and math.prod(dims.values()) <= 1 << 16)
    order = draw(st.permutations(par))
    groups = [[order[0]]]
    for d in order[1:]:  # each digit merged into the axis before it, or a new axis
        if draw(st.booleans()):
            groups[-1].append(d)
        else:
            groups.append([d])
    assume(any(len(g) > 1 for g in groups))
    index, shape = [], []
    for g in groups:
        terms = [(d, math.prod(dims[e] for e in g[i + 1:])) for i, d in enumerate(g)]
        index.append("+".join(d if c == 1 else f"{c}*{d}" for d, c in terms))
        shape.append(math.prod(dims[d] for d in g))
    if draw(st.booleans()):  # a literal 0 axis
        at = draw(st.integers(0, len(index)))
        index.insert(at, "0")
        shape.insert(at, 1)
    out_dt = "int64" if fn == "argmax" else dt
    plain = [f"p{i}" for i in range(len(shape))]
    p = declared({**tensors, "y": (shape, out_dt)}, list(tensors),
                 [{"name": "m", "op": fn, "out": f"y[{','.join(index)}]", "ins": x},
                  {"name": "e", "op": "neg", "out": f"z[{','.join(plain)}]",
                   "ins": [f"y[{','.join(plain)}]"]}], ["y", "z"])
    assert p.op("m").merges_output
    return p


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(merged_programs(), st.sampled_from(CORES), st.sampled_from(THREADS), st.booleans(),
       st.data())
def test_random_merged_writes(p, cores, threads, redraw, data):
    try:
        planned = ap.plan(p, ap.targets.spyre(cores=cores))
    except (PlanningError, ProgramError):
        assume(False)
        return
    if redraw:  # the merged op's splits redrawn within its units and the cores
        m = planned.plan.op("m")
        splits, used = {}, 1
        for d, u in m.unit_map.items():
            splits[d] = data.draw(st.integers(1, max(1, min(u, 4, cores // used))))
            used *= splits[d]
        planned = resplit(planned, {"m": splits})
    check(planned, threads, seed=1)


# --- generated programs ------------------------------------------------------------------------

@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(small_programs(), st.sampled_from(CORES), st.sampled_from(THREADS), st.integers(0, 3))
def test_random_small_programs(p, cores, threads, seed):
    check(plan_small(p, cores), threads, seed)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(resplit_programs(), st.sampled_from(THREADS), st.integers(0, 3))
def test_random_splits(planned, threads, seed):
    check(planned, threads, seed)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tiled_programs(), st.sampled_from(CORES), st.sampled_from([None, 4096, 512]),
       st.sampled_from(THREADS), st.integers(0, 3))
def test_random_tiled_programs(case, cores, scratch, threads, seed):
    p, params = case
    target = ap.targets.spyre(cores=cores)
    if scratch is not None:  # small scratchpads: tiles in device memory, accumulators
        target = dataclasses.replace(target, scratchpad_bytes=scratch)
    try:
        planned = ap.plan(p, target)
    except (PlanningError, ProgramError):
        assume(False)
        return
    check(planned, threads, seed, params)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(kind_programs(), st.sampled_from(CORES), st.sampled_from(["greedy", "balanced"]),
       st.sampled_from(THREADS))
def test_random_programs_of_the_newer_kinds(p, cores, strategy, threads):
    try:
        planned = ap.plan(p, ap.targets.spyre(cores=cores), strategy)
    except (PlanningError, ProgramError):
        assume(False)
        return
    check(planned, threads, seed=3)


# --- pieces ------------------------------------------------------------------------------------

def test_the_namespace_speaks_numpy():
    a = torch.tensor([1.0, -2.0, float("nan")])
    assert XP.equal(a, a).tolist() == [True, True, False]  # elementwise, not torch.equal
    assert XP.maximum(a, 0).tolist()[:2] == [1.0, 0.0] and torch.isnan(XP.maximum(a, 0)[2])
    assert XP.power(torch.tensor([2.0]), torch.tensor([3.0])).tolist() == [8.0]
    assert XP.asarray(1.5).dtype == torch.float64


def test_argmax_takes_the_first_maximum_and_nan_across_split_cores():
    p = program({"x": ([3, 128], "float32")},
                [{"name": "a", "op": "argmax", "out": "a[i]", "ins": ["x[i,j]"]}], ["a"])
    x = np.zeros((3, 128), dtype=np.float32)
    x[0, [40, 70, 100]] = 5.0  # ties in three cores' slices: the first wins
    x[2, [50, 90]], x[2, 60] = np.nan, 9.0  # NaN wins, the first one
    planned = resplit(ap.plan(p, ap.targets.spyre(cores=4)), {"a": {"j": 4}})
    got = run_torch(planned.lowered, {"x": x}, threads=4)["a"].tolist()
    assert got == np.argmax(x, axis=1).tolist() == [40, 0, 50]


def test_torch_and_numpy_inputs_give_the_same_outputs_and_threads_are_restored():
    planned = ap.plan(ap.load(ROOT / "examples/rmsnorm_argmax.json"), ap.targets.spyre(cores=8))
    xs = random_inputs(planned.program)
    before = torch.get_num_threads()
    a = run_torch(planned.lowered, xs, threads=4)
    b = run_torch(planned.lowered, {n: to_torch_storage(x, planned.program.tensor(n).dtype)
                            for n, x in xs.items()}, threads=1)
    assert torch.get_num_threads() == before
    for name in a:  # the same boxes in the same order: the same numbers
        assert torch.equal(a[name], b[name])


def test_cores_run_on_the_pool_threads_and_small_ops_on_the_calling_thread(monkeypatch):
    planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8))
    seen: dict[str, list[str]] = {}
    run_boxes = torch_exec._run_boxes

    def spy(step, *args):
        seen.setdefault(step.op.name, []).append(threading.current_thread().name)
        return run_boxes(step, *args)

    monkeypatch.setattr(torch_exec, "_run_boxes", spy)
    all_boxes = Step.all_boxes

    def spy_batched(step, *args):  # a lattice of small boxes: one batched call
        seen.setdefault(step.op.name, []).append(threading.current_thread().name)
        return all_boxes(step, *args)

    monkeypatch.setattr(Step, "all_boxes", spy_batched)
    xs = random_inputs(planned.program)
    here = [threading.current_thread().name]
    with TorchExecutor(planned.lowered, threads=4) as ex:
        ex.run(xs)
        # the matmuls (92M points per core) are above the grain: four tasks on pool threads;
        # silu and mul (90K points per core) run on the calling thread
        assert set(seen) == {"gate", "up", "act", "glu", "down"}
        for name in ("gate", "up", "down"):
            assert len(seen[name]) == 4, seen
            assert all(n.startswith("apportion-core") for n in seen[name]), seen
        assert seen["act"] == seen["glu"] == here
        seen.clear()
        ex.grain = 0  # every op on the pool
        ex.run(xs)
        assert all(len(names) == 4 and here[0] not in names for names in seen.values()), seen
    assert GRAIN == 1 << 20


def test_an_executor_runs_one_binding_of_symbolic_counts_and_bad_counts_are_refused():
    doc = json.loads(ap.dumps(ap.load(ROOT / "examples/fused.json")))
    doc["tiling"][0]["loops"][0]["count"] = "T"
    planned = ap.plan(ap.loads(json.dumps(doc)), ap.targets.spyre(cores=8))
    assert planned.params == ("T",)
    xs = random_inputs(planned.program)
    want = run_unplanned(planned.program, xs)
    for t in (2, 4):
        with TorchExecutor(planned.schedule(params={"T": t}), threads=4) as ex:
            for _ in range(2):  # reused across runs
                got = numpy_outputs(ex.run(xs))
                assert all(c.ok for c in compare(want, got, planned.program))
    with pytest.raises(ExecutionError, match="symbolic loop count 'T' needs a value"):
        planned.schedule()
    with pytest.raises(ExecutionError, match=r"params \['U'\] given"):
        planned.schedule(params={"T": 2, "U": 1})
    for run in (lambda: planned.schedule(params={"T": 3}),  # as the reference refuses it
                lambda: run_planned(planned.program, planned.plan, xs, params={"T": 3})):
        with pytest.raises(ExecutionError, match="count 3 .* does not divide"):
            run()


@pytest.mark.parametrize(("inputs", "threads", "match"), [
    ({}, 1, "input 'x' of program 'mlp' is missing"),
    ({"nope": np.zeros(1)}, 1, "'nope' is not an input of program 'mlp'"),
    ({"x": np.zeros((2, 2))}, 1, r"input 'x' has shape \(2, 2\), expected \(256, 1024\)"),
    (None, 0, "threads must be an int >= 1, got 0"),
    (None, True, "threads must be an int >= 1, got True"),
])
def test_bad_inputs_and_threads_are_execution_errors(inputs, threads, match):
    planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8))
    xs = random_inputs(planned.program) if inputs is None else inputs
    with pytest.raises(ExecutionError, match=match):
        run_torch(planned.lowered, xs, threads)


def test_a_plan_for_another_program_is_refused():
    planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8))
    other = ap.plan(ap.load(ROOT / "examples/attention.json"), ap.targets.spyre(cores=8))
    with pytest.raises(ExecutionError, match="op 'gate'"):
        TorchExecutor(schedule_of(planned.program, other.plan))
