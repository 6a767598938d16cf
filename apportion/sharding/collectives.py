"""Resharding: the collective steps that turn one sharding of a tensor into another, what each
costs, and each step run on per-device numpy arrays (the simulated collectives).

``steps(shape, dtype, src, dst, mesh)`` decomposes a resharding into steps along one mesh axis
each, in this order:

1. ``all_reduce`` of each partial axis that ends on no dim (while the data is smallest);
2. per dim, the axes ``src`` splits it by beyond what it shares with ``dst`` are gathered,
   innermost first: ``all_gather``, or ``all_to_all`` when the axis moves straight on to the dim
   ``dst`` splits by it next (PyTorch's ``Shard(i) -> Shard(j)``);
3. each remaining partial axis: ``reduce_scatter`` onto the dim ``dst`` splits by it next, else
   ``all_reduce``;
4. ``slice``: a dim ``dst`` splits further than the data is is cut locally (no communication).

A ``dst`` read through windows (``spec.Window``: what an op reads of a dim across shard
boundaries on peered axes) is reached through its shards, then per windowed dim a ``halo``:
each device reads the rows of its window beyond its shard, and only those, from the peers
holding them (a ``slice`` of the window where the dim was not cut yet). A dim split over
several peered axes has one ``halo`` across all of them (``Step.axes``): a device's window
rows come from whichever devices, along any of the axes, hold them. A
``peer_read`` is not made here: it is what ``plan.in_place_read`` makes of a single gather,
all-to-all or halo on a peered axis when the reader reads the source in place.

A partial ``argmax`` waits as int64 keys, each packing a (value, global flat index) pair so that
the larger key is the larger value, then the lower index (``argmax_keys``): its reductions are
reductions by max of 8-byte elements, priced as such, and the step that reduces its last
partial axis unpacks the index (``argmax_index``). Other partials move in their partial dtype
(``spec.partial_dtype``: a float16 or bfloat16 sum's in float32) and are priced in it.

A step's time is that of a ring collective over the axis's devices, ``n - 1`` messages (twice
for an all-reduce) plus the bytes each device receives over the axis's link bandwidth: an
all-gather receives the ``(n - 1) / n`` of the result it lacks, a reduce-scatter and an
all-to-all ``(n - 1) / n`` of what it holds, an all-reduce ``2 (n - 1) / n``. Along an axis with
peered memory the same bytes are read remotely with one latency (two for an all-reduce: a
reduce-scatter by reads, then an all-gather by reads). Sizes are those of the largest shard. A
``halo`` or ``peer_read`` receives the elements of its box the device does not hold
(``halo_elements``, the most of any device), with one latency (across several axes: over the
slowest of their links, ``read_link``).

>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.spec import Sharding
>>> m = parse("tp=4")
>>> [str(s) for s in steps((8, 8), "float32", Sharding(((), ("tp",))), Sharding((("tp",), ())),
...                        m)]
['all_to_all(tp) dim 1 -> dim 0']
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from apportion.errors import PlanningError
from apportion.ir.dtypes import dtype_bytes
from apportion.ir.kinds import REDUCERS, SplitFinish
from apportion.runtime import kernels
from apportion.schedule.mesh import argmax_index  # the schedule's key format, one for all
from apportion.sharding.mesh import Link, Mesh, combos
from apportion.sharding.spec import Sharding, chunk

KINDS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "slice", "halo",
         "peer_read")

#: value dtypes whose argmax pairs pack into one int64 key (their values fit 32 bits in order)
KEYED_DTYPES = frozenset({"float16", "bfloat16", "float32", "int8", "int32"})
@dataclass(frozen=True)
class Step:
    """One resharding step along mesh axis ``axis``.

    ``dim`` is the tensor dim gathered, scattered or cut (an all-to-all's source dim),
    ``to_dim`` an all-to-all's destination dim, ``reducer`` a reduction's combine. ``remote``:
    the axis has peered memory, the step is remote reads. ``bytes``: what one device receives;
    ``time_us``: the predicted time. ``across``: a read through windows of a dim split over
    several peered axes names them all, outer first (``axis`` is the first); empty otherwise.
    """

    kind: str
    axis: str
    src: Sharding
    dst: Sharding
    dim: int | None = None
    to_dim: int | None = None
    reducer: str | None = None
    remote: bool = False
    bytes: int = 0
    time_us: float = 0.0
    across: tuple[str, ...] = ()

    @property
    def axes(self) -> tuple[str, ...]:
        """Every mesh axis the step runs along: ``across``, else ``axis`` alone."""
        return self.across or (self.axis,)

    @property
    def communicates(self) -> bool:
        return self.kind != "slice"

    def __str__(self) -> str:
        axes = ",".join(self.axes)
        what = f"{self.reducer}, {axes}" if self.reducer else axes
        text = f"{self.kind}({what})"
        if self.kind == "all_to_all":
            text += f" dim {self.dim} -> dim {self.to_dim}"
        elif self.dim is not None:
            text += f" dim {self.dim}"
        return text + (" by remote reads" if self.remote and self.communicates else "")


def _prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _next_on(cur: Sharding, dst: Sharding, j: int) -> str | None:
    """The axis ``dst`` splits dim ``j`` by next, when ``cur``'s axes of dim ``j`` are a prefix
    of ``dst``'s."""
    have, want = cur.dims[j], dst.dims[j]
    if len(have) < len(want) and want[:len(have)] == have:
        return want[len(have)]
    return None


def _with(cur: Sharding, dims: list[tuple[str, ...]] | None = None,
          partial: tuple[str, ...] | None = None) -> Sharding:
    p = cur.partial if partial is None else partial
    return Sharding(tuple(dims) if dims is not None else cur.dims, p,
                    cur.reducer if p else None)


def steps(shape: Sequence[int], dtype: str, src: Sharding, dst: Sharding, mesh: Mesh
          ) -> tuple[Step, ...]:
    """The steps from ``src`` to ``dst`` (see the module docstring), each priced."""
    if src.windows:
        raise PlanningError(f"cannot reshard from {src}: a window is only ever read")
    if dst.windows:
        return _windowed(shape, dtype, src, dst, mesh)
    extra = [a for a in dst.partial if a not in src.partial]
    if extra:
        raise PlanningError(f"cannot reshard {src} to {dst}: a value cannot become partial "
                            f"over axis {extra[0]!r}")
    if dst.partial and src.reducer != dst.reducer:
        raise PlanningError(f"cannot reshard {src} to {dst}: the pending reductions differ")
    out: list[tuple[str, str, Sharding, Sharding, int | None, int | None]] = []
    cur = src

    def step(kind: str, axis: str, new: Sharding, dim: int | None = None,
             to_dim: int | None = None) -> None:
        nonlocal cur
        out.append((kind, axis, cur, new, dim, to_dim))
        cur = new

    reducer = src.reducer
    # 1. partial axes that end on no dim: reduce now, while the data is smallest
    for a in src.partial:
        if a not in dst.partial and dst.dim_of(a) is None:
            step("all_reduce", a, _with(cur, partial=tuple(p for p in cur.partial if p != a)))
    # 2. gathers (or all-to-alls straight onto the dim that takes the axis next)
    for i in range(len(shape)):
        keep = _prefix(cur.dims[i], dst.dims[i])
        for a in reversed(cur.dims[i][len(keep):]):
            dims = list(cur.dims)
            dims[i] = dims[i][:-1]
            j = dst.dim_of(a)
            if j is not None and j != i and _next_on(cur, dst, j) == a:
                dims[j] = dims[j] + (a,)
                step("all_to_all", a, _with(cur, dims), i, j)
            else:
                step("all_gather", a, _with(cur, dims), i)
    # 3. the other partial axes: reduce-scatter onto their dim, else all-reduce
    for a in cur.partial:
        if a in dst.partial:
            continue
        j = dst.dim_of(a)
        rest = tuple(p for p in cur.partial if p != a)
        if j is not None and _next_on(cur, dst, j) == a:
            dims = list(cur.dims)
            dims[j] = dims[j] + (a,)
            step("reduce_scatter", a, _with(cur, dims, rest), j)
        else:
            step("all_reduce", a, _with(cur, partial=rest))
    # 4. local cuts
    for j in range(len(shape)):
        while cur.dims[j] != dst.dims[j]:
            a = _next_on(cur, dst, j)
            if a is None:  # unreachable: step 2 left every dim a prefix of dst's
                raise PlanningError(f"cannot reshard {src} to {dst} at dim {j}")
            dims = list(cur.dims)
            dims[j] = dims[j] + (a,)
            step("slice", a, _with(cur, dims), j)
    if cur != dst:
        raise PlanningError(f"cannot reshard {src} to {dst}: reached {cur}")
    return tuple(_priced(kind, a, s, d, i, j, reducer, shape, dtype, mesh)
                 for kind, a, s, d, i, j in out)


def _windowed(shape: Sequence[int], dtype: str, src: Sharding, dst: Sharding, mesh: Mesh
              ) -> tuple[Step, ...]:
    """The steps to a sharding read through windows (a halo read, ``spec.Window``): to its
    shards first, then per windowed dim a ``halo`` (each device reads the rows of its window
    beyond its shard from the peers that hold them) or, where the data is not yet cut along
    the dim, a ``slice`` of the window out of what the device holds (no communication). A dim
    cut by the outer part of the window's axes is cut further locally first, then haloed."""
    cut = list(dst.dims)
    for j, w in enumerate(dst.windows):
        if w is not None and not (src.dims[j] and dst.dims[j][:len(src.dims[j])] == src.dims[j]):
            cut[j] = ()  # not cut along these axes yet: the window is sliced out locally
    pre = Sharding(tuple(cut), dst.partial, dst.reducer)
    out = list(steps(shape, dtype, src, pre, mesh)) if src != pre else []
    cur = pre
    for j, w in enumerate(dst.windows):
        if w is None:
            continue
        done = {k for k, v in enumerate(cur.windows) if v is not None} | {j}
        windows = tuple(v if k in done else None for k, v in enumerate(dst.windows))
        dims = tuple(dst.dims[k] if k in done else cur.dims[k] for k in range(len(shape)))
        new = Sharding(dims, cur.partial, cur.reducer, windows)
        kind = "halo" if cur.dims[j] == dst.dims[j] else "slice"
        out.append(_priced(kind, dst.dims[j][0], cur, new, j, None, None, shape, dtype, mesh,
                           dst.dims[j]))
        cur = new
    if cur != dst:  # unreachable: every windowed dim was read
        raise PlanningError(f"cannot reshard {src} to {dst}: reached {cur}")
    return tuple(out)


def halo_elements(shape: Sequence[int], src: Sharding, dst: Sharding, mesh: Mesh) -> int:
    """The most elements one device reads from its peers when its shard of ``src`` becomes
    its box of ``dst`` (what it holds less what it held, box by box)."""
    sizes = {a.name: a.size for a in mesh.axes}
    most = 0
    for d in range(mesh.devices):
        c = mesh.coords(d)
        want, have = dst.block(shape, c, sizes), src.block(shape, c, sizes)
        total = 1
        for lo, hi in want:
            total *= hi - lo
        kept = 1
        for (lo, hi), (p, q) in zip(want, have, strict=True):
            kept *= max(0, min(hi, q) - max(lo, p))
        most = max(most, total - kept)
    return most


def read_group(mesh: Mesh, device: int, axes: Sequence[str]) -> tuple[int, ...]:
    """The devices that differ from ``device`` only along ``axes`` (itself included), the
    outer axis first: whom a read across those axes reads from.

    >>> from apportion.sharding.mesh import parse
    >>> read_group(parse("a=2,b=2,c=2"), 0, ("a", "c")), read_group(parse("a=2"), 1, ("a",))
    ((0, 1, 4, 5), (0, 1))
    """
    c = mesh.coords(device)
    return tuple(mesh.device({**c, **k}) for k in combos(mesh, axes))


def read_link(mesh: Mesh, axes: Sequence[str]) -> Link:
    """The link a read across ``axes`` is priced over: the slowest of theirs (the most latency,
    the least bandwidth; a device's window may lie across any of them).

    >>> from apportion.sharding.mesh import parse
    >>> read_link(parse("a=2@chiplet:peered,b=2@device:peered"), ("a", "b")).level
    'device'
    """
    links = [mesh.link(a) for a in axes]
    worst = min(links, key=lambda lk: lk.bandwidth)
    return replace(worst, latency_us=max(lk.latency_us for lk in links))


def _priced(kind: str, axis: str, src: Sharding, dst: Sharding, dim: int | None,
            to_dim: int | None, reducer: str | None, shape: Sequence[int], dtype: str,
            mesh: Mesh, axes: tuple[str, ...] = ()) -> Step:
    sizes = {a.name: a.size for a in mesh.axes}
    # a partial value moves in its partial dtype (``Sharding.held_dtype``): a float16 sum's
    # partials are float32 on the wire, twice the bytes
    before = src.local_bytes(shape, src.held_dtype(dtype), sizes)
    after = dst.local_bytes(shape, dst.held_dtype(dtype), sizes)
    n = mesh.size(axis)
    link = read_link(mesh, axes) if len(axes) > 1 else mesh.link(axis)
    remote = all(mesh.axis(a).peered for a in axes or (axis,))
    messages = 1 if remote else n - 1
    if kind == "all_gather":
        received = after - before
    elif kind in ("reduce_scatter", "all_to_all"):
        received = before * (n - 1) // n
    elif kind == "all_reduce":
        received = 2 * before * (n - 1) // n
        messages *= 2
    elif kind in ("halo", "peer_read"):
        # the rows beyond the device's shard, read from the peers holding them at once
        received = halo_elements(shape, src, dst, mesh) * dtype_bytes(src.held_dtype(dtype))
        messages = 1
    else:
        received, messages = 0, 0
    time = messages * link.latency_us + received / link.bandwidth * 1e6
    red = reducer if kind in ("all_reduce", "reduce_scatter") else None
    return Step(kind, axis, src, dst, dim, to_dim, red, remote, int(received), time,
                axes if len(axes) > 1 else ())


@functools.lru_cache(maxsize=65536)
def cached_steps(shape: tuple[int, ...], dtype: str, src: Sharding, dst: Sharding,
                 mesh: Mesh) -> tuple[Step, ...]:
    return steps(shape, dtype, src, dst, mesh)


def reshard_time(shape: tuple[int, ...], dtype: str, src: Sharding, dst: Sharding,
                 mesh: Mesh) -> float:
    """Predicted time of resharding ``src`` to ``dst`` (0 when they are equal)."""
    if src == dst:
        return 0.0
    return sum(s.time_us for s in cached_steps(shape, dtype, src, dst, mesh))


# --- simulated collectives (numpy) -----------------------------------------------------------

def _cut(a: np.ndarray, dim: int, parts: int, index: int) -> np.ndarray:
    lo, hi = chunk(a.shape[dim], parts)[index]
    sl = [slice(None)] * a.ndim
    sl[dim] = slice(lo, hi)
    return a[tuple(sl)]  # a view: no copy


def keyed(reducer: str) -> bool:
    """Whether partials waiting on ``reducer`` are packed (value, index) keys (an argmax's,
    ``argmax_keys``): reduced by max, their index unpacked once the last partial axis is.

    >>> keyed("argmax"), keyed("sum")
    (True, False)
    """
    across = REDUCERS[reducer].across_devices
    return across is not None and across.finish is SplitFinish.PACK


def _reduce(step: Step, parts: list[np.ndarray], dtype: str) -> np.ndarray:
    assert step.reducer is not None
    if keyed(step.reducer):  # packed keys: the larger wins; unpacked once fully reduced
        keys = functools.reduce(np.maximum, parts)
        return keys if step.dst.partial else argmax_index(keys)
    r = REDUCERS[step.reducer]
    total = functools.reduce(lambda p, q: r.combine(kernels.XP, p, q), parts)
    return kernels.to_storage(np.asarray(total), dtype)


def _read_boxes(step: Step, arrays: Sequence[np.ndarray], mesh: Mesh, shape: Sequence[int]
                ) -> list[np.ndarray]:
    """A ``halo`` or ``peer_read`` (or the ``slice`` of a window): each device's box of
    ``step.dst`` filled element by element from the devices of its group whose box of
    ``step.src`` holds it (its own first): only the rows it lacks cross the link."""
    sizes = {a.name: a.size for a in mesh.axes}
    boxes = [step.src.block(shape, mesh.coords(d), sizes) for d in range(mesh.devices)]
    out = []
    for d in range(mesh.devices):
        want = step.dst.block(shape, mesh.coords(d), sizes)
        res = np.empty(tuple(hi - lo for lo, hi in want), dtype=np.asarray(arrays[d]).dtype)
        seen = np.zeros(res.shape, dtype=bool)
        group = read_group(mesh, d, step.axes) if step.kind != "slice" else (d,)
        for p in sorted(group, key=lambda q: q != d):
            part = tuple((max(lo, a), min(hi, b)) for (lo, hi), (a, b)
                         in zip(want, boxes[p], strict=True))
            if any(lo >= hi for lo, hi in part):
                continue
            at = tuple(slice(lo - w, hi - w) for (lo, hi), (w, _) in zip(part, want, strict=True))
            res[at] = arrays[p][tuple(slice(lo - b, hi - b) for (lo, hi), (b, _)
                                      in zip(part, boxes[p], strict=True))]
            seen[at] = True
        if not seen.all():
            raise PlanningError(f"{step}: device {d} reads {want}, which its group does not "
                                "hold")
        out.append(res)
    return out


def apply(step: Step, arrays: Sequence[np.ndarray], mesh: Mesh, dtype: str,
          shape: Sequence[int] | None = None) -> list[np.ndarray]:
    """``step`` run on every device's local array (``arrays[d]`` for device ``d``), as the
    devices would run it; returns each device's result. ``dtype``: what the result holds
    (``step.dst.held_dtype``): a reduction combines the partials as they are held and casts
    the total to it. ``shape``: the tensor's, which a read through windows (``halo``,
    ``peer_read``, a window's ``slice``) cuts its boxes by."""
    if step.kind in ("halo", "peer_read") or step.dst.windows:
        if shape is None:
            raise PlanningError(f"{step}: a read through windows needs the tensor's shape")
        return _read_boxes(step, arrays, mesh, shape)
    n = mesh.size(step.axis)
    out: list[np.ndarray] = []
    done: dict[tuple[int, ...], np.ndarray] = {}
    for d in range(mesh.devices):
        group = mesh.group(d, step.axis)
        me = mesh.coords(d)[step.axis]
        if step.kind == "slice":
            assert step.dim is not None
            out.append(_cut(arrays[d], step.dim, n, me))
            continue
        if group not in done:
            parts = [arrays[g] for g in group]
            if step.kind in ("all_gather", "all_to_all"):
                done[group] = np.concatenate(parts, axis=step.dim)
            else:
                done[group] = _reduce(step, parts, dtype)
        whole = done[group]
        if step.kind == "all_to_all":
            assert step.to_dim is not None
            out.append(_cut(whole, step.to_dim, n, me))
        elif step.kind == "reduce_scatter":
            assert step.dim is not None
            out.append(_cut(whole, step.dim, n, me))
        else:
            out.append(whole)
    return out
