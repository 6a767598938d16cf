"""Per-op sharding rules: how an op may divide over a mesh, and what each device computes.

A *strategy* of an op gives some of its dims mesh axes to split them over (outer first; each
axis splits one dim at most); along the axes it names no dim the op is replicated. Everything
else follows from the op's indexing maps, the same for every kind, and the registry entry's
category says which dims may split:

* ``pointwise``, ``layout``: any dim (they have no reduction dims);
* ``reduction``, ``matmul``: any parallel dim, and a reduction dim when the kind's reducer
  combines partials with nothing left to do (``sum``, ``max``, ``min``, ``prod``, ``any``, a
  matmul's sum): the output is then *partial* over those axes. A ``mean`` (its finish divides
  by the count) and an ``argmax`` (value-index pairs) keep their reduction dims whole;
* ``fallback``: none; a fallback runs whole, so its inputs must be replicated.

What each input must look like (``Strategy.ins``) follows from its access. A tensor dim read by
one op dim ``d`` alone (and of ``d``'s size) is split like ``d``. A dim read through a sum of
dims, ``q[t, 128*h+d]``, is split like ``h`` when ``h`` is its outermost term, the others cover
the rest exactly (``128 = size of d``) and the shards line up (``h``'s shards times 128 are the
column shards): the heads of attention. Any other read of a split dim (an inner term, a
leading slice, an offset) needs that tensor dim replicated, and each device reads its part of
it through offsets in its access. The output is split like its dims; literal-0 axes stay whole.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> p = load("examples/mlp.json")
>>> s = make_strategy(p.op("down"), p, parse("tp=4"), {"k": ("tp",)})
>>> [str(x) for x in s.ins], str(s.out)
(['[-, tp]', '[tp, -]'], '[-, -] partial sum over tp')
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from apportion.errors import ProgramError
from apportion.ir.affine import AffineExpr
from apportion.ir.kinds import Category, OpKind
from apportion.ir.op import Access, Op
from apportion.ir.program import Program, TensorType
from apportion.sharding.mesh import Mesh, combos
from apportion.sharding.spec import PARTIAL_REDUCERS, Sharding, dim_block, shard_sizes

#: what each category allows, for reports and docs
RULES: dict[Category, str] = {
    Category.POINTWISE: "any dim; inputs and output split alike",
    Category.LAYOUT: "any dim; inputs and output split alike",
    Category.REDUCTION: "parallel dims; a reduction dim when its reducer has no finish "
                        "(output partial)",
    Category.MATMUL: "parallel dims; reduction dims (output partial, summed later)",
    Category.FALLBACK: "none: runs whole on replicated inputs",
}


def device_reduction(kind: OpKind) -> bool:
    """True when partial results of ``kind`` on different devices combine by its reducer with
    nothing left to do, so its reduction dims may split over a mesh."""
    r = kind.reducer
    return r is not None and r.name in PARTIAL_REDUCERS


def splittable(op: Op) -> tuple[str, ...]:
    """The dims of ``op`` a strategy may split (see the module docstring)."""
    kind = op.kind
    if not kind.divisible:
        return ()
    if op.reduction_dims and not device_reduction(kind):
        return op.parallel_dims
    return op.dim_names


@dataclass(frozen=True)
class Strategy:
    """How one op divides over a mesh: dim -> mesh axes splitting it (outer first), and the
    shardings that follow: each input's (``ins``, by position) and the output's."""

    op: str
    splits: tuple[tuple[str, tuple[str, ...]], ...]
    ins: tuple[Sharding, ...]
    out: Sharding

    @cached_property
    def split_map(self) -> dict[str, tuple[str, ...]]:
        return dict(self.splits)

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for _, axes in self.splits for a in axes)

    @property
    def label(self) -> str:
        """``m:dp n:tp`` (``replicated`` when nothing splits)."""
        return " ".join(f"{d}:{'*'.join(a)}" for d, a in self.splits) or "replicated"

    def __str__(self) -> str:
        return f"{self.op} {self.label}"


def _sizes(mesh: Mesh) -> dict[str, int]:
    return {a.name: a.size for a in mesh.axes}


def _aligned(e: AffineExpr, n: int, op: Op, split: str, axes: tuple[str, ...],
             mesh: Mesh) -> bool:
    """True when tensor dim of size ``n`` read through ``e`` can be split like op dim
    ``split`` (over ``axes``): each device's part of ``split`` reads exactly its shard."""
    sizes = op.sizes
    if e.single_dim == split:
        return sizes[split] == n
    if e.const or e.coeff(split) != max(c for _, c in e.terms):
        return False
    expected = 1
    for d, c in sorted((t for t in e.terms if t[0] != split), key=lambda t: t[1]):
        if c != expected:
            return False
        expected *= sizes[d]
    c = e.coeff(split)
    if c != expected or c * sizes[split] != n:
        return False
    msizes = _sizes(mesh)
    for coords in combos(mesh, axes):
        lo, hi = dim_block(sizes[split], axes, coords, msizes)
        if dim_block(n, axes, coords, msizes) != (c * lo, c * hi):
            return False
    return True


def access_sharding(op: Op, acc: Access, shape: Sequence[int],
                    splits: Mapping[str, tuple[str, ...]], mesh: Mesh) -> Sharding:
    """The sharding operand ``acc`` (of ``shape``) must have under ``splits``."""
    dims: list[tuple[str, ...]] = []
    used: set[str] = set()
    for e, n in zip(acc.index, shape, strict=True):
        split = [d for d in e.dims if d in splits]
        axes: tuple[str, ...] = ()
        if len(split) == 1 and _aligned(e, n, op, split[0], splits[split[0]], mesh) \
                and not used & set(splits[split[0]]):
            axes = splits[split[0]]
        used |= set(axes)
        dims.append(axes)
    return Sharding(tuple(dims))


def make_strategy(op: Op, program: Program, mesh: Mesh,
                  splits: Mapping[str, Sequence[str] | str]) -> Strategy:
    """The strategy of ``op`` splitting ``splits`` (dim -> axes, outer first); refuses a dim the
    op lacks or may not split, an axis the mesh lacks or used twice, and an empty shard."""
    where = f"op {op.name!r}"
    norm: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    allowed = splittable(op)
    for d, axes in splits.items():
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        if d not in op.sizes:
            raise ProgramError(f"{where}: no dim {d!r} to split; dims: "
                               f"{', '.join(op.dim_names)}")
        if not axes:
            continue
        if d not in allowed:
            why = ("a fallback runs whole" if not op.kind.divisible else
                   f"its {op.kind.reducer.name if op.kind.reducer else ''} reduction does not "
                   "combine across devices")
            raise ProgramError(f"{where}: dim {d!r} cannot split over the mesh: {why}")
        for a in axes:
            mesh.axis(a)
            if a in seen:
                raise ProgramError(f"{where}: mesh axis {a!r} splits both dim {seen[a]!r} and "
                                   f"dim {d!r}")
            seen[a] = d
        if min(shard_sizes(op.sizes[d], axes, _sizes(mesh))) == 0:
            raise ProgramError(f"{where}: dim {d!r} of size {op.sizes[d]} split over "
                               f"{'*'.join(axes)} leaves a device nothing")
        norm[d] = axes
    ordered = tuple((d, norm[d]) for d in op.dim_names if d in norm)
    ins = tuple(access_sharding(op, acc, program.tensor(acc.tensor).shape, norm, mesh)
                for acc in op.ins)
    out_dims = tuple(norm.get(e.single_dim, ()) if e.single_dim else () for e in op.out.index)
    partial = tuple(a for a in mesh.names
                    if any(a in norm.get(d, ()) for d in op.reduction_dims))
    reducer = op.kind.reducer.name if partial and op.kind.reducer else None
    return Strategy(op.name, ordered, ins, Sharding(out_dims, partial, reducer))


def op_strategies(op: Op, program: Program, mesh: Mesh) -> tuple[Strategy, ...]:
    """Every strategy of ``op``: each mesh axis on one splittable dim or none, the axes of one
    dim in mesh order, no empty shard. The replicated strategy comes first."""
    allowed = splittable(op)
    sizes = _sizes(mesh)
    out = []
    for choice in itertools.product(*([None, *allowed] for _ in mesh.axes)):
        splits: dict[str, tuple[str, ...]] = {}
        for a, d in zip(mesh.names, choice, strict=True):
            if d is not None:
                splits[d] = splits.get(d, ()) + (a,)
        if any(min(shard_sizes(op.sizes[d], axes, sizes)) == 0 for d, axes in splits.items()):
            continue
        out.append(make_strategy(op, program, mesh, splits))
    return tuple(out)


# --- what one device computes --------------------------------------------------------------

def local_ranges(op: Op, strategy: Strategy, mesh: Mesh, coords: Mapping[str, int]
                 ) -> dict[str, tuple[int, int]]:
    """Dim -> the ``(start, stop)`` of the op's iteration space the device at ``coords``
    computes."""
    sizes = _sizes(mesh)
    split = strategy.split_map
    return {d: dim_block(n, split.get(d, ()), coords, sizes) for d, n in op.dims}


def local_op(op: Op, program: Program, mesh: Mesh, strategy: Strategy,
             coords: Mapping[str, int], names: Sequence[str] | None = None,
             out_name: str | None = None) -> tuple[Op, dict[str, TensorType]]:
    """The op the device at ``coords`` runs, and the local types of its operands.

    Input ``k`` reads the local tensor ``names[k]`` (default: its own name), which holds that
    device's shard of ``strategy.ins[k]``; each access is shifted by where the device's part of
    the iteration space starts less where its shard of the tensor starts. The output is the
    device's shard of ``strategy.out`` (partial where that is)."""
    sizes = _sizes(mesh)
    ranges = local_ranges(op, strategy, mesh, coords)
    start = {d: lo for d, (lo, _) in ranges.items()}
    types: dict[str, TensorType] = {}

    def local(acc: Access, s: Sharding, name: str) -> Access:
        t = program.tensor(acc.tensor)
        block = s.block(t.shape, coords, sizes)
        index = []
        for j, e in enumerate(acc.index):
            shift = sum(c * start[d] for d, c in e.terms) - block[j][0]
            const = e.const + shift
            if const < 0:  # the shard starts after what the device reads: a rule bug
                raise ProgramError(f"op {op.name!r}: device {dict(coords)} reads tensor "
                                   f"{acc.tensor!r} dim {j} before its shard {block[j]}")
            index.append(AffineExpr(e.terms, const))
        shape = tuple(hi - lo for lo, hi in block)
        types.setdefault(name, TensorType(name, shape, t.dtype))
        return Access(name, tuple(index))

    ins = tuple(local(acc, s, acc.tensor if names is None else names[k])
                for k, (acc, s) in enumerate(zip(op.ins, strategy.ins, strict=True)))
    out = local(op.out, strategy.out, out_name or op.out.tensor)
    dims = tuple((d, hi - lo) for d, (lo, hi) in ranges.items())
    return Op(op.name, op.fn, out, ins, dims, op.attrs), types
