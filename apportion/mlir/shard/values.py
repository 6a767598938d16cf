"""What the shard forms render: a sharding plan as upstream MLIR's ``shard`` dialect reads it,
every fact already decided by the planner, so this layer renders and never plans.

``apportion.sharding.forms`` builds these values from a plan (and its mesh): a ``Grid`` (the
mesh), a ``TensorSharding`` per annotated value (split axes per dim, every shard's cut where
the grid is static, partial axes, upstream's halo pair) and ``Propagated`` (every value's, op
by op); for the forms that say what each device runs, ``Partitioned`` (per op every device's
``LocalCode``, per resharding step a ``Reshard`` around the mesh schedule's ``Collective``)
and ``OpSplit`` (how each op divides, for the dynamic-list form). The unrolled form reads the
``MeshSchedule`` itself.

>>> g = Grid((GridAxis("dp", 2), GridAxis("tp", 4, symbol="N")), "dp=2,tp=N~4")
>>> g.index("tp"), g.symbolic, [a.name for a in g.axes if a.symbolic]
(1, True, ['tp'])
>>> s = TensorSharding(((0,), ()), cuts=((0, 3, 5), ()))   # 5 rows over dp=2: 3 and 2
>>> s.offsets, s.without((1,)).split
((0, 3, 5), ((0,),))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from apportion.errors import EmitError
from apportion.ir.op import Op
from apportion.ir.program import Program, TensorType
from apportion.schedule.mesh import Collective, FinishPart


@dataclass(frozen=True)
class GridAxis:
    """One axis of a ``shard.grid``: its name, size (a symbolic axis: the size it was planned
    at), level, whether its devices read one another's memory (``peered``), and for a size
    known only at run time the symbol naming it."""

    name: str
    size: int
    level: str = "device"
    peered: bool = False
    symbol: str | None = None

    @property
    def symbolic(self) -> bool:
        return self.symbol is not None


@dataclass(frozen=True)
class Grid:
    """A mesh as a ``shard.grid``: its axes, and ``spec``, the mesh as the user writes it
    (``dp=2,tp=N~4``), for attributes and messages."""

    axes: tuple[GridAxis, ...]
    spec: str

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def symbolic(self) -> bool:
        return any(a.symbolic for a in self.axes)

    def index(self, name: str) -> int:
        """The grid axis ``name`` is (upstream numbers them)."""
        try:
            return self.names.index(name)
        except ValueError:
            raise EmitError(f"grid {self.spec} has no axis {name!r}") from None


@dataclass(frozen=True)
class TensorSharding:
    """One value's sharding as ``shard.sharding`` says it: per tensor dim the grid axes (by
    index, outer first) splitting it; ``cuts``, on a static grid, per dim every shard's start
    along it in device order and the dim's end (empty for a dim not split; no cuts at all on a
    symbolic grid); the partial axes and the reducer that will combine them; ``halos``, where
    upstream's one (low, high) pair per split dim says the windows an op reads the value
    through, and ``windows``, those windows as apportion cuts them (per dim, ``""`` where none),
    exact per device."""

    split: tuple[tuple[int, ...], ...]
    cuts: tuple[tuple[int, ...], ...] = ()
    partial: tuple[int, ...] = ()
    reducer: str | None = None
    halos: tuple[tuple[int, int], ...] | None = None
    windows: tuple[str, ...] = ()

    @property
    def offsets(self) -> tuple[int, ...] | None:
        """Upstream's ``sharded_dims_offsets``: every split dim's cuts, where some dim is cut
        unevenly (None where every cut is even: upstream's own rule gives the same shards)."""
        if not any(len({hi - lo for lo, hi in zip(c, c[1:], strict=False)}) > 1
                   for c in self.cuts):
            return None
        return tuple(x for c in self.cuts for x in c)

    def without(self, dims: Sequence[int]) -> TensorSharding:
        """This sharding with tensor dims ``dims`` left out, whole (no partial axes, no
        windows): what an op's destination written without its size-1 dims is laid out as."""
        return TensorSharding(tuple(a for j, a in enumerate(self.split) if j not in dims),
                              tuple(c for j, c in enumerate(self.cuts) if j not in dims))


@dataclass(frozen=True)
class Propagated:
    """A plan as the propagated form reads it: how each input is placed (by name), per op (in
    program order) the sharding it reads each operand in and the one its result has, how
    each output is handed back, and the method that chose them (``propagate``, ``search``)."""

    program: Program
    grid: Grid
    method: str
    inputs: tuple[tuple[str, TensorSharding], ...]
    ops: tuple[tuple[tuple[TensorSharding, ...], TensorSharding], ...]
    outputs: tuple[tuple[str, TensorSharding], ...]


@dataclass(frozen=True)
class LocalCode:
    """What one device runs for one op: its ops on its shards, the local type of every value
    they read and write, and the finish of a mean or argmax split over devices."""

    ops: tuple[Op, ...]
    types: tuple[TensorType, ...]
    finish: FinishPart | None = None


@dataclass(frozen=True)
class LocalStage:
    """One op in the partitioned form: the local values it reads, the value it writes
    (``result``), and every device's ``LocalCode``, in device order."""

    result: str
    reads: tuple[str, ...]
    devices: tuple[LocalCode, ...]


@dataclass(frozen=True)
class Reshard:
    """One resharding step in the partitioned form: the mesh schedule's ``Collective`` (every
    device's box before and after, the groups, the dtypes moved and made) and what the dialect
    needs besides: ``remote`` (it reads the peers' memory), a halo's one (low, high) pair for
    every shard (``halo``) or why upstream cannot say it (``refusal``), and the shardings it
    goes between as the plan prints them (``between``)."""

    step: Collective
    remote: bool = False
    halo: tuple[int, int] | None = None
    refusal: str | None = None
    between: tuple[str, str] = ("", "")


@dataclass(frozen=True)
class Partitioned:
    """A plan on a static grid as the SPMD form reads it: every input's local type on each
    device, the ops and resharding steps in program order, and the local values handed back
    (the outputs, in order)."""

    program: Program
    grid: Grid
    inputs: tuple[tuple[str, tuple[TensorType, ...]], ...]
    stages: tuple[LocalStage | Reshard, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class OpSplit:
    """How one op divides over the grid (the dynamic-list form): each split op dim's grid
    axes by name, outer first; the axes its output is partial over and their reducer; the
    dtype the devices hold its shards in; and ``label``, the split as the plan prints it."""

    splits: tuple[tuple[str, tuple[str, ...]], ...]
    held: str
    label: str
    partial: tuple[str, ...] = ()
    reducer: str | None = None

    @property
    def split_map(self) -> dict[str, tuple[str, ...]]:
        return dict(self.splits)

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for _, axes in self.splits for a in axes)
