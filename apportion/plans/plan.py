"""Plan values: what the passes decided for each op (plan format v1)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from apportion.errors import PlanningError
from apportion.ir.program import Program
from apportion.plans.memory import Buffer, GroupPlan
from apportion.target.split_k import SelectChain

Pairs = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class LoopInfo:
    """Where an op sits in a coarse-tiling loop nest: group path, counts, tiled dims per level.

    ``tile_sizes`` gives the per-iteration size of each dim whose size is known only at run
    time, as an expression in its symbols: a run-time dim size ``S`` tiled by 4 is ``S/4``, a
    dim of 2048 tiled by a symbolic count ``T`` is ``2048/T`` (the plan's iteration space has
    the size at the planning values).
    """

    group: tuple[int, ...]
    count: tuple[int | str, ...]
    tiled_dims: tuple[tuple[str, ...], ...]
    # left out of the repr, which messages and docs show for static nests
    tile_sizes: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not (len(self.group) == len(self.count) == len(self.tiled_dims)):
            raise PlanningError(f"loop info levels disagree: group {self.group}, count "
                                f"{self.count}, tiled_dims {self.tiled_dims}")

    def __str__(self) -> str:
        """As a message names it: ``group [0, 0], counts [2, 4] over dims m; n``."""
        dims = "; ".join(", ".join(ds) for ds in self.tiled_dims)
        return f"group {list(self.group)}, counts {list(self.count)} over dims {dims}"


@dataclass(frozen=True)
class SplitK:
    """How an op's reduction was split before work distribution: the reduction dims cut, the
    slices, and who decided (a target resolver's name, ``user``, or ``pinned``).

    For a reduction size known only at run time, ``select`` chooses the slices from the size
    (first matching case) and ``factor`` is its choice at the planning size. Where more than one
    dim is cut, ``factors`` holds each dim's slices and ``factor`` their product.

    >>> SplitK(("c", "kh"), 12, "gpu", factors=(4, 3)).per_dim
    {'c': 4, 'kh': 3}
    """

    dims: tuple[str, ...]
    factor: int
    by: str
    select: SelectChain | None = None
    factors: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.dims) > 1 and (len(self.factors) != len(self.dims)
                                   or math.prod(self.factors) != self.factor):
            raise PlanningError(f"split-K of dims {self.dims}: factors {self.factors} must give "
                                f"each dim's slices, their product {self.factor}")

    @property
    def per_dim(self) -> dict[str, int]:
        """Each cut dim's slices."""
        return dict(zip(self.dims, self.factors, strict=True)) if len(self.dims) > 1 else {
            d: self.factor for d in self.dims}

    def factor_at(self, size: int) -> int:
        """The slices for a run-time reduction size ``size``."""
        return self.factor if self.select is None else self.select.evaluate(size)


@dataclass(frozen=True)
class OpPlan:
    """The plan of one op.

    ``iteration_space`` holds element counts (per loop iteration when the op is tiled);
    ``unit_elems`` the elements in one planning unit of each dim (a stick for stick dims, else 1)
    and ``splits`` how many slices each dim is cut into, in those units. ``cores`` is the
    product of the splits.
    """

    name: str
    op: str
    kind: str
    iteration_space: Pairs
    reduction_dims: tuple[str, ...]
    stick_dims: tuple[str, ...]
    unit_elems: Pairs
    splits: Pairs
    utilization: float
    predicted_time_us: float
    span_bytes: Pairs
    loop: LoopInfo | None = None
    span_splits: Pairs = ()
    split_k: SplitK | None = None

    def __post_init__(self) -> None:
        dims = [d for d, _ in self.iteration_space]
        for pairs, what in ((self.unit_elems, "unit_elems"), (self.splits, "splits")):
            if [d for d, _ in pairs] != dims:
                raise PlanningError(f"op {self.name!r}: {what} dims {[d for d, _ in pairs]} differ "
                                    f"from its iteration space {dims}")
        for d, n in self.splits:
            if n < 1 or n > self.unit_map[d]:
                raise PlanningError(f"op {self.name!r}: dim {d!r} split {n} outside "
                                    f"1..{self.unit_map[d]}")

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.iteration_space)

    @property
    def split_map(self) -> dict[str, int]:
        return dict(self.splits)

    @property
    def unit_map(self) -> dict[str, int]:
        """Planning units per dim: sticks for stick dims, elements otherwise."""
        per = dict(self.unit_elems)
        return {d: -(-n // per[d]) for d, n in self.iteration_space}

    @property
    def cores(self) -> int:
        return math.prod(n for _, n in self.splits)

    @property
    def fallback(self) -> bool:
        return self.kind == "fallback"

    def is_even(self, dim: str) -> bool:
        return self.unit_map[dim] % self.split_map[dim] == 0


@dataclass(frozen=True)
class ReuseCounts:
    """How many ops of a plan were planned and how many took an identical op's plan."""

    planned: int
    reused: int


@dataclass(frozen=True)
class Plan:
    """A whole program's plan for one target and core count.

    ``reuse`` says how it was made (ops planned vs ops that took an identical op's plan, see
    ``passes/geometry.PlanCache``), not what it is: plans compare equal whatever it holds.
    """

    program: str
    target: str
    cores: int
    strategy: str
    ops: tuple[OpPlan, ...]
    extras: tuple[tuple[str, object], ...] = field(default=())
    groups: tuple[GroupPlan, ...] = ()
    buffers: tuple[Buffer, ...] = ()
    reuse: ReuseCounts | None = field(default=None, compare=False)
    #: the program as planned, where planning rewrote it (split-K ops as partial and combine
    #: ops); None when it planned the program as given. Not part of plan format v1: reading a
    #: plan back rewrites the program again from the ops' ``split_k``
    rewritten: Program | None = field(default=None, compare=False, repr=False)
    #: symbol -> the size it was planned at, for a program with run-time sizes
    symbols: tuple[tuple[str, int], ...] = ()

    # Indexes built once per plan: reports, emitters and executors ask per op and per tensor,
    # and a scan of the whole plan each time made them quadratic in the program's size.

    @cached_property
    def op_map(self) -> dict[str, OpPlan]:
        """Op name -> its plan (the first, as ``op`` always answered)."""
        out: dict[str, OpPlan] = {}
        for o in self.ops:
            out.setdefault(o.name, o)
        return out

    @cached_property
    def buffer_map(self) -> dict[str, tuple[Buffer, ...]]:
        """Tensor -> its buffers, in plan order."""
        out: dict[str, list[Buffer]] = {}
        for b in self.buffers:
            out.setdefault(b.tensor, []).append(b)
        return {t: tuple(bs) for t, bs in out.items()}

    def op(self, name: str) -> OpPlan:
        found = self.op_map.get(name)
        if found is not None:
            return found
        raise PlanningError(f"plan has no op {name!r}; ops: {', '.join(o.name for o in self.ops)}")

    def group(self, path: tuple[int, ...]) -> GroupPlan:
        """The loop group at ``path``, or holding the loop at ``path`` (an op's loop path: the
        group's index, then which sibling loop at each depth)."""
        for g in self.groups:
            if g.path == tuple(path):
                return g
        for g in self.groups:
            if path and g.path[:1] == tuple(path[:1]):
                return g
        raise PlanningError(f"plan has no loop group {list(path)}; groups: "
                            f"{[list(g.path) for g in self.groups]}")

    def buffers_of(self, tensor: str) -> tuple[Buffer, ...]:
        """The buffers of ``tensor`` (a tile and a full one when a loop copies it out)."""
        return self.buffer_map.get(tensor, ())

    def buffer(self, tensor: str, kind: str | None = None) -> Buffer:
        """The buffer of ``tensor`` (of ``kind`` when it has two)."""
        found = [b for b in self.buffers_of(tensor) if kind is None or b.kind == kind]
        if len(found) != 1:
            what = "no" if not found else "more than one"
            raise PlanningError(f"plan has {what} {kind or ''} buffer for tensor {tensor!r}")
        return found[0]

    @property
    def mean_utilization(self) -> float:
        return sum(o.utilization for o in self.ops) / len(self.ops) if self.ops else 0.0
