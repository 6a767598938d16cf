"""The LoopSpec builder reads only the schedule: on random tiled programs, nests, conformance
cases and every example it builds what the builder did when it derived tiles, splits and
steps from the plan itself (``plan_loopspec`` below, kept here only as the oracle), and a
schedule's steps, not the plan's, set the strides it emits."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.backends.bundle.addressing import (
    device_coordinates,
    padded_strides,
    tile_strides,
)
from apportion.backends.bundle.loopspec import from_schedule
from apportion.errors import ApportionError, EmitError, PlanningError, ProgramError
from apportion.frontend.random_programs import case
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.limits import cite
from apportion.planned import PlannedProgram
from apportion.plans.memory import Buffer, FinishOp, GroupPlan
from apportion.plans.plan import LoopInfo, OpPlan, Plan
from apportion.plans.tiles import LoopTree, loop_tree
from apportion.schedule.loopspec_values import LoopSpec, OpSpec, Spec, SpecProgram, TensorArg
from apportion.schedule.lower import lower, planned_counts
from apportion.schedule.values import Launch, symbolic_steps
from apportion.target.layout import device_layout
from apportion.target.presets import spyre
from apportion.target.target import Target
from tests.backends.bundle.test_loopspec import fused, ops_of
from tests.backends.reference.test_loops_properties import tiled_programs
from tests.passes.test_loop_nests import nests

ROOT = Path(__file__).parents[3]
EXAMPLES = sorted(p for p in ROOT.joinpath("examples").glob("*.json")
                  if p.name != "lm_head_prime_vocab.json")


# --- the oracle: the builder as it was, deriving every tile from the plan --------------------

def plan_level_steps(loop: LoopInfo, sizes: dict[str, int]
                     ) -> list[dict[str, tuple[int, tuple[str, ...]]]]:
    steps = []
    for level, dims in enumerate(loop.tiled_dims):
        step: dict[str, tuple[int, tuple[str, ...]]] = {}
        for d in dims:
            n, symbols = sizes[d], []
            for count, tiled in zip(loop.count[:level + 1], loop.tiled_dims[:level + 1],
                                    strict=True):
                if d not in tiled:
                    continue
                if isinstance(count, str):
                    symbols.append(count)
                elif n % count:
                    raise EmitError(f"loop count {count} does not divide dim {d!r} "
                                    f"({n} elements at that level)")
                else:
                    n //= count
            step[d] = (n, tuple(symbols))
        steps.append(step)
    return steps


def plan_loopspec(program: Program, plan: Plan, target: Target) -> SpecProgram:
    out: list[Spec] = []
    done: set[tuple[int, ...]] = set()
    for op in program.ops:
        op_plan = plan.op(op.name)
        if op_plan.loop is None:
            out.append(_op_spec(program, plan, target, op, op_plan, None))
        elif op_plan.loop.group[:1] not in done:
            done.add(op_plan.loop.group[:1])
            group = plan.group(op_plan.loop.group)
            loops = {n: plan.op(n).loop for n in group.ops}
            out += _items(program, plan, target, group, loop_tree(group.ops, loops))
    return SpecProgram(out)


def _finish_spec(program: Program, plan: Plan, target: Target, fin: FinishOp) -> OpSpec:
    op, op_plan = program.op(fin.op), plan.op(fin.op)
    loop = op_plan.loop
    assert loop is not None
    depth = fin.level
    planned = {n: v for n, _lo, _hi, v in plan.group(loop.group).symbolic}
    sizes = _sizes_at(op, op_plan, loop, depth, planned)
    space = {d: (sizes[d], op_plan.split_map[d]) for d in op.out.dims}
    kinds = {b.kind for b in plan.buffers_of(op.out.tensor)}
    args = [_arg(program, plan, target, op, op.out, 0, True, loop, depth, prefer="accumulator")]
    for kind in ("full", "tile"):
        if kind in kinds:
            args.append(_arg(program, plan, target, op, op.out, len(args), False, loop, depth,
                             prefer=kind))
    tiled = _tiled(LoopInfo(loop.group[:depth], loop.count[:depth], loop.tiled_dims[:depth]))
    return OpSpec(f"finish_{fin.fn}", False, space, tuple(args),
                  tuple(d for d in tiled if d in op.out.dims), f"{op.name}.finish")


def _items(program: Program, plan: Plan, target: Target, group: GroupPlan,
           items: list[str | LoopTree]) -> list[Spec]:
    out: list[Spec] = []
    for item in items:
        if isinstance(item, str):
            op, op_plan = program.op(item), plan.op(item)
            accumulates = any(c.op == item for c in group.combines)
            out.append(_op_spec(program, plan, target, op, op_plan, op_plan.loop, accumulates))
            for c in group.copies:
                if c.op == item:
                    assert op_plan.loop is not None
                    out.append(_step_spec(program, plan, target, op, op_plan, "copy", "copy",
                                          len(op_plan.loop.count)))
            continue
        inside = set(item.names())
        out += [_step_spec(program, plan, target, program.op(i.op), plan.op(i.op), "init",
                           "fill", item.depth)
                for i in group.inits if i.level == item.depth and i.op in inside]
        out.append(LoopSpec(item.count, tuple(_items(program, plan, target, group,
                                                     item.items))))
        out += [_finish_spec(program, plan, target, f)
                for f in group.finishes if f.level == item.depth and f.op in inside]
    return out


def _op_spec(program: Program, plan: Plan, target: Target, op: Op, op_plan: OpPlan,
             loop: LoopInfo | None, accumulates: bool = False) -> OpSpec:
    depth = len(loop.count) if loop else 0
    reads = (*op.ins, op.out) if accumulates else op.ins
    acc = "accumulator" if accumulates else None
    args = [_arg(program, plan, target, op, a, i, True, loop, depth,
                 prefer=acc if a is op.out else None) for i, a in enumerate(reads)]
    args.append(_arg(program, plan, target, op, op.out, len(reads), False, loop, depth,
                     prefer=acc))
    space = {d: (n, op_plan.split_map[d]) for d, n in op_plan.iteration_space}
    return OpSpec(op.fn, bool(op.reduction_dims), space, tuple(args), _tiled(loop), op.name)


def _step_spec(program: Program, plan: Plan, target: Target, op: Op, op_plan: OpPlan,
               step: str, fn: str, depth: int) -> OpSpec:
    loop = op_plan.loop
    assert loop is not None
    out = op.out
    planned = {n: v for n, _lo, _hi, v in plan.group(loop.group).symbolic}
    sizes = _sizes_at(op, op_plan, loop, depth, planned)
    space = {d: (sizes[d], op_plan.split_map[d]) for d in out.dims}
    if step == "copy":
        args: tuple[TensorArg, ...] = (
            _arg(program, plan, target, op, out, 0, True, loop, depth, prefer="tile"),
            _arg(program, plan, target, op, out, 1, False, loop, depth, prefer="full"))
    else:
        args = (_arg(program, plan, target, op, out, 0, False, loop, depth,
                     prefer="accumulator"),)
    tiled = _tiled(LoopInfo(loop.group[:depth], loop.count[:depth], loop.tiled_dims[:depth]))
    return OpSpec(fn, False, space, args, tuple(d for d in tiled if d in out.dims),
                  f"{op.name}.{step}")


def _sizes_at(op: Op, op_plan: OpPlan, loop: LoopInfo, depth: int,
              planned: dict[str, int]) -> dict[str, int]:
    if depth == len(loop.count):
        return op_plan.sizes
    sizes = dict(op.sizes)
    for count, dims in zip(loop.count[:depth], loop.tiled_dims[:depth], strict=True):
        n = count if isinstance(count, int) else planned.get(count, 1)
        for d in dims:
            sizes[d] //= n
    return sizes


def _tiled(loop: LoopInfo | None) -> tuple[str, ...]:
    out: list[str] = []
    for dims in loop.tiled_dims if loop else ():
        out += [d for d in dims if d not in out]
    return tuple(out)


def _buffer(plan: Plan, tensor: str, loop: LoopInfo | None, prefer: str | None) -> Buffer:
    found = plan.buffers_of(tensor)
    if not found:
        raise EmitError(f"the plan places no buffer for tensor {tensor!r}; plan it with the "
                        "buffers and scratchpad passes")
    group = loop.group if loop else None
    tiles = [b for b in found if b.kind == "tile" and group is not None
             and b.group == group[:len(b.group)]]
    whole = [b for b in found if b.kind != "tile"]
    if tiles and prefer in (None, "tile"):
        return tiles[0]
    if not whole:
        raise EmitError(f"tensor {tensor!r} has only tile buffers "
                        f"({[list(b.group) for b in found]}); nothing holds it whole")
    want = prefer or ("accumulator" if any(b.kind == "accumulator" and b.group == group
                                           for b in whole) else "full")
    return next((b for b in whole if b.kind == want), whole[0])


def _arg(program: Program, plan: Plan, target: Target, op: Op, access: Access, index: int,
         is_input: bool, loop: LoopInfo | None, depth: int, prefer: str | None = None
         ) -> TensorArg:
    t = program.tensor(access.tensor)
    buf = _buffer(plan, t.name, loop, prefer)
    dtype = buf.dtype or t.dtype
    fixed = buf.per_tile_fixed
    if buf.kind == "tile" or buf.kind == "accumulator" and (
            buf.space == "lx" or buf.shape != t.shape):
        shape, strides = buf.shape, (0,) * depth
        lives = len(buf.group) if buf.kind == "tile" else next(
            i.level for g in plan.groups for i in g.inits if i.tensor == t.name)
        if loop is not None and depth > lives:
            inner = LoopInfo(loop.group[:depth], loop.count[:depth], loop.tiled_dims[:depth])
            held = _per_core(plan, program, t.name, shape) if buf.space == "lx" else shape
            moves = tile_strides(access, padded_strides(held, dtype, target),
                                 plan_level_steps(inner, op.sizes))
            strides = (0,) * lives + moves[lives:]
        fixed = not any(strides)
    else:
        shape = t.shape
        strides = (0,) * depth
        if loop is not None and depth:
            inner = LoopInfo(loop.group[:depth], loop.count[:depth], loop.tiled_dims[:depth])
            strides = tile_strides(access, padded_strides(shape, dtype, target),
                                   plan_level_steps(inner, op.sizes))
    return TensorArg(
        is_input=is_input, arg_index=index, dtype=dtype,
        device_size=device_layout(shape, dtype, target).shape,
        device_coordinates=device_coordinates(access, shape, dtype, target),
        allocation={buf.space: buf.offset}, per_tile_fixed=fixed,
        tensor=t.name, tile_strides=strides)


def _per_core(plan: Plan, program: Program, tensor: str, shape: tuple[int, ...]
              ) -> tuple[int, ...]:
    producer = program.producer(tensor)
    if producer is None:
        return shape
    op_plan = plan.op(producer.name)
    per, splits = dict(op_plan.unit_elems), op_plan.split_map
    out = []
    for e, n in zip(producer.out.index, shape, strict=True):
        d = e.single_dim
        if d is None and any(splits.get(x, 1) > 1 for x in e.dims):
            raise EmitError(
                f"op {producer.name!r} writes tensor {tensor!r} through the merge "
                f"{e.to_source()} split over cores, and its scratchpad tile is read in loops "
                "deeper than the tile: one core's part of a merged axis has no scratchpad layout "
                "(ops that write through a merge run outside loop nests) "
                f"{cite('bundle-merged-scratchpad-tile')}")
        if d is None or splits.get(d, 1) == 1:
            out.append(n)
        else:
            units = -(-n // per[d])
            out.append(min(n, -(-units // splits[d]) * per[d]))
    return tuple(out)


# --- the property: the schedule's LoopSpec is the plan's ------------------------------------

def outcome(build, planned: PlannedProgram) -> SpecProgram | str:
    """The specs ``build`` makes of ``planned``, or the refusal it raises (its message)."""
    try:
        return build(planned.program, planned.plan, planned.target)
    except ApportionError as e:
        return f"{type(e).__name__}: {e}"


def assert_same_specs(planned: PlannedProgram) -> SpecProgram | str:
    """The builder reading the schedule makes exactly the oracle's specs (or its refusal)."""
    want = outcome(plan_loopspec, planned)
    got = outcome(lambda _program, _plan, target: from_schedule(planned.lowered, target),
                  planned)
    assert got == want, (planned.program.name, got, want)
    return got


def planned_or_skip(program: ap.Program, target: Target) -> PlannedProgram:
    try:
        return ap.plan(program, target)
    except (PlanningError, ProgramError) as e:
        event(f"not planned: {type(e).__name__}")
        assume(False)
        raise AssertionError from e  # unreachable: assume raised


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tiled_programs(), st.integers(1, 32), st.sampled_from([None, 4096, 512]))
def test_random_tiled_programs_build_the_plans_loopspec_from_the_schedule(case_, cores,
                                                                           scratch):
    prog, params = case_
    target = spyre(cores=cores)
    if scratch is not None:  # small scratchpads leave tiles in device memory
        target = dataclasses.replace(target, scratchpad_bytes=scratch)
    planned = planned_or_skip(prog, target)
    got = assert_same_specs(planned)
    event(f"{'refused' if isinstance(got, str) else 'built'}; symbolic count: {bool(params)}")


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(nests())
def test_nests_with_ops_at_several_depths_and_fallbacks_build_the_plans_loopspec(case_):
    prog, cores = case_
    got = assert_same_specs(planned_or_skip(prog, spyre(cores=cores)))
    event("refused" if isinstance(got, str) else "built")


@pytest.mark.parametrize("seed", range(60))
def test_conformance_cases_build_the_plans_loopspec_from_the_schedule(seed):
    c = case(seed)
    try:
        planned = ap.plan(c.program, c.target, c.strategy)
    except (PlanningError, ProgramError):
        return  # the planner refuses it: nothing to emit
    if planned.symbols:
        planned = planned.at(dict(c.sizes) or planned.given.planning_sizes())
    assert_same_specs(planned)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_builds_the_plans_loopspec_from_the_schedule(path):
    planned = ap.plan(ap.load(path).bind(), spyre(cores=32))
    assert not isinstance(assert_same_specs(planned), str)


def test_a_symbolic_count_stays_symbolic_at_the_value_it_was_planned_at():
    planned = ap.plan(fused(("T", 4)), spyre(cores=32))
    assert planned_counts(planned.plan) == {"T": 1}
    specs = assert_same_specs(planned)
    assert not isinstance(specs, str) and specs[0].count == "T"
    assert ops_of(specs)[0].args[0].tile_strides == ("8388608 floordiv T", 2048)


def test_the_schedules_steps_not_the_plans_set_the_strides():
    # halve every step of the schedule's launches: the tile strides follow, so the builder
    # reads the schedule (a copy of it edited by hand), not the plan behind it
    planned = ap.plan(fused(), spyre(cores=32))
    sched = lower(planned.program, planned.plan, planned.target)

    def halved(step):
        if isinstance(step, Launch):
            return dataclasses.replace(step, steps=tuple(tuple(s // 2 for s in level)
                                                         for level in step.steps))
        if hasattr(step, "body"):
            return dataclasses.replace(step, body=tuple(halved(s) for s in step.body))
        return step

    edited = dataclasses.replace(sched, steps=tuple(halved(s) for s in sched.steps))
    a = ops_of(from_schedule(edited, planned.target))[0].args[0]
    assert a.tile_strides == (4194304 // 2, 2048 // 2)
    assert ops_of(from_schedule(sched, planned.target))[0].args[0].tile_strides == (
        4194304, 2048)


# --- what the schedule carries for the builder ----------------------------------------------

@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tiled_programs(), st.integers(1, 32))
def test_schedule_loop_paths_units_and_symbolic_steps_agree_with_the_plan(case_, cores):
    prog, _ = case_
    planned = planned_or_skip(prog, spyre(cores=cores))
    sched = lower(planned.program, planned.plan, planned.target,
                  params=planned_counts(planned.plan))
    for step, loops in sched.walk():
        if not isinstance(step, Launch):
            continue
        op_plan = planned.plan.op(step.op)
        # the innermost loop's path is the op's loop path in the plan (its buffers' groups)
        assert (loops[-1].path if loops else None) == (op_plan.loop.group if op_plan.loop
                                                       else None)
        # a worker's part of the tile is the largest box the launch gives a worker
        for d, (lo, hi) in zip(step.dims, step.tile, strict=True):
            widest = max(b[step.dims.index(d)][1] - b[step.dims.index(d)][0]
                         for b in step.boxes if b is not None)
            assert step.part(d, hi - lo) == widest, (step.op, d)
        # the steps with symbolic counts kept symbolic are what the plan's loop info gives
        if op_plan.loop is not None:
            got = [{d: v for d, v in zip(step.dims, row, strict=True) if v[0]}
                   for row in symbolic_steps(step.steps, loops)]
            sizes = dict(planned.program.op(step.op).sizes)
            assert got == plan_level_steps(op_plan.loop, sizes), step.op
