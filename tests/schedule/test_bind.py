"""Binding run-time sizes by substitution (``schedule.bind``): the planned program at its
planning sizes made concrete at a run's sizes without running a planning pass again, the same
program the planning passes would rewrite at those sizes, its runs matching the unplanned
program."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import ExecutionError
from apportion.frontend.json_format import from_dict
from apportion.passes.split_k import rewrite_as_planned
from apportion.schedule.bind import bind_plan
from tests.passes.test_symbolic_sizes import transposed_doc
from tests.split_k_chains import matmul_doc


def pinned_doc() -> dict[str, Any]:
    """A matmul over a run-time K with a static split-K pin of 4 slices."""
    return {**matmul_doc(), "name": "pin", "split_k": {"mm": 4}}


def planned_cases() -> list[ap.PlannedProgram]:
    """A select chain (gpu), a static split of a run-time K on a target that pads a split
    stick (gpu) and one that does not (spyre), and a relayout copy of a run-time axis."""
    return [ap.plan(from_dict(matmul_doc()), ap.targets.gpu(cores=8)),
            ap.plan(from_dict(pinned_doc()), ap.targets.gpu(cores=8)),
            ap.plan(from_dict(pinned_doc()), ap.targets.spyre(cores=8)),
            ap.plan(from_dict(transposed_doc()), ap.targets.spyre(cores=32))]


CASES = planned_cases()


def rewritten_at(planned: ap.PlannedProgram, sizes: dict[str, int]) -> ap.Program:
    """The oracle: the program as given bound at ``sizes`` and rewritten by the planning
    passes (relayout, split-K partials) as its plan records, each split at its choice there."""
    concrete = planned.given.bind(sizes)
    split = {}
    for o in planned.plan.ops:
        if o.split_k is not None and o.name.endswith(".partial"):
            base = concrete.op(o.name.removesuffix(".partial"))
            split[o.name] = replace(o.split_k, factor=o.split_k.factor_at(
                base.sizes[base.reduction_dims[0]]))
    return rewrite_as_planned(concrete, planned.target, split)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(range(len(CASES))), st.integers(1, 65536))
def test_binding_gives_the_program_the_planning_passes_rewrite_at_that_size(case, size):
    planned = CASES[case]
    sizes = {planned.symbols[0]: min(size, planned.given.symbols[0].max or size)}
    try:
        bound, plan = bind_plan(planned.program, planned.plan, planned.given, sizes,
                                planned.target.split_padded_reduction)
    except ExecutionError as e:
        assert "whole planning units as planned" in str(e)
        names = {o.name for o in rewritten_at(planned, sizes).ops}
        assert names != {o.name for o in planned.program.ops}  # not cut there either
        return
    assert bound == rewritten_at(planned, sizes)
    assert [o.name for o in plan.ops] == [o.name for o in bound.ops] and not plan.symbols


def test_binding_runs_no_planning_pass(monkeypatch):
    from apportion.passes import coarse_tile, geometry, layouts, relayout, split_k

    planned = planned_cases()  # planned before the passes are taken away
    for module, name in ((relayout, "relayout"), (layouts, "layouts"),
                         (coarse_tile, "coarse_tile"), (geometry, "contexts"),
                         (split_k, "rewrite_as_planned"), (split_k, "partials")):
        monkeypatch.setattr(module, name, _refuse(name))
    for p, size in zip(planned, (40960, 4000, 4096, 1000), strict=True):
        schedule = p.schedule({p.symbols[0]: size})
        assert dict(schedule.sizes) == {p.symbols[0]: size}
        assert all(c.ok for c in p.check(params={p.symbols[0]: size})), p.program.name


def _refuse(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"binding ran the planning pass {name}")
    return refuse


def test_a_select_chain_cuts_the_bound_size_as_its_first_matching_case():
    chain = CASES[0]
    split = chain.plan.op("mm.partial").split_k
    assert split is not None and split.select is not None
    for k in (4096, 40960, 3000):
        bound, plan = chain.bound({"K": k})
        f = split.select.evaluate(k)
        assert bound.op("mm.partial").sizes == {"k_slice": f, "m": 32, "n": 32, "k_in": k // f}
        assert bound.tensor("y.partials").shape == (f, 32, 32)
        assert bound.op("mm.combine").sizes["k_slice"] == f
        assert plan.op("mm.partial").split_k.factor == f


def test_a_static_split_of_a_run_time_size_is_refused_where_its_slices_are_not_whole_units():
    spyre, gpu = CASES[2], CASES[1]
    with pytest.raises(ExecutionError, match=r"op 'mm': at sizes \{'K': 4000\} its reduction "
                                             r"cannot be cut into 4 slices \(pinned\)"):
        spyre.schedule({"K": 4000})
    # a target that pads a split stick takes any multiple of the slices
    assert gpu.schedule({"K": 4000}).program.op("mm.partial").sizes["k_in"] == 1000
    assert all(c.ok for c in gpu.check(params={"K": 4000}))


def test_a_binding_is_lowered_once_and_the_lowered_schedule_is_what_it_binds():
    planned = CASES[0]
    first = planned.schedule({"K": 4096})
    assert planned.schedule({"K": 4096}) is first
    assert first.unbound is planned.lowered and first.covering is planned.lowered
    at_planning = planned.schedule()
    assert at_planning is planned.lowered and at_planning.unbound is None
