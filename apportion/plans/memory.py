"""Plan values of coarse tiling: loop groups, buffers and the extra steps a loop nest needs.

A tensor lives in one or two buffers:

* ``full``: the whole tensor in device memory ("hbm"): inputs, results of ops outside loops,
  results of a loop read after it (written tile by tile into their slice);
* ``tile``: one loop iteration's tile at a fixed place every iteration reuses, in the scratchpad
  ("lx", one region per core) or in device memory when it does not fit;
* ``accumulator``: the op's output over the loops outside the one tiling its reduction (the whole
  tensor when that loop is the outermost), in the scratchpad when it fits, else in device memory;
  set to its reduction's identity before that loop, combined into every iteration, and copied
  out (``FinishOp``) after it.

A tensor made in a loop and read both in and after it has a ``tile`` and a ``full`` buffer and a
``CopyOp`` writing each tile into the full one.

>>> Buffer("y", "tile", "lx", 0, 32768, (512, 1024), (0, 0)).per_tile_fixed
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apportion.errors import PlanningError

BUFFER_KINDS = ("full", "tile", "accumulator")
SPACES = ("hbm", "lx")


@dataclass(frozen=True)
class Buffer:
    """Where one tensor's elements live.

    ``offset`` is a device-memory byte address (space ``hbm``) or a byte offset in every core's
    scratchpad (space ``lx``, where ``nbytes`` is per core and each core holds its part: a full
    buffer there is an untiled op's output kept on chip for its readers). ``shape`` is the
    elements it holds: the tensor's shape, or one tile's (an upper bound when a loop count is
    symbolic). ``group`` is the path of the loops a tile lives in (a prefix of its producer's)
    or of the accumulating op. ``dtype`` is set when the buffer
    holds another type than the tensor (a float32 accumulator of a float16 result).
    """

    tensor: str
    kind: str
    space: str
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    group: tuple[int, ...] = ()
    dtype: str = ""

    def __post_init__(self) -> None:
        where = f"buffer of tensor {self.tensor!r}"
        if self.kind not in BUFFER_KINDS:
            raise PlanningError(f"{where}: kind {self.kind!r}; valid: {', '.join(BUFFER_KINDS)}")
        if self.space not in SPACES:
            raise PlanningError(f"{where}: space {self.space!r}; valid: {', '.join(SPACES)}")
        if self.offset < 0 or self.nbytes <= 0:
            raise PlanningError(f"{where}: offset {self.offset} and nbytes {self.nbytes} must be "
                                ">= 0 and > 0")
        if self.kind != "full" and not self.group:
            raise PlanningError(f"{where}: a {self.kind} buffer needs its loop group path")

    @property
    def per_tile_fixed(self) -> bool:
        """True for a tile buffer: the same address every iteration (it does not advance)."""
        return self.kind == "tile"

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class InitOp:
    """Before the loop at ``level`` of ``group``: set the op's output slice to ``identity``.

    The slice is the one the loops outside ``level`` select, so a reduction tiled inside an
    outer loop restarts for every outer tile.
    """

    group: tuple[int, ...]
    op: str
    tensor: str
    fn: str
    identity: float
    level: int


@dataclass(frozen=True)
class CombineOp:
    """In the loop body after ``op``: ``tensor[tile] = fn(tensor[tile], the op's tile partial)``."""

    group: tuple[int, ...]
    op: str
    tensor: str
    fn: str


@dataclass(frozen=True)
class CopyOp:
    """In the loop body after ``op``: copy ``tensor``'s tile buffer into its full buffer."""

    group: tuple[int, ...]
    op: str
    tensor: str


@dataclass(frozen=True)
class FinishOp:
    """After the loop at depth ``level`` holding ``op`` (the loop that tiles its reduction;
    level 0: after the nest): ``tensor = cast(finish(fn, accumulator))`` into the tensor's
    buffers (its full one, and its tile buffer where ops of the group read it).

    The copy-out of a tile-sized accumulator; needed too when the accumulator is wider than the
    tensor or ``fn`` is ``mean`` (the sum over ``count`` reduction points is divided by it).
    """

    group: tuple[int, ...]
    op: str
    tensor: str
    fn: str
    count: int
    level: int = 0


@dataclass(frozen=True)
class GroupPlan:
    """One coarse-tiling loop nest: its ops, loop levels, and what its scratchpad holds.

    ``working_set_bytes`` is the scratchpad one core would need to hold every per-iteration
    intermediate (and tile-sized accumulator) of the group at once (offsets aligned, freed space
    reused); ``lx_tensors`` are
    those placed in the ``capacity`` bytes, ``hbm_tiles`` the tiles left in device memory, and
    ``saved_bytes`` the device memory the group's intermediates no longer take compared with
    whole tensors. ``iteration_time_us`` is the predicted time of one iteration of the body, its
    scratchpad tensors moving no device memory (0 when not computed). ``added`` is empty for a
    group of the program and names why the planner added it otherwise: ``"span"``, a loop of
    last resort around one op that no split keeps within the span limit (pass
    ``span_tiling``). ``symbolic`` gives each symbolic count's bounds and the value its tiles
    were planned at: a run may take any count from that value up to the bound.
    """

    path: tuple[int, ...]
    ops: tuple[str, ...]
    counts: tuple[int | str, ...]
    tiled_dims: tuple[tuple[str, ...], ...]
    working_set_bytes: int
    capacity: int
    lx_tensors: tuple[str, ...] = ()
    hbm_tiles: tuple[str, ...] = ()
    saved_bytes: int = 0
    inits: tuple[InitOp, ...] = ()
    combines: tuple[CombineOp, ...] = ()
    copies: tuple[CopyOp, ...] = ()
    finishes: tuple[FinishOp, ...] = ()
    iteration_time_us: float = 0.0
    added: str = ""
    #: per symbolic count: (name, min, max or None, the value every tile was planned at)
    symbolic: tuple[tuple[str, int, int | None, int], ...] = ()

    def __post_init__(self) -> None:
        if not (len(self.path) == len(self.counts) == len(self.tiled_dims)):
            raise PlanningError(f"loop group {list(self.ops)}: path {self.path}, counts "
                                f"{self.counts} and tiled_dims {self.tiled_dims} disagree")

    @property
    def fits(self) -> bool:
        """True when every per-iteration intermediate is in the scratchpad."""
        return self.working_set_bytes <= self.capacity

    @property
    def params(self) -> tuple[str, ...]:
        """Names of the symbolic loop counts (run-time parameters)."""
        return tuple(c for c in self.counts if isinstance(c, str))

    def check_count(self, name: str, value: int) -> str | None:
        """Why run-time ``value`` of symbolic count ``name`` is outside what the plan holds
        for (None when it is inside)."""
        for sym, _lo, hi, planned in self.symbolic:
            if sym != name:
                continue
            if value < planned:
                return (f"symbolic loop count {name!r} = {value} is below {planned}, the value "
                        f"loop group {list(self.path)} was planned at (its tiles hold "
                        f"{name} >= {planned})")
            if hi is not None and value > hi:
                return f"symbolic loop count {name!r} = {value} is above its bound max {hi}"
        return None

    @property
    def iterations(self) -> int | None:
        """Loop iterations in all, or None when a count is symbolic."""
        if self.params:
            return None
        return math.prod(int(c) for c in self.counts)
