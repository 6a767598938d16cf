"""Sharding plans run on torch.distributed: two gloo processes on loopback, DTensors placed
and redistributed as planned, results equal to the single-device reference; a failing rank
ends the run with a clear error, never a hang."""

from __future__ import annotations

import time

import numpy as np
import pytest

from apportion.errors import ExecutionError, TargetError
from apportion.frontend.json_format import from_dict
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.spec import Sharding
from tests.sharding.programs import attention, hard_inputs, reduction

pytest.importorskip("torch")
dtensor = pytest.importorskip("apportion.sharding.dtensor")

pytestmark = pytest.mark.distributed

S = Sharding
REP = S(((), ()))
TP = parse("tp=2")


def mlp():
    return from_dict({
        "name": "mlp", "inputs": ["x", "w1", "w2"], "outputs": ["y"],
        "tensors": {"x": {"shape": [16, 32], "dtype": "float32"},
                    "w1": {"shape": [32, 64], "dtype": "float32"},
                    "w2": {"shape": [64, 32], "dtype": "float32"}},
        "ops": [{"name": "up", "op": "matmul", "out": "h[t,f]", "ins": ["x[t,n]", "w1[n,f]"]},
                {"name": "act", "op": "gelu", "out": "a[t,f]", "ins": ["h[t,f]"]},
                {"name": "down", "op": "matmul", "out": "y[t,n]", "ins": ["a[t,f]",
                                                                          "w2[f,n]"]}]})


def matmul():
    return from_dict({
        "name": "kmm", "inputs": ["x", "w"], "outputs": ["y"],
        "tensors": {"x": {"shape": [12, 32], "dtype": "float32"},
                    "w": {"shape": [32, 10], "dtype": "float32"}},
        "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}]})


COLS = S(((), ("tp",)))
PLANS = {
    "megatron": lambda: propagate(mlp(), TP, annotations={
        "x": REP, "w1": S(((), ("tp",))), "w2": S((("tp",), ())), "y": REP}),
    "data-parallel": lambda: propagate(mlp(), TP, annotations={"x": S((("tp",), ()))}),
    "k-split all-reduce": lambda: propagate(matmul(), TP, annotations={
        "x": S(((), ("tp",))), "w": S((("tp",), ())), "y": REP}),
    "k-split reduce-scatter": lambda: propagate(matmul(), TP, annotations={
        "x": S(((), ("tp",))), "w": S((("tp",), ())), "y": S((("tp",), ()))}),
    # a mean and an argmax with the reduced dim split: 9 elements, 5 + 4
    "mean split": lambda: propagate(reduction("mean", (6, 9)), TP, annotations={"x": COLS}),
    "argmax all-reduce": lambda: propagate(reduction("argmax", (6, 9)), TP,
                                           annotations={"x": COLS}),
    "argmax reduce-scatter": lambda: propagate(reduction("argmax", (6, 9), "float16"), TP,
                                               annotations={"x": COLS, "r": S((("tp",),))}),
    # heads split over the devices and written back merged, o[t, 64*h+e]
    "merged heads": lambda: propagate(attention(), TP, annotations={
        "wq": COLS, "wk": COLS, "wv": COLS, "wo": S((("tp",), ())), "x": REP, "y": REP}),
    # planned at N=4, run at N=2 (run_dtensor_many's sizes bind it)
    "symbolic mesh": lambda: propagate(mlp(), parse("tp=N~4"), annotations={
        "x": REP, "w1": S(((), ("tp",))), "w2": S((("tp",), ())), "y": REP}),
}
COLLECTIVES = {"megatron": "1 all_reduce", "data-parallel": "none",
               "k-split all-reduce": "1 all_reduce",
               "k-split reduce-scatter": "1 reduce_scatter", "mean split": "1 all_reduce",
               "argmax all-reduce": "1 all_reduce", "argmax reduce-scatter": "1 reduce_scatter",
               "merged heads": "1 all_reduce", "symbolic mesh": "1 all_reduce"}
#: inputs with ties, NaNs and signed zeros where an argmax's pick is at stake
INPUTS = {"argmax all-reduce": hard_inputs, "argmax reduce-scatter": hard_inputs}


@pytest.fixture(scope="module")
def runs():
    """Every plan in one launch of two processes (torch imported once per rank), each output
    compared with the reference executor's run of the unsharded program."""
    plans = {name: make() for name, make in PLANS.items()}
    inputs = [INPUTS.get(name, lambda p: random_inputs(p, 0))(p.program)
              for name, p in plans.items()]
    results = dtensor.run_dtensor_many(list(plans.values()), inputs, timeout_s=180,
                                       sizes={"N": 2})
    return {name: (plan, compare(run_unplanned(plan.program, xs), run.outputs, plan.program),
                   run)
            for (name, plan), xs, run in zip(plans.items(), inputs, results, strict=True)}


@pytest.mark.parametrize("name", list(PLANS))
def test_two_gloo_processes_match_the_single_device_result(runs, name):
    plan, checks, run = runs[name]
    assert plan.collectives_text() == COLLECTIVES[name]
    assert all(c.ok for c in checks), checks
    # every op and step checked its placement; torch's own propagation placed the matmuls as
    # the plan did (a split K gives Partial(sum)); those that read or write heads through a sum
    # of dims ran on the local shards
    assert run.placement_checks >= len(plan.ops) + len(plan.program.inputs)
    plain = {o.name for o in plan.program.ops if o.kind.name == "matmul" and
             all(e.single_dim for a in o.operands for e in a.index)}
    assert plain <= set(run.native_ops)


def test_a_split_mean_waits_as_a_sum_and_a_split_argmax_as_keys_then_gathers_exactly(runs):
    assert runs["mean split"][0].strategy("r").out == S(((),), ("tp",), "sum")
    for name in ("argmax all-reduce", "argmax reduce-scatter"):
        plan, checks, run = runs[name]
        assert plan.strategy("r").out == S(((),), ("tp",), "argmax")
        want = run_unplanned(plan.program, hard_inputs(plan.program))["r"]
        assert np.array_equal(run.outputs["r"], want)  # ties and NaNs picked as numpy picks
    plan = runs["merged heads"][0]
    assert str(plan.strategy("pv").out) == "[-, tp]"


def test_an_unbound_symbolic_mesh_is_refused_before_launch():
    with pytest.raises(TargetError, match=r"axis 'tp' has symbolic size N \(planned at 4\)"):
        dtensor.run_dtensor(PLANS["symbolic mesh"]())
    with pytest.raises(TargetError, match=r"no mesh of the plans has a symbolic size 'K'"):
        dtensor.run_dtensor(PLANS["symbolic mesh"](), sizes={"K": 2})


def test_the_k_split_is_partial_then_all_reduced_or_reduce_scattered(runs):
    ar = runs["k-split all-reduce"][0]
    rs = runs["k-split reduce-scatter"][0]
    assert ar.strategy("mm").out == S(((), ()), ("tp",), "sum") == rs.strategy("mm").out
    assert [str(s) for t in ar.transfers for s in t.steps] == ["all_reduce(sum, tp)"]
    assert [str(s) for t in rs.transfers for s in t.steps] == ["reduce_scatter(sum, tp) dim 0"]


@pytest.mark.parametrize(("how", "match"), [
    ("raise", r"rank 1 of 2 failed at op 'down': RuntimeError: injected fault at op 'down'; "
              "the other ranks were stopped"),
    ("kill", r"rank 1 of 2 was killed by signal SIGKILL at op 'act'; the other ranks were "
             "stopped"),
])
def test_a_failing_rank_ends_the_whole_run_with_a_clear_error(how, match):
    plan = PLANS["megatron"]()
    op = "down" if how == "raise" else "act"
    start = time.monotonic()
    with pytest.raises(ExecutionError, match=match):
        dtensor.run_dtensor(plan, timeout_s=120, fault={"rank": 1, "op": op, "how": how})
    assert time.monotonic() - start < 60


def test_a_dim_split_out_of_mesh_order_is_refused_before_launch():
    plan = propagate(matmul(), parse("a=1,b=2"), annotations={"x": S((("b", "a"), ()))})
    with pytest.raises(ExecutionError, match=r"dim 0 is split over b\*a, not in mesh order"):
        dtensor.run_dtensor(plan)


def test_the_device_is_cpu_with_gloo_unless_there_is_a_gpu_per_rank():
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert dtensor.resolve_device("cpu", 2) == "cpu"
    assert dtensor.resolve_device("auto", 2) == ("cuda" if gpus >= 2 else "cpu")
    if gpus < 64:
        with pytest.raises(ExecutionError, match="the mesh has 64 devices, one process each"):
            dtensor.resolve_device("cuda", 64)
    with pytest.raises(ExecutionError, match="expected auto, cpu or cuda"):
        dtensor.resolve_device("tpu", 2)


@pytest.mark.gpu
def test_megatron_on_nccl_with_one_gpu_per_rank_matches_the_single_device_result():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    checks, run = dtensor.check_dtensor(PLANS["megatron"](), timeout_s=120, device="cuda")
    assert run.backend == "nccl" and all(c.ok for c in checks), checks
