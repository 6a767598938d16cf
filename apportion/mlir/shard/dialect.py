"""The sharding package's values in upstream MLIR's ``shard`` dialect (MLIR 22): a ``Mesh`` as
a ``shard.grid``, a ``Sharding`` as a ``shard.sharding``.

IREE 3.13's bindings lack the dialect; upstream MLIR 22 (the ``mlir`` extra,
``runtime.upstream_mlir``) registers it, and ``apportion.mlir.shard`` emits whole programs in
its forms and verifies each with it. This module writes only the dialect's vocabulary for the
values of this package (it imports no backend, so the op bodies live in ``mlir.shard``).

What upstream's attributes cannot say travels as discardable ``apportion.*`` attributes, which
upstream keeps and ignores:

* a grid's axis names, levels and peered axes (``apportion.axes``, ``apportion.levels``,
  ``apportion.peered``: upstream grids have numbered axes and no notion of one device reading
  another's memory), and a symbolic axis's name and planning size (``apportion.symbols``,
  ``apportion.planned_at``: upstream writes the size ``?``);
* a partial value (``apportion.partial_axes``, ``apportion.reducer``: upstream 22's
  ``shard.sharding`` has no partial axes; its partitioner reduces a split reduction at once);
* the windows an op reads a split dim through (``apportion.windows``, a convolution's halo:
  exact per device). Where upstream can say them too (``halo_pair``: an even cut whose
  devices lack the same rows of each neighbour) the sharding also carries upstream's
  ``halo_sizes``, one (low, high) pair per split dim for every shard.

Uneven shards are exact: where a dim's cut is not even, the sharding lists every shard's
offsets (``sharded_dims_offsets``, in device order along the dim's axes, outer first), as
apportion cuts them (the larger shards first; ``spec.chunk``).

>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.spec import Sharding
>>> m = parse("dp=2,tp=N~4:peered")
>>> print(grid_op(m))
shard.grid @mesh(shape = 2x?) {apportion.axes = ["dp", "tp"], apportion.levels = ["device", \
"device"], apportion.peered = ["tp"], apportion.symbols = {tp = "N"}, apportion.planned_at = [2, 4]}
>>> sharding_op("%s", Sharding(((), ("dp",))), m, (4, 10))
'%s = shard.sharding @mesh split_axes = [[], [0]] : !shard.sharding'
>>> sharding_op("%s", Sharding(((), ("dp",))), parse("dp=4"), (4, 10))
'%s = shard.sharding @mesh split_axes = [[], [0]] sharded_dims_offsets = [0, 3, 6, 8, 10] : \
!shard.sharding'
"""

from __future__ import annotations

from collections.abc import Sequence

from apportion.errors import EmitError
from apportion.sharding.mesh import Mesh
from apportion.sharding.spec import Sharding, dim_block

#: the symbol every emitted module names its grid by
GRID = "mesh"


def grid_op(mesh: Mesh, name: str = GRID) -> str:
    """The mesh as a ``shard.grid``: static sizes, ``?`` for a symbolic axis, the axis names,
    levels, peered axes and symbols as discardable attributes."""
    shape = "x".join("?" if a.symbolic else str(a.size) for a in mesh.axes)
    attrs = [f"apportion.axes = [{', '.join(_q(a.name) for a in mesh.axes)}]",
             f"apportion.levels = [{', '.join(_q(a.level) for a in mesh.axes)}]"]
    peered = [a.name for a in mesh.axes if a.peered]
    if peered:
        attrs.append(f"apportion.peered = [{', '.join(map(_q, peered))}]")
    if mesh.symbolic:
        syms = ", ".join(f"{a.name} = {_q(a.symbol or '')}" for a in mesh.axes if a.symbolic)
        attrs.append(f"apportion.symbols = {{{syms}}}")
        attrs.append(f"apportion.planned_at = [{', '.join(str(a.size) for a in mesh.axes)}]")
    return f"shard.grid @{name}(shape = {shape}) {{{', '.join(attrs)}}}"


def split_axes(sharding: Sharding, mesh: Mesh) -> str:
    """``[[0], [], [1, 2]]``: per tensor dim the grid axes (by index) splitting it, outer
    first; ``[[]]`` for a rank-0 tensor (upstream needs one sub-array)."""
    dims = [f"[{', '.join(str(mesh.index(a)) for a in axes)}]" for axes in sharding.dims]
    return f"[{', '.join(dims) or '[]'}]"


def offsets(sharding: Sharding, mesh: Mesh, shape: Sequence[int]) -> list[int] | None:
    """Every shard's start along each split dim and the dim's end (upstream's
    ``sharded_dims_offsets``), when some split dim is cut unevenly on a static mesh; None when
    every cut is even (upstream's own rule then gives the same shards) or the mesh is
    symbolic."""
    if mesh.symbolic:
        return None
    sizes = {a.name: a.size for a in mesh.axes}
    out: list[int] = []
    uneven = False
    for n, axes in zip(shape, sharding.dims, strict=True):
        if not axes:
            continue
        coords_list = _coords(axes, sizes)
        starts = [dim_block(n, axes, c, sizes)[0] for c in coords_list]
        widths = {dim_block(n, axes, c, sizes)[1] - dim_block(n, axes, c, sizes)[0]
                  for c in coords_list}
        uneven |= len(widths) > 1
        out += [*starts, n]
    return out if uneven else None


def _coords(axes: Sequence[str], sizes: dict[str, int]) -> list[dict[str, int]]:
    """Every coordinate of ``axes``, the first axis outermost."""
    out: list[dict[str, int]] = [{}]
    for a in axes:
        out = [{**c, a: k} for c in out for k in range(sizes[a])]
    return out


def sharding_op(result: str, sharding: Sharding, mesh: Mesh, shape: Sequence[int],
                name: str = GRID) -> str:
    """``RESULT = shard.sharding @mesh split_axes = ... : !shard.sharding`` for a tensor of
    ``shape`` (exact offsets where a cut is uneven); a partial sharding's axes and reducer
    as discardable attributes."""
    text = f"{result} = shard.sharding @{name} split_axes = {split_axes(sharding, mesh)}"
    offs = offsets(sharding, mesh, shape)
    if offs is not None:
        text += f" sharded_dims_offsets = [{', '.join(map(str, offs))}]"
    attrs = []
    if sharding.partial:
        axes = ", ".join(str(mesh.index(a)) for a in sharding.partial)
        attrs += [f"apportion.partial_axes = array<i64: {axes}>",
                  f"apportion.reducer = {_q(sharding.reducer or '')}"]
    halos = upstream_halos(sharding, mesh, shape) if offs is None else None
    if halos is not None:  # upstream forbids halo_sizes beside sharded_dims_offsets
        text += f" halo_sizes = [{', '.join(str(n) for pair in halos for n in pair)}]"
    windows = getattr(sharding, "windows", ())
    if windows:  # exact per device (upstream's halo_sizes are one pair for every shard)
        attrs.append(f"apportion.windows = [{', '.join(_q(str(w) if w else '') for w in windows)}]")
    if attrs:
        text += f" {{{', '.join(attrs)}}}"
    return text + " : !shard.sharding"


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
    if not getattr(sharding, "windows", ()):
        return None
    try:
        return tuple(halo_pair("", shape, sharding, mesh, j)
                     for j, axes in enumerate(sharding.dims) if axes)
    except EmitError:
        return None


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
