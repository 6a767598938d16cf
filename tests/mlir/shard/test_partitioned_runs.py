"""The partitioned (SPMD) form run device by device by upstream MLIR, its collectives and halo
updates done between the runs as upstream's shard dialect documents them (``spmd.py``), matches
the unplanned program: even, uneven (equal padded slots) and two-axis meshes."""

from __future__ import annotations

import dataclasses

import pytest

from apportion.mlir.upstream import MISSING, available
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.sharding.forms import partitioned_mlir
from apportion.sharding.mesh import parse
from apportion.sharding.search import search
from apportion.sharding.spec import load
from tests.mlir.shard import spmd

pytestmark = pytest.mark.skipif(not available(), reason=MISSING)

#: (example, mesh, the data-moving shard ops its partitioned form has at least)
CASES = [("megatron", "tp=2", {"reduce_scatter"}), ("megatron", "tp=3", {"reduce_scatter"}),
         pytest.param("mlp", "dp=2,tp=2", {"all_gather", "reduce_scatter"},
                      marks=pytest.mark.slow),
         ("splitk", "dp=2,tp=2", {"reduce_scatter"}),
         ("softmax_tiled", "tp=3", {"all_slice", "all_reduce"}), ("attention", "tp=2", set()),
         ("fused", "tp=3", set()), ("transposed", "dp=2,tp=2", set()),
         ("halo", "die=3", {"all_to_all"})]  # a plain axis: the window's dim moved whole


def _run(name: str, spec: str) -> tuple[list, set[str]]:
    prog, ann = load(f"examples/{name}.json")
    plan = search(prog, parse(spec), annotations=ann)
    text = partitioned_mlir(plan)
    xs = random_inputs(prog)
    checks = compare(run_unplanned(prog, xs), spmd.run_partitioned(text, plan, xs), prog)
    return checks, {h.kind for h in spmd.exchanges(text)}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "spec", "kinds"), CASES)
def test_the_partitioned_form_run_device_by_device_matches_the_unplanned_program(name, spec,
                                                                                  kinds):
    checks, found = _run(name, spec)
    assert kinds <= found
    assert all(c.ok for c in checks), [str(c) for c in checks]


def test_a_wrong_reduction_between_the_runs_is_caught(monkeypatch):
    real = spmd.exchange

    def as_max(arrays, h, plan):  # a sum done as a max: the check must see it
        return real(arrays, dataclasses.replace(h, reduction="max") if h.reduction else h, plan)

    monkeypatch.setattr(spmd, "exchange", as_max)
    checks, kinds = _run("megatron", "tp=3")
    assert "reduce_scatter" in kinds and not all(c.ok for c in checks)
