"""Parts of a schedule (``schedule.parts``): a schedule cut at its host ops is, part by part,
the schedule that part's program and plan lower to, and renders the same parallel IR; a
schedule returning more tensors keeps its steps."""

from __future__ import annotations

from dataclasses import replace

import pytest

import apportion as ap
from apportion.mlir import bodies
from apportion.mlir.forall import forall_mlir
from apportion.mlir.module import gather_indices, host_ops, with_gather_indices
from apportion.plans.plan import Plan
from apportion.schedule.lower import lower, planned_counts
from apportion.schedule.parts import part_program, segments, with_outputs
from apportion.schedule.values import Loop, Schedule
from tests.backends.iree.test_iree_host_ops import noise_program
from tests.helpers import program
from tests.mlir.test_forall_ops import dead_program, nests_program


def part_plan(plan: Plan, names: set[str], name: str) -> Plan:
    """The plan of the ops ``names`` alone, as a program of their own plans them."""
    groups = (replace(g, ops=tuple(n for n in g.ops if n in names)) for g in plan.groups)
    return replace(plan, program=name, ops=tuple(o for o in plan.ops if o.name in names),
                   groups=tuple(g for g in groups if g.ops), buffers=(), rewritten=None)


def without_loop_dims(steps: tuple) -> tuple:
    """``steps`` with every loop's tiled dims left out (a loop that lost a lifted op may tile
    fewer dims of its group; nothing renders them)."""
    return tuple(replace(s, dims=(), body=without_loop_dims(s.body)) if isinstance(s, Loop)
                 else s for s in steps)


def assert_parts_lower_alike(planned: ap.PlannedProgram) -> int:
    """Every part of ``planned``'s schedule cut at its host ops is the schedule its program
    and plan lower to, and renders the same IR; how many parts there are."""
    parts = [s for s in segments(planned.lowered, host_ops(planned.program))
             if isinstance(s, Schedule)]
    for part in parts:
        names = {o.name for o in part.program.ops}
        pp = part_plan(planned.plan, names, part.program.name)
        oracle = lower(part.program, pp, planned.target, params=planned_counts(pp) or None)
        assert part.program == oracle.program
        assert without_loop_dims(part.steps) == without_loop_dims(oracle.steps)
        assert part.lifetimes == oracle.lifetimes and not part.buffers
        assert forall_mlir(part) == forall_mlir(oracle)
    return len(parts)


@pytest.mark.parametrize("noise_in_group", [False, True])
def test_each_part_around_a_host_step_is_the_schedule_its_own_plan_lowers_to(noise_in_group,
                                                                             monkeypatch):
    monkeypatch.delitem(bodies.BODIES, "sort")  # a host step that reads a tensor
    planned = ap.plan(nests_program(noise_in_group), ap.targets.spyre(cores=8))
    assert assert_parts_lower_alike(planned) == 2


@pytest.mark.parametrize("tiled", [False, True])
def test_parts_without_their_dead_ops_lower_alike(tiled, monkeypatch):
    monkeypatch.delitem(bodies.BODIES, "sort")
    planned = ap.plan(dead_program(tiled), ap.targets.spyre(cores=4))
    assert assert_parts_lower_alike(planned) == 1


def test_lifted_random_numbers_leave_one_part_as_its_plan_lowers():
    planned = ap.plan(noise_program(), ap.targets.spyre(cores=8))
    assert assert_parts_lower_alike(planned) == 1


def test_a_schedule_returning_its_gather_indices_keeps_its_steps_and_renders_them_too():
    p = program({"ids": ([6], "int32"), "k": ([6], "int32"), "table": ([5, 8], "float16")},
                [{"name": "shift", "op": "add", "out": "j[i]", "ins": ["ids[i]", "k[i]"]},
                 {"name": "emb", "op": "gather", "out": "e[i,d]",
                  "ins": ["table[v,d]", "j[i]"]}], ["e"])
    planned = ap.plan(p, ap.targets.spyre(cores=4))
    extra = gather_indices(planned.program)
    assert extra == ("j",)
    s = with_gather_indices(planned.lowered)
    assert s.program.outputs == (*planned.program.outputs, *extra)
    assert s.steps == planned.lowered.steps
    returning = replace(planned.program, outputs=s.program.outputs)
    oracle = lower(returning, planned.plan, planned.target)
    assert s.lifetimes == oracle.lifetimes and forall_mlir(s) == forall_mlir(oracle)
    assert with_outputs(planned.lowered, ()) is planned.lowered


def test_a_part_program_keeps_what_its_ops_read_and_what_is_read_later():
    p = noise_program()
    run = [p.op("add"), p.op("mm")]
    part = part_program(p, run, {"y"}, "t_part")
    assert (part.inputs, part.outputs) == (("t2", "e", "w"), ("y",))
    assert {t.name for t in part.tensors} == {"t2", "e", "w", "s", "y"}
