"""The torch executor's batched path: an op whose boxes form a lattice (equal boxes, every
operand's view moved by a fixed offset per loop level and worker axis) runs as one batched
kernel call, each box a batch element, and gives the numbers the box-by-box path gives; an
uneven split runs one lattice per box size; a matmul lattice is one GEMM."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import apportion as ap  # noqa: E402
from apportion.backends.torch.executor import TorchExecutor  # noqa: E402
from apportion.backends.torch.tensors import from_torch_storage  # noqa: E402
from apportion.errors import PlanningError, ProgramError  # noqa: E402
from apportion.planned import PlannedProgram  # noqa: E402
from apportion.runtime.reference import compare, random_inputs, run_unplanned  # noqa: E402
from tests.backends.reference.test_loops_properties import tiled_programs  # noqa: E402
from tests.helpers import bound, program  # noqa: E402
from tests.mlir.test_forall import (  # noqa: E402
    plan_small,
    resplit,
    resplit_programs,
    small_programs,
)


def both_ways(planned: PlannedProgram, seed: int = 0, params: dict[str, int] | None = None
              ) -> TorchExecutor:
    """Run ``planned`` batched and box by box on one thread; both match the unplanned
    reference and each other within the dtype's tolerance. Returns the batched executor."""
    xs = random_inputs(planned.program, seed)
    want = run_unplanned(planned.program, xs)
    batched = TorchExecutor(bound(planned, params), batched=True)
    boxwise = TorchExecutor(bound(planned, params), batched=False)
    got = {b: {n: from_torch_storage(y) for n, y in ex.run(xs).items()}
           for b, ex in ((True, batched), (False, boxwise))}
    for ys in got.values():
        bad = [c for c in compare(want, ys, planned.program) if not c.ok]
        assert not bad, bad
    bad = [c for c in compare(got[False], got[True], planned.program) if not c.ok]
    assert not bad, bad
    return batched


def pointwise_and_matmul(rows: int) -> ap.Program:
    return program({"x": ([rows, 128], "float32"), "w": ([128, 256], "float32")},
                   [{"name": "e", "op": "exp", "out": "e[i,j]", "ins": ["x[i,j]"]},
                    {"name": "mm", "op": "matmul", "out": "y[i,n]", "ins": ["e[i,k]", "w[k,n]"]}],
                   ["y"])


def test_even_splits_run_as_one_lattice_that_is_the_output():
    planned = ap.plan(pointwise_and_matmul(64), ap.targets.spyre(cores=8))
    ex = both_ways(planned)
    steps = {s.op.name: s for s in ex.steps}
    for op in planned.plan.ops:
        if op.cores > 1:
            step = steps[op.name]
            assert [lat.shape for lat in step.lattices] == \
                [tuple(n for _, n in op.splits if n > 1)], op
            assert step.loose == ()
            # the split follows the output's row-major order: the result is the output
            assert step.lattices[0].whole, op


def test_a_single_core_op_runs_as_a_lattice_of_one_box():
    planned = ap.plan(pointwise_and_matmul(64), ap.targets.spyre(cores=1))
    ex = both_ways(planned)
    for step in ex.steps:
        assert [lat.shape for lat in step.lattices] == [()], step.op.name


def test_uneven_splits_run_one_lattice_per_box_size():
    planned = ap.plan(pointwise_and_matmul(10), ap.targets.spyre(cores=4))
    planned = resplit(planned, {"e": {"i": 4}})  # 10 rows over 4 cores: 3, 3, 2, 2
    ex = both_ways(planned)
    e = {s.op.name: s for s in ex.steps}["e"]
    assert [lat.shape for lat in e.lattices] == [(2,), (2,)]
    assert e.loose == ()
    assert not any(lat.whole for lat in e.lattices)  # each writes its part of the output


def test_a_split_reduction_runs_box_by_box():
    planned = ap.plan(pointwise_and_matmul(64), ap.targets.spyre(cores=4))
    planned = resplit(planned, {"mm": {"k": 4}})  # the partials combine
    ex = both_ways(planned)
    assert {s.op.name: s for s in ex.steps}["mm"].lattices == ()


def test_a_matmul_lattice_runs_as_one_gemm_rows_and_column_blocks_stacked(monkeypatch):
    planned = ap.plan(pointwise_and_matmul(64), ap.targets.spyre(cores=32))
    mm = planned.plan.op("mm")
    cols = dict(mm.splits).get("n", 1)
    assert mm.cores > cols > 1, mm  # rows and columns both split
    calls = []
    real = torch.matmul

    def counting(a, b):
        calls.append((tuple(a.shape), tuple(b.shape)))
        return real(a, b)

    ex = TorchExecutor(planned.lowered)
    xs = random_inputs(planned.program)
    monkeypatch.setattr(torch, "matmul", counting)
    ex.run(xs)
    # one [64, 128] @ [128, 256]: every row block and column block of the lattice at once
    assert calls == [((64, 128), (128, 256))]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(small_programs(), st.sampled_from([1, 8, 32]), st.integers(0, 3))
def test_random_small_programs_agree_batched_and_box_by_box(p, cores, seed):
    both_ways(plan_small(p, cores), seed)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(resplit_programs(), st.integers(0, 3))
def test_random_redrawn_splits_agree_batched_and_box_by_box(planned, seed):
    both_ways(planned, seed)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tiled_programs(), st.sampled_from([1, 8, 32]), st.sampled_from([None, 4096]),
       st.integers(0, 3))
def test_random_tiled_programs_agree_batched_and_box_by_box(case, cores, scratch, seed):
    p, params = case
    target = ap.targets.spyre(cores=cores)
    if scratch is not None:
        target = dataclasses.replace(target, scratchpad_bytes=scratch)
    try:
        planned = ap.plan(p, target)
    except (PlanningError, ProgramError):
        assume(False)
        return
    both_ways(planned, seed, params)
