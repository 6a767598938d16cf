"""Sharding plans in upstream MLIR's ``shard`` dialect: the sharding proposal's forms, each
rendered by ``apportion.mlir.shard`` from what this module works out of a plan and its mesh
(``mlir.shard.values``), and verified by upstream MLIR 22 (the ``mlir`` extra) before it is
returned:

* ``annotated_mlir(program, mesh, annotations)``: the user's annotations (form 1);
* ``propagated_mlir(plan)``: every tensor's sharding after propagation or search (form 2);
* ``partitioned_mlir(plan)``: the SPMD form with per-shard types and collectives (form 3);
* ``unrolled_mlir(schedule, mesh)``: one function per device segment of the lowered mesh
  schedule and a wrapper with the caller's signature (form 4, static mesh);
* ``dynamic_mlir(plan)``: for a mesh with run-time axis sizes, one per-shard function per op
  and a wrapper looping over the run-time list of shards (form 5; ``run_dynamic`` runs it).

What upstream's attributes cannot say travels as discardable ``apportion.*`` attributes (see
``mlir.shard.dialect``). Where an op reads a split dim through a window (a convolution's halo)
and upstream can say it too, the sharding carries upstream's ``halo_sizes``: one (low, high)
pair per split dim for every shard (``halo_pair``), exact only where the cut is even and every
device lacks the same rows of its neighbours.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.spec import Sharding
>>> grid(parse("dp=2,tp=N~4:peered")).axes[1]
GridAxis(name='tp', size=4, level='device', peered=True, symbol='N')
>>> tensor_sharding(Sharding(((), ("dp",))), parse("dp=4"), (4, 10)).offsets
(0, 3, 6, 8, 10)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apportion.errors import EmitError
from apportion.ir.program import Program, TensorType
from apportion.mlir.shard import dynamic as dynamic_form
from apportion.mlir.shard import forms as spmd_forms
from apportion.mlir.shard.unrolled import unrolled_mlir as render_unrolled
from apportion.mlir.shard.values import (
    Grid,
    GridAxis,
    LocalCode,
    LocalStage,
    OpSplit,
    Partitioned,
    Propagated,
    Reshard,
    TensorSharding,
)
from apportion.schedule.mesh import MeshSchedule
from apportion.sharding.collectives import Step
from apportion.sharding.lower import step_collective
from apportion.sharding.mesh import Mesh, combos
from apportion.sharding.plan import ShardingPlan
from apportion.sharding.rules import local_ops
from apportion.sharding.spec import Sharding, dim_block


def grid(mesh: Mesh) -> Grid:
    """``mesh`` as a ``shard.grid`` says it (see the module docstring)."""
    return Grid(tuple(GridAxis(a.name, a.size, a.level, a.peered, a.symbol) for a in mesh.axes),
                mesh.spec())


def tensor_sharding(sharding: Sharding, mesh: Mesh, shape: Sequence[int]) -> TensorSharding:
    """``sharding`` of a tensor of ``shape`` as ``shard.sharding`` says it: its axes by grid
    index, every shard's cut on a static mesh (as apportion cuts them, the larger shards
    first: ``spec.chunk``), and upstream's halo pairs where it can say the windows."""
    cuts: tuple[tuple[int, ...], ...] = ()
    if not mesh.symbolic:
        sizes = {a.name: a.size for a in mesh.axes}
        cuts = tuple((*(dim_block(n, axes, c, sizes)[0] for c in combos(mesh, axes)), n)
                     if axes else () for n, axes in zip(shape, sharding.dims, strict=True))
    return TensorSharding(
        tuple(tuple(mesh.index(a) for a in axes) for axes in sharding.dims), cuts,
        tuple(mesh.index(a) for a in sharding.partial), sharding.reducer,
        upstream_halos(sharding, mesh, shape),
        tuple(str(w) if w else "" for w in sharding.windows))


def halo_pair(tensor: str, shape: Sequence[int], sharding: Sharding, mesh: Mesh, dim: int
              ) -> tuple[int, int]:
    """Upstream's one ``(low, high)`` halo pair for every shard of dim ``dim`` of a tensor of
    ``shape`` read through ``sharding``'s window there: the rows each device lacks below and
    above its shard (``sharding.base``) of the neighbour on that side. Upstream's
    ``shard.update_halo`` gives every shard that pair (an outermost shard's halo beyond the
    tensor is padding, never read) and exchanges it with its adjacent shards only, so the
    pair says apportion's per-device halos exactly only where the cut is even (upstream's
    halos and uneven offsets exclude each other), every device with a neighbour below lacks
    as many rows of it (likewise above), and no halo passes a neighbour's shard. Anything else
    is an EmitError naming the tensor, dim, axis and the devices' halos.

    >>> from apportion.sharding.mesh import parse
    >>> from apportion.sharding.spec import Window
    >>> s = Sharding(((), ("die",)), windows=(None, Window(8, 1, 0, 2)))  # y[h] = x[h + kh]
    >>> halo_pair("x", (4, 10), s, parse("die=2"), 1)   # shards [0, 5), [5, 10)
    (1, 1)
    """
    window = sharding.window(dim)
    if window is None:
        return (0, 0)
    if len(sharding.dims[dim]) != 1:
        raise EmitError(f"tensor {tensor!r} dim {dim} read through a window across axes "
                        f"{', '.join(sharding.dims[dim])}: upstream's update_halo exchanges "
                        "halos with the adjacent shards along one grid axis, not across several "
                        "(the unrolled and dynamic forms move them)")
    (axis,) = sharding.dims[dim]
    where = f"tensor {tensor!r} dim {dim} read through a window along axis {axis!r}"
    if mesh.symbolic:
        raise EmitError(f"{where}: mesh {mesh.spec()} has symbolic sizes, so the devices' "
                        "halos are not known; bind the sizes (--param NAME=SIZE)")
    sizes = {a.name: a.size for a in mesh.axes}
    k, n = sizes[axis], shape[dim]
    shards = [dim_block(n, (axis,), {axis: c}, sizes) for c in range(k)]
    if n % k:
        raise EmitError(f"{where}: its {n} rows are cut unevenly in {k} "
                        f"({', '.join(str(hi - lo) for lo, hi in shards)}); upstream's "
                        "halo_sizes go with its even cut only (they exclude "
                        "sharded_dims_offsets)")
    lacks = []  # per device the rows it lacks below and above its shard
    for c, (lo, hi) in enumerate(shards):
        wl, wh = window.rows((axis,), {axis: c}, sizes)
        lacks.append((max(0, lo - wl), max(0, wh - hi)))
    lows = {lacks[c][0] for c in range(1, k)}  # the devices with a neighbour below
    highs = {lacks[c][1] for c in range(k - 1)}
    low, high = max(lows, default=0), max(highs, default=0)
    if len(lows) > 1 or len(highs) > 1:
        raise EmitError(f"{where}: the devices lack different halos of their neighbours "
                        f"((low, high) by device along {axis!r}: "
                        f"{', '.join(map(str, lacks))}), where upstream's update_halo gives "
                        "every shard one (low, high) pair")
    if max(low, high) > n // k:
        raise EmitError(f"{where}: a halo of {max(low, high)} rows passes a neighbour's shard "
                        f"of {n // k}, where upstream's update_halo exchanges with adjacent "
                        "shards only")
    return (low, high)


def upstream_halos(sharding: Sharding, mesh: Mesh, shape: Sequence[int]
                   ) -> tuple[tuple[int, int], ...] | None:
    """``halo_sizes`` for ``sharding``: per split dim (in dim order) its ``halo_pair``
    ((0, 0) where no window reads it); None where it has no window or upstream cannot say
    one of them (``halo_pair`` refuses it: the exact windows stay in ``apportion.windows``)."""
    if not sharding.windows:
        return None
    try:
        return tuple(halo_pair("", shape, sharding, mesh, j)
                     for j, axes in enumerate(sharding.dims) if axes)
    except EmitError:
        return None


def _annotations(program: Program, mesh: Mesh, annotations: Mapping[str, Sharding]
                 ) -> dict[str, TensorSharding]:
    for name, s in annotations.items():
        s.check(mesh, program.tensor(name).shape, name)
    return {name: tensor_sharding(s, mesh, program.tensor(name).shape)
            for name, s in annotations.items()}


def annotated_mlir(program: Program, mesh: Mesh, annotations: Mapping[str, Sharding]) -> str:
    """The program with the user's annotations (form 1), verified upstream.

    >>> from apportion.sharding.spec import load
    >>> from apportion.sharding.mesh import parse
    >>> prog, ann = load("examples/megatron.json")
    >>> text = annotated_mlir(prog, parse("tp=2"), ann)   # doctest: +SKIP
    """
    return spmd_forms.annotated_mlir(program, grid(mesh),
                                     _annotations(program, mesh, annotations))


def annotated_ops(program: Program, mesh: Mesh, annotations: Mapping[str, Sharding]
                  ) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Per op of ``annotated_mlir``'s form, the SSA value its output is made as and the lines
    of its code (``mlir.shard.forms.annotated_ops``)."""
    return spmd_forms.annotated_ops(program, _annotations(program, mesh, annotations))


def propagated_mlir(plan: ShardingPlan) -> str:
    """Every tensor's sharding as ``plan`` chose it (form 2), verified upstream."""
    program, mesh = plan.program, plan.mesh

    def ts(s: Sharding, tensor: str) -> TensorSharding:
        return tensor_sharding(s, mesh, program.tensor(tensor).shape)

    ops = []
    for op in program.ops:
        st = plan.strategy(op.name)
        ops.append((tuple(ts(s, a.tensor) for a, s in zip(op.ins, st.ins, strict=True)),
                    ts(st.out, op.out.tensor)))
    return spmd_forms.propagated_mlir(Propagated(
        program, grid(mesh), plan.method, tuple((n, ts(s, n)) for n, s in plan.inputs),
        tuple(ops), tuple((n, ts(s, n)) for n, s, _ in plan.outputs)))


def partitioned_mlir(plan: ShardingPlan) -> str:
    """The SPMD form every device runs (form 3), verified upstream (a static mesh: bind a
    symbolic one first, ``plan.bind``)."""
    mesh, program = plan.mesh, plan.program
    if mesh.symbolic:
        raise EmitError(f"mesh {mesh.spec()} has symbolic axis sizes "
                        f"({', '.join(mesh.symbols)}): the partitioned form needs the "
                        "devices' shard shapes; bind the sizes (--param NAME=SIZE)")
    sizes = {a.name: a.size for a in mesh.axes}
    coords = [mesh.coords(d) for d in range(mesh.devices)]
    inputs = tuple((name, tuple(TensorType(name, s.local_shape(program.tensor(name).shape, c,
                                                                sizes),
                                           s.held_dtype(program.tensor(name).dtype))
                                for c in coords)) for name, s in plan.inputs)
    by_point: dict[int, list[Any]] = {}
    for t in plan.transfers:
        by_point.setdefault(t.at, []).append(t)
    stages: list[LocalStage | Reshard] = []
    for i, op in enumerate([*program.ops, None]):
        for t in by_point.get(i, []):
            src = t.source or t.tensor
            for k, step in enumerate(t.steps):
                dst = t.name if k == len(t.steps) - 1 else f"{t.name}.{k}"
                stages.append(_reshard(plan, t.tensor, src, dst, step))
                src = dst
        if op is None:
            continue
        shard = plan.op(op.name)
        devices = []
        for c in coords:
            lops, types, finish = local_ops(op, program, mesh, shard.strategy, c,
                                            list(shard.reads), op.out.tensor)
            devices.append(LocalCode(lops, tuple(types.values()),
                                     None if finish is None else finish.part()))
        stages.append(LocalStage(op.out.tensor, tuple(dict.fromkeys(shard.reads)),
                                 tuple(devices)))
    return spmd_forms.partitioned_mlir(Partitioned(
        program, grid(mesh), inputs, tuple(stages), tuple(local for _, _, local in plan.outputs)))


def _reshard(plan: ShardingPlan, tensor: str, source: str, result: str, step: Step) -> Reshard:
    halo, refusal = None, None
    if step.kind == "halo":
        assert step.dim is not None  # a halo step names its dim
        try:
            halo = halo_pair(tensor, plan.program.tensor(tensor).shape, step.dst, plan.mesh,
                             step.dim)
        except EmitError as e:  # said where the form reaches the step, as the others are
            refusal = str(e)
    return Reshard(step_collective(plan, step, tensor, source, result), step.remote, halo,
                   refusal, (str(step.src), str(step.dst)))


def unrolled_mlir(schedule: MeshSchedule, mesh: Mesh | None = None) -> str:
    """The per-shard unrolled form of a lowered mesh schedule (a static mesh), verified
    upstream; ``mesh`` adds its ``shard.grid`` (the devices' names and links) for reference.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.sharding.mesh import parse
    >>> from apportion.sharding.search import search
    >>> from apportion.sharding.lower import lower_plan
    >>> text = unrolled_mlir(lower_plan(search(load("examples/mlp.json"), parse("tp=2"))))
    >>> 'func.func @"mlp"(' in text and 'func.call @"mlp.d0.s0"' in text
    True
    """
    return render_unrolled(schedule, None if mesh is None else grid(mesh))


def dynamic_mlir(plan: ShardingPlan) -> str:
    """The dynamic-list form of ``plan`` over a mesh with symbolic axes (see
    ``mlir.shard.dynamic``), verified upstream. The same text serves every device count.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.sharding.mesh import parse
    >>> from apportion.sharding.search import search
    >>> text = dynamic_mlir(search(load("examples/mlp.json"), parse("tp=N~4")))  # doctest: +SKIP
    >>> "shard.grid_shape @mesh axes = [0]" in text                              # doctest: +SKIP
    True
    """
    if not plan.mesh.symbolic:
        raise EmitError(f"mesh {plan.mesh.spec()} has no symbolic axis size: the "
                        "dynamic-list form is for a run-time device count (tp=N~4); a "
                        "static mesh has the partitioned and unrolled forms")
    program = plan.program
    splits = []
    for op in program.ops:
        st = plan.strategy(op.name)
        splits.append(OpSplit(st.splits, st.out.held_dtype(program.tensor(op.out.tensor).dtype),
                              st.label, st.out.partial, st.out.reducer))
    return dynamic_form.dynamic_mlir(program, grid(plan.mesh), tuple(splits), plan.method)


def run_dynamic(text: str, program: Program, mesh: Mesh, inputs: Mapping[str, Any],
                sizes: Mapping[str, int]) -> dict[str, Any]:
    """Run ``dynamic_mlir``'s text of ``program`` over ``mesh`` with upstream MLIR's
    execution engine at the symbolic axis sizes ``sizes`` (symbol -> devices), given as data
    (``mlir.shard.dynamic.run_dynamic``). Returns each output by name."""
    return dynamic_form.run_dynamic(text, program, grid(mesh), inputs, sizes)
