"""The sharding plan: every op's strategy, every tensor's layout over the mesh, every move of
data, with predicted times and each device's memory.

``build_plan`` completes a choice of strategies (from ``propagate`` or ``search``) into a
``ShardingPlan``. Walking the ops in order, each input an op reads in another sharding than
the tensor has gets a ``Transfer``: a copy in the needed sharding made by the resharding steps
of ``collectives.steps``, shared by every later reader that needs the same sharding. An
annotated tensor is resharded to its annotation as soon as it is made; each program output is
handed back in its chosen sharding.

Reads in place: where a reader needs another sharding than the tensor has and the
resharding is one gather, all-to-all or halo along an axis with peered memory, the reader may
instead read the tensor as it is from its peers' memory (``in_place_read``): no copy is
written or held, but every read of an element it lacks crosses the link (a matmul re-reads its
operand once per output column, ``reuse``). ``read_us`` prices both, the copy with its write
into device memory (``copy_write_us``), and the plan takes the cheaper: such a ``Transfer`` is
``in_place``, its one step a ``peer_read`` read by that op alone, and it holds no memory.

Times: each op's compute is apportion's cost model on the largest device's part of the op
(``CostModel``: the op over that device's shard of the iteration space, split over the
device's cores as the ``balanced`` work division splits it); each transfer's time is the sum of
its steps'. The plan's predicted time is their sum: ops and transfers one after another, no
overlap of communication with compute.

Memory: each device holds its shard of every input for the whole program, of every other
tensor from the op that makes it to its last reader, of each copy from its transfer to its
last reader (program outputs to the end); ``peak_bytes`` is the largest such sum over the
program's points, on the largest device. A mesh with ``memory_bytes`` refuses a plan above it.

Tiling groups: ``tiled_counts`` gives each grouped op the product of its group's static counts
per tiled dim (``tiled_granules``: times a stick where the op writes along the dim), and
``fits_tiling`` / ``tiling_strategies`` keep the strategies whose every device share of such
a dim those counts cut into whole tiles, so that each device's program keeps the group with
its counts (the rule of ``unroll.carry_tiling``); search and propagation offer no other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from apportion.errors import PlanningError, ProgramError, TargetError
from apportion.ir.dtypes import dtype_bytes
from apportion.ir.op import Op
from apportion.ir.program import Program, TensorType
from apportion.passes.geometry import OpContext
from apportion.passes.layouts import op_layout, tensor_layouts
from apportion.passes.strategy import Balanced
from apportion.passes.work_distribution import distribute, greedy
from apportion.sharding.collectives import (
    Step,
    cached_steps,
    halo_elements,
    read_link,
    reshard_time,
)
from apportion.sharding.mesh import Mesh
from apportion.sharding.rules import (
    OpSharding,
    finish_kind,
    local_op,
    local_ops,
    local_ranges,
    make_strategy,
    op_strategies,
)
from apportion.sharding.spec import Sharding, shard_sizes
from apportion.target.presets import spyre
from apportion.target.target import Target

FORMAT = "apportion.sharding/1"


def default_target(mesh: Mesh, target: Target | None) -> Target:
    """``target``, else the mesh's device target, else the Spyre preset."""
    if target is not None:
        if not isinstance(target, Target):
            raise TargetError(f"target must be a Target (ap.targets.spyre(cores=8)), got "
                              f"{type(target).__name__} {target!r}"[:200])
        return target
    return mesh.target if mesh.target is not None else spyre()


class CostModel:
    """Predicted compute time of an op's strategy on the largest device: the device's part of
    the op planned over its cores by the ``balanced`` work division (the greedy one where no
    split keeps every operand within the span limit), priced by ``apportion.cost``; kept by the
    local op's shape, so identical parts are priced once."""

    def __init__(self, program: Program, mesh: Mesh, target: Target) -> None:
        self.program, self.mesh, self.target = program, mesh, target
        self._memo: dict[tuple, float] = {}
        self.evaluated = 0

    def local(self, op: Op, strategy: OpSharding) -> tuple[Op, dict[str, TensorType]]:
        """The largest device's op, inputs renamed by position (``i0``, ``i1``, ...; one name
        for one tensor read in one sharding) and the output ``o``."""
        zero = dict.fromkeys(self.mesh.names, 0)
        return local_op(op, self.program, self.mesh, strategy, zero, _input_names(op, strategy),
                        "o")

    def compute_us(self, op: Op, strategy: OpSharding) -> float:
        if finish_kind(op, strategy) is None:
            return self._priced(*self.local(op, strategy))
        # a mean or argmax split over devices: the device's ops (an argmax also takes its local
        # max), then its finish, elementwise over its output: priced as one copy of it
        zero = dict.fromkeys(self.mesh.names, 0)
        lops, types, finish = local_ops(op, self.program, self.mesh, strategy, zero,
                                        _input_names(op, strategy), "o")
        assert finish is not None
        total = sum(self._priced(lop, {a.tensor: types[a.tensor] for a in lop.operands})
                    for lop in lops)
        last = lops[-1]
        src = finish.sources[-1]
        copy = Op("finish", "copy", replace(last.out, tensor=finish.result),
                  (replace(last.out, tensor=src),),
                  tuple((d, n) for d, n in last.dims if d in set(last.out.dims)))
        return total + self._priced(copy, {src: types[src], finish.result: types[finish.result]})

    def _priced(self, lop: Op, types: dict[str, TensorType]) -> float:
        key = (lop.fn, tuple(str(a) for a in lop.operands), lop.dims, lop.attrs,
               tuple(sorted((n, t.shape, t.dtype) for n, t in types.items())))
        if key not in self._memo:
            self._memo[key] = self._time(lop, types)
        return self._memo[key]

    def _time(self, lop: Op, types: dict[str, TensorType]) -> float:
        self.evaluated += 1
        ins = tuple(dict.fromkeys(a.tensor for a in lop.ins))
        prog = Program("local", tuple(types.values()), ins, (lop.out.tensor,), (lop,))
        t = self.target
        ctx = OpContext(lop, prog, t, op_layout(lop, prog, t), tensor_layouts(prog, t),
                        dict(lop.sizes))
        ones = dict.fromkeys(lop.sizes, 1)
        try:
            splits = distribute(ctx, ones, Balanced())
        except PlanningError:  # nothing fits the span limit: the planner would loop over it
            splits = greedy(ctx, ones)
        return ctx.time_us(splits)


def _input_names(op: Op, strategy: OpSharding) -> list[str]:
    """The local op's inputs by position (``i0``, ``i1``, ...; one name for one tensor read in
    one sharding)."""
    names: list[str] = []
    seen: dict[tuple[str, Sharding], str] = {}
    for k, (acc, s) in enumerate(zip(op.ins, strategy.ins, strict=True)):
        names.append(seen.setdefault((acc.tensor, s), f"i{k}"))
    return names


def reuse(op: Op, pos: int, strategy: OpSharding, mesh: Mesh) -> float:
    """How many times, on average, the largest device's part of ``op`` reads each element of
    its input ``pos``: its iteration points over the elements its access reaches (a matmul
    reads ``x[m, k]`` once per ``n``; a pointwise op once; a three-point stencil's
    ``x[i + k]`` about three times, its windows overlapping). A read in place from a peer's
    memory pays its link that many times: nothing is kept between the reads.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.sharding.mesh import parse
    >>> p = load("examples/mlp.json")
    >>> m = parse("tp=2")
    >>> st = make_strategy(p.op("gate"), p, m, {"n": ("tp",)})
    >>> reuse(p.op("gate"), 0, st, m), reuse(p.op("act"), 0,
    ...                                      make_strategy(p.op("act"), p, m, {}), m)
    (1408.0, 1.0)
    """
    ranges = local_ranges(op, strategy, mesh, dict.fromkeys(mesh.names, 0))
    size = {d: hi - lo for d, (lo, hi) in ranges.items()}
    points = 1
    for n in size.values():
        points *= n
    reached = 1  # per tensor dim the span its expression covers over the device's part
    for e in op.ins[pos].index:
        reached *= sum(c * (size[d] - 1) for d, c in e.terms) + 1
    return points / reached


#: the resharding steps a reader may replace by reading the source in place from its peers
IN_PLACE_KINDS = ("all_gather", "all_to_all", "halo")


def in_place_read(shape: tuple[int, ...], dtype: str, src: Sharding, dst: Sharding,
                  mesh: Mesh, reads: float) -> Step | None:
    """The ``peer_read`` an op makes when it reads ``src`` in place where it needs ``dst``,
    reading each element ``reads`` times (``reuse``): None unless the resharding is one
    gather, all-to-all or halo along a peered axis (its devices address one another's
    memory). Its time is one latency plus ``reads`` times the bytes the device lacks over the
    link: no copy is written, and none is held.

    >>> from apportion.sharding.mesh import parse
    >>> m = parse("tp=2@chiplet:peered")
    >>> st = in_place_read((8, 4), "float32", Sharding((("tp",), ())), Sharding(((), ())), m, 1)
    >>> str(st), st.bytes
    ('peer_read(tp) dim 0 by remote reads', 64)
    >>> in_place_read((8, 4), "float32", Sharding((("tp",), ())), Sharding(((), ())),
    ...               parse("tp=2"), 1) is None  # not peered: the data must move
    True
    """
    if src == dst:
        return None
    steps = cached_steps(shape, dtype, src, dst, mesh)
    if len(steps) != 1 or steps[0].kind not in IN_PLACE_KINDS or not steps[0].remote:
        return None
    step = steps[0]
    received = halo_elements(shape, src, dst, mesh) * dtype_bytes(dtype)
    link = read_link(mesh, step.axes)  # a halo across several peered axes: the slowest
    time = link.latency_us + reads * received / link.bandwidth * 1e6
    return replace(step, kind="peer_read", bytes=received, time_us=time)


def copy_write_us(shape: tuple[int, ...], dtype: str, dst: Sharding, mesh: Mesh,
                  target: Target) -> float:
    """Predicted time of writing a resharded copy into the device's memory: its largest shard
    over ``target.mem_bandwidth`` (none given: free). What a read in place saves."""
    if target.mem_bandwidth <= 0:
        return 0.0
    sizes = {a.name: a.size for a in mesh.axes}
    return dst.local_bytes(shape, dst.held_dtype(dtype), sizes) / target.mem_bandwidth * 1e6


def read_us(program: Program, op: Op, pos: int, strategy: OpSharding, src: Sharding,
            mesh: Mesh, target: Target) -> tuple[float, Step | None]:
    """What it costs ``op`` under ``strategy`` to read its input ``pos`` from a tensor held
    as ``src``, and the read in place that does it (None: a resharded copy, or nothing to
    move). A read in place (``in_place_read``, with the op's ``reuse``) is taken where it
    costs less than the copy's steps and writing the copy (``copy_write_us``); a copy costs
    its steps, as it always has (the link figures price the same bytes either way, so the
    write is what tells the two apart)."""
    t = program.tensor(op.ins[pos].tensor)
    dst = strategy.ins[pos]
    copy = reshard_time(t.shape, t.dtype, src, dst, mesh)
    if copy == 0.0:
        return 0.0, None
    peer = in_place_read(t.shape, t.dtype, src, dst, mesh, reuse(op, pos, strategy, mesh))
    if peer is not None and peer.time_us < copy + copy_write_us(t.shape, t.dtype, dst, mesh,
                                                                target):
        return peer.time_us, peer
    return copy, None


def tiled_counts(program: Program) -> dict[str, dict[str, int]]:
    """Op -> {dim: the product of the static counts of its tiling group's levels that tile
    it}, for the ops of the program's tiling groups (run-time counts are left out: the planner
    checks them against the tiles it plans).

    >>> from apportion.frontend.json_format import load
    >>> tiled_counts(load("examples/fused.json"))
    {'add': {'m': 2, 'n': 4}, 'mul': {'m': 2, 'n': 4}}
    """
    out: dict[str, dict[str, int]] = {}
    for g in program.tiling:
        for name in g.ops:
            op = program.op(name)
            counts: dict[str, int] = {}
            for lv in g.loops:
                if isinstance(lv.count, int):
                    for d in lv.dims:
                        if d in op.sizes:
                            counts[d] = counts.get(d, 1) * lv.count
            out[name] = counts
    return out


def tiled_granules(program: Program, target: Target) -> dict[str, dict[str, int]]:
    """Op -> {dim: the elements every device's share of that dim must be a multiple of} for
    the ops of tiling groups: the product of the static counts tiling it (``tiled_counts``),
    times the elements of one stick where the op writes its output along that dim (a tile
    boundary inside a stick the op writes is the planner's error).

    >>> from apportion.frontend.json_format import load
    >>> from apportion.target.presets import spyre
    >>> tiled_granules(load("examples/fused.json"), spyre())["add"]  # n: 4 tiles of sticks
    {'m': 2, 'n': 256}
    """
    out: dict[str, dict[str, int]] = {}
    for name, counts in tiled_counts(program).items():
        op = program.op(name)
        units = dict(op_layout(op, program, target).unit_elems)
        written = set(op.out.index[-1].dims) if op.out.index else set()
        out[name] = {d: c * (units.get(d, 1) if d in written else 1) for d, c in counts.items()}
    return out


def fits_tiling(strategy: OpSharding, sizes: Mapping[str, int], granules: Mapping[str, int],
                mesh: Mesh) -> bool:
    """True when every device's share of each dim ``strategy`` splits is a multiple of its
    granule (``granules``, from ``tiled_granules``; ``sizes``: the op's dim sizes): the
    group's counts then cut every device's share into tiles of whole sticks.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.sharding.mesh import parse
    >>> from apportion.target.presets import spyre
    >>> p = load("examples/fused.json")
    >>> add = p.op("add")
    >>> g = tiled_granules(p, spyre())["add"]
    >>> [fits_tiling(make_strategy(add, p, parse(m), {"n": ("tp",)}), add.sizes, g, parse(m))
    ...  for m in ("tp=2", "tp=32")]  # 2048 columns per device, or 128: not 4 tiles of sticks
    [True, False]
    """
    msizes = {a.name: a.size for a in mesh.axes}
    return all(g <= 1 or all(n % g == 0 for n in shard_sizes(sizes[d], axes, msizes))
               for d, axes in strategy.splits for g in (granules.get(d, 1),))


def tiling_strategies(op: Op, program: Program, mesh: Mesh,
                      granules: Mapping[str, int]) -> tuple[OpSharding, ...]:
    """``op_strategies`` less those whose shares its tiling group's counts would not cut
    into whole tiles on some device (``fits_tiling``).

    >>> from apportion.frontend.json_format import load
    >>> from apportion.sharding.mesh import parse
    >>> from apportion.target.presets import spyre
    >>> p = load("examples/fused.json")
    >>> g = tiled_granules(p, spyre())["add"]
    >>> [s.label for s in tiling_strategies(p.op("add"), p, parse("tp=32"), g)]
    ['replicated', 'm:tp']
    """
    return tuple(s for s in op_strategies(op, program, mesh)
                 if fits_tiling(s, op.sizes, granules, mesh))


@dataclass(frozen=True)
class Transfer:
    """A copy of ``tensor`` in sharding ``dst``, made from its sharding ``src`` by ``steps``
    before op number ``at`` (the op count: after the last op); readers read it as ``name``.
    ``reader``: the first op that reads it (None: the program output handed back, or the
    annotation it is resharded to)."""

    tensor: str
    name: str
    at: int
    reader: str | None
    src: Sharding
    dst: Sharding
    steps: tuple[Step, ...]
    why: str = "read"
    #: the local name of what it copies (the tensor, or its annotated copy)
    source: str = ""
    #: no copy is made: the reader reads ``src`` in place from its peers' memory (one
    #: ``peer_read`` step, see ``in_place_read``); the device holds nothing for it
    in_place: bool = False

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.steps)

    @property
    def time_us(self) -> float:
        return sum(s.time_us for s in self.steps)

    @property
    def collectives(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.communicates)

    def __str__(self) -> str:
        return (f"{self.tensor} {self.src} -> {self.dst}: "
                f"{', '.join(str(s) for s in self.steps)}")


@dataclass(frozen=True)
class OpShard:
    """One op's strategy, the local tensors its inputs read, its compute time on the largest
    device and that device's part of its iteration space."""

    op: str
    strategy: OpSharding
    reads: tuple[str, ...]
    compute_us: float
    local_sizes: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ShardingPlan:
    """A program divided over a mesh: what every device computes and where data moves."""

    program: Program
    mesh: Mesh
    target: Target
    ops: tuple[OpShard, ...]
    inputs: tuple[tuple[str, Sharding], ...]
    outputs: tuple[tuple[str, Sharding, str], ...]
    transfers: tuple[Transfer, ...]
    annotations: tuple[tuple[str, Sharding], ...] = ()
    method: str = "given"
    solve_s: float = 0.0
    #: the search's objective (it counts one resharding per reader)
    objective_us: float | None = None
    peak_bytes: int = 0
    peak_at: str = ""
    stats: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    @cached_property
    def op_map(self) -> dict[str, OpShard]:
        return {o.op: o for o in self.ops}

    def op(self, name: str) -> OpShard:
        try:
            return self.op_map[name]
        except KeyError:
            raise PlanningError(f"sharding plan has no op {name!r}") from None

    def strategy(self, name: str) -> OpSharding:
        return self.op(name).strategy

    @cached_property
    def tensor_shardings(self) -> dict[str, Sharding]:
        """Every tensor as it is made (inputs as placed; an annotated tensor as annotated)."""
        out = dict(self.inputs)
        for o in self.ops:
            out[self.program.op(o.op).out.tensor] = o.strategy.out
        out.update(dict(self.annotations))
        return out

    def sharding(self, tensor: str) -> Sharding:
        return self.tensor_shardings[tensor]

    @property
    def compute_us(self) -> float:
        return sum(o.compute_us for o in self.ops)

    @property
    def comm_us(self) -> float:
        return sum(t.time_us for t in self.transfers)

    @property
    def predicted_us(self) -> float:
        return self.compute_us + self.comm_us

    @property
    def comm_bytes(self) -> int:
        """Bytes one device receives in all the plan's collectives."""
        return sum(t.bytes for t in self.transfers)

    @property
    def collectives(self) -> Counter[str]:
        return Counter(s.kind + ("(remote)" if s.remote else "")
                       for t in self.transfers for s in t.collectives)

    def collectives_text(self) -> str:
        c = self.collectives
        return ", ".join(f"{n} {k}" for k, n in sorted(c.items())) or "none"

    def summary(self) -> str:
        return (f"{self.program.name} on {self.mesh} ({self.method}): predicted "
                f"{self.predicted_us:.1f} us ({self.compute_us:.1f} compute, {self.comm_us:.1f} "
                f"communication), {self.comm_bytes / 2**20:.2f} MiB received per device, "
                f"collectives: {self.collectives_text()}; peak memory per device "
                f"{self.peak_bytes / 2**20:.1f} MiB" + (f" at {self.peak_at}" if self.peak_at
                                                         else ""))

    def bind(self, sizes: Mapping[str, object] | None = None) -> ShardingPlan:
        """This plan on its mesh with the symbolic axis sizes bound (``Mesh.bind``): every op
        keeps its splits, every input, output and annotation its sharding, and the transfers,
        times and memory are those of the bound mesh (uneven shards cut there, exactly). A
        plan on a static mesh is returned as it is. A split the bound mesh cannot take (an
        empty shard, heads that no longer line up) is a ``PlanningError`` naming the op or
        tensor; so is a device memory the bound plan outgrows.

        >>> from apportion.frontend.json_format import load
        >>> from apportion.sharding.mesh import parse
        >>> from apportion.sharding.search import search
        >>> plan = search(load("examples/mlp.json"), parse("tp=N~4"))
        >>> str(plan.mesh), str(plan.bind({"N": 2}).mesh)
        ('tp=N~4 (tp=N~4, 4 devices at N=4)', 'tp=2 (tp=2, 2 devices)')
        """
        mesh = self.mesh.bind(sizes)
        if mesh is self.mesh:
            return self
        p = self.program
        at = ", ".join(f"{k}={v}" for k, v in (sizes or {}).items())
        try:
            strategies = {o.op: make_strategy(p.op(o.op), p, mesh, dict(o.strategy.splits))
                          for o in self.ops}
            for name, s in (*self.inputs, *self.annotations,
                            *((n, s) for n, s, _ in self.outputs)):
                s.check(mesh, p.tensor(name).shape, name)
        except ProgramError as e:
            raise PlanningError(f"the plan of {p.name!r} made on mesh {self.mesh.name!r} at "
                                f"{self.mesh.planning_text()} cannot run at {at}: {e}") from None
        return build_plan(p, mesh, self.target, strategies, dict(self.inputs),
                          {n: s for n, s, _ in self.outputs}, dict(self.annotations),
                          self.method, self.solve_s, stats=dict(self.stats))

    # -- plan format ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "program": self.program.name, "method": self.method,
            "mesh": self.mesh.to_dict(),
            "target": {"name": self.target.name, "cores": self.target.cores},
            "solve_s": round(self.solve_s, 6),
            "predicted_us": round(self.predicted_us, 4),
            "compute_us": round(self.compute_us, 4), "comm_us": round(self.comm_us, 4),
            "comm_bytes": self.comm_bytes, "peak_bytes": self.peak_bytes,
            "annotations": {n: s.to_json() for n, s in self.annotations},
            "inputs": {n: s.to_json() for n, s in self.inputs},
            "outputs": {n: s.to_json() for n, s, _ in self.outputs},
            "ops": [{"name": o.op, "splits": {d: list(a) for d, a in o.strategy.splits},
                     "out": o.strategy.out.to_json(), "compute_us": round(o.compute_us, 4)}
                    for o in self.ops],
            "transfers": [{"tensor": t.tensor, "copy": t.name, "before": t.reader,
                           "from": t.src.to_json(), "to": t.dst.to_json(),
                           "steps": [str(s) for s in t.steps], "bytes": t.bytes,
                           "in_place": t.in_place,
                           "time_us": round(t.time_us, 4)} for t in self.transfers],
        }

    @staticmethod
    def from_dict(doc: Mapping[str, Any], program: Program, mesh: Mesh,
                  target: Target | None = None) -> ShardingPlan:
        """A plan of format ``apportion.sharding/1`` read back for ``program`` on ``mesh``;
        compute times are taken from the document."""
        if doc.get("format") != FORMAT or doc.get("program") != program.name:
            raise PlanningError(f"not a sharding plan of program {program.name!r} (format "
                                f"{FORMAT})")
        strategies = {o["name"]: make_strategy(program.op(o["name"]), program, mesh,
                                               o["splits"]) for o in doc["ops"]}
        times = {o["name"]: float(o["compute_us"]) for o in doc["ops"]}
        parse = Sharding.from_json
        return build_plan(program, mesh, default_target(mesh, target), strategies,
                          {n: parse(s) for n, s in doc["inputs"].items()},
                          {n: parse(s) for n, s in doc["outputs"].items()},
                          {n: parse(s) for n, s in doc["annotations"].items()},
                          method=doc.get("method", "given"), solve_s=doc.get("solve_s", 0.0),
                          compute=times)


def build_plan(program: Program, mesh: Mesh, target: Target,
               strategies: Mapping[str, OpSharding], inputs: Mapping[str, Sharding],
               outputs: Mapping[str, Sharding], annotations: Mapping[str, Sharding],
               method: str = "given", solve_s: float = 0.0, cost: CostModel | None = None,
               compute: Mapping[str, float] | None = None, objective_us: float | None = None,
               stats: Mapping[str, Any] | None = None) -> ShardingPlan:
    """The plan of ``strategies`` (one per op), ``inputs`` placed and ``outputs`` handed back
    as given, ``annotations`` holding (see the module docstring)."""
    cost = cost or CostModel(program, mesh, target)
    current: dict[str, tuple[str, Sharding]] = {}
    placed: dict[str, Sharding] = {}
    for name in program.inputs:
        s = annotations.get(name, inputs.get(name))
        if s is None:
            raise PlanningError(f"input {name!r} has no placement")
        if s.windows:  # a window is what an op reads, never how a tensor is held
            raise PlanningError(f"input {name!r} cannot be placed as a window ({s})")
        current[name] = (name, s)
        placed[name] = s
    # a copy is shared by the readers of consecutive ops (the search counts one per reader,
    # so sharing only among neighbours never holds more than it counted)
    copies: dict[tuple[str, Sharding], tuple[str, int]] = {}
    transfers: list[Transfer] = []
    used_names = set(program.tensor_map)

    def ensure(tensor: str, need: Sharding, at: int, reader: str | None, why: str,
               pos: int | None = None) -> str:
        base, have = current[tensor]
        if have == need:
            return base
        peer = None
        if pos is not None and reader is not None:  # an op's read: in place where it wins
            op = program.op(reader)
            _, peer = read_us(program, op, pos, strategies[reader], have, mesh, target)
        if peer is not None:  # never shared: each reader reads its peers itself (as the
            name = fresh(tensor)  # search counts it, time and memory)
            transfers.append(Transfer(tensor, name, at, reader, have, need, (peer,), why,
                                      base, in_place=True))
            return name
        key = (tensor, need)
        if key in copies and copies[key][1] >= at - 1:  # read by this op or the one before
            copies[key] = (copies[key][0], at)
            return copies[key][0]
        t = program.tensor(tensor)
        name = fresh(tensor)
        transfers.append(Transfer(tensor, name, at, reader, have, need,
                                  cached_steps(t.shape, t.dtype, have, need, mesh), why, base))
        copies[key] = (name, at)
        return name

    def fresh(tensor: str) -> str:
        k = 1
        while f"{tensor}@{k}" in used_names:
            k += 1
        used_names.add(f"{tensor}@{k}")
        return f"{tensor}@{k}"

    shards = []
    zero = dict.fromkeys(mesh.names, 0)
    for i, op in enumerate(program.ops):
        st = strategies.get(op.name)
        if st is None:
            raise PlanningError(f"op {op.name!r} has no strategy")
        reads = tuple(ensure(acc.tensor, st.ins[k], i, op.name, "read", k)
                      for k, acc in enumerate(op.ins))
        time = compute[op.name] if compute is not None and op.name in compute else \
            cost.compute_us(op, st)
        lop, _ = local_op(op, program, mesh, st, zero)
        shards.append(OpShard(op.name, st, reads, time, lop.dims))
        out = op.out.tensor
        current[out] = (out, st.out)
        if out in annotations and annotations[out] != st.out:
            name = ensure(out, annotations[out], i + 1, None, "annotation")
            current[out] = (name, annotations[out])
            for key in [key for key in copies if key[0] == out]:
                del copies[key]
    outs = []
    for name in program.outputs:
        want = annotations.get(name, outputs.get(name))
        if want is None:
            want = current[name][1].without_partial()
        if want.partial or want.windows:
            raise PlanningError(f"output {name!r} cannot be handed back "
                                f"{'partial' if want.partial else 'as a window'} ({want})")
        outs.append((name, want, ensure(name, want, len(program.ops), None, "output")))
    plan = ShardingPlan(program, mesh, target, tuple(shards), tuple(placed.items()),
                        tuple(outs), tuple(transfers), tuple(annotations.items()), method,
                        solve_s, objective_us, stats=tuple((stats or {}).items()))
    peak, at = peak_memory(plan)
    plan = _with_peak(plan, peak, at)
    check_memory(plan)
    return plan


def _with_peak(plan: ShardingPlan, peak: int, at: str) -> ShardingPlan:
    return replace(plan, peak_bytes=peak, peak_at=at)


def transfer_point(program: Program, t: Transfer) -> int:
    """The program point a transfer is made at: before its reader (``t.at``), but for a reader
    inside a tiling group of a tensor made before the group starts, before the group's first
    op, so that the devices' runs of the group's ops stay unbroken.

    >>> from apportion.frontend.json_format import load
    >>> p = load("examples/fused.json")
    >>> t = Transfer("c", "c@1", 1, "mul", Sharding(((), ())), Sharding(((), ())), ())
    >>> t.at, transfer_point(p, t)
    (1, 0)
    """
    n = len(program.ops)
    at = min(t.at, n)
    if at == n or not program.tiling:
        return at
    pos = program.op_positions
    group = next((g for g in program.tiling if program.ops[at].name in g.ops), None)
    if group is None:
        return at
    first = pos[group.ops[0]]
    made = program.producer(t.tensor)
    return first if made is None or pos[made.name] < first else at


def lifetimes(plan: ShardingPlan) -> list[tuple[int, int, str, str, Sharding]]:
    """What a device holds: ``(first point, last point, local name, tensor, sharding)`` per
    local tensor; the points are the ops in order, then the end."""
    p = plan.program
    n = len(p.ops)
    born: dict[str, tuple[int, str, Sharding]] = {}
    last: dict[str, int] = {}
    for name, s in plan.inputs:
        born[name] = (0, name, s)
        last[name] = n
    for i, o in enumerate(plan.ops):
        out = p.op(o.op).out.tensor
        born[out] = (i, out, o.strategy.out)
        last.setdefault(out, i)
        for r in o.reads:
            last[r] = max(last.get(r, i), i)
    for t in plan.transfers:
        if t.in_place:  # read from the peers' memory by its reader: nothing held
            last[t.source] = max(last.get(t.source, 0), min(t.at, n))
            continue
        made = transfer_point(p, t)
        born[t.name] = (made, t.tensor, t.dst)
        last.setdefault(t.name, min(t.at, n))
        last[t.source] = max(last.get(t.source, 0), made)
    for name, _, local in plan.outputs:
        last[local] = last[name] = n
    return [(b, last.get(local, b), local, tensor, s) for local, (b, tensor, s) in born.items()]


def memory_profile(plan: ShardingPlan) -> list[int]:
    """Bytes the largest device holds at each program point (the ops, then the end)."""
    sizes = {a.name: a.size for a in plan.mesh.axes}
    delta = [0] * (len(plan.program.ops) + 2)
    for b, e, _, tensor, s in lifetimes(plan):
        t = plan.program.tensor(tensor)
        nbytes = s.local_bytes(t.shape, t.dtype, sizes)
        delta[b] += nbytes
        delta[e + 1] -= nbytes
    out, total = [], 0
    for d in delta[:-1]:
        total += d
        out.append(total)
    return out


def peak_memory(plan: ShardingPlan) -> tuple[int, str]:
    """The most bytes the largest device holds at one point, and where."""
    prof = memory_profile(plan)
    i = max(range(len(prof)), key=prof.__getitem__)
    where = f"op {plan.program.ops[i].name!r}" if i < len(plan.program.ops) else "the end"
    return prof[i], where


def check_memory(plan: ShardingPlan) -> None:
    """Refuse a plan that needs more memory on one device than the mesh gives it."""
    cap = plan.mesh.memory_bytes
    if cap is None or plan.peak_bytes <= cap:
        return
    sizes = {a.name: a.size for a in plan.mesh.axes}
    prof = memory_profile(plan)
    at = max(range(len(prof)), key=prof.__getitem__)
    live = [(plan.program.tensor(t), s) for b, e, _, t, s in lifetimes(plan) if b <= at <= e]
    big = sorted(((s.local_bytes(t.shape, t.dtype, sizes), t.name, s) for t, s in live),
                 key=lambda x: -x[0])[:3]
    parts = ", ".join(f"tensor {t!r} {s} {b / 2**20:.1f} MiB" for b, t, s in big)
    raise PlanningError(f"program {plan.program.name!r} does not fit mesh {plan.mesh.name!r}: "
                        f"a device needs {plan.peak_bytes / 2**20:.1f} MiB at {plan.peak_at} "
                        f"but has {cap / 2**20:.1f} MiB (largest: {parts})")
