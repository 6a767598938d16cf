"""Per-op sharding rules: how an op may divide over a mesh, and what each device computes.

A *strategy* of an op gives some of its dims mesh axes to split them over (outer first; each
axis splits one dim at most); along the axes it names no dim the op is replicated. Everything
else follows from the op's indexing maps, the same for every kind, and the registry entry's
category says which dims may split:

* ``pointwise``, ``layout``: any dim (they have no reduction dims);
* ``reduction``, ``matmul``: any parallel dim, and a reduction dim: the output is then
  *partial* over the axes splitting it. Partials of ``sum``, ``max``, ``min``, ``prod``, ``any``
  and a matmul's sum combine by their reducer with nothing left to do. A ``mean`` (of floats)
  splits as a sum: each device's part is its shard's sum over the *whole* op's count (its local
  mean times its share of the count, ``DeviceFinish`` ``scale``), so the output waits as a partial
  ``sum``. An ``argmax`` (of floats, int8 or int32 values) waits as a partial ``argmax``: each
  device packs its shard's (value, global flat index) pair into one int64 key ordered by value
  then lowest index (``DeviceFinish`` ``pack``, ``schedule.mesh.argmax_keys``), the keys combine by
  max, and the index is unpacked once the last partial axis is reduced. Other dtypes keep the
  reduction dims whole;
* ``fallback``: none; a fallback runs whole, so its inputs must be replicated.

What each input must look like (``OpSharding.ins``) follows from its access. A tensor dim read by
one op dim ``d`` alone (and of ``d``'s size) is split like ``d``. A dim read through a sum of
dims, ``q[t, 128*h+d]``, is split like ``h`` when ``h`` is its outermost term, the others cover
the rest exactly (``128 = size of d``) and the shards line up (``h``'s shards times 128 are the
column shards): the heads of attention. Any other read of a split dim (an inner term, a leading
slice, an offset) needs that tensor dim replicated, and each device reads its part of it
through offsets in its access; but where the dim is split over mesh axes that all have *peered*
memory (one axis or several) and it is the read's outermost term (a convolution's ``x[h + kh]``, a
shifted slice's ``x[i + 1]``, a leading slice), the tensor dim stays split over those axes and each
device reads its ``Window`` of it (``read_window``): its rows, exact for uneven cuts, and the
neighbours' rows the window reaches, which a ``halo`` fetches from the peers across the axes
(``collectives``) rather than an all-gather of the whole dim. The output is split like its dims;
literal-0 axes stay whole. An output axis written through a merge of dims, ``o[t, 64*h+d]``
(``Op.out_digits``), is split like its outermost digit of size above 1 when that digit alone is
split and its shards, times its stride, are the axis's own cuts (always so for even splits; uneven
ones are checked device by device): each device then writes one contiguous block of the axis. A
strategy splitting an inner digit (its columns would be strided) or cutting the lead digit out of
line with the axis's cuts is not offered, and ``make_strategy`` refuses it.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> p = load("examples/mlp.json")
>>> s = make_strategy(p.op("down"), p, parse("tp=4"), {"k": ("tp",)})
>>> [str(x) for x in s.ins], str(s.out)
(['[-, tp]', '[tp, -]'], '[-, -] partial sum over tp')
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from apportion.errors import ProgramError
from apportion.ir.affine import AffineExpr
from apportion.ir.dtypes import FLOAT_DTYPES
from apportion.ir.kinds import SplitFinish
from apportion.ir.op import Access, Op
from apportion.ir.program import Program, TensorType
from apportion.runtime import kernels
from apportion.schedule.mesh import MAX_KEYED_INDEX, FinishPart, argmax_keys
from apportion.sharding.collectives import KEYED_DTYPES
from apportion.sharding.mesh import Mesh, combos
from apportion.sharding.spec import PARTIAL_REDUCERS, Sharding, Window, dim_block, shard_sizes


def device_split_refusal(op: Op, program: Program) -> str | None:
    """None when ``op``'s reduction dims may split over devices (its partials combine across
    devices, see the module docstring), else why not."""
    r = op.kind.reducer
    if r is None:
        return "it has no reducer"
    across = r.across_devices
    if across is None or across.waits_as not in PARTIAL_REDUCERS:
        return f"its {r.name} reduction does not combine across devices"
    if across.finish is SplitFinish.SCALE:  # a scaled integer part is not exact
        dtype = program.tensor(op.out.tensor).dtype
        if dtype not in FLOAT_DTYPES:
            return f"a {r.name} of {dtype} splits over devices only with a float result"
    elif across.finish is SplitFinish.PACK:  # the key holds a 32-bit value and a 32-bit index
        dtype = program.tensor(op.ins[0].tensor).dtype
        if dtype not in KEYED_DTYPES:
            return (f"an {r.name} of {dtype} values cannot pack its (value, index) pairs into "
                    f"one key (values: {', '.join(sorted(KEYED_DTYPES))})")
        if math.prod(op.sizes[d] for d in op.reduction_dims) > MAX_KEYED_INDEX:
            return "its flat reduction index does not fit a key's 32 bits"
    return None


def splittable(op: Op, program: Program) -> tuple[str, ...]:
    """The dims of ``op`` a strategy may split (see the module docstring)."""
    kind = op.kind
    if not kind.divisible:
        return ()
    if op.reduction_dims and device_split_refusal(op, program) is not None:
        return op.parallel_dims
    return op.dim_names


def device_reducer(op: Op) -> str | None:
    """The reducer a partial output of ``op`` waits on (its kind's ``across_devices``): its
    own, a mean's ``sum``; None where its parts do not combine across devices."""
    r = op.kind.reducer
    if r is None or r.across_devices is None:
        return None
    return r.across_devices.waits_as


@dataclass(frozen=True)
class OpSharding:
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


def finish_kind(op: Op, strategy: OpSharding) -> SplitFinish | None:
    """What each device does last to its part of ``op`` when the strategy splits its reduction
    dims over devices (its kind's ``across_devices.finish``: ``scale`` for a mean, ``pack``
    for an argmax; then a ``DeviceFinish``); None otherwise."""
    r = op.kind.reducer
    if r is None or r.across_devices is None or r.across_devices.finish is None:
        return None
    if not any(d in strategy.split_map for d in op.reduction_dims):
        return None
    return r.across_devices.finish


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


def read_window(op: Op, e: AffineExpr, n: int, split: str, axes: tuple[str, ...],
                mesh: Mesh) -> Window | None:
    """The ``Window`` a device reads of a tensor dim of ``n`` read through ``e`` when op dim
    ``split`` is split over ``axes`` and ``e`` is not aligned with it: None unless every one
    of ``axes`` is a *peered* mesh axis (their devices read one another's memory, so a device
    fetches only the rows beyond its shard, a halo, from whichever devices across the axes
    hold them; where any axis is not peered the dim is read replicated, all-gathered),
    ``split`` is ``e``'s outermost term and the window of some device is smaller than the
    dim (else a halo is a gather)."""
    if not axes or not all(mesh.axis(a).peered for a in axes):
        return None
    c = e.coeff(split)
    if c != max(k for _, k in e.terms):
        return None
    sizes = op.sizes
    w = Window(sizes[split], c, e.const,
               sum(k * (sizes[d] - 1) for d, k in e.terms if d != split))
    msizes = _sizes(mesh)
    rows = [w.rows(axes, c, msizes) for c in combos(mesh, axes)]
    if any(lo < 0 or hi > n for lo, hi in rows) or all(hi - lo >= n for lo, hi in rows):
        return None
    return w


def access_sharding(op: Op, acc: Access, shape: Sequence[int],
                    splits: Mapping[str, tuple[str, ...]], mesh: Mesh) -> Sharding:
    """The sharding operand ``acc`` (of ``shape``) must have under ``splits``: a dim read
    alike split alike, a dim read across shard boundaries on a peered axis split with the
    ``Window`` each device reads (``read_window``), any other dim replicated."""
    dims: list[tuple[str, ...]] = []
    windows: list[Window | None] = []
    used: set[str] = set()
    for e, n in zip(acc.index, shape, strict=True):
        split = [d for d in e.dims if d in splits]
        axes: tuple[str, ...] = ()
        w = None
        if len(split) == 1 and not used & set(splits[split[0]]):
            if _aligned(e, n, op, split[0], splits[split[0]], mesh):
                axes = splits[split[0]]
            else:
                w = read_window(op, e, n, split[0], splits[split[0]], mesh)
                axes = splits[split[0]] if w is not None else ()
        used |= set(axes)
        dims.append(axes)
        windows.append(w)
    return Sharding(tuple(dims), windows=tuple(windows))


def out_axes(op: Op, j: int, n: int, splits: Mapping[str, tuple[str, ...]], mesh: Mesh
             ) -> tuple[str, ...] | str:
    """The axes splitting output axis ``j`` (of size ``n``) under ``splits``; for an axis
    written through a merge of dims, a string saying why the split cannot be written (see the
    module docstring)."""
    digits = op.out_digits[j]
    if len(digits) <= 1:
        return splits.get(digits[0], ()) if digits else ()
    split = [d for d in digits if splits.get(d)]
    if not split:
        return ()
    e = op.out.index[j]
    lead = next((d for d in digits if op.sizes[d] > 1), None)
    if split != [lead]:
        inner = next(d for d in split if d != lead)
        return (f"it writes {op.out.tensor!r} axis {j} through {e.to_source()}, and a split of "
                f"its inner digit {inner!r} would leave each device strided columns; only the "
                f"outermost digit {lead!r} may split")
    axes = splits[lead]
    c = e.coeff(lead)
    msizes = _sizes(mesh)
    whole = c * op.sizes[lead] == n  # the lead digit spans the axis (size-1 digits beside)
    for coords in combos(mesh, axes):
        lo, hi = dim_block(op.sizes[lead], axes, coords, msizes)
        if not whole or dim_block(n, axes, coords, msizes) != (c * lo, c * hi):
            ways = " x ".join(f"{a}={msizes[a]}" for a in axes)
            return (f"it writes {op.out.tensor!r} axis {j} through {e.to_source()}, and "
                    f"{lead!r} ({op.sizes[lead]}) split over {ways} gives device {coords} "
                    f"columns {c * lo}..{c * hi}, not the axis's own cut "
                    f"{dim_block(n, axes, coords, msizes)} (uneven heads)")
    return axes


def make_strategy(op: Op, program: Program, mesh: Mesh,
                  splits: Mapping[str, Sequence[str] | str]) -> OpSharding:
    """The strategy of ``op`` splitting ``splits`` (dim -> axes, outer first); refuses a dim the
    op lacks or may not split, an axis the mesh lacks or used twice, an empty shard, and a
    merged output axis whose split it cannot write."""
    where = f"op {op.name!r}"
    norm: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    allowed = splittable(op, program)
    for d, axes in splits.items():
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        if d not in op.sizes:
            raise ProgramError(f"{where}: no dim {d!r} to split; dims: "
                               f"{', '.join(op.dim_names)}")
        if not axes:
            continue
        if d not in allowed:
            why = ("a fallback runs whole" if not op.kind.divisible else
                   device_split_refusal(op, program))
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
    shape = program.tensor(op.out.tensor).shape
    out_dims = []
    for j, n in enumerate(shape):
        axes = out_axes(op, j, n, norm, mesh)
        if isinstance(axes, str):
            raise ProgramError(f"{where}: cannot split {', '.join(sorted(norm))} over the mesh: "
                               f"{axes}")
        out_dims.append(axes)
    partial = tuple(a for a in mesh.names
                    if any(a in norm.get(d, ()) for d in op.reduction_dims))
    reducer = device_reducer(op) if partial else None
    return OpSharding(op.name, ordered, ins, Sharding(tuple(out_dims), partial, reducer))


def op_strategies(op: Op, program: Program, mesh: Mesh) -> tuple[OpSharding, ...]:
    """Every strategy of ``op``: each mesh axis on one splittable dim or none, the axes of one
    dim in mesh order, no empty shard, every merged output axis writable (see the module
    docstring). The replicated strategy comes first."""
    allowed = splittable(op, program)
    sizes = _sizes(mesh)
    shape = program.tensor(op.out.tensor).shape
    out = []
    for choice in itertools.product(*([None, *allowed] for _ in mesh.axes)):
        splits: dict[str, tuple[str, ...]] = {}
        for a, d in zip(mesh.names, choice, strict=True):
            if d is not None:
                splits[d] = splits.get(d, ()) + (a,)
        if any(min(shard_sizes(op.sizes[d], axes, sizes)) == 0 for d, axes in splits.items()):
            continue
        if op.merges_output and any(isinstance(out_axes(op, j, n, splits, mesh), str)
                                    for j, n in enumerate(shape)):
            continue
        out.append(make_strategy(op, program, mesh, splits))
    return tuple(out)


# --- what one device computes --------------------------------------------------------------

def local_ranges(op: Op, strategy: OpSharding, mesh: Mesh, coords: Mapping[str, int]
                 ) -> dict[str, tuple[int, int]]:
    """Dim -> the ``(start, stop)`` of the op's iteration space the device at ``coords``
    computes."""
    sizes = _sizes(mesh)
    split = strategy.split_map
    return {d: dim_block(n, split.get(d, ()), coords, sizes) for d, n in op.dims}


def local_op(op: Op, program: Program, mesh: Mesh, strategy: OpSharding,
             coords: Mapping[str, int], names: Sequence[str] | None = None,
             out_name: str | None = None) -> tuple[Op, dict[str, TensorType]]:
    """The op the device at ``coords`` runs, and the local types of its operands.

    Input ``k`` reads the local tensor ``names[k]`` (default: its own name), which holds that
    device's shard of ``strategy.ins[k]``; each access is shifted by where the device's part of
    the iteration space starts less where its shard of the tensor starts. The output is the
    device's shard of ``strategy.out``; a partial one is held in its partial dtype
    (``spec.partial_dtype``: a float16 sum's partials in float32), cast to the tensor's dtype
    by the collective that makes it whole."""
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
        # a partial output is held in its partial dtype (``Sharding.held_dtype``)
        types.setdefault(name, TensorType(name, shape, s.held_dtype(t.dtype)))
        return Access(name, tuple(index))

    ins = tuple(local(acc, s, acc.tensor if names is None else names[k])
                for k, (acc, s) in enumerate(zip(op.ins, strategy.ins, strict=True)))
    out = local(op.out, strategy.out, out_name or op.out.tensor)
    dims = tuple((d, hi - lo) for d, (lo, hi) in ranges.items())
    return Op(op.name, op.fn, out, ins, dims, op.attrs), types


@dataclass(frozen=True)
class DeviceFinish:
    """What a device does last for a mean or argmax whose reduction dims are split over
    devices, so that its part combines across devices (see the module docstring): ``scale``
    multiplies its local mean (``sources[0]``) by ``factor``, its share of the op's whole
    count; ``pack`` turns its local max (``sources[0]``) and local flat index (``sources[1]``,
    over the device's reduction sizes ``local``) into int64 keys of the value and the global
    flat index (the device's reduction ``starts`` added, over the op's reduction ``sizes``).
    Elementwise over the device's output; it writes ``result``, of ``dtype``."""

    op: str
    kind: str
    sources: tuple[str, ...]
    result: str
    dtype: str
    factor: float = 1.0
    local: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()

    def run(self, env: Mapping[str, np.ndarray]) -> np.ndarray:
        """The result from the device's local arrays ``env``."""
        if self.kind == SplitFinish.SCALE:
            x = np.asarray(env[self.sources[0]], dtype=np.float64)
            return kernels.to_storage(x * self.factor, self.dtype)
        values = np.asarray(env[self.sources[0]])
        flat = self.part().flat_index(np.asarray(env[self.sources[1]], dtype=np.int64))
        return argmax_keys(values, flat)

    def part(self) -> FinishPart:
        """This device's finish as the mesh schedule holds it (without the op's name)."""
        return FinishPart(self.kind, self.sources, self.result, self.dtype, self.factor,
                          self.local, self.starts, self.sizes)

    def __str__(self) -> str:
        what = (f"x {self.factor:.6g}" if self.kind == SplitFinish.SCALE else
                f"reduction {'x'.join(map(str, self.local))} at "
                f"{', '.join(map(str, self.starts))} of {'x'.join(map(str, self.sizes))}")
        return f"{self.result} = {self.kind}({', '.join(self.sources)}; {what})"


def local_ops(op: Op, program: Program, mesh: Mesh, strategy: OpSharding,
              coords: Mapping[str, int], names: Sequence[str] | None = None,
              out_name: str | None = None
              ) -> tuple[tuple[Op, ...], dict[str, TensorType], DeviceFinish | None]:
    """Everything the device at ``coords`` runs for ``op``: its ops and the local types of
    their operands, and the ``DeviceFinish`` after them (None: ``local_op`` alone writes the
    device's part). A mean split over devices computes its local mean into ``OUT~mean``, an
    argmax its local max and local index into ``OUT~value`` and ``OUT~index``; the finish
    writes the output."""
    lop, types = local_op(op, program, mesh, strategy, coords, names, out_name)
    kind = finish_kind(op, strategy)
    if kind is None:
        return (lop,), types, None
    out = lop.out.tensor
    shape = types[out].shape
    if kind is SplitFinish.SCALE:
        tmp = f"{out}~mean"
        types[tmp] = TensorType(tmp, shape, types[out].dtype)
        share = math.prod(lop.sizes[d] for d in op.reduction_dims) / \
            math.prod(op.sizes[d] for d in op.reduction_dims)
        return ((replace(lop, out=Access(tmp, lop.out.index)),), types,
                DeviceFinish(op.name, kind, (tmp,), out, types[out].dtype, factor=share))
    value, index = f"{out}~value", f"{out}~index"
    types[value] = TensorType(value, shape, program.tensor(op.ins[0].tensor).dtype)
    types[index] = TensorType(index, shape, types[out].dtype)
    vop = Op(f"{op.name}.value", "max", Access(value, lop.out.index), lop.ins, lop.dims)
    ranges = local_ranges(op, strategy, mesh, coords)
    red = op.reduction_dims
    return ((vop, replace(lop, out=Access(index, lop.out.index))), types,
            DeviceFinish(op.name, kind, (value, index), out, types[out].dtype,
                   local=tuple(lop.sizes[d] for d in red),
                   starts=tuple(ranges[d][0] for d in red),
                   sizes=tuple(op.sizes[d] for d in red)))
