"""IREE runs of split-K select chains whose cases pick more slices than cores: one module for
every run-time K, its partial forall one thread per core, each thread's range of slices cut from
the run-time slice count (several a thread, unevenly where they do not divide), matching the
unplanned program at each size."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apportion.backends.iree.run import iree_run
from apportion.planned import PlannedProgram
from tests.backends.iree.emitting import emit
from tests.helpers import checked
from tests.split_k_chains import SIZES, TARGETS, planned, planned_uneven


def run_at(p: PlannedProgram, sizes: tuple[int, ...], cache: Path) -> None:
    """Check ``p`` in IREE at each K of ``sizes``: one compile, then cache hits."""
    for i, k in enumerate(sizes):
        checks, run = checked(p, lambda s, xs: iree_run(s, xs, cache), params={"K": k})
        bad = [c for c in checks if not c.ok]
        assert checks and not bad, (k, bad)
        assert run.cached == (i > 0), k  # the module covers every size
    assert len(list(cache.glob("*.vmfb"))) == 1


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "cores"), TARGETS)
def test_a_chain_of_more_slices_than_cores_runs_in_iree_at_each_size(preset, cores, tmp_path):
    p = planned(preset, cores)
    assert max(p.plan.op("mm.partial").split_k.select.factors) == 128 > cores
    text = emit(p.program, p.plan, p.target, p.given)
    # the chain's 128-slice case, and the partials' forall of one thread per core
    assert re.search(r"%mm_slices\w* = arith.select %\w+, %c128, ", text)
    assert re.search(rf"%y\.partials = scf\.forall \(%\S+\) in \({cores}\)", text)
    run_at(p, SIZES, tmp_path)


def test_a_user_chain_of_slices_uneven_over_the_cores_runs_in_iree(tmp_path):
    run_at(planned_uneven(), (12800, 3840, 23040, 3000), tmp_path)
