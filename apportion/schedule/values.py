"""The lowered form of one device's plan over its cores: an explicit, frozen schedule.

A ``Schedule`` is what a backend runs: every decision of the plan made concrete, so that no
backend derives per-core or per-iteration boxes from ``Plan`` + ``Program`` itself. Its
``steps`` are, in program order:

- ``Launch``: an op run over a grid of worker axes (``WorkerAxis``, each with a ``level``:
  ``"core"`` here; a mesh adds ``"device"`` axes outside them), with every worker's box of the
  iteration space, the region of every operand it reads and the region of the output it
  writes, the groups of workers whose partials combine (a split reduction), and whether it
  writes its output or accumulates into it (a reduction tiled by a loop);
- ``Host``: a whole-tensor fallback, run whole on the host (in a loop body with its tile, for
  a backend keeping one tile at a time);
- ``Loop``: a counted loop (an int; the symbol it was bound from, if any) and its body;
- ``Init`` / ``Finish`` / ``Copy``: an accumulator set to its identity before a loop, copied
  out (finished) after it, a tile copied into the tensor's full buffer after its producer.

Boxes and regions inside loops are not listed per iteration: each is given at iteration 0 of
its enclosing loops plus an affine step per loop level (outermost first), so a loop of 4096
iterations stays one small value; ``Launch.boxes_at(index)`` and ``Operand.at(index)`` give
the concrete ranges at a loop index. A range is ``(start, stop)``; a box names the op's dims
in ``Launch.dims`` order, a region a tensor's axes in order.

>>> launch = Launch("e", "exp", ("i",), (WorkerAxis("i", 2),), ((0, 8),),
...                 (((0, 4),), ((4, 8),)), ((8,),), (),
...                 Operand("y[i]", (((0, 4),), ((4, 8),)), ((8,),)))
>>> launch.boxes_at((3,))
({'i': (24, 28)}, {'i': (28, 32)})
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Union

from apportion.errors import ExecutionError
from apportion.ir.program import Program
from apportion.plans.memory import Buffer
from apportion.plans.plan import SplitK

#: ``(start, stop)`` of one axis
Interval = tuple[int, int]
#: one range per axis (an op's dims, or a tensor's axes)
Ranges = tuple[Interval, ...]
#: per enclosing loop level (outermost first), how far each axis moves per iteration
Steps = tuple[tuple[int, ...], ...]

#: worker levels, outermost first: devices of a mesh, then the cores of one device
LEVELS = ("device", "core")
MODES = ("write", "accumulate")


def moved(start: Ranges, steps: Steps, index: Sequence[int]) -> Ranges:
    """``start`` at loop ``index`` (one entry per level of ``steps``, outermost first).

    >>> moved(((0, 4), (0, 8)), ((4, 0), (0, 8)), (2, 1))
    ((8, 12), (8, 16))
    """
    if len(index) != len(steps):
        raise ExecutionError(f"loop index {tuple(index)} has {len(index)} levels; the "
                             f"enclosing loops have {len(steps)}")
    shift = [sum(i * s[a] for i, s in zip(index, steps, strict=True))
             for a in range(len(start))]
    return tuple((lo + d, hi + d) for (lo, hi), d in zip(start, shift, strict=True))


def outer_tile(tile: Ranges, steps: Steps, whole: Ranges, depth: int) -> tuple[Ranges, Steps]:
    """The tile of only the ``depth`` outermost of the loops ``steps`` moves ``tile`` by (the
    deeper loops' dims ``whole``), at iteration 0, and its steps: a loop level's step along an
    axis is the width of the tile it cuts there, so an axis moved by a level ``< depth`` is as
    wide as the deepest such level's step, and any other axis is ``whole``'s range (what a
    buffer living in the outer loops of a nest holds, an accumulator reset outside them).

    >>> outer_tile(((0, 2), (0, 4)), ((4, 0), (2, 4)), ((0, 16), (0, 8)), 1)
    (((0, 4), (0, 8)), ((4, 0),))
    """
    out = []
    for a, ((lo, _hi), (wlo, whi)) in enumerate(zip(tile, whole, strict=True)):
        width = next((s[a] for s in reversed(steps[:depth]) if s[a]), None)
        out.append((wlo, whi) if width is None else (lo, lo + width))
    return tuple(out), steps[:depth]


#: a step kept symbolic: ``(n, symbols)``, ``n`` divided by the product of the symbolic loop
#: counts ``symbols`` (exact at every value they may take)
SymbolicStep = tuple[int, tuple[str, ...]]


def symbolic_steps(steps: Steps, loops: Sequence[Loop]) -> tuple[tuple[SymbolicStep, ...], ...]:
    """``steps`` (per level of ``loops``, outermost first, per dim of one op: ``Launch.steps``)
    with the symbolic loop counts kept symbolic. A level's step along a dim is the dim divided
    by the counts of that level and of every outer level tiling it (those where its step is not
    0), so at the bound counts it is ``n`` over the product of the symbolic ones among them:
    ``n`` is the bound step times their bound values.

    >>> loops = (Loop(4, (), "T"), Loop(2, ()))
    >>> symbolic_steps(((256, 0), (64, 512)), loops)
    (((1024, ('T',)), (0, ())), ((256, ('T',)), (512, ())))
    """
    if len(steps) != len(loops):
        raise ExecutionError(f"steps of {len(steps)} loop levels; {len(loops)} loops given")
    out = []
    for level, step in enumerate(steps):
        row = []
        for a, s in enumerate(step):
            tiling = [lv for lv in range(level + 1) if s and loops[lv].symbol and steps[lv][a]]
            row.append((s * math.prod(loops[lv].count for lv in tiling),
                        tuple(str(loops[lv].symbol) for lv in tiling)))
        out.append(tuple(row))
    return tuple(out)


def _ranges(r: Ranges) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in r) + "]"


def _steps(steps: Steps, names: Sequence[str] | None = None) -> str:
    """``+[64, 0]/L0`` for every level that moves (nothing when none does)."""
    out = []
    for level, s in enumerate(steps):
        if any(s):
            if names is None:
                out.append(f"+[{', '.join(map(str, s))}]/L{level}")
            else:
                out.append("+" + ",".join(f"{n}{v}" for n, v in zip(names, s, strict=True) if v)
                           + f"/L{level}")
    return (" " + " ".join(out)) if out else ""


@dataclass(frozen=True)
class WorkerAxis:
    """One axis of a launch's grid of workers: ``size`` workers at ``level`` (``"core"``:
    cores of one device; ``"device"``: devices of a mesh), splitting the op dim ``name``."""

    name: str
    size: int
    level: str = "core"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ExecutionError(f"worker axis {self.name!r}: level {self.level!r}; valid: "
                                 f"{', '.join(LEVELS)}")
        if self.size < 1:
            raise ExecutionError(f"worker axis {self.name!r}: size {self.size} must be >= 1")

    def __str__(self) -> str:
        return f"{self.name}:{self.size}"


@dataclass(frozen=True)
class Operand:
    """One operand of a launch: its access (``x[m, 128*h+d]``), the region of the tensor each
    worker touches at iteration 0 (None: a worker with nothing to do), and the step of those
    regions per enclosing loop level."""

    access: str
    regions: tuple[Ranges | None, ...]
    steps: Steps = ()

    @property
    def tensor(self) -> str:
        return self.access.partition("[")[0]

    def at(self, index: Sequence[int]) -> tuple[Ranges | None, ...]:
        """Every worker's region at loop ``index``.

        >>> Operand("y[i]", (((0, 4),), None), ((8,),)).at((1,))
        (((8, 12),), None)
        """
        return tuple(None if r is None else moved(r, self.steps, index) for r in self.regions)


@dataclass(frozen=True)
class Launch:
    """An op run over a grid of workers (``axes``, row-major: worker ids run over the grid with
    the last axis fastest, as ``plans.views.core_slices`` numbers cores).

    ``tile`` is the box of the op's iteration space the launch covers at iteration 0 (the whole
    space outside loops), ``boxes`` each worker's part of it (None: nothing, when a bound loop
    count made the tile smaller than planned), and ``steps`` how far the tile and every box
    move per iteration of each enclosing loop (zero at a level tiling none of the op's dims:
    the same tile every iteration). ``combine`` lists the groups of workers whose partial
    results combine into one output region (a split reduction; ring neighbours). ``mode`` is
    ``write`` (the result, finished, goes to the output) or ``accumulate`` (combined into the
    output's accumulator, a reduction tiled by a loop)."""

    op: str
    kind: str
    dims: tuple[str, ...]
    axes: tuple[WorkerAxis, ...]
    tile: Ranges
    boxes: tuple[Ranges | None, ...]
    steps: Steps
    reads: tuple[Operand, ...]
    write: Operand
    combine: tuple[tuple[int, ...], ...] = ()
    mode: str = "write"
    #: elements per planning unit of each dim (``dims`` order; a stick for stick dims): the
    #: workers cut the tile into whole units (``part``); empty where not given
    units: tuple[int, ...] = ()
    #: the split of a reduction the plan records for the op (a split-K partial op's cut of its
    #: base op's reduction: its ``select`` chain picks the slices from a run-time reduction
    #: size, which an emitter of one function for every size computes as the chain does); None
    #: where the plan records none
    split_k: SplitK | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ExecutionError(f"launch of op {self.op!r}: mode {self.mode!r}; valid: "
                                 f"{', '.join(MODES)}")
        if math.prod(a.size for a in self.axes) != len(self.boxes):
            raise ExecutionError(f"launch of op {self.op!r}: a grid of "
                                 f"{' x '.join(map(str, self.axes)) or '1'} workers holds "
                                 f"{len(self.boxes)} boxes")

    @property
    def workers(self) -> int:
        return len(self.boxes)

    @property
    def depth(self) -> int:
        """How many loops enclose the launch."""
        return len(self.steps)

    @property
    def moving(self) -> tuple[int, ...]:
        """The enclosing loop levels that move the tile (the others repeat it)."""
        return tuple(level for level, s in enumerate(self.steps) if any(s))

    def part(self, dim: str, n: int) -> int:
        """The most elements of a range of ``n`` along ``dim`` one worker holds when the grid
        cuts it as it cuts the tile: whole units, the larger parts first (``n`` where no
        worker axis splits ``dim``). What one core keeps of a buffer the launch writes that
        spans more than its tile (a tile buffer of outer loops, an accumulator).

        >>> launch = Launch("e", "exp", ("i",), (WorkerAxis("i", 2),), ((0, 8),),
        ...                 (((0, 4),), ((4, 8),)), (), (), Operand("y[i]", ((), ())),
        ...                 units=(64,))
        >>> launch.part("i", 100), launch.part("i", 8)
        (64, 8)
        """
        split = math.prod(a.size for a in self.axes if a.name == dim)
        if split == 1:
            return n
        if len(self.units) != len(self.dims):
            raise ExecutionError(f"launch of op {self.op!r}: no planning units given, so how "
                                 f"its {split} workers cut dim {dim!r} is unknown")
        per = self.units[self.dims.index(dim)]
        units = -(-n // per)
        return min(n, -(-units // split) * per)

    def tile_at(self, index: Sequence[int]) -> dict[str, Interval]:
        """The tile at loop ``index``, as ``{dim: (start, stop)}``."""
        return dict(zip(self.dims, moved(self.tile, self.steps, index), strict=True))

    def boxes_at(self, index: Sequence[int]) -> tuple[dict[str, Interval] | None, ...]:
        """Every worker's box at loop ``index`` as ``{dim: (start, stop)}`` (None: nothing)."""
        return tuple(None if b is None else
                     dict(zip(self.dims, moved(b, self.steps, index), strict=True))
                     for b in self.boxes)

    def __str__(self) -> str:
        grid = " x ".join(map(str, self.axes)) or "1"
        level = self.axes[0].level if self.axes else "core"
        verb = "accumulates" if self.mode == "accumulate" else "writes"
        head = (f"launch {self.op} ({self.kind}) over {grid} ({level}s), tile "
                f"{_box(self.dims, self.tile)}{_steps(self.steps, self.dims)}")
        lines = [head]
        for w, b in enumerate(self.boxes):
            if b is None:
                lines.append(f"  {level} {w}: nothing")
                continue
            reads = " ".join(f"{o.tensor}{_ranges(o.regions[w] or ())}" for o in self.reads)
            lines.append(f"  {level} {w}: {_box(self.dims, b)}"
                         + (f"  reads {reads}" if reads else "")
                         + f"  {verb} {self.write.tensor}{_ranges(self.write.regions[w] or ())}")
        if self.combine:
            lines.append("  combine " + " ".join("(" + ",".join(map(str, g)) + ")"
                                                 for g in self.combine))
        return "\n".join(lines)


def _box(dims: Sequence[str], r: Ranges) -> str:
    return " ".join(f"{d}[{lo}:{hi}]" for d, (lo, hi) in zip(dims, r, strict=True)) or "[]"


@dataclass(frozen=True)
class Host:
    """A whole-tensor fallback: ``op`` run whole, on the host, reading ``reads`` and writing
    ``write`` (every tensor whole, in a loop body too: a fallback works on whole rows, so its
    tiles' results are the whole op's)."""

    op: str
    kind: str
    reads: tuple[str, ...]
    write: str
    #: in a loop body: the tile of the op's iteration space (its dims in op order) at
    #: iteration 0 of the enclosing loops, and its step per level (what a backend keeping one
    #: tile at a time stores of the whole result); outside loops empty (the whole space)
    tile: Ranges = ()
    steps: Steps = ()

    def tile_at(self, index: Sequence[int]) -> Ranges:
        """The tile at loop ``index`` (outside loops: empty, the whole space)."""
        return moved(self.tile, self.steps, index) if self.tile else ()

    def __str__(self) -> str:
        return f"host {self.op} ({self.kind}): {', '.join(self.reads) or '-'} -> {self.write}"


@dataclass(frozen=True)
class Init:
    """Before the loop that follows it: set ``tensor``'s accumulator over ``region`` (at
    iteration 0 of the enclosing loops; ``steps`` per level) to ``identity``, the reduction
    ``fn``'s (today's ``plans.memory.InitOp``)."""

    op: str
    tensor: str
    fn: str
    identity: float
    region: Ranges
    steps: Steps = ()

    def at(self, index: Sequence[int]) -> Ranges:
        return moved(self.region, self.steps, index)

    def __str__(self) -> str:
        return (f"init {self.tensor}{_ranges(self.region)}{_steps(self.steps)} = "
                f"{self.identity:g} ({self.fn} of op {self.op})")


@dataclass(frozen=True)
class Finish:
    """After the loop before it: ``tensor[region] = finish(fn, accumulator)`` over ``count``
    reduction points (a mean divides), cast to the tensor's dtype, into its full and tile
    buffers (today's ``plans.memory.FinishOp``)."""

    op: str
    tensor: str
    fn: str
    count: int
    region: Ranges
    steps: Steps = ()

    def at(self, index: Sequence[int]) -> Ranges:
        return moved(self.region, self.steps, index)

    def __str__(self) -> str:
        return (f"finish {self.tensor}{_ranges(self.region)}{_steps(self.steps)} = "
                f"{self.fn}(accumulator) over {self.count} points (op {self.op})")


@dataclass(frozen=True)
class Copy:
    """After ``op`` in a loop body: copy ``tensor``'s tile (``region`` at iteration 0, moving
    by ``steps``) from its tile buffer into its full buffer (today's ``plans.memory.CopyOp``)."""

    op: str
    tensor: str
    region: Ranges
    steps: Steps = ()

    def at(self, index: Sequence[int]) -> Ranges:
        return moved(self.region, self.steps, index)

    def __str__(self) -> str:
        return f"copy {self.tensor}{_ranges(self.region)}{_steps(self.steps)} tile -> full"


@dataclass(frozen=True)
class Loop:
    """A counted loop: ``count`` iterations (bound: ``symbol`` names the run-time count it
    came from, if any) of ``body``, tiling the dims ``dims`` of its group."""

    count: int
    body: tuple[Step, ...]
    symbol: str | None = None
    dims: tuple[str, ...] = ()
    #: the loop's path in the plan (its group's index, then which sibling loop at each
    #: depth): a buffer names the loops it lives in by it (``Buffer.group``, a prefix)
    path: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ExecutionError(f"loop count {self.count} must be >= 1")

    def __str__(self) -> str:
        count = f"{self.count} ({self.symbol} = {self.count})" if self.symbol else str(self.count)
        over = f" over {', '.join(self.dims)}" if self.dims else ""
        lines = [f"loop {count}{over}:"]
        for s in self.body:
            lines += ["  " + line for line in str(s).splitlines()]
        return "\n".join(lines)


Step = Union[Launch, Host, Loop, Init, Finish, Copy]  # noqa: UP007 (a runtime alias)


@dataclass(frozen=True)
class Lifetime:
    """When ``tensor`` holds a value, as positions in ``Schedule.ops``: made by the op at
    ``first`` (-1: a program input), last read by the op at ``last`` (``len(ops)``: held to
    the end, a program input or output)."""

    tensor: str
    first: int
    last: int


@dataclass(frozen=True)
class Schedule:
    """One device's plan over its cores, lowered: the concrete ``program`` (run-time sizes
    bound), the target's name and core count, the bound ``sizes`` and symbolic loop counts
    (``params``), the plan's ``buffers`` and every tensor's ``lifetimes``, and the ``steps``
    in program order. ``given`` is the program as given, with its symbols, where it has
    run-time sizes (``program`` is it bound at ``sizes``; split-K ops cut as the plan cuts
    them): what an emitter of one function for every size reads (None: no run-time sizes).
    ``forall_mapping`` is the target's (``Target.forall_mapping``: its workers the cores or GPU
    blocks), what a parallel-IR emitter maps each worker grid to; not printed.

    ``unbound`` is the schedule this one binds, where they differ: the plan lowered once at
    the planning sizes and the symbolic loop counts' planned values (``planned_counts``),
    which a compiled backend renders as one function for every size and count, this
    schedule's ``sizes`` and ``params`` its arguments (``covering``). It takes no part in
    equality."""

    program: Program
    target: str
    cores: int
    steps: tuple[Step, ...]
    buffers: tuple[Buffer, ...] = ()
    lifetimes: tuple[Lifetime, ...] = ()
    sizes: tuple[tuple[str, int], ...] = ()
    params: tuple[tuple[str, int], ...] = ()
    given: Program | None = None
    forall_mapping: str = "cores"
    unbound: Schedule | None = field(default=None, compare=False, repr=False)

    @property
    def covering(self) -> Schedule:
        """The schedule a compiled backend renders for this one (``unbound``, or this one
        where it binds nothing)."""
        return self.unbound if self.unbound is not None else self

    def walk(self) -> Iterator[tuple[Step, tuple[Loop, ...]]]:
        """Every step at any depth, in order, with the loops enclosing it (outermost first)."""
        def go(steps: Sequence[Step], loops: tuple[Loop, ...]
               ) -> Iterator[tuple[Step, tuple[Loop, ...]]]:
            for s in steps:
                yield s, loops
                if isinstance(s, Loop):
                    yield from go(s.body, (*loops, s))
        return go(self.steps, ())

    @property
    def ops(self) -> tuple[Launch | Host, ...]:
        """The launches and host steps, in order (the program's ops, each once)."""
        return tuple(s for s, _ in self.walk() if isinstance(s, Launch | Host))

    def __str__(self) -> str:
        head = f"schedule {self.program.name} on {self.target}, {self.cores} cores"
        bound = [f"{k}={v}" for k, v in (*self.sizes, *self.params)]
        lines = [head + (f" ({', '.join(bound)})" if bound else "")]
        if self.buffers:
            lines.append("buffers:")
            width = max(len(b.tensor) for b in self.buffers)
            for b in self.buffers:
                where = f" in loop {list(b.group)}" if b.group else ""
                dtype = f" {b.dtype}" if b.dtype else ""
                lines.append(f"  {b.tensor:<{width}} {b.kind:<11} {b.space:<3} @{b.offset:<10} "
                             f"{b.nbytes:>10} B  {list(b.shape)}{dtype}{where}")
        lines.append("steps:")
        for s in self.steps:
            lines += ["  " + line for line in str(s).splitlines()]
        return "\n".join(lines)
