"""Split-K select chains on a run-time K whose cases pick more slices than the target's cores:
the chain keeps the static resolver's factor (gpu heuristic, table rows measured at the core
count), the partial op's slice dim is divided over the cores, and a run at each size divides
the chosen slices over them (several a core, unevenly where they do not divide) and matches the
unplanned program on the reference executor."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.frontend.json_format import from_dict
from apportion.planned import PlannedProgram
from apportion.plans.plan import SplitK
from apportion.report.tables import symbol_lines
from apportion.schedule.values import Launch
from apportion.target.split_k import (
    Case,
    ReductionShape,
    SelectChain,
    TableRow,
    gpu_slices,
    table_row,
)
from tests.split_k_chains import (
    SIZES,
    TARGETS,
    UNEVEN,
    matmul_doc,
    planned,
    planned_uneven,
    static_doc,
    target,
)


def partial_slices_per_core(p: PlannedProgram, k: int) -> list[int]:
    """How many slices each core's box of the partial op holds at run-time size ``k``."""
    schedule = p.schedule({"K": k})
    launch = next(s for s in schedule.steps if isinstance(s, Launch) and s.op == "mm.partial")
    axis = launch.dims.index("k_slice")
    return [0 if b is None else b[axis][1] - b[axis][0] for b in launch.boxes]


@pytest.mark.parametrize(("preset", "cores"), TARGETS)
def test_a_run_time_chain_picks_more_slices_than_cores_and_each_core_runs_several(preset,
                                                                                   cores):
    p = planned(preset, cores)
    split = p.plan.op("mm.partial").split_k
    assert split is not None and split.select is not None and split.by == "gpu"
    assert max(split.select.factors) == 128 > cores
    # the slice dim is spread over every core; 128 slices at K = 40960 fall 128 / cores a core
    assert dict(p.plan.op("mm.partial").splits)["k_slice"] == cores
    assert split.factor_at(40960) == 128
    assert partial_slices_per_core(p, 40960) == [128 // cores] * cores


@pytest.mark.parametrize(("preset", "cores"), TARGETS)
@pytest.mark.parametrize("k", [4096, 8192, 40960, 65536])
def test_the_chain_picks_what_the_static_gpu_resolver_picks_where_it_exceeds_the_cores(
        preset, cores, k):
    chain = planned(preset, cores).plan.op("mm.partial").split_k
    static = ap.plan(from_dict(static_doc(k)), target(preset, cores))
    picked = static.plan.op("mm.partial").split_k
    assert picked is not None and picked.factor > cores  # the static split is not clamped
    assert chain.factor_at(k) == picked.factor == gpu_slices(ReductionShape(1, 32, 32, k))


@pytest.mark.parametrize(("preset", "cores"), TARGETS)
@pytest.mark.parametrize("k", SIZES)
def test_a_chain_of_more_slices_than_cores_runs_right_on_the_reference(preset, cores, k):
    p = planned(preset, cores)
    checks = p.check(params={"K": k})
    assert checks and all(c.ok for c in checks), checks


def test_a_table_chain_keeps_rows_measured_at_the_core_count_and_cuts_the_others():
    rows = (TableRow(64, k=(2048, 8192), cores=8), TableRow(16, k=(8193, 32768)),
            TableRow(32, k=(32769, None), cores=8))
    t = dataclasses.replace(ap.targets.spyre(cores=8), split_k="table", split_k_table=rows)
    p = ap.plan(from_dict(matmul_doc()), t)
    split = p.plan.op("mm.partial").split_k
    assert split is not None and split.select is not None and split.by == "table"
    for k, want in ((4096, 64), (16384, 8), (40960, 32)):
        static = ap.plan(from_dict(static_doc(k)), t).plan.op("mm.partial").split_k
        row = table_row(rows, ReductionShape(1, 32, 32, k))
        assert row is not None and split.factor_at(k) == static.factor == want
        assert want == (row.slices if row.cores == 8 else min(row.slices, 8))
        assert all(c.ok for c in p.check(params={"K": k})), k
    assert partial_slices_per_core(p, 4096) == [8] * 8


def test_a_user_chain_divides_its_slices_unevenly_over_the_cores_and_runs_right():
    p = planned_uneven()
    split = p.plan.op("mm.partial").split_k
    assert split.select == UNEVEN and split.factor == 12 and split.by == "user"
    # planned at 12 slices: 6 of the 8 cores take them; 40 slices fall 7, 7, 7, 7, 6, 6
    assert partial_slices_per_core(p, 12800) == [7, 7, 7, 7, 6, 6]
    assert partial_slices_per_core(p, 23040) == [2] * 6
    for k in (12800, 3840, 23040, 3000):
        assert all(c.ok for c in p.check(params={"K": k})), k


def test_a_chain_is_kept_beside_work_division_pins_its_slices_over_the_cores_they_leave():
    doc = matmul_doc() | {"work_division": {"mm": {"m": 2}}}
    p = ap.plan(from_dict(doc), target("spyre", 8))
    partial = p.plan.op("mm.partial")
    assert partial.split_k.select is not None and max(partial.split_k.select.factors) == 128
    assert dict(partial.splits)["m"] == 2 and dict(partial.splits)["k_slice"] == 4
    for k in SIZES:
        assert all(c.ok for c in p.check(params={"K": k})), k


def test_a_plan_of_more_slices_than_cores_round_trips_through_json_and_runs():
    p = planned("spyre", 8)
    back = ap.PlannedProgram.from_json(p.to_json(), p.given, p.target)
    assert back.plan == p.plan
    assert all(c.ok for c in back.check(params={"K": 40960}))


def test_the_report_says_how_many_slices_a_core_runs():
    lines = symbol_lines(planned("spyre", 8).plan)
    assert "mm.partial: up to 128 slices over 8 cores, up to 16 a core" in lines
    assert not any("a core" in line for line in symbol_lines(planned("gpu", 304).plan))


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(k=st.one_of(st.integers(1, 20480), st.integers(1, 640).map(lambda n: 32 * n)),
       at=st.sampled_from(TARGETS))
def test_any_run_time_k_runs_right_with_its_slices_over_the_cores(k, at):
    preset, cores = at
    p = planned(preset, cores)
    split = p.plan.op("mm.partial").split_k
    factor = split.factor_at(k)
    static = gpu_slices(ReductionShape(1, 32, 32, k)) or 1
    if k % (static * 32) == 0 and static & (static - 1) == 0 and k <= 4194304:
        assert factor == static  # a power-of-two pick of whole sticks: the chain agrees
    shares = partial_slices_per_core(p, k)
    assert sum(shares) == factor and max(shares) == -(-factor // cores)
    assert all(c.ok for c in p.check(params={"K": k})), k


def test_an_argmax_chain_of_more_slices_than_cores_keeps_a_static_split_at_the_cores():
    doc = {"name": "am", "symbols": {"K": {"max": 8192}},
           "tensors": {"x": {"shape": [4, "K"], "dtype": "float32"},
                       "y": {"shape": [4], "dtype": "int64"}},
           "inputs": ["x"], "outputs": ["y"],
           "ops": [{"name": "am", "op": "argmax", "out": "y[m]", "ins": ["x[m,k]"]}]}
    chain = SelectChain("K", (Case(64, multiple=64 * 32),))
    p = ap.plan(from_dict(doc), ap.targets.spyre(cores=8),
                split_k=lambda s: chain if s.symbol else None)
    # value-index pairs are not cut into partials at run time: one split inside the op, at
    # most the cores, as a static resolver's split of argmax
    assert p.plan.op("am").split_k == SplitK(("k",), 8, "user")
    for k in (8192, 4096, 3000):
        assert all(c.ok for c in p.check(params={"K": k})), k
