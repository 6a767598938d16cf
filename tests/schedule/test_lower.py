"""The schedule a plan lowers to: every launch's boxes and regions at every loop iteration are
the ones ``plans.tiles`` and ``plans.views`` give (random tiled and untiled programs, uneven and
split reductions, run-time sizes), its steps keep program order, its text form reads, and bad
counts and sizes are refused before anything runs."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.frontend.json_format import from_dict
from apportion.planned import PlannedProgram
from apportion.plans.tiles import core_boxes, region, resolve_counts, tile_box
from apportion.plans.views import core_slices, ring_groups
from apportion.schedule import Copy, Finish, Host, Init, Launch, Loop, Schedule, lower
from apportion.schedule.values import WorkerAxis, moved
from tests.backends.reference.test_loops_properties import tiled_programs
from tests.helpers import program
from tests.mlir.test_forall import plan_small, resplit_programs, small_programs

ROOT = Path(__file__).parents[2]
CORES = (1, 8, 32)
PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


def lowered(planned: PlannedProgram, params: dict[str, int] | None = None) -> Schedule:
    return lower(planned.program, planned.plan, planned.target, params=params)


def check_against_plan(planned: PlannedProgram, sched: Schedule,
                       params: dict[str, int] | None = None) -> int:
    """Every launch's tile, boxes and regions at every index of its loops equal
    ``tile_box`` / ``core_boxes`` / ``region`` of the plan (``core_slices`` and ``ring_groups``
    outside loops); returns how many launches were checked."""
    program, plan = sched.program, planned.plan
    checked = 0
    for step, loops in sched.walk():
        if isinstance(step, Init | Finish | Copy):
            check_around(sched, planned, step, loops, params)
        if not isinstance(step, Launch):
            continue
        op = program.op(step.op)
        op_plan = plan.op(op.name)
        assert step.kind == op.kind.name and step.dims == op.dim_names
        assert [(a.name, a.size) for a in step.axes] == [
            (d, n) for d, n in op_plan.splits if n > 1]
        assert all(a.level == "core" for a in step.axes)
        assert step.workers == op_plan.cores
        counts = tuple(lp.count for lp in loops)
        if op_plan.loop is None:
            assert not loops and step.mode == "write"
            assert list(step.boxes_at(())) == core_slices(op_plan)
            assert [list(g) for g in step.combine] == [list(g) for g in ring_groups(op_plan)]
            indexes: list[tuple[int, ...]] = [()]
        else:
            assert counts == resolve_counts(op_plan.loop.count, params)
            indexes = list(itertools.product(*(range(c) for c in counts)))
        for index in indexes:
            tile = (tile_box(op.sizes, op_plan.loop, index, counts, op.name)
                    if op_plan.loop else {d: (0, n) for d, n in op.dims})
            assert step.tile_at(index) == tile
            boxes = core_boxes(op_plan, tile) if op_plan.loop else core_slices(op_plan)
            assert list(step.boxes_at(index)) == boxes
            for operand, access in zip((*step.reads, step.write), (*op.ins, op.out),
                                       strict=True):
                assert operand.access == str(access)
                assert list(operand.at(index)) == [None if b is None else region(access, b)
                                                   for b in boxes]
        checked += 1
    return checked


def check_around(sched: Schedule, planned: PlannedProgram, step: Init | Finish | Copy,
                 loops: tuple[Loop, ...], params: dict[str, int] | None = None) -> None:
    """An init, finish or copy's region at every index of its enclosing loops is its op's
    output over the op's tile at that depth (the accumulator's reset and copy-out region, the
    tile copied out)."""
    op = sched.program.op(step.op)
    loop = planned.plan.op(op.name).loop
    assert loop is not None and step.tensor == op.out.tensor
    counts = resolve_counts(loop.count, params)
    for index in itertools.product(*(range(lp.count) for lp in loops)):
        assert step.at(index) == region(op.out, tile_box(op.sizes, loop, index, counts))


def check_order(planned: PlannedProgram, sched: Schedule) -> None:
    """The launches and host steps are the program's ops, each once, in program order."""
    assert [s.op for s in sched.ops] == [op.name for op in sched.program.ops]
    for s in sched.ops:
        assert isinstance(s, Host) == (not sched.program.op(s.op).kind.divisible)


# --- properties --------------------------------------------------------------------------------

@PROPERTY
@given(tiled_programs(), st.sampled_from(CORES), st.sampled_from([None, 4096, 512]))
def test_tiled_programs_boxes_and_regions_at_every_iteration_are_the_plans(case, cores,
                                                                           scratch):
    p, params = case
    target = ap.targets.spyre(cores=cores)
    if scratch is not None:  # small scratchpads: tiles in device memory, accumulators
        target = dataclasses.replace(target, scratchpad_bytes=scratch)
    try:
        planned = ap.plan(p, target)
    except (PlanningError, ProgramError):
        assume(False)
        return
    sched = lowered(planned, params)
    check_order(planned, sched)
    assert check_against_plan(planned, sched, params) >= 1
    assert dict(sched.params) == (params or {})
    assert sched.buffers == planned.plan.buffers


@PROPERTY
@given(small_programs(), st.sampled_from(CORES))
def test_untiled_programs_boxes_are_the_core_slices(p, cores):
    planned = plan_small(p, cores)
    sched = lowered(planned)
    check_order(planned, sched)
    check_against_plan(planned, sched)


@PROPERTY
@given(resplit_programs())
def test_uneven_splits_and_split_reductions_combine_as_the_ring_groups(planned):
    sched = lowered(planned)
    check_against_plan(planned, sched)
    split = [o for o in planned.plan.ops if ring_groups(o)]
    for o in split:
        launch = next(s for s in sched.ops if s.op == o.name)
        assert isinstance(launch, Launch) and launch.combine


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 64))
def test_run_time_sizes_are_bound_before_the_boxes_are_cut(sticks):
    planned = ap.plan(ap.load(ROOT / "examples/dynamic_k.json"), ap.targets.spyre(cores=8))
    k = 32 * sticks  # whole float32 sticks
    try:
        program, plan = planned.bound({"K": k})
    except (ExecutionError, ProgramError):
        with pytest.raises(ExecutionError):
            planned.schedule({"K": k})
        return
    sched = planned.schedule({"K": k})
    assert dict(sched.sizes) == {"K": k}
    assert sched.program.tensor("x").shape == (32, k)
    assert [s.op for s in sched.ops] == [o.name for o in program.ops]
    for s in sched.ops:
        assert isinstance(s, Launch)
        assert list(s.boxes_at(())) == core_slices(plan.op(s.op))


def test_an_accumulator_is_reset_before_the_loop_tiling_its_reduction_and_finished_after():
    """A matmul tiled over m and then k, its exp after the k loop: the init of its
    accumulator before the k loop, the launch accumulating in it, the finish after it, each
    region the m tile."""
    mm = program({"x": ([64, 512], "float16"), "w": ([512, 128], "float16")},
                 [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
                  {"name": "e", "op": "exp", "out": "z[m,n]", "ins": ["y[m,n]"]}],
                 ["y", "z"],
                 tiling=[{"ops": ["mm", "e"], "depths": {"e": 1},
                          "loops": [{"count": 2, "dims": ["m"]}, {"count": 2, "dims": ["k"]}]}])
    target = dataclasses.replace(ap.targets.spyre(cores=8), scratchpad_bytes=8192)
    planned = ap.plan(mm, target)
    sched = lowered(planned)
    outer = sched.steps[0]
    assert isinstance(outer, Loop) and (outer.count, outer.dims) == (2, ("m",))
    init, inner, finish, exp = outer.body
    assert isinstance(init, Init) and (init.tensor, init.fn, init.identity) == ("y", "sum", 0.0)
    assert isinstance(inner, Loop) and inner.dims == ("k",)
    launch = inner.body[0]
    assert isinstance(launch, Launch) and launch.mode == "accumulate"
    assert isinstance(finish, Finish) and (finish.fn, finish.count) == ("sum", 512)
    assert isinstance(exp, Launch) and exp.mode == "write"
    assert init.at((1,)) == finish.at((1,)) == ((32, 64), (0, 128))
    assert "accumulates y[0:8, 0:64]" in str(launch)
    check_against_plan(planned, sched)


def test_a_long_loop_stays_one_small_value():
    p = program({"x": ([32768, 64], "float16")},
                [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]}], ["y"],
                tiling=[{"ops": ["e"], "loops": [{"count": 4096, "dims": ["m"]}]}])
    planned = ap.plan(p, ap.targets.spyre(cores=8))
    sched = lowered(planned)
    loop = sched.steps[0]
    assert isinstance(loop, Loop) and loop.count == 4096
    launch = loop.body[0]
    assert isinstance(launch, Launch) and len(launch.boxes) == 8
    assert launch.boxes_at((4095,))[7] == {"m": (32767, 32768), "n": (0, 64)}
    assert len(str(sched)) < 2000


def test_symbolic_counts_are_bound_and_named():
    doc = json.loads(ap.dumps(ap.load(ROOT / "examples/fused.json")))
    doc["tiling"][0]["loops"][0]["count"] = "T"
    planned = ap.plan(ap.loads(json.dumps(doc)), ap.targets.spyre(cores=8))
    sched = lowered(planned, {"T": 4})
    loop = sched.steps[0]
    assert isinstance(loop, Loop) and (loop.count, loop.symbol) == (4, "T")
    assert dict(sched.params) == {"T": 4}
    assert str(loop).startswith("loop 4 (T = 4) over m:")
    check_against_plan(planned, sched, {"T": 4})


def test_lifetimes_end_at_the_last_reader_and_outputs_are_held():
    planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8))
    sched = lowered(planned)
    life = {x.tensor: (x.first, x.last) for x in sched.lifetimes}
    names = [s.op for s in sched.ops]
    end = len(names)
    assert life["x"] == (-1, end) and life["y"][1] == end
    # gate's output is read by act only
    g = planned.program.op("gate").out.tensor
    assert life[g] == (names.index("gate"), names.index("act"))


def test_host_steps_are_the_fallbacks():
    p = program({"x": ([4, 64], "float32")},
                [{"name": "cs", "op": "cumsum", "out": "c[i,j]", "ins": ["x[i,j]"]},
                 {"name": "e", "op": "exp", "out": "e[i,j]", "ins": ["c[i,j]"]}], ["e"])
    planned = ap.plan(p, ap.targets.spyre(cores=8))
    sched = lowered(planned)
    host = sched.steps[0]
    assert isinstance(host, Host) and (host.reads, host.write) == (("x",), "c")
    assert str(host) == "host cs (cumsum): x -> c"


# --- the text form -----------------------------------------------------------------------------

def test_text_form_of_the_fused_example():
    planned = ap.plan(ap.load(ROOT / "examples/fused.json"), ap.targets.spyre(cores=8))
    text = str(lowered(planned))
    lines = text.splitlines()
    assert lines[0] == "schedule fused on spyre, 8 cores"
    assert "buffers:" in lines and "steps:" in lines
    assert "  loop 2 over m:" in lines and "    loop 4 over n:" in lines
    assert ("      launch add (add) over m:8 (cores), tile m[0:512] n[0:1024] +m512/L0 "
            "+n1024/L1") in lines
    assert ("        core 7: m[448:512] n[0:1024]  reads a[448:512, 0:1024] "
            "b[448:512, 0:1024]  writes y[448:512, 0:1024]") in lines


def test_text_form_names_split_reductions_and_accumulation():
    launch = Launch("s", "sum", ("i", "k"), (WorkerAxis("k", 2),), ((0, 4), (0, 8)),
                    (((0, 4), (0, 4)), ((0, 4), (4, 8))), ((0, 8),),
                    (), dataclasses.replace(_out(), regions=(((0, 4),), ((0, 4),))),
                    combine=((0, 1),), mode="accumulate")
    text = str(launch)
    assert text.splitlines()[0] == ("launch s (sum) over k:2 (cores), tile i[0:4] k[0:8] "
                                    "+k8/L0")
    assert "accumulates y[0:4]" in text and text.endswith("combine (0,1)")


def _out():
    from apportion.schedule import Operand
    return Operand("y[i]", (((0, 4),),), ((0,),))


# --- the values --------------------------------------------------------------------------------

def test_moved_ranges_step_once_per_level():
    assert moved(((0, 4),), ((4,), (1,)), (2, 3)) == ((11, 15),)
    with pytest.raises(ExecutionError, match="has 1 levels; the enclosing loops have 2"):
        moved(((0, 4),), ((4,), (1,)), (2,))


def test_bad_values_are_refused():
    with pytest.raises(ExecutionError, match="level 'chip'"):
        WorkerAxis("m", 2, "chip")
    with pytest.raises(ExecutionError, match="mode 'add'"):
        dataclasses.replace(Launch("e", "exp", (), (), (), ((),), (), (), _out()), mode="add")
    with pytest.raises(ExecutionError, match="a grid of m:2 workers holds 1 boxes"):
        Launch("e", "exp", (), (WorkerAxis("m", 2),), (), ((),), (), (), _out())
    with pytest.raises(ExecutionError, match="loop count 0"):
        Loop(0, ())


# --- errors ------------------------------------------------------------------------------------

def symbolic_fused() -> PlannedProgram:
    doc = json.loads(ap.dumps(ap.load(ROOT / "examples/fused.json")))
    doc["tiling"][0]["loops"][0]["count"] = "T"
    return ap.plan(ap.loads(json.dumps(doc)), ap.targets.spyre(cores=8))


def test_a_count_that_does_not_divide_a_dim_names_op_dim_and_count():
    planned = symbolic_fused()
    with pytest.raises(ExecutionError,
                       match=r"op 'add': loop level 0 count 3 \(symbolic 'T'\) does not divide "
                             r"dim 'm' of size 1024"):
        lowered(planned, {"T": 3})


def test_an_unbound_or_unknown_symbolic_count_is_refused():
    planned = symbolic_fused()
    with pytest.raises(ExecutionError, match="symbolic loop count 'T' needs a value"):
        lowered(planned)
    with pytest.raises(ExecutionError, match=r"params \['U'\] given"):
        lowered(planned, {"T": 2, "U": 1})


def test_sizes_need_symbols_and_binding_needs_the_target():
    planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8))
    with pytest.raises(ExecutionError, match=r"program 'mlp' has no symbolic sizes; got \['K'\]"):
        lower(planned.program, planned.plan, planned.target, sizes={"K": 8})
    dyn = ap.plan(ap.load(ROOT / "examples/dynamic_k.json"), ap.targets.spyre(cores=8))
    with pytest.raises(ExecutionError, match="binding them needs the target 'spyre' itself"):
        lower(dyn.given, dyn.plan, "spyre", sizes={"K": 64})


def test_a_plan_for_another_program_is_refused_naming_the_op():
    planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8))
    other = ap.plan(ap.load(ROOT / "examples/attention.json"), ap.targets.spyre(cores=8))
    with pytest.raises(ExecutionError, match="op 'gate': plan has no op 'gate'"):
        lower(planned.program, other.plan, planned.target)


def test_a_program_with_run_time_sizes_keeps_the_program_as_given():
    planned = ap.plan(ap.load(ROOT / "examples/dynamic_k.json"), ap.targets.spyre(cores=8))
    sched = lower(planned.given, planned.plan, planned.target, sizes={"K": 256})
    assert sched.given is planned.given and sched.given.tensor("x").symbols == {1: "K"}
    assert sched.program.tensor("x").shape == (32, 256) and not sched.program.symbol_map
    static = ap.plan(ap.load(ROOT / "examples/mlp.json"), ap.targets.spyre(cores=8))
    assert lower(static.program, static.plan, static.target).given is None


def test_a_split_k_partial_launch_carries_the_plans_split_and_its_select_chain():
    doc = {"name": "dynk", "symbols": {"K": {"max": 65536}},
           "tensors": {"x": {"shape": [32, "K"], "dtype": "float32"},
                       "w": {"shape": ["K", 32], "dtype": "float32"}},
           "inputs": ["x", "w"], "outputs": ["y"],
           "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]",
                    "ins": ["x[m,k]", "w[k,n]"]}]}
    planned = ap.plan(from_dict(doc), ap.targets.resolve("gpu", None))
    split = planned.plan.op("mm.partial").split_k
    assert split is not None and split.select is not None  # a run-time K: a select chain
    sched = planned.lowered
    launches = {s.op: s for s in sched.ops if isinstance(s, Launch)}
    assert launches["mm.partial"].split_k == split
    assert all(s.split_k == planned.plan.op(n).split_k for n, s in launches.items())
