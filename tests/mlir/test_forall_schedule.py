"""The parallel IR is the schedule's: ``forall_mlir`` reads a ``Schedule`` (``schedule.lower``)
and nothing of the plan it was lowered from. A schedule built by hand, with no plan at all,
emits and runs; with every way to read a plan's decisions made to fail, the examples and random
nests emit the same text; an edited schedule changes the IR although the plan did not; and
random nests run in IREE from their schedules give what the reference executor gives at the
same loop counts. Modules are cached in a folder of the session."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.backends.iree import runtime as iree
from apportion.backends.iree.run import iree_run
from apportion.mlir.forall import forall_mlir, verify_mlir
from apportion.mlir.forall.context import symbols
from apportion.plans import memory, plan, tiles, views
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.lower import lower, planned_counts
from apportion.schedule.values import Launch, Operand, Schedule, WorkerAxis
from tests.backends.iree.nests import nest_programs, plan_nest, reference_exact
from tests.helpers import bound, emitted, program

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("iree")


def _fail(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("the emitter read the plan")


#: what a plan's decisions are read through: its ops' and groups' lookups and derived views,
#: and the functions that cut boxes and loop trees from them
_PLAN_METHODS = [(plan.Plan, "op"), (plan.Plan, "group")]
_PLAN_PROPERTIES = [(plan.OpPlan, "split_map"), (plan.OpPlan, "unit_map")]
_PLAN_FUNCTIONS = ["loop_tree", "tile_box", "core_boxes", "core_slices", "resolve_counts"]


@contextmanager
def plan_unreadable() -> Iterator[None]:
    """Every way to read a plan's decisions raises inside (in every loaded module that holds
    one of the functions, so an import by name is caught too)."""
    with pytest.MonkeyPatch.context() as m:
        for cls, name in _PLAN_METHODS:
            m.setattr(cls, name, _fail)
        for cls, name in _PLAN_PROPERTIES:
            m.setattr(cls, name, property(_fail))
        for mod in [tiles, views, memory,
                    *(v for k, v in sys.modules.items() if k.startswith("apportion.backends"))]:
            for name in _PLAN_FUNCTIONS:
                if hasattr(mod, name):
                    m.setattr(mod, name, _fail)
        yield


def schedule_of(planned: ap.PlannedProgram) -> Schedule:
    """The schedule a run emits (symbolic loop counts at their planned values), without the
    plan's buffers: nothing of the plan is left in it."""
    s = emitted(planned.program, planned.plan, planned.target,
                planned.given if planned.symbols else None)
    return dataclasses.replace(s, buffers=())


# --- a schedule without a plan -------------------------------------------------------------------

def hand_schedule() -> Schedule:
    """y = exp(x) over [6, 128] float32, built by hand: rows split over two cores unevenly in
    planning units of 2 rows (4 and 2), columns in units of a 32-element stick. No plan exists
    for it."""
    p = program({"x": ([6, 128], "float32")},
                [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}], ["y"],
                name="by_hand")
    boxes = (((0, 4), (0, 128)), ((4, 6), (0, 128)))
    launch = Launch("e", "exp", ("i", "j"), (WorkerAxis("i", 2),), ((0, 6), (0, 128)), boxes,
                    (), (Operand("x[i,j]", boxes),), Operand("y[i,j]", boxes), units=(2, 32))
    return Schedule(program=p, target="spyre", cores=2, steps=(launch,))


def test_a_schedule_built_by_hand_without_a_plan_emits_and_runs(cache):
    schedule = hand_schedule()
    text = forall_mlir(schedule)
    verify_mlir(text)
    assert "scf.forall (%e_i) in (2)" in text
    # the uneven slices of whole units: 4 rows, then 2
    assert "affine.min" in text
    inputs = random_inputs(schedule.program, seed=3)
    compiled = iree.compile_mlir(text, cache)
    run = iree.run_vmfb(compiled.vmfb, "by_hand", [(inputs["x"], "f32")], ["f32"])
    want = run_unplanned(schedule.program, inputs)
    checks = compare(want, {**inputs, "y": run.outputs[0]}, schedule.program)
    assert checks and all(c.ok for c in checks), checks


# --- nothing of the plan is read -------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.json")), ids=lambda p: p.stem)
def test_every_example_emits_the_same_ir_with_its_plan_unreadable(path):
    planned = ap.plan(ap.load(path), ap.targets.spyre(cores=8))
    schedule = schedule_of(planned)
    want = planned.forall_mlir()
    with plan_unreadable():
        assert forall_mlir(schedule) == want


def test_the_plan_made_unreadable_is_caught_where_it_is_read():
    # the guard itself: lowering reads the plan, so it fails inside
    planned = ap.plan(ap.load(ROOT / "examples/fused.json"), ap.targets.spyre(cores=8))
    with plan_unreadable(), pytest.raises(AssertionError, match="the emitter read the plan"):
        lower(planned.program, planned.plan, planned.target)


_EMITS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@_EMITS
@given(nest_programs())
def test_random_nests_emit_the_same_ir_with_their_plan_unreadable(case):
    prog, _params, cores, scratch = case
    try:
        planned = plan_nest(prog, cores, scratch)
    except (ap.PlanningError, ap.ProgramError):
        assume(False)
        return
    schedule = schedule_of(planned)
    want = planned.forall_mlir()
    with plan_unreadable():
        assert forall_mlir(schedule) == want


# --- the schedule decides ----------------------------------------------------------------------

def test_an_edited_schedule_changes_the_ir_though_the_plan_did_not(cache):
    planned = ap.plan(ap.load(ROOT / "examples/fused.json"), ap.targets.spyre(cores=8))
    schedule = schedule_of(planned)
    assert "scf.forall (%add_m) in (8)" in forall_mlir(schedule)

    def one_core(step: Any) -> Any:
        if isinstance(step, Launch) and step.op == "add":
            return dataclasses.replace(step, axes=(), boxes=(step.tile,), combine=(),
                                       reads=tuple(dataclasses.replace(o, regions=(o.regions[0],))
                                                   for o in step.reads),
                                       write=dataclasses.replace(step.write,
                                                                 regions=(step.write.regions[0],)))
        if hasattr(step, "body"):
            return dataclasses.replace(step, body=tuple(one_core(s) for s in step.body))
        return step

    edited = dataclasses.replace(schedule, steps=tuple(one_core(s) for s in schedule.steps))
    text = forall_mlir(edited)
    verify_mlir(text)
    assert "%add_m" not in text and planned.op("add").split_map["m"] == 8
    inputs = random_inputs(planned.program, seed=1)
    compiled = iree.compile_mlir(text, cache)
    p = planned.program
    run = iree.run_vmfb(compiled.vmfb, p.name, [(inputs[n], _elt(p, n)) for n in p.inputs],
                        [_elt(p, n) for n in p.outputs])
    got = {**inputs, **dict(zip(p.outputs, run.outputs, strict=True))}
    checks = compare(run_unplanned(p, inputs), got, p)
    assert checks and all(c.ok for c in checks), checks


def _elt(p: ap.Program, tensor: str) -> str:
    from apportion.mlir.types import mlir_type

    return mlir_type(p.tensor(tensor).dtype)


def test_symbolic_counts_are_the_schedule_s_loop_symbols_in_order():
    prog = program({"x": ([16, 256], "float16")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                    {"name": "r", "op": "sum", "out": "s[m,0]", "ins": ["y[m,n]"]}], ["s"],
                   tiling=[{"ops": ["e", "r"], "loops": [{"count": "T", "dims": ["m"]},
                                                         {"count": "U", "dims": ["n"]}]}])
    planned = ap.plan(prog, ap.targets.spyre(cores=4))
    schedule = lower(planned.program, planned.plan, planned.target,
                     params=planned_counts(planned.plan))
    assert symbols(schedule) == ("T", "U")
    head = forall_mlir(schedule).splitlines()[0]
    assert head.endswith("%T: index, %U: index) -> tensor<16x1xf16> {")


# --- random nests in IREE against the reference executor ---------------------------------------

def _iree_matches_reference(case: tuple, seed: int, cache: Path) -> None:
    """The nest's IREE run (emitted from its schedule) gives the reference executor's outputs
    at the same loop counts, within the dtype's tolerance."""
    prog, params, cores, scratch = case
    try:
        planned = plan_nest(prog, cores, scratch)
    except (ap.PlanningError, ap.ProgramError):
        assume(False)
        return
    assume(reference_exact(planned, params, seed))
    p = planned.program
    inputs = random_inputs(p, seed)
    want = planned.run(inputs, params=params)  # the reference executor, its schedule
    got = iree_run(bound(planned, params), inputs, cache).tensors
    checks = compare({n: want[n] for n in (*p.inputs, *p.outputs)}, got, p)
    bad = [c for c in checks if not c.ok]
    assert checks and not bad, bad
    assert all(np.shape(got[n]) == tuple(p.tensor(n).shape) for n in p.outputs)


def _runs(n: int) -> Any:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@_runs(4)
@given(nest_programs(), st.integers(0, 3))
def test_random_nests_run_in_iree_as_the_reference_executor_runs_them(cache, case, seed):
    _iree_matches_reference(case, seed, cache)


@pytest.mark.slow
@_runs(40)
@given(nest_programs(), st.integers(0, 3))
def test_many_random_nests_run_in_iree_as_the_reference_executor_runs_them(cache, case, seed):
    _iree_matches_reference(case, seed, cache)
