"""Split-K select chains whose cases pick more slices than cores, lowered by upstream MLIR to
OpenMP and run from one module at each run-time K (several slices a thread, unevenly where they
do not divide), matching the unplanned program."""

from __future__ import annotations

import pytest

from apportion.mlir import upstream
from apportion.planned import PlannedProgram
from tests.split_k_chains import SIZES, TARGETS, planned, planned_uneven

pytestmark = pytest.mark.skipif(not upstream.available() or
                                upstream.openmp_library() is None,
                                reason="needs the mlir extra (upstream MLIR 22 and libiomp5)")

from apportion.backends.openmp.run import openmp_run  # noqa: E402
from tests.helpers import checked  # noqa: E402


def run_at(p: PlannedProgram, sizes: tuple[int, ...]) -> None:
    for i, k in enumerate(sizes):
        checks, run = checked(p, lambda s, xs: openmp_run(s, xs, 2), params={"K": k})
        bad = [c for c in checks if not c.ok]
        assert checks and not bad, (k, bad)
        assert run.cached == (i > 0), k  # one module for every size


@pytest.mark.parametrize(("preset", "cores"), TARGETS)
def test_a_chain_of_more_slices_than_cores_runs_on_openmp_at_each_size(preset, cores):
    p = planned(preset, cores)
    assert max(p.plan.op("mm.partial").split_k.select.factors) == 128 > cores
    run_at(p, SIZES)


def test_a_user_chain_of_slices_uneven_over_the_cores_runs_on_openmp():
    run_at(planned_uneven(), (12800, 3840, 23040, 3000))
