"""Lowering a plan to its schedule: every per-core and per-iteration box made explicit once.

``lower(program, plan, target, sizes, params, given)`` binds the run-time sizes of a program
that has them (``schedule.bind.bind_plan``: by substitution in the planned program, split-K
select chains evaluated, every op's slices cut from the bound sizes) and the symbolic loop
counts (``params``, each checked against what its group was planned for), then walks the
program in order: an op outside loops becomes a ``Launch`` over its cores (the plan's core
slices, ``plans.views.core_slices``) or a ``Host`` step (a fallback); a loop group becomes its
nest of ``LoopTree``s (``plans.tiles.loop_tree``) with the ``Init`` of each accumulator before the
loop tiling its reduction, the ``Finish`` after it, and a ``Copy`` after each producer whose
tile is copied out. A launch in a loop gives its tile and its cores' boxes
(``plans.tiles.tile_box`` and ``core_boxes``) at iteration 0 and their step per loop level: a
tile is the previous level's divided by a count that divides it, so every box moves by the same
amount each iteration. Every error of a loop count (one that does not divide a dim, an unbound
symbol, one outside its planned range) is raised here, before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from apportion.errors import ApportionError, ExecutionError, ProgramError
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.plans.memory import GroupPlan
from apportion.plans.plan import LoopInfo, OpPlan, Plan
from apportion.plans.tiles import (
    Box,
    LoopTree,
    core_boxes,
    loop_tree,
    region,
    resolve_counts,
    tile_box,
)
from apportion.plans.views import core_slices
from apportion.schedule.bind import bind_plan
from apportion.schedule.parts import lifetimes
from apportion.schedule.values import (
    Copy,
    Finish,
    Host,
    Init,
    Launch,
    Loop,
    Operand,
    Ranges,
    Schedule,
    Step,
    Steps,
    WorkerAxis,
)
from apportion.target.target import Target

__all__ = ["lower", "planned_counts"]


def lower(program: Program, plan: Plan, target: Target | str,
          sizes: Mapping[str, int] | None = None, params: Mapping[str, int] | None = None,
          given: Program | None = None) -> Schedule:
    """The schedule of ``plan`` for ``program`` on ``target`` (a ``Target``, or its name where
    nothing needs more: binding run-time sizes asks whether the target pads a split stick),
    at symbolic loop counts ``params``. ``given`` is the program as given where it has
    run-time sizes (``program``, the planned one, is then at its planning sizes): the
    schedule is at run-time ``sizes`` of its symbols (default: the planning sizes), bound by
    substitution (``schedule.bind``); a program with run-time sizes passed as ``program`` is
    its own given one (a plan that rewrote nothing). Raises ExecutionError for a plan that
    does not fit the program, a loop count that does not divide a dim or is unbound, or sizes
    the plan cannot take.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
    >>> s = lower(planned.program, planned.plan, planned.target)
    >>> first = s.steps[0]
    >>> first.op, [str(a) for a in first.axes], first.boxes_at(())[7]
    ('gate', ['m:2', 'n:4'], {'m': (128, 256), 'n': (2112, 2816), 'k': (0, 1024)})
    """
    name = target if isinstance(target, str) else target.name
    cores = plan.cores if isinstance(target, str) else target.cores
    if (plan.target, plan.cores) != (name, cores):
        raise ExecutionError(f"plan is for {plan.target!r} with {plan.cores} cores, not "
                             f"{name!r} with {cores}")
    bound: tuple[tuple[str, int], ...] = ()
    if given is None and program.symbol_map:
        given, program = program, program.bind()
        if [o.name for o in program.ops] != [o.name for o in plan.ops]:
            raise ExecutionError(f"plan of {plan.program!r} rewrote program {given.name!r} "
                                 "(relayout copies, split-K ops): lower the planned program "
                                 "with the program as given (given=)")
    if given is not None and given.symbol_map:
        if isinstance(target, str):
            raise ExecutionError(f"program {given.name!r} has run-time sizes "
                                 f"({', '.join(given.symbol_map)}): binding them needs the "
                                 f"target {name!r} itself, not its name")
        chosen = {**given.planning_sizes(), **dict(sizes or {})}
        try:
            program, plan = bind_plan(program, plan, given, sizes or {},
                                      target.split_padded_reduction)
        except ProgramError as e:
            raise ExecutionError(str(e)) from None
        bound = tuple(chosen.items())
    else:
        given = None
        if sizes:
            raise ExecutionError(f"program {program.name!r} has no symbolic sizes; got "
                                 f"{sorted(sizes)}")
    counts = _bind_counts(program, plan, params)
    steps = _Lowering(program, plan, counts).steps()
    # a target's name alone maps nothing: its foralls' workers are cores
    mapping = "cores" if isinstance(target, str) else target.forall_mapping
    return Schedule(program=program, target=name, cores=plan.cores, steps=steps,
                    buffers=plan.buffers, lifetimes=lifetimes(program, steps), sizes=bound,
                    params=tuple(sorted((params or {}).items())), given=given,
                    forall_mapping=mapping)


def planned_counts(plan: Plan) -> dict[str, int]:
    """Every symbolic loop count of ``plan`` at the value its group's tiles were planned at
    (the largest, where groups share a name: the least value every one of them takes), so a
    schedule lowered at them has the tiles as planned (an emitter keeping the counts symbolic
    recovers its steps from them: ``values.symbolic_steps``).

    >>> import apportion as ap
    >>> p = ap.load("examples/fused.json")
    >>> planned_counts(ap.plan(p, ap.targets.spyre(cores=8)).plan)
    {}
    """
    out: dict[str, int] = {}
    for g in plan.groups:
        for name, _lo, _hi, value in g.symbolic:
            out[name] = max(value, out.get(name, value))
    return out


def _bind_counts(program: Program, plan: Plan, params: Mapping[str, int] | None
                 ) -> dict[str, int]:
    """Every symbolic loop count at its value in ``params``: each one given, within what its
    group was planned for; no other name."""
    needed = {c for g in plan.groups for c in g.counts if isinstance(c, str)}
    extra = sorted(set(params or {}) - needed)
    if extra:
        raise ExecutionError(f"params {extra} given, but plan of {program.name!r} has no such "
                             "symbolic loop count")
    out: dict[str, int] = {}
    for g in plan.groups:
        for count, value in zip(g.counts, resolve_counts(g.counts, params), strict=True):
            if isinstance(count, str):
                why = g.check_count(count, value)
                if why is not None:
                    raise ExecutionError(why)
                out[count] = value
    return out


def _axis_steps(access: Access, steps: Sequence[Mapping[str, int]]) -> Steps:
    """How far ``access``'s region moves per loop level when its box moves by ``steps`` (per
    level, dim -> offset): a region's bounds are affine in its box's, so it moves by the
    access's coefficients times the box's step."""
    return tuple(tuple(sum(c * s.get(d, 0) for d, c in e.terms) for e in access.index)
                 for s in steps)


class _Lowering:
    """One lowering: the program, its plan, the symbolic counts bound."""

    def __init__(self, program: Program, plan: Plan, counts: Mapping[str, int]) -> None:
        self.program, self.plan, self.counts = program, plan, counts

    def op_plan(self, op: Op) -> OpPlan:
        try:
            return self.plan.op(op.name)
        except ApportionError as e:
            raise ExecutionError(f"op {op.name!r}: {e}") from None

    def loop_counts(self, loop: LoopInfo) -> tuple[int, ...]:
        return tuple(self.counts[c] if isinstance(c, str) else c for c in loop.count)

    def steps(self) -> tuple[Step, ...]:
        group_of = {n: g for g in self.plan.groups for n in g.ops}
        out: list[Step] = []
        done: set[tuple[int, ...]] = set()
        for op in self.program.ops:
            op_plan = self.op_plan(op)
            if op_plan.loop is None:
                out.append(self.untiled(op, op_plan))
                continue
            group = group_of.get(op.name)
            if group is None:
                raise ExecutionError(f"op {op.name!r}: plan puts it in loop {op_plan.loop}, "
                                     "which no loop group of the plan holds")
            if group.path not in done:
                done.add(group.path)
                out += self.group(group)
        return tuple(out)

    # --- ops outside loops -------------------------------------------------------------------

    def untiled(self, op: Op, op_plan: OpPlan) -> Launch | Host:
        if op_plan.sizes != op.sizes:
            raise ExecutionError(f"op {op.name!r}: plan's iteration space {op_plan.sizes} "
                                 f"differs from the op's {op.sizes}")
        if not op.kind.divisible:
            return self.host(op, op_plan)
        return self.launch(op, op_plan, {d: (0, n) for d, n in op.dims},
                           list(core_slices(op_plan)), ())

    def host(self, op: Op, op_plan: OpPlan) -> Host:
        if op_plan.cores != 1:
            raise ExecutionError(f"op {op.name!r}: fallback ops run on one core, plan gives "
                                 f"{op_plan.cores}")
        return Host(op.name, op.kind.name, tuple(a.tensor for a in op.ins), op.out.tensor)

    def launch(self, op: Op, op_plan: OpPlan, tile: Box, boxes: Sequence[Box | None],
               steps: tuple[dict[str, int], ...], mode: str = "write") -> Launch:
        dims = op.dim_names
        par = op.parallel_dims
        by_slice: dict[tuple[tuple[int, int], ...], list[int]] = {}
        for w, b in enumerate(boxes):
            if b is not None:
                by_slice.setdefault(tuple(b[d] for d in par), []).append(w)
        dim_steps = tuple(tuple(s.get(d, 0) for d in dims) for s in steps)

        def operand(access: Access) -> Operand:
            return Operand(str(access),
                           tuple(None if b is None else region(access, b) for b in boxes),
                           _axis_steps(access, steps))

        return Launch(
            op=op.name, kind=op.kind.name, dims=dims,
            axes=tuple(WorkerAxis(d, n) for d, n in op_plan.splits if n > 1),
            tile=tuple(tile[d] for d in dims),
            boxes=tuple(None if b is None else tuple(b[d] for d in dims) for b in boxes),
            steps=dim_steps, reads=tuple(operand(a) for a in op.ins), write=operand(op.out),
            combine=tuple(tuple(g) for g in by_slice.values() if len(g) > 1), mode=mode,
            units=tuple(dict(op_plan.unit_elems)[d] for d in dims), split_k=op_plan.split_k)

    # --- loop groups -------------------------------------------------------------------------

    def group(self, group: GroupPlan) -> list[Step]:
        loops: dict[str, LoopInfo] = {}
        for name in group.ops:
            op_plan = self.op_plan(self.program.op(name))
            loop = op_plan.loop
            if loop is None or loop.group[:1] != group.path[:1]:
                raise ExecutionError(f"op {name!r}: plan's loop {loop} is not in group "
                                     f"{list(group.path)}")
            loops[name] = loop
        return self.items(group, loop_tree(group.ops, loops), 0)

    def items(self, group: GroupPlan, items: Sequence[str | LoopTree], depth: int
              ) -> list[Step]:
        out: list[Step] = []
        for item in items:
            if isinstance(item, str):
                out += self.tiled(group, self.program.op(item), depth)
                continue
            inside = item.names()
            out += [self.init(self.program.op(i.op), i.fn, i.identity, depth)
                    for i in group.inits if i.level == depth and i.op in inside]
            count = item.count
            symbol = count if isinstance(count, str) else None
            tiled: list[str] = []
            path: tuple[int, ...] = ()
            for name in inside:
                loop = self.op_plan(self.program.op(name)).loop
                assert loop is not None
                tiled += [d for d in loop.tiled_dims[depth] if d not in tiled]
                path = path or loop.group[:depth + 1]  # the ops inside share it (loop_tree)
            out.append(Loop(self.counts[count] if symbol else int(count),
                            tuple(self.items(group, item.items, depth + 1)), symbol,
                            tuple(tiled), path))
            out += [self.finish(self.program.op(f.op), f.fn, f.count, depth)
                    for f in group.finishes if f.level == depth and f.op in inside]
        return out

    def moves(self, op: Op, depth: int) -> tuple[Box, tuple[dict[str, int], ...], LoopInfo]:
        """``op``'s tile at iteration 0 of its ``depth`` outermost loops, and its step per
        level: the tile at a unit index of that level less the tile at 0."""
        loop = self.op_plan(op).loop
        assert loop is not None
        counts = self.loop_counts(loop)
        zero = (0,) * depth
        tile = tile_box(op.sizes, loop, zero, counts, op.name)
        steps = []
        for level in range(depth):
            unit = tuple(1 if i == level else 0 for i in range(depth))
            at = tile_box(op.sizes, loop, unit, counts, op.name)
            steps.append({d: at[d][0] - tile[d][0] for d in tile if at[d][0] != tile[d][0]})
        return tile, tuple(steps), loop

    def tiled(self, group: GroupPlan, op: Op, depth: int) -> list[Step]:
        op_plan = self.op_plan(op)
        tile, steps, loop = self.moves(op, depth)
        # every level divides: checked over the whole nest, so a bad count fails here
        tile_box(op.sizes, loop, (0,) * len(loop.count), self.loop_counts(loop), op.name)
        out: list[Step]
        if not op.kind.divisible:  # its tile too: a backend may keep one tile at a time
            host = self.host(op, op_plan)
            dims = op.dim_names
            out = [Host(host.op, host.kind, host.reads, host.write,
                        tuple(tile[d] for d in dims),
                        tuple(tuple(s.get(d, 0) for d in dims) for s in steps))]
        else:
            mode = "accumulate" if any(c.op == op.name for c in group.combines) else "write"
            out = [self.launch(op, op_plan, tile, core_boxes(op_plan, tile), steps, mode)]
        for c in group.copies:
            if c.op == op.name:
                reg = region(op.out, tile)
                out.append(Copy(op.name, c.tensor, reg, _axis_steps(op.out, steps)))
        return out

    def _acc(self, op: Op, level: int) -> tuple[Ranges, Steps]:
        tile, steps, _ = self.moves(op, level)
        return region(op.out, tile), _axis_steps(op.out, steps)

    def init(self, op: Op, fn: str, identity: float, level: int) -> Init:
        reg, steps = self._acc(op, level)
        return Init(op.name, op.out.tensor, fn, identity, reg, steps)

    def finish(self, op: Op, fn: str, count: int, level: int) -> Finish:
        reg, steps = self._acc(op, level)
        return Finish(op.name, op.out.tensor, fn, count, reg, steps)
