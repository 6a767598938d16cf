"""Upstream MLIR's ``shard`` dialect (MLIR 22), the vocabulary every shard form writes: a
``Grid`` as a ``shard.grid``, a ``TensorSharding`` as a ``shard.sharding`` (both
``mlir.shard.values``, which ``apportion.sharding.forms`` builds from a mesh and a plan).

IREE 3.13's bindings lack the dialect; upstream MLIR 22 (the ``mlir`` extra,
``mlir.upstream``) registers it, and each form is verified with it.

What upstream's attributes cannot say travels as discardable ``apportion.*`` attributes, which
upstream keeps and ignores:

* a grid's axis names, levels and peered axes (``apportion.axes``, ``apportion.levels``,
  ``apportion.peered``: upstream grids have numbered axes and no notion of one device reading
  another's memory), and a symbolic axis's name and planning size (``apportion.symbols``,
  ``apportion.planned_at``: upstream writes the size ``?``);
* a partial value (``apportion.partial_axes``, ``apportion.reducer``: upstream 22's
  ``shard.sharding`` has no partial axes; its partitioner reduces a split reduction at once);
* the windows an op reads a split dim through (``apportion.windows``, a convolution's halo:
  exact per device). Where upstream can say them too (an even cut whose devices lack the same
  rows of each neighbour) the sharding also carries upstream's ``halo_sizes``, one (low, high)
  pair per split dim for every shard.

Uneven shards are exact: where a dim's cut is not even, the sharding lists every shard's
offsets (``sharded_dims_offsets``, in device order along the dim's axes, outer first), as
apportion cuts them (the larger shards first).

>>> from apportion.mlir.shard.values import Grid, GridAxis, TensorSharding
>>> g = Grid((GridAxis("dp", 2), GridAxis("tp", 4, peered=True, symbol="N")),
...          "dp=2,tp=N~4:peered")
>>> print(grid_op(g))
shard.grid @mesh(shape = 2x?) {apportion.axes = ["dp", "tp"], apportion.levels = ["device", \
"device"], apportion.peered = ["tp"], apportion.symbols = {tp = "N"}, apportion.planned_at = [2, 4]}
>>> sharding_op("%s", TensorSharding(((), (0,))))
'%s = shard.sharding @mesh split_axes = [[], [0]] : !shard.sharding'
>>> sharding_op("%s", TensorSharding(((), (0,)), cuts=((), (0, 3, 6, 8, 10))))
'%s = shard.sharding @mesh split_axes = [[], [0]] sharded_dims_offsets = [0, 3, 6, 8, 10] : \
!shard.sharding'
"""

from __future__ import annotations

from apportion.mlir.shard.values import Grid, TensorSharding

#: the symbol every emitted module names its grid by
GRID = "mesh"


def grid_op(grid: Grid, name: str = GRID) -> str:
    """The grid as a ``shard.grid``: static sizes, ``?`` for a symbolic axis, the axis names,
    levels, peered axes and symbols as discardable attributes."""
    shape = "x".join("?" if a.symbolic else str(a.size) for a in grid.axes)
    attrs = [f"apportion.axes = [{', '.join(_q(a.name) for a in grid.axes)}]",
             f"apportion.levels = [{', '.join(_q(a.level) for a in grid.axes)}]"]
    peered = [a.name for a in grid.axes if a.peered]
    if peered:
        attrs.append(f"apportion.peered = [{', '.join(map(_q, peered))}]")
    if grid.symbolic:
        syms = ", ".join(f"{a.name} = {_q(a.symbol or '')}" for a in grid.axes if a.symbolic)
        attrs.append(f"apportion.symbols = {{{syms}}}")
        attrs.append(f"apportion.planned_at = [{', '.join(str(a.size) for a in grid.axes)}]")
    return f"shard.grid @{name}(shape = {shape}) {{{', '.join(attrs)}}}"


def split_axes(sharding: TensorSharding) -> str:
    """``[[0], [], [1, 2]]``: per tensor dim the grid axes (by index) splitting it, outer
    first; ``[[]]`` for a rank-0 tensor (upstream needs one sub-array)."""
    dims = [f"[{', '.join(map(str, axes))}]" for axes in sharding.split]
    return f"[{', '.join(dims) or '[]'}]"


def sharding_op(result: str, sharding: TensorSharding, name: str = GRID) -> str:
    """``RESULT = shard.sharding @mesh split_axes = ... : !shard.sharding`` (exact offsets
    where a cut is uneven; upstream's halo pairs where it can say the windows); a partial
    sharding's axes and reducer and the windows as discardable attributes."""
    text = f"{result} = shard.sharding @{name} split_axes = {split_axes(sharding)}"
    offs = sharding.offsets
    if offs is not None:
        text += f" sharded_dims_offsets = [{', '.join(map(str, offs))}]"
    attrs = []
    if sharding.partial:
        attrs += [f"apportion.partial_axes = array<i64: {', '.join(map(str, sharding.partial))}>",
                  f"apportion.reducer = {_q(sharding.reducer or '')}"]
    if offs is None and sharding.halos is not None:  # upstream forbids both
        text += f" halo_sizes = [{', '.join(str(n) for pair in sharding.halos for n in pair)}]"
    if sharding.windows:  # exact per device (upstream's halo_sizes are one pair for every shard)
        attrs.append(f"apportion.windows = [{', '.join(map(_q, sharding.windows))}]")
    if attrs:
        text += f" {{{', '.join(attrs)}}}"
    return text + " : !shard.sharding"


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
