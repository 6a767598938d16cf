"""Property: random programs on random meshes (symbolic, uneven and peered axes among them),
sharded by propagation or the search, are emitted in every shard-dialect form and verified by
upstream MLIR 22; the unrolled form, compiled and run by upstream MLIR, gives the unplanned
run's numbers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.errors import EmitError, PlanningError
from apportion.frontend.random_meshes import MeshCase, mesh_case, random_mesh_case
from apportion.ir.kinds import Category
from apportion.mlir.shard.body import opaque
from apportion.mlir.upstream import MISSING, available
from apportion.sharding.forms import (
    annotated_mlir,
    partitioned_mlir,
    propagated_mlir,
    unrolled_mlir,
)
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from tests.conformance.draws import HypothesisDraw, conformance
from tests.helpers import assert_runs_as_unplanned

pytestmark = pytest.mark.skipif(not available(), reason=MISSING)


def _check(case: MeshCase) -> None:
    mesh = parse(case.mesh)
    ann = {name: Sharding(dims) for name, dims in case.shardings.items()}
    prog = case.program
    try:
        plan = search(prog, mesh, case.target, annotations=ann, time_limit=10) \
            if case.chooser == "search" else propagate(prog, mesh, case.target, annotations=ann)
        bound = plan.bind(dict(case.sizes) or None)
        schedule = lower_plan(bound, None, case.target)
    except PlanningError:  # a device's segment its few cores cannot plan: refused, not wrong
        return
    annotated_mlir(prog, mesh, ann)
    propagated_mlir(plan)
    try:
        partitioned_mlir(bound)
    except EmitError as e:  # only a read of peers' memory in place, or a halo upstream's one
        # halo pair cannot say (uneven cuts, devices lacking different rows), has no shard op
        assert ("in place" in str(e) or "upstream's update_halo" in str(e) or
                "upstream's halo_sizes" in str(e)) and "peered" in case.mesh, str(e)
    text = unrolled_mlir(schedule, bound.mesh)
    if any(opaque(op) for op in prog.ops):  # a fallback is an opaque call: nothing to run
        return
    if any(t.dtype == "bool" for t in prog.tensors):  # upstream 22's LLVM lowering asserts on
        return  # stores to i1 memrefs (MemRefToLLVM: width >= 8), so no bool program runs
    assert_runs_as_unplanned(text, prog)


@pytest.mark.parametrize("seed", [1, 2, 5, 6, 12, 14, 18])
def test_seeded_mesh_cases_verify_in_every_form_and_the_unrolled_form_matches(seed):
    _check(mesh_case(seed))


@st.composite
def peered_cases(draw: st.DrawFn) -> MeshCase:
    return random_mesh_case(HypothesisDraw(draw), peered=True)


@pytest.mark.slow
@conformance(25)
@given(peered_cases())
def test_random_mesh_cases_verify_in_every_form_and_the_unrolled_form_matches(case):
    _check(case)


def test_a_fallback_is_an_opaque_op():
    from apportion.frontend.json_format import load

    prog = load("examples/rmsnorm_argmax.json")
    assert [op.name for op in prog.ops if opaque(op)] == ["rank"]
    assert prog.op("rank").kind.category is Category.FALLBACK
