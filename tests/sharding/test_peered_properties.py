"""Property: random programs (shifted slices and stencils among them) on random meshes whose
axes have peered memory half the time, planned, lowered and run: the numbers are the unplanned
run's, and halos and reads in place happen along peered axes only."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from apportion.bench.conformance import plan_mesh_case
from apportion.errors import PlanningError
from apportion.frontend.random_meshes import MeshCase, random_mesh_case
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.mesh import READS
from apportion.sharding.mesh import parse
from tests.conformance.draws import HypothesisDraw, conformance


@st.composite
def peered_cases(draw: st.DrawFn) -> MeshCase:
    return random_mesh_case(HypothesisDraw(draw), peered=True)


@conformance(60)
@given(peered_cases())
def test_random_programs_on_meshes_with_peered_axes_match_the_unplanned_run(case):
    from apportion.backends.reference.mesh import run_mesh

    try:
        s = plan_mesh_case(case)
    except PlanningError:  # a device's segment its few cores cannot plan: refused, not wrong
        return
    mesh = parse(case.mesh)
    for c in s.collectives:
        if c.kind in READS:
            # a read across several axes (a dim split over them) needs every one peered
            assert all(mesh.axis(a).peered for a in c.axes), \
                f"{c} along a plain axis of {case.mesh}"
            # a device reads only what it lacks: its own part never crosses
            assert all(c.lacked(d, d) is None for d in range(len(s.devices)))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        xs = random_inputs(case.program, 0)
        checks = compare(run_unplanned(case.program, xs), run_mesh(s, xs), case.program)
    assert all(c.ok for c in checks), [str(c) for c in checks]


def test_seeded_mesh_cases_are_unchanged_by_the_peered_draws():
    """``peered`` is off for ``bench conformance``'s seeded cases: no axis is peered and no
    program reads across shard boundaries, so its recorded cases stay as they were."""
    from apportion.frontend.random_meshes import mesh_case

    for seed in range(40):
        c = mesh_case(seed)
        assert "peered" not in c.mesh and "peered" not in c.features
        assert not any(e.const for op in c.program.ops for a in op.ins for e in a.index
                       if c.family == "sharded")
