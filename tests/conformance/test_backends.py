"""Conformance: random programs (every op kind of the registry, tiled and not, writes through a
merge of dims, run-time sizes; meshes in test_meshes.py) planned, run by the reference against the
unplanned program, then through every backend that claims to support them and compared with
the reference. A backend either matches or refuses up front or while running naming a
documented limit (``docs/limits.md``); wrong numbers, an error citing no limit, or a crash
fail. ``apportion bench conformance`` counts the same on seeded cases."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

import apportion as ap
from apportion.backends import BACKENDS
from apportion.bench.conformance import Outcome, run_backend, run_case
from apportion.errors import PlanningError, ProgramError
from apportion.frontend.random_programs import KIND_NAMES, Case, random_case, single, target
from apportion.limits import LIMITS_BY_ID
from apportion.runtime import random_inputs, run_unplanned
from tests.conformance.draws import HypothesisDraw, conformance

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs the torch extra")


@st.composite
def cases(draw: Any, family: str | None = None) -> Case:
    return random_case(HypothesisDraw(draw), family=family)


@st.composite
def kind_cases(draw: Any, kind: str) -> Case:
    d = HypothesisDraw(draw)
    return Case(single(d, kind), target(d), d.sampled_from(("greedy", "balanced")), "single")


def conform(c: Case, backend: str) -> Outcome:
    """Plan ``c`` (a case the planner refuses is skipped), check the reference runs it exactly,
    then run ``backend`` on the reference's inputs; a refusal must name a documented limit."""
    try:
        planned = ap.plan(c.program, c.target, c.strategy)
    except (PlanningError, ProgramError) as e:
        event(f"not planned: {type(e).__name__}")
        assume(False)
    given = c.program.bind(dict(c.sizes)) if c.program.symbols else c.program
    inputs = random_inputs(given, seed=5)
    want = run_unplanned(given, inputs)
    ref = run_backend(BACKENDS["reference"], c, planned, inputs, want)
    assert ref.status == "match", ref  # the reference runs every plan exactly
    out = run_backend(BACKENDS[backend], c, planned, inputs, want)
    event(f"{backend}: {out.status} {out.detail if out.status == 'refused' else ''}")
    for feature in c.features[:4]:
        event(f"feature: {feature}")
    assert out.status != "failed", out
    if out.status == "refused":
        assert out.detail in LIMITS_BY_ID and backend in LIMITS_BY_ID[out.detail].backends
    return out


@needs_torch
@conformance(40)
@given(cases())
def test_torch_matches_the_reference_on_random_plans(c):
    assert conform(c, "torch").status == "match"  # torch has no limit but PyTorch itself


@conformance(4)
@given(cases())
def test_iree_matches_the_reference_or_names_a_limit(c):
    conform(c, "iree")


@pytest.mark.slow
@conformance(60)
@given(cases())
def test_iree_matches_the_reference_or_names_a_limit_on_many_plans(c):
    conform(c, "iree")


@conformance(40)
@given(cases())
def test_bundle_emits_verified_mlir_or_names_a_limit(c):
    conform(c, "bundle")


@pytest.mark.parametrize("family", ["merged", "nested", "symbolic"])
@needs_torch
@conformance(10)
@given(data=st.data())
def test_torch_matches_on_merged_writes_loop_nests_and_run_time_sizes(family, data):
    assert conform(data.draw(cases(family)), "torch").status == "match"


@needs_torch
@pytest.mark.parametrize("kind", KIND_NAMES)
@conformance(3)
@given(data=st.data())
def test_every_kind_runs_on_torch_as_on_the_reference(kind, data):
    assert conform(data.draw(kind_cases(kind)), "torch").status == "match"


@pytest.mark.slow
@pytest.mark.parametrize("kind", KIND_NAMES)
@conformance(2)
@given(data=st.data())
def test_every_kind_runs_on_iree_or_names_a_limit(kind, data):
    conform(data.draw(kind_cases(kind)), "iree")


def test_a_bench_case_is_reproduced_from_its_seed():
    a, b = run_case(3, backends=("bundle",)), run_case(3, backends=("bundle",))
    assert (a.family, a.features, a.target, a.cores, a.strategy) == (
        b.family, b.features, b.target, b.cores, b.strategy)
    assert [o.status for o in a.outcomes] == [o.status for o in b.outcomes]
