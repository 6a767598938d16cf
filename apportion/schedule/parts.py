"""Parts of a schedule: what a backend that runs some ops elsewhere (IREE, on the host between
its modules) cuts a schedule into, and a schedule that returns more of its tensors.

``segments(schedule, host)`` cuts a schedule at the ops ``host`` names: those that read nothing
(random numbers) first, lifted out of wherever they sit (a loop nest included), then each
maximal run of the other ops as a schedule of its own (its program: what the run reads from
before it, a lifted op's result among them, as inputs; what later ops or the program need as
outputs) with each host op that reads tensors alone between them. A run that nothing after it
reads is left out. Each part is the schedule the part's program and plan lower to (its steps
are the schedule's own: an op's launch depends on its plan alone), so the parts of a schedule
bound at run-time sizes are the bound parts of its ``unbound`` one.

``with_outputs(schedule, extra)``: the schedule whose program also returns ``extra`` tensors
(a compiled module returning the indices its gathers computed, to check them).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace

from apportion.errors import ExecutionError
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.schedule.values import Host, Launch, Lifetime, Loop, Schedule, Step

__all__ = ["enclosing", "lifetimes", "ops_in", "part", "part_program", "segments",
           "with_outputs"]


def lifetimes(program: Program, steps: Sequence[Step]) -> tuple[Lifetime, ...]:
    """When each tensor of ``program`` holds a value over ``steps`` (``Schedule.lifetimes``):
    made by the op at ``first`` (-1: an input), last read at ``last`` (the number of ops: held
    to the end, an input or output)."""
    ops = list(_ops(steps))
    end = len(ops)
    first = {t: -1 for t in program.inputs}
    last: dict[str, int] = {}
    for i, s in enumerate(ops):
        for t in (s.reads if isinstance(s, Host) else [o.tensor for o in s.reads]):
            last[t] = i
        out = s.write if isinstance(s, Host) else s.write.tensor
        first.setdefault(out, i)
    held = set(program.inputs) | set(program.outputs)
    return tuple(Lifetime(t, f, end if t in held else last.get(t, f)) for t, f in first.items())


def ops_in(loop: Loop) -> tuple[Launch | Host, ...]:
    """The launches and host steps in ``loop``'s body at any depth, in order."""
    return tuple(_ops(loop.body))


def _ops(steps: Sequence[Step]) -> Iterator[Launch | Host]:
    for s in steps:
        if isinstance(s, Loop):
            yield from _ops(s.body)
        elif isinstance(s, Launch | Host):
            yield s


def with_outputs(schedule: Schedule, extra: Sequence[str]) -> Schedule:
    """``schedule`` (and the one it binds) with ``extra`` tensors among its program's outputs
    (and the program as given's), after the others.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
    >>> with_outputs(planned.lowered, ["g"]).program.outputs
    ('y', 'g')
    """
    if not extra:
        return schedule
    outputs = (*schedule.program.outputs, *extra)
    program = replace(schedule.program, outputs=outputs)
    given = None if schedule.given is None else replace(schedule.given, outputs=outputs)
    unbound = None if schedule.unbound is None else with_outputs(schedule.unbound, extra)
    return replace(schedule, program=program, given=given, unbound=unbound,
                   lifetimes=lifetimes(program, schedule.steps))


def part_program(program: Program, run: Sequence[Op], later: Collection[str],
                 name: str) -> Program:
    """The program of the ops ``run`` (consecutive but for lifted host ops) of ``program``:
    its inputs what the run reads and does not make, its outputs what it makes that ``later``
    names, its tiling groups those of ``program`` restricted to the run's ops."""
    made = {op.out.tensor for op in run}
    ins = tuple(dict.fromkeys(a.tensor for op in run for a in op.ins if a.tensor not in made))
    outs = tuple(op.out.tensor for op in run if op.out.tensor in later)
    names = {op.name for op in run}
    used = set(ins) | made
    tiling = tuple(replace(t, ops=tuple(n for n in t.ops if n in names),
                           depths=tuple((n, d) for n, d in t.depths if n in names))
                   for t in program.tiling if names & set(t.ops))
    return replace(program, name=name, tensors=tuple(t for t in program.tensors if t.name in used),
                   inputs=ins, outputs=outs, ops=tuple(run), tiling=tiling, work_division=(),
                   split_k=())


def enclosing(schedule: Schedule, op: str) -> tuple[Loop, ...]:
    """The loops enclosing op ``op``'s step, outermost first (empty: outside every loop)."""
    for s, loops in schedule.walk():
        if isinstance(s, Launch | Host) and s.op == op:
            return loops
    raise ExecutionError(f"op {op!r} has no step in the schedule of {schedule.program.name!r}")


def segments(schedule: Schedule, host: Collection[str]) -> list[Schedule | Op]:
    """``schedule`` cut at the ops ``host`` names (see the module docstring): the host ops
    that read nothing first, then the parts (schedules) with each host op that reads tensors
    between them. Such an op must sit outside every loop (an ExecutionError names it).

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
    >>> segments(planned.lowered, ()) == [planned.lowered]
    True
    """
    program = schedule.program
    if not set(host) & set(program.op_map):
        return [schedule]
    lifted = [op for op in program.ops if op.name in host and not op.ins]
    cut = set(host) - {op.name for op in lifted}
    for name in sorted(cut):
        loops = enclosing(schedule, name)
        if loops:
            raise ExecutionError(f"op {name!r} runs on the host but sits in loop "
                                 f"{list(loops[0].path)}: a host step that reads tensors runs "
                                 "between the parts of a schedule, outside every loop")
    runs: list[list[Op] | Op] = []
    for op in program.ops:
        if op.name in cut:
            runs.append(op)
        elif op.name in host:
            continue  # lifted: computed before everything
        elif runs and isinstance(runs[-1], list):
            runs[-1].append(op)
        else:
            runs.append([op])
    out: list[Schedule | Op] = list(lifted)
    for i, run in enumerate(runs):
        if not isinstance(run, list):
            out.append(run)
            continue
        later = {a.tensor for op in program.ops[program.ops.index(run[-1]) + 1:]
                 for a in op.ins} | set(program.outputs)
        if not any(op.out.tensor in later for op in run):
            continue  # dead ops: nothing reads what they make
        out.append(part(schedule, [op.name for op in run], later, f"{program.name}_part{i}"))
    return out


def part(schedule: Schedule, ops: Collection[str], later: Collection[str], name: str
         ) -> Schedule:
    """The part of ``schedule`` (and of the one it binds) that runs ``ops`` alone: its steps
    of those ops (loops left empty dropped), its program ``part_program`` of them (``later``:
    what is read after it), no buffers (the part is a program of its own)."""
    keep = set(ops)
    program = part_program(schedule.program, [o for o in schedule.program.ops if o.name in keep],
                           later, name)
    given = None if schedule.given is None else part_program(
        schedule.given, [o for o in schedule.given.ops if o.name in keep], later, name)
    steps = _kept(schedule.steps, keep)
    unbound = None if schedule.unbound is None else part(schedule.unbound, ops, later, name)
    return replace(schedule, program=program, steps=steps, buffers=(),
                   lifetimes=lifetimes(program, steps), given=given, unbound=unbound)


def _kept(steps: Sequence[Step], keep: Collection[str]) -> tuple[Step, ...]:
    out: list[Step] = []
    for s in steps:
        if isinstance(s, Loop):
            body = _kept(s.body, keep)
            if body:
                out.append(replace(s, body=body))
        elif s.op in keep:
            out.append(s)
    return tuple(out)
