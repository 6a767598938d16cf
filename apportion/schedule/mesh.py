"""The device level of the lowered form: a ``MeshSchedule``, what every device of a mesh runs.

A sharded program runs as the same *stages* on every device, in the same order (SPMD):

- ``Compute``: one ``DeviceLaunch`` per device, the device's segment (its shards of the ops
  between two communications) planned over the device's cores and lowered to its core
  ``Schedule`` (``schedule.lower``): the device's launches over its cores, so a launch's
  workers are the mesh's device axes (``MeshSchedule.axes``) with the cores innermost
  (``MeshSchedule.worker_axes``);
- ``Collective``: data moving between groups of devices along one mesh axis: ``all_gather``,
  ``all_reduce`` (with its reducer), ``reduce_scatter``, ``all_to_all``, a ``slice`` (each
  device keeps a part of what it holds, no communication), or, along an axis whose devices
  read one another's memory, a ``halo`` (a device reads the rows of the window an op reads
  beyond its shard, and only those, from the peers holding them) or a ``peer_read`` (an op
  reads another sharding of a tensor from its peers' memory in place of a resharded copy;
  only the elements the device lacks cross the link); a read of a dim split over several
  peered axes runs across all of them at once. Every device's region of the
  tensor before (``src_boxes``) and after (``dst_boxes``) is listed as the plan cuts it, so a
  backend moves data by those boxes and never recomputes how a dim is cut;
- ``MeshFinish``: elementwise on each device, what a mean or argmax split over devices does
  before its partials combine (``scale`` the local mean by the device's share of the count;
  ``pack`` the local max and index into argmax keys, ``argmax_keys``).

A box is ``((start, stop), ...)`` per tensor dim, in the program's (global) coordinates. The
program's inputs and outputs are placed per device (``Device.inputs``/``outputs``: the tensor,
its local name and box). ``apportion.sharding.lower`` builds a ``MeshSchedule`` from a
sharding plan; backends consume it without knowing the sharding package.

The data movement on the host is here, backend-neutral, so every mesh runner moves data the
same way: ``shard_inputs`` cuts host arrays into the devices' shards, ``Collective.move`` and
``FinishPart.apply`` perform a step on the devices' local arrays, ``unshard_outputs`` puts the
outputs back together, and ``MeshSteps`` runs the stages in order, handing each device's
launch to the backend that drives it, which runs it with its own compute.

>>> c = Collective("all_gather", "x", "x", "x@1", "float32", "tp", ((0, 1),),
...                ((((0, 2), (0, 4))), (((2, 4), (0, 4)))), (((0, 4), (0, 4)),) * 2, dim=0)
>>> str(c), c.rank(1), c.group(1)
('x@1 = all_gather(tp) dim 0(x)', 1, (0, 1))
>>> parts = c.move([np.zeros((2, 4)), np.ones((2, 4))])
>>> parts[0].sum(axis=1).tolist()
[0.0, 0.0, 4.0, 4.0]
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apportion.errors import ExecutionError
from apportion.ir.kinds import REDUCERS
from apportion.ir.program import Program
from apportion.plans.tiles import Region
from apportion.runtime import kernels
from apportion.runtime.reference import bind_inputs
from apportion.schedule.values import Launch, Schedule, WorkerAxis
from apportion.target.target import Target

KINDS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "slice", "halo",
         "peer_read")
#: the kinds where each device reads exactly its result box from its group's devices (a
#: ``halo``: the rows of a window beyond its shard; a ``peer_read``: what an op reads of a
#: peer's memory in place of a resharded copy), only the elements it lacks crossing a link
READS = ("halo", "peer_read")
#: the kinds that combine the group's arrays with a reducer
REDUCING = ("all_reduce", "reduce_scatter")
FINISHES = ("scale", "pack")

#: the largest flat reduction index an argmax key holds (its low 32 bits)
MAX_KEYED_INDEX = (1 << 32) - 1
_LOW = np.int64(MAX_KEYED_INDEX)


def argmax_keys(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """(value, flat index) pairs as int64 keys, the format a partial argmax travels in between
    devices: the high 32 bits order the values (floats by their float32 bits made monotonic,
    NaN above everything and every NaN alike, -0 as +0; ints as they are), the low 32 bits
    hold ``MAX_KEYED_INDEX - index``. The largest key is the largest value and, among equal
    values, the lowest index (numpy's first maximum), so keys reduce by max.

    >>> k = argmax_keys(np.array([1.0, 3.0, 3.0, np.nan], np.float32), np.array([0, 5, 2, 9]))
    >>> [argmax_index(k[i:i + 1]).item() for i in range(4)], int(np.argmax(k[:3]))
    ([0, 5, 2, 9], 2)
    """
    values = np.asarray(values)
    if values.dtype.kind == "f":
        v = values.astype(np.float32)
        v = np.where(np.isnan(v), np.float32(np.nan), v + np.float32(0.0))  # one NaN; -0 -> +0
        bits = v.view(np.int32).astype(np.int64)
        high = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    else:
        high = values.astype(np.int64)
    return (high << 32) | (_LOW - np.asarray(index, dtype=np.int64))


def argmax_index(keys: np.ndarray) -> np.ndarray:
    """The flat indices packed in ``argmax_keys``' keys.

    >>> argmax_index(argmax_keys(np.array([2.0]), np.array([7]))).tolist()
    [7]
    """
    return _LOW - (np.asarray(keys, dtype=np.int64) & _LOW)


def box_shape(box: Region) -> tuple[int, ...]:
    """The shape of a box.

    >>> box_shape(((2, 5), (0, 4)))
    (3, 4)
    """
    return tuple(hi - lo for lo, hi in box)


def intersect(a: Region, b: Region) -> Region | None:
    """The part two boxes share (None: nothing).

    >>> intersect(((0, 4), (0, 8)), ((2, 6), (4, 8))), intersect(((0, 2),), ((2, 4),))
    (((2, 4), (4, 8)), None)
    """
    out = tuple((max(p, q), min(r, s)) for (p, r), (q, s) in zip(a, b, strict=True))
    return None if any(lo >= hi for lo, hi in out) else out


def within(inner: Region, outer: Region) -> Region:
    """``inner`` in the coordinates of ``outer``'s array (``inner`` must lie in it).

    >>> within(((2, 4), (4, 8)), ((2, 6), (0, 8)))
    ((0, 2), (4, 8))
    """
    return tuple((lo - o, hi - o) for (lo, hi), (o, _) in zip(inner, outer, strict=True))


def _sl(box: Region) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in box)


def _box_text(box: Region) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"


@dataclass(frozen=True)
class DeviceLaunch:
    """One device's compute segment, lowered: ``schedule`` is the segment (its shards of a
    run of ops, ``schedule.program``) planned over the device's cores and lowered
    (``schedule.lower``), every launch in it over the device's core worker axes. ``name`` is
    the device's own name for it; devices whose segments are equal share one ``schedule``
    (its program named after the first of them), so a backend compiles or plans it once.
    A compiled backend renders the schedule it binds (``Schedule.covering``: the segment's
    symbolic loop counts kept as arguments)."""

    name: str
    schedule: Schedule


@dataclass(frozen=True)
class Compute:
    """A compute stage: every device's launch, in device order."""

    launches: tuple[DeviceLaunch, ...]

    def __str__(self) -> str:
        return "compute: " + ", ".join(launch.name for launch in self.launches)


@dataclass(frozen=True)
class Collective:
    """Data moving along mesh axis ``axis``: each device's array ``source`` (its box
    ``src_boxes[d]`` of tensor ``tensor``) becomes its array ``result`` (box ``dst_boxes[d]``).

    ``groups`` are the devices that communicate, one tuple per group in rank order (the
    devices along ``axis`` with the other coordinates fixed). A read (``READS``) of a dim
    split over several peered axes runs across all of them: ``axis`` names them comma-joined
    (``"a,b"``, ``axes`` splits them) and a group is the devices differing along any of
    them, the outer axis first. ``dim`` is the tensor dim
    gathered, scattered or cut (an all-to-all's source dim), ``to_dim`` an all-to-all's
    destination dim. ``reducer`` combines an all-reduce's or reduce-scatter's arrays (a name
    of ``ir.kinds.REDUCERS``; ``argmax`` reduces keys by max); ``unpack``: the reduction ends
    the argmax's last pending axis, so the result is the index in the keys (``argmax_index``).
    ``dtype`` is the element dtype of the arrays it moves: a partial value's is its partial
    dtype (a float16 sum's partials travel in float32, the accumulator dtype, so they round
    once); ``result_dtype``, where it differs, is the dtype a reduction casts its total to (the
    tensor's own, once the value is whole; None: ``dtype``)."""

    kind: str
    tensor: str
    source: str
    result: str
    dtype: str
    axis: str
    groups: tuple[tuple[int, ...], ...]
    src_boxes: tuple[Region, ...]
    dst_boxes: tuple[Region, ...]
    dim: int | None = None
    to_dim: int | None = None
    reducer: str | None = None
    unpack: bool = False
    result_dtype: str | None = None

    def __post_init__(self) -> None:
        what = f"collective on tensor {self.tensor!r} along axis {self.axis!r}"
        if self.result_dtype not in (None, self.dtype) and self.kind not in REDUCING:
            raise ExecutionError(f"{what}: a {self.kind} moves its {self.dtype} elements as "
                                 f"they are; only a reduction casts (to {self.result_dtype})")
        if self.kind not in KINDS:
            raise ExecutionError(f"{what}: kind {self.kind!r}; valid: {', '.join(KINDS)}")
        if "," in self.axis and self.kind not in (*READS, "slice"):
            raise ExecutionError(f"{what}: {self.kind} runs along one mesh axis; only a "
                                 "read (or the slice of its window) runs across several")
        if (self.reducer is not None) != (self.kind in REDUCING):
            raise ExecutionError(f"{what}: a {self.kind} "
                                 f"{'needs' if self.kind in REDUCING else 'takes no'} reducer")
        if self.unpack and self.reducer != "argmax":
            raise ExecutionError(f"{what}: only an argmax's keys unpack")
        devices = sorted(d for g in self.groups for d in g)
        if devices != list(range(len(self.src_boxes))) or \
                len(self.dst_boxes) != len(self.src_boxes):
            raise ExecutionError(f"{what}: groups {self.groups} do not cover the "
                                 f"{len(self.src_boxes)} devices once each, or "
                                 f"{len(self.dst_boxes)} result boxes")

    @property
    def axes(self) -> tuple[str, ...]:
        """The mesh axes the step runs along (several only for a read across them).

        >>> Collective("halo", "x", "x", "x@1", "float32", "a,b", ((0, 1, 2, 3),),
        ...            (((0, 1),), ((1, 2),), ((2, 3),), ((3, 4),)),
        ...            (((0, 2),), ((0, 3),), ((1, 4),), ((2, 4),)), dim=0).axes
        ('a', 'b')
        """
        return tuple(self.axis.split(","))

    def group(self, device: int) -> tuple[int, ...]:
        """The devices ``device`` communicates with (itself included), in rank order."""
        for g in self.groups:
            if device in g:
                return g
        raise ExecutionError(f"device {device} is in no group of {self}")

    def rank(self, device: int) -> int:
        """``device``'s place in its group."""
        return self.group(device).index(device)

    def color(self, device: int) -> int:
        """The index of ``device``'s group (what splits a channel into the groups)."""
        return self.groups.index(self.group(device))

    def lacked(self, p: int, q: int) -> Region | None:
        """What device ``q`` reads of device ``p`` in a read (``READS``): the part of its
        result box that ``p`` holds, unless ``q`` holds it itself (along one mesh axis the
        devices' boxes are one and the same or apart), so only elements ``q`` lacks move.

        >>> c = Collective("halo", "x", "x", "x@1", "float32", "tp", ((0, 1),),
        ...                (((0, 4),), ((4, 8),)), (((0, 5),), ((3, 8),)), dim=0)
        >>> c.lacked(1, 0), c.lacked(0, 1), c.lacked(0, 0)
        (((4, 5),), ((3, 4),), None)
        """
        part = intersect(self.src_boxes[p], self.dst_boxes[q])
        if part is None or intersect(part, self.src_boxes[q]) == part:
            return None
        return part

    def move(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """This step on every device's array (``arrays[d]``, device ``d``'s box
        ``src_boxes[d]``, a storage array); each device's result, its box ``dst_boxes[d]``.
        Gathers and all-to-alls copy each element from the group's device whose box holds
        it; reductions combine the group's arrays in rank order with the reducer and cast
        to the storage of ``out_dtype``; an argmax's keys reduce by max (``unpack``: to the
        index they hold).

        >>> c = Collective("all_reduce", "x", "x", "x@1", "float32", "tp", ((0, 1),),
        ...                (((0, 2),),) * 2, (((0, 2),),) * 2, reducer="sum")
        >>> [a.tolist() for a in c.move([np.array([1.0, 2.0]), np.array([3.0, 4.0])])]
        [[4.0, 6.0], [4.0, 6.0]]
        """
        if len(arrays) != len(self.src_boxes):
            raise ExecutionError(f"{self}: {len(arrays)} devices' arrays, the step has "
                                 f"{len(self.src_boxes)} devices")
        out: list[np.ndarray] = []
        reduced: dict[tuple[int, ...], np.ndarray] = {}
        for d, (src, dst) in enumerate(zip(self.src_boxes, self.dst_boxes, strict=True)):
            if np.shape(arrays[d]) != box_shape(src):
                raise ExecutionError(f"device {d}: {self.source!r} has shape "
                                     f"{np.shape(arrays[d])}, its box {src} of tensor "
                                     f"{self.tensor!r} needs {box_shape(src)}")
            group = self.group(d)
            if self.kind == "slice":
                if intersect(dst, src) != dst:
                    raise ExecutionError(f"device {d}: slice of tensor {self.tensor!r} keeps "
                                         f"{dst}, outside what it holds, {src}")
                out.append(arrays[d][_sl(within(dst, src))])
            elif self.kind in ("all_gather", "all_to_all", *READS):
                out.append(self._gather(d, group, arrays))
            else:
                if group not in reduced:
                    if any(self.src_boxes[p] != src for p in group):
                        raise ExecutionError(f"{self.kind} of tensor {self.tensor!r} along axis "
                                             f"{self.axis!r}: the partial arrays of group "
                                             f"{group} cover different boxes")
                    reduced[group] = self._reduce([np.asarray(arrays[p]) for p in group])
                out.append(reduced[group][_sl(within(dst, src))])
        return out

    def _gather(self, d: int, group: tuple[int, ...], arrays: Sequence[np.ndarray]
                ) -> np.ndarray:
        dst = self.dst_boxes[d]
        res = np.empty(box_shape(dst), dtype=np.asarray(arrays[d]).dtype)
        seen = np.zeros(box_shape(dst), dtype=bool)
        for p in group:
            part = intersect(self.src_boxes[p], dst)
            if part is not None:
                res[_sl(within(part, dst))] = arrays[p][_sl(within(part, self.src_boxes[p]))]
                seen[_sl(within(part, dst))] = True
        if not seen.all():
            raise ExecutionError(f"device {d}: {self.kind} of tensor {self.tensor!r} along axis "
                                 f"{self.axis!r}: no device of group {group} holds part of its "
                                 f"box {dst}")
        return res

    def _reduce(self, parts: list[np.ndarray]) -> np.ndarray:
        assert self.reducer is not None
        if self.reducer == "argmax":  # keys: the larger wins
            keys = functools.reduce(np.maximum, parts)
            return argmax_index(keys) if self.unpack else keys
        r = REDUCERS[self.reducer]
        total = functools.reduce(lambda p, q: r.combine(kernels.XP, p, q), parts)
        return kernels.to_storage(np.asarray(total), self.out_dtype)

    @property
    def out_dtype(self) -> str:
        """The element dtype of the result: ``result_dtype``, else ``dtype``.

        >>> Collective("all_reduce", "x", "x", "x@1", "float32", "tp", ((0, 1),),
        ...            (((0, 2),),) * 2, (((0, 2),),) * 2, reducer="sum",
        ...            result_dtype="float16").out_dtype
        'float16'
        """
        return self.result_dtype or self.dtype

    def __str__(self) -> str:
        what = f"{self.reducer}, {self.axis}" if self.reducer else self.axis
        text = f"{self.result} = {self.kind}({what})"
        if self.kind == "all_to_all":
            text += f" dim {self.dim} -> dim {self.to_dim}"
        elif self.dim is not None:
            text += f" dim {self.dim}"
        return text + f"({self.source})" + (" unpacked" if self.unpack else "")


@dataclass(frozen=True)
class FinishPart:
    """One device's finish (see ``MeshFinish``): ``scale`` multiplies ``sources[0]`` by
    ``factor``; ``pack`` turns the local max ``sources[0]`` and local flat index
    ``sources[1]`` (over the device's reduction sizes ``local``) into argmax keys of the value
    and the global flat index (the device's reduction ``starts`` added, over the whole
    reduction ``sizes``). Elementwise; it writes ``result`` of ``dtype``."""

    kind: str
    sources: tuple[str, ...]
    result: str
    dtype: str
    factor: float = 1.0
    local: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in FINISHES:
            raise ExecutionError(f"finish writing {self.result!r}: kind {self.kind!r}; valid: "
                                 f"{', '.join(FINISHES)}")

    def apply(self, env: Mapping[str, np.ndarray]) -> np.ndarray:
        """This device's finish on its local arrays ``env`` (storage arrays by local name):
        the array ``result`` holds.

        >>> FinishPart("scale", ("m",), "s", "float32", factor=0.5).apply(
        ...     {"m": np.array([2.0, 4.0], np.float32)}).tolist()
        [1.0, 2.0]
        """
        if self.kind == "scale":
            x = np.asarray(env[self.sources[0]], dtype=np.float64)
            return kernels.to_storage(x * self.factor, self.dtype)
        return argmax_keys(np.asarray(env[self.sources[0]]),
                           self.flat_index(np.asarray(env[self.sources[1]])))

    def flat_index(self, index: np.ndarray) -> np.ndarray:
        """A local flat index of the device's reduction box as the whole reduction's.

        >>> FinishPart("pack", ("v", "i"), "k", "int64", local=(2, 3), starts=(0, 3),
        ...            sizes=(2, 6)).flat_index(np.array([4])).tolist()
        [10]
        """
        coords = np.unravel_index(np.asarray(index, dtype=np.int64), self.local)
        return np.asarray(np.ravel_multi_index(
            tuple(c + s for c, s in zip(coords, self.starts, strict=True)), self.sizes),
            dtype=np.int64)


@dataclass(frozen=True)
class MeshFinish:
    """The finish of op ``op``'s part on every device, in device order (the factor of a
    ``scale`` and the reduction box of a ``pack`` differ from device to device)."""

    op: str
    parts: tuple[FinishPart, ...]

    def __str__(self) -> str:
        p = self.parts[0]
        return f"{p.result} = {p.kind}({', '.join(p.sources)}) of op {self.op}"


MeshStage = Compute | Collective | MeshFinish


@dataclass(frozen=True)
class Placement:
    """Where one device holds a program input or output: ``tensor``'s box ``box``, under the
    local name ``local``."""

    tensor: str
    local: str
    box: Region

    def __str__(self) -> str:
        return f"{self.local} = {self.tensor}{_box_text(self.box)}"


@dataclass(frozen=True)
class Layout:
    """How the mesh holds one value of a program tensor, as the shard dialect's sharding says
    it: ``tensor`` (the program's tensor) under the local name ``local`` every device gives
    it; ``split[i]`` the mesh axes that cut tensor dim ``i``, outermost cut first;
    ``partial`` the axes over which each device holds a partial value still to be combined
    by ``reducer`` (a name of ``ir.kinds.REDUCERS``: a mean waits as ``sum``, an argmax's
    keys as ``argmax``); an axis named nowhere replicates the value. ``boxes`` is each
    device's box of the tensor, in device order, as the plan cuts it (uneven cuts included),
    so a runner whose own cut differs (DTensor's ``torch.chunk``) can tell. ``dtype`` is the
    element dtype the devices hold it in where it is not the tensor's (a partial float16 sum's
    float32, see ``Collective``; None: the tensor's).

    >>> lay = Layout("h", "h", (("dp",), ("tp",)), boxes=((((0, 2), (0, 4))),) * 4)
    >>> str(lay), lay.axis_placement("tp"), lay.axis_placement("pp")
    ('h = h[dp, tp]', ('shard', 1), ('replicate', None))
    """

    tensor: str
    local: str
    split: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()
    reducer: str | None = None
    boxes: tuple[Region, ...] = ()
    dtype: str | None = None

    def __post_init__(self) -> None:
        if bool(self.partial) != (self.reducer is not None):
            raise ExecutionError(f"layout of {self.local!r} (tensor {self.tensor!r}): a partial "
                                 "value needs its reducer, and only a partial one")
        if self.reducer is not None and self.reducer not in REDUCERS:
            raise ExecutionError(f"layout of {self.local!r} (tensor {self.tensor!r}): reducer "
                                 f"{self.reducer!r} is not a reducer kind")

    def axis_placement(self, axis: str) -> tuple[str, int | str | None]:
        """What mesh axis ``axis`` does to the value: ``("shard", dim)``, ``("partial",
        reducer)`` or ``("replicate", None)``."""
        for i, axes in enumerate(self.split):
            if axis in axes:
                return ("shard", i)
        if axis in self.partial:
            return ("partial", self.reducer)
        return ("replicate", None)

    def __str__(self) -> str:
        dims = ", ".join("*".join(axes) or "-" for axes in self.split)
        part = f" partial {self.reducer}({', '.join(self.partial)})" if self.partial else ""
        return f"{self.local} = {self.tensor}[{dims}]{part}"


@dataclass(frozen=True)
class Device:
    """One device of the mesh: its coordinates and where its shards of the program's inputs
    and outputs are (in the program's input and output order)."""

    index: int
    coords: tuple[tuple[str, int], ...]
    inputs: tuple[Placement, ...]
    outputs: tuple[Placement, ...]

    def __str__(self) -> str:
        return f"device {self.index} ({', '.join(f'{a}={c}' for a, c in self.coords)})"


@dataclass(frozen=True)
class MeshSchedule:
    """A program sharded over a mesh, lowered: ``program`` is the unsharded program (its
    signature; the reference a run is checked against), ``mesh`` the mesh as text and
    ``target`` each device's target; ``devices`` in device order and ``stages`` every device
    runs, in order (see the module docstring). ``layouts`` says how the mesh holds every
    value that is a program tensor laid out over it (``Layout``: the inputs as placed, each
    op's result, each collective's source and result), by local name; values a device keeps
    to itself (a split mean's or argmax's local parts) have none."""

    program: Program
    mesh: str
    target: Target
    devices: tuple[Device, ...]
    stages: tuple[MeshStage, ...]
    layouts: tuple[Layout, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.devices)
        for s in self.stages:
            count = len(s.launches) if isinstance(s, Compute) else \
                len(s.parts) if isinstance(s, MeshFinish) else len(s.src_boxes)
            if count != n:
                raise ExecutionError(f"mesh schedule of {self.program.name!r}: stage {s} has "
                                     f"{count} devices' parts, the mesh {n} devices")
        for lay in self.layouts:
            if len(lay.boxes) != n:
                raise ExecutionError(f"mesh schedule of {self.program.name!r}: layout {lay} "
                                     f"has {len(lay.boxes)} devices' boxes, the mesh {n} "
                                     "devices")

    def layout(self, local: str) -> Layout | None:
        """How the mesh holds the value every device calls ``local`` (None: no layout, a
        device's own part)."""
        return self._layouts.get(local)

    @functools.cached_property
    def _layouts(self) -> dict[str, Layout]:
        return {lay.local: lay for lay in self.layouts}

    def launches(self, device: int) -> tuple[DeviceLaunch, ...]:
        """Device ``device``'s segments in order, each lowered over its cores."""
        return tuple(s.launches[device] for s in self.stages if isinstance(s, Compute))

    @property
    def axes(self) -> tuple[WorkerAxis, ...]:
        """The mesh's axes as the outer worker axes of every launch (level ``device``; an
        axis's name is the mesh axis's), in the mesh's order.

        >>> MeshSchedule(Program("p", (), (), (), ()), "tp=2", None,
        ...              (Device(0, (("tp", 0),), (), ()), Device(1, (("tp", 1),), (), ())),
        ...              ()).axes
        (WorkerAxis(name='tp', size=2, level='device'),)
        """
        if not self.devices:
            return ()
        names = [a for a, _ in self.devices[0].coords]
        return tuple(WorkerAxis(a, 1 + max(dict(dev.coords)[a] for dev in self.devices),
                                "device") for a in names)

    def worker_axes(self, launch: Launch) -> tuple[WorkerAxis, ...]:
        """Every worker axis of ``launch`` (a launch of a device's schedule): the mesh's
        device axes, then the launch's core axes, innermost."""
        return (*self.axes, *launch.axes)

    def distinct_launches(self) -> tuple[DeviceLaunch, ...]:
        """One launch per distinct segment schedule (devices with equal shards share one),
        in the order the stages first run them: what a backend compiles or lowers."""
        seen: dict[int, DeviceLaunch] = {}
        for s in self.stages:
            if isinstance(s, Compute):
                for launch in s.launches:
                    seen.setdefault(id(launch.schedule), launch)
        return tuple(seen.values())

    def distinct(self) -> int:
        """How many distinct segment schedules the devices run (``distinct_launches``)."""
        return len(self.distinct_launches())

    def __str__(self) -> str:
        """The stages in order, each device's part of each: a compute stage's schedule over
        the device's cores nested under the device (once per distinct schedule), a
        collective's or finish's boxes per device."""
        grid = " x ".join(map(str, self.axes)) or "1"
        lines = [f"mesh schedule {self.program.name} over {self.mesh} "
                 f"({getattr(self.target, 'name', self.target)}): {len(self.devices)} devices "
                 f"on device axes {grid}, each device's launches over its cores innermost",
                 "devices:"]
        for dev in self.devices:
            lines.append(f"  {dev}: in {', '.join(map(str, dev.inputs)) or '-'}; out "
                         f"{', '.join(map(str, dev.outputs)) or '-'}")
        lines.append("stages:")
        for k, stage in enumerate(self.stages):
            lines.append(f"  stage {k}: {stage}")
            if isinstance(stage, Compute):
                seen: dict[int, int] = {}
                for d, launch in enumerate(stage.launches):
                    first = seen.setdefault(id(launch.schedule), d)
                    if first != d:
                        lines.append(f"    device {d}: {launch.name}, the schedule of device "
                                     f"{first}")
                        continue
                    lines.append(f"    device {d}: {launch.name}")
                    lines += ["      " + line for line in str(launch.schedule).splitlines()]
            elif isinstance(stage, MeshFinish):
                for d, part in enumerate(stage.parts):
                    what = (f"x {part.factor:.6g}" if part.kind == "scale" else
                            f"reduction {'x'.join(map(str, part.local))} at "
                            f"{', '.join(map(str, part.starts))} of "
                            f"{'x'.join(map(str, part.sizes))}")
                    lines.append(f"    device {d}: {what}")
            else:
                for d, (src, dst) in enumerate(zip(stage.src_boxes, stage.dst_boxes,
                                                   strict=True)):
                    group = stage.group(d)
                    peers = "" if stage.kind == "slice" else \
                        f" (rank {group.index(d)} of devices {list(group)})"
                    if stage.kind in READS:  # what crosses: the rows it lacks, by peer
                        got = [f"{_box_text(b)} of device {p}" for p in group if p != d
                               for b in [stage.lacked(p, d)] if b is not None]
                        peers += f" reads {', '.join(got) or 'nothing'}"
                    lines.append(f"    device {d}: {stage.tensor}{_box_text(src)} -> "
                                 f"{_box_text(dst)}{peers}")
        return "\n".join(lines)

    @property
    def collectives(self) -> tuple[Collective, ...]:
        return tuple(s for s in self.stages if isinstance(s, Collective))

    def summary(self) -> str:
        """One line: devices, stages and what kinds of collective.

        >>> MeshSchedule(Program("p", (), (), (), ()), "tp=2", None, (), ()).summary()
        'p over tp=2: 0 devices, 0 stages (0 compute, 0 collectives)'
        """
        comp = sum(isinstance(s, Compute) for s in self.stages)
        kinds: dict[str, int] = {}
        for c in self.collectives:
            kinds[c.kind] = kinds.get(c.kind, 0) + 1
        fins = sum(isinstance(s, MeshFinish) for s in self.stages)
        what = ", ".join(f"{n} {k}" for k, n in kinds.items())
        return (f"{self.program.name} over {self.mesh}: {len(self.devices)} devices, "
                f"{len(self.stages)} stages ({comp} compute, {len(self.collectives)} collectives"
                + (f": {what}" if what else "") + (f", {fins} finishes" if fins else "") + ")")


def group_order(groups: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Groups as tuples, in order of their first device.

    >>> group_order([[1, 3], [0, 2]])
    ((0, 2), (1, 3))
    """
    return tuple(sorted((tuple(g) for g in groups), key=lambda g: min(g)))


def shard_inputs(schedule: MeshSchedule, inputs: Mapping[str, np.ndarray]
                 ) -> list[dict[str, np.ndarray]]:
    """Each device's shards of the host inputs (checked and cast to their storage arrays:
    ``runtime.reference.bind_inputs``), by local name: views of the storage arrays, no copy
    per device."""
    host = bind_inputs(schedule.program, inputs)
    return [{p.local: host[p.tensor][_sl(p.box)] for p in dev.inputs}
            for dev in schedule.devices]


def unshard_outputs(schedule: MeshSchedule, envs: Sequence[Mapping[str, np.ndarray]]
                    ) -> dict[str, np.ndarray]:
    """Each program output put together from the devices' shards (``envs[d]``: device ``d``'s
    local arrays); replicas must agree, and every element must be held by some device."""
    return assemble_outputs(schedule.program,
                            [[(p.local, p.box) for p in dev.outputs] for dev in schedule.devices],
                            [dev.index for dev in schedule.devices], envs)


def assemble_outputs(program: Program, places: Sequence[Sequence[tuple[str, Region]]],
                     devices: Sequence[int], envs: Sequence[Mapping[str, np.ndarray]]
                     ) -> dict[str, np.ndarray]:
    """Each output of ``program`` put together from every device's shard: ``places[d][k]`` is
    the local name and the box of output ``k`` on device ``d`` (numbered ``devices[d]`` in
    errors), ``envs[d]`` its local arrays. Replicas must agree (NaN alike), and every element
    must be held by some device."""
    out: dict[str, np.ndarray] = {}
    for k, name in enumerate(program.outputs):
        t = program.tensor(name)
        whole = np.empty(t.shape, dtype=kernels.storage_dtype(t.dtype))
        written = np.zeros(t.shape, dtype=bool)
        for device, place, env in zip(devices, places, envs, strict=True):
            local, box = place[k]
            part = np.asarray(env[local])
            sl = _sl(box)
            if part.shape != whole[sl].shape:
                raise ExecutionError(f"device {device}: output {name!r} shard has shape "
                                     f"{part.shape}, its box {box} needs {whole[sl].shape}")
            seen = written[sl]
            if seen.any() and not _same(whole[sl][seen], part[seen]):
                raise ExecutionError(f"device {device}: its replica of output {name!r} "
                                     "differs from another device's")
            whole[sl] = part
            written[sl] = True
        if not written.all():
            raise ExecutionError(f"output {name!r}: no device holds some of its elements")
        out[name] = whole
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind == "f":
        return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))
    return bool(np.array_equal(a, b))


@dataclass(frozen=True)
class DeviceStep:
    """One device's launch of a compute stage, ready to run: ``inputs`` are the device's
    local arrays the segment reads, by local name."""

    launch: DeviceLaunch
    device: int
    inputs: dict[str, np.ndarray]


class MeshSteps:
    """One run of ``schedule`` on the host ``inputs``, driven by the backend that runs it: the
    inputs sharded (``shard_inputs``); iterating yields each device's launch of each compute
    stage in order (devices one after another), which the backend runs itself and hands back
    (``give``), while the collectives and finishes between them run here on the host
    (``Collective.move``, ``FinishPart.apply``); ``outputs`` puts the program's outputs back
    together (``unshard_outputs``). The backend calls down into the schedule, never the
    other way round.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.runtime.reference import random_inputs, run_unplanned
    >>> from apportion.sharding.lower import lower_plan
    >>> from apportion.sharding.mesh import parse
    >>> from apportion.sharding.search import search
    >>> s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
    >>> steps = MeshSteps(s, random_inputs(s.program))
    >>> for step in steps:
    ...     steps.give(step, run_unplanned(step.launch.schedule.program, step.inputs))
    >>> steps.outputs()["y"].shape
    (256, 1024)
    """

    def __init__(self, schedule: MeshSchedule, inputs: Mapping[str, np.ndarray]) -> None:
        self.schedule = schedule
        self._envs = shard_inputs(schedule, inputs)
        self._pending: DeviceStep | None = None  # the step yielded, until its outputs come

    def __iter__(self) -> Iterator[DeviceStep]:
        envs = self._envs
        for stage in self.schedule.stages:
            if isinstance(stage, Compute):
                for d, (launch, env) in enumerate(zip(stage.launches, envs, strict=True)):
                    program = launch.schedule.program
                    absent = [n for n in program.inputs if n not in env]
                    if absent:
                        raise ExecutionError(f"device {d}: segment {launch.name!r} reads "
                                             f"{', '.join(map(repr, absent))}, which no earlier "
                                             "stage gave the device")
                    self._pending = DeviceStep(launch, d, {n: env[n] for n in program.inputs})
                    yield self._pending
                    if self._pending is not None:
                        raise ExecutionError(f"device {d}: segment {launch.name!r} was not run "
                                             "(its outputs were not given back)")
            elif isinstance(stage, MeshFinish):
                for part, env in zip(stage.parts, envs, strict=True):
                    env[part.result] = part.apply(env)
            else:
                moved = stage.move([env[stage.source] for env in envs])
                for env, res in zip(envs, moved, strict=True):
                    env[stage.result] = res

    def give(self, step: DeviceStep, done: Mapping[str, np.ndarray]) -> None:
        """The outputs of ``step``'s run by local name (at least its segment's outputs); the
        step must be the one last yielded."""
        launch, d = step.launch, step.device
        if step is not self._pending:
            raise ExecutionError(f"device {d}: segment {launch.name!r} is not the step the "
                                 "mesh run is waiting for")
        outputs = launch.schedule.program.outputs
        missing = [n for n in outputs if n not in done]
        if missing:
            raise ExecutionError(f"device {d}: the run of segment {launch.name!r} gave "
                                 f"no {', '.join(map(repr, missing))}")
        self._envs[d].update({n: done[n] for n in outputs})
        self._pending = None

    def outputs(self) -> dict[str, np.ndarray]:
        """The program's outputs put back together from the devices' shards."""
        return unshard_outputs(self.schedule, self._envs)
