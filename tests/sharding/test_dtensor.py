"""Sharding plans run on torch.distributed: two gloo processes on loopback, DTensors placed
and redistributed as planned, results equal to the single-device reference; a failing rank
ends the run with a clear error, never a hang."""

from __future__ import annotations

import time

import pytest

from apportion.errors import ExecutionError
from apportion.frontend.json_format import from_dict
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.spec import Sharding

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


PLANS = {
    "megatron": lambda: propagate(mlp(), TP, annotations={
        "x": REP, "w1": S(((), ("tp",))), "w2": S((("tp",), ())), "y": REP}),
    "data-parallel": lambda: propagate(mlp(), TP, annotations={"x": S((("tp",), ()))}),
    "k-split all-reduce": lambda: propagate(matmul(), TP, annotations={
        "x": S(((), ("tp",))), "w": S((("tp",), ())), "y": REP}),
    "k-split reduce-scatter": lambda: propagate(matmul(), TP, annotations={
        "x": S(((), ("tp",))), "w": S((("tp",), ())), "y": S((("tp",), ()))}),
}
COLLECTIVES = {"megatron": "1 all_reduce", "data-parallel": "none",
               "k-split all-reduce": "1 all_reduce",
               "k-split reduce-scatter": "1 reduce_scatter"}


@pytest.fixture(scope="module")
def runs():
    """Every plan in one launch of two processes (torch imported once per rank)."""
    plans = {name: make() for name, make in PLANS.items()}
    results = dtensor.check_dtensor_many(list(plans.values()), timeout_s=180)
    return {name: (plans[name], *res) for name, res in zip(plans, results, strict=True)}


@pytest.mark.parametrize("name", list(PLANS))
def test_two_gloo_processes_match_the_single_device_result(runs, name):
    plan, checks, run = runs[name]
    assert plan.collectives_text() == COLLECTIVES[name]
    assert all(c.ok for c in checks), checks
    # every op and step checked its placement; torch's own propagation placed the matmuls as
    # the plan did (a split K gives Partial(sum))
    assert run.placement_checks >= len(plan.ops) + len(plan.program.inputs)
    assert {o.op for o in plan.ops if plan.program.op(o.op).kind.name == "matmul"} <= \
        set(run.native_ops)


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
