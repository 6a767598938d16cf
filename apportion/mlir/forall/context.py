"""What every part of one function's renderer reads (``mlir.forall``): each op's step of the
schedule (``Work``), every size as an index expression (``forall.sizes``), the symbolic loop
counts' SSA values, and the ``mapping`` the schedule's target gives its foralls."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from apportion.errors import EmitError
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.mlir.forall.sizes import Sizes
from apportion.mlir.index import Ix
from apportion.schedule.values import Host, Launch, Loop, Schedule


@dataclass(frozen=True)
class Work:
    """What the renderer reads of one op's step of the schedule: the step (a ``Launch`` over
    its cores, or a ``Host`` fallback) and the loops enclosing it, outermost first. The
    worker grid, the planning units and the dims each loop level tiles all come from it.

    >>> import apportion as ap
    >>> from apportion.schedule.lower import lower
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    >>> works = Work.of(lower(planned.program, planned.plan, planned.target))
    >>> w = works["add"]
    >>> w.splits, [w.tiled(level) for level in range(len(w.loops))]
    ({'m': 8, 'n': 1}, [('m',), ('n',)])
    """

    step: Launch | Host
    dims: tuple[str, ...]
    loops: tuple[Loop, ...] = ()

    @staticmethod
    def of(schedule: Schedule) -> dict[str, Work]:
        """Op name -> its work, for every launch and host step of ``schedule``."""
        out: dict[str, Work] = {}
        for s, loops in schedule.walk():
            if isinstance(s, Launch | Host):
                op = schedule.program.op(s.op)
                out[s.op] = Work(s, op.dim_names, loops)
        return out

    @property
    def splits(self) -> dict[str, int]:
        """Dim -> how many workers split it (1: none; a host step runs whole)."""
        axes = self.step.axes if isinstance(self.step, Launch) else ()
        return {d: math.prod(a.size for a in axes if a.name == d) for d in self.dims}

    @property
    def per(self) -> dict[str, int]:
        """Dim -> elements in one planning unit (the workers cut whole units)."""
        if isinstance(self.step, Host) or not self.step.units:
            return dict.fromkeys(self.dims, 1)
        return dict(zip(self.dims, self.step.units, strict=True))

    @property
    def path(self) -> tuple[int, ...]:
        """The path of the innermost loop enclosing the op (empty outside loops)."""
        return self.loops[-1].path if self.loops else ()

    def tiled(self, level: int) -> tuple[str, ...]:
        """The dims loop ``level`` (outermost 0) tiles: those its iterations move the op's
        tile along (a nonzero step)."""
        steps = self.step.steps
        if level >= len(steps):
            return ()
        return tuple(d for d, v in zip(self.dims, steps[level], strict=True) if v)


def forall_mapping(workers: str, ids: int) -> str:
    """The ``mapping`` of a forall of ``ids`` induction variables whose workers are ``workers``
    (the schedule's ``forall_mapping``, its target's), as the text after its region:
    ``gpu_blocks`` maps the worker grid onto GPU blocks (the last id ``x``; beyond three ids
    ``linear_dim_i``); a block's work runs as loops in it, so nothing maps to GPU threads.
    ``cores`` gives none (a forall's threads are the cores).

    >>> forall_mapping("gpu_blocks", 2), forall_mapping("cores", 2)
    (' {mapping = [#gpu.block<y>, #gpu.block<x>]}', '')
    """
    if workers != "gpu_blocks":
        return ""
    dims = ["x", "y", "z"][:ids] if ids <= 3 else [f"linear_dim_{i}" for i in range(ids)]
    return f" {{mapping = [{', '.join(f'#gpu.block<{d}>' for d in reversed(dims))}]}}"



def symbols(schedule: Schedule) -> tuple[str, ...]:
    """The symbolic loop counts, in the order the emitted function takes them (after the
    inputs): as their loops first appear in the schedule.

    >>> import apportion as ap
    >>> from apportion.schedule.lower import lower, planned_counts
    >>> planned = ap.plan(ap.load("examples/softmax_symbolic.json"), ap.targets.spyre(cores=8))
    >>> symbols(lower(planned.program, planned.plan, planned.target,
    ...               params=planned_counts(planned.plan)))
    ('T',)
    """
    return tuple(dict.fromkeys(s.symbol for s, _ in schedule.walk()
                               if isinstance(s, Loop) and s.symbol))


@dataclass(frozen=True)
class Context:
    """The schedule one function renders, with each op's work, every size (``sizes``; run-time
    ones are defined as the function starts) and each symbolic loop count's SSA value
    (``counts``: the function's argument named after it)."""

    schedule: Schedule
    sizes: Sizes
    counts: Mapping[str, str]
    works: Mapping[str, Work]

    @staticmethod
    def of(schedule: Schedule, sizes: Sizes, counts: Mapping[str, str]) -> Context:
        """The context of ``schedule``, which must run the program's ops in order."""
        works = Work.of(schedule)
        program = schedule.program
        ran = [s.op for s in schedule.ops]
        if ran != [o.name for o in program.ops]:
            raise EmitError(f"schedule of {program.name!r} runs ops {ran}, not the program's "
                            f"{[o.name for o in program.ops]} in order")
        return Context(schedule, sizes, counts, works)

    @property
    def program(self) -> Program:
        return self.schedule.program

    def work(self, op: Op) -> Work:
        """``op``'s step of the schedule (and the loops around it)."""
        found = self.works.get(op.name)
        if found is None:
            raise EmitError(f"op {op.name!r}: the schedule of {self.program.name!r} runs no "
                            "such op")
        return found

    def slice_dims(self, op: Op) -> frozenset[str]:
        """The slice dims of ``op`` where it is a split-K partial (its launch's ``split_k``; the
        split names the cut dims, the partial's output leads with their slice dims): the sums
        they index are read expanded (``tensors.expanded``)."""
        found = self.works.get(op.name)
        step = found.step if found is not None else None
        split = step.split_k if isinstance(step, Launch) else None
        if split is None:
            return frozenset()
        # the partial writes [slices..., ...output dims]: one slice dim per cut dim, leading
        return frozenset(e.single_dim for e in op.out.index[:len(split.dims)] if e.single_dim)

    def dtype(self, tensor: str) -> str:
        return self.program.tensor(tensor).dtype

    def mapping(self, grid: str) -> str:
        """What follows the region of the forall over ``grid`` (``(%a, %b) in (2, 4)``): its
        ``mapping`` where the schedule's target gives one (``forall_mapping``)."""
        return forall_mapping(self.schedule.forall_mapping,
                              grid.split(" in ")[0].count(",") + 1)

    def count(self, loop: Loop) -> Ix:
        """A loop's count as an index value: a symbolic one is its function argument."""
        return Ix.atom(self.counts[loop.symbol]) if loop.symbol else Ix(loop.count)
