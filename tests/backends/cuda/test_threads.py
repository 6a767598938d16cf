"""A block's work split over its threads (``mlir.gpu_threads``): the split IR computes what
the plan computes (run here through upstream's OpenMP lowering, each thread loop a loop), and a
block whose threads would share a buffer keeps one thread."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.backends.cuda.lowering import lower_nvvm
from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.mlir import upstream
from apportion.mlir.forall import forall_mlir
from apportion.mlir.gpu_threads import ThreadSplit, thread_tiles
from apportion.mlir.module import call, with_gather_indices
from apportion.runtime.check import expect
from apportion.runtime.reference import bind_inputs
from tests.helpers import bound, emitted

pytestmark = pytest.mark.skipif(not upstream.available(),
                                reason="needs the mlir extra (upstream MLIR 22)")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _split_matches(planned: ap.PlannedProgram, threads: int,
                   params: dict[str, int] | None = None) -> ThreadSplit:
    """Split ``planned``'s parallel IR over ``threads`` threads a block, run it on two OpenMP
    threads and assert every output matches the reference; the split."""
    from apportion.backends.openmp.engine import Engine

    schedule = with_gather_indices(bound(planned, params))
    split = thread_tiles(forall_mlir(schedule.covering), threads)
    sizes = {k: v for k, v in (params or {}).items() if k in planned.symbols}
    unplanned = planned.given.bind(sizes) if planned.symbols else planned.program

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        env = bind_inputs(schedule.program, inputs)
        c = call(schedule, env)
        engine = Engine(split.text)
        try:
            done = engine.call(c.function, [(v, elt) for _, v, elt in c.arguments],
                               [(shape, elt) for _, shape, elt in c.results], threads=2)
        finally:
            engine.drop()
        outputs = planned.program.outputs
        return {**env, **{n: a for (n, _, _), a in zip(c.results, done.outputs, strict=True)
                          if n in outputs}}

    with np.errstate(all="ignore"):
        want = expect(unplanned)
        checks = want.compare(run(want.inputs))
    assert all(c.ok for c in checks), checks
    return split


@pytest.mark.parametrize("name", ["fused", "megatron", "softmax_tiled", "attention", "halo"])
def test_an_example_split_over_threads_computes_what_the_plan_computes(name):
    planned = ap.plan(ap.load(EXAMPLES / f"{name}.json"), ap.targets.gpu(cores=8))
    split = _split_matches(planned, 16)
    assert split.threaded >= 1 and "#gpu.thread<x>" in split.text


def test_every_block_of_an_elementwise_chain_is_split():
    planned = ap.plan(ap.load(EXAMPLES / "fused.json"), ap.targets.gpu(cores=8))
    split = _split_matches(planned, 64)
    assert (split.blocks, split.threaded) == (2, 2)


def test_a_block_whose_threads_would_share_a_copied_slice_keeps_one_thread():
    # the k-tiled matmul accumulates into a slice of its output that bufferization copies into
    # a buffer of the block's own: each GPU thread would hold a copy, so the block stays whole
    planned = ap.plan(ap.load(EXAMPLES / "matmul_mk.json"), ap.targets.gpu(cores=8))
    text = forall_mlir(emitted(planned.program, planned.plan, planned.target))
    lowered = lower_nvvm(text, threads=128)
    assert (lowered.blocks, lowered.threaded) == (1, 0)


def test_threads_per_block_beyond_cuda_s_limit_are_refused():
    planned = ap.plan(ap.load(EXAMPLES / "fused.json"), ap.targets.gpu(cores=8))
    text = forall_mlir(emitted(planned.program, planned.plan, planned.target))
    with pytest.raises(ExecutionError, match=r"threads per block must be in 1\.\.1024, got 2048"):
        lower_nvvm(text, threads=2048)


@st.composite
def _cases(draw):
    from apportion.frontend.random_programs import random_case
    from tests.conformance.draws import HypothesisDraw

    return random_case(HypothesisDraw(draw)), draw(st.integers(1, 32)), draw(
        st.sampled_from([2, 8, 32]))


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_random_plans_split_over_threads_compute_what_the_plan_computes(case):
    c, cores, threads = case
    try:
        planned = ap.plan(c.program, ap.targets.gpu(cores=cores), c.strategy)
        forall_mlir(emitted(planned.program, planned.plan, planned.target,
                            planned.given if planned.symbols else None))
    except (PlanningError, ProgramError):
        assume(False)
    except ap.ApportionError:
        assume(False)  # the emitter's own documented refusals (tested with IREE)
    _split_matches(planned, threads, dict(c.sizes) or None)
