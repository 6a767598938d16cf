"""The device level of the lowered form: a ``MeshSchedule``, what every device of a mesh runs.

A sharded program runs as the same *stages* on every device, in the same order (SPMD):

- ``Compute``: one ``DeviceLaunch`` per device, the device's segment program (its shards of
  the ops between two communications) with the core plan it runs with on the device's cores;
- ``Collective``: data moving between groups of devices along one mesh axis: ``all_gather``,
  ``all_reduce`` (with its reducer), ``reduce_scatter``, ``all_to_all``, or a ``slice`` (each
  device keeps a part of what it holds, no communication). Every device's region of the
  tensor before (``src_boxes``) and after (``dst_boxes``) is listed as the plan cuts it, so a
  backend moves data by those boxes and never recomputes how a dim is cut;
- ``MeshFinish``: elementwise on each device, what a mean or argmax split over devices does
  before its partials combine (``scale`` the local mean by the device's share of the count;
  ``pack`` the local max and index into argmax keys, ``argmax_keys``).

A box is ``((start, stop), ...)`` per tensor dim, in the program's (global) coordinates. The
program's inputs and outputs are placed per device (``Device.inputs``/``outputs``: the tensor,
its local name and box), so a runner cuts host arrays into shards and puts outputs back
together itself. ``apportion.sharding.lower`` builds a ``MeshSchedule`` from a sharding plan;
backends consume it without knowing the sharding package.

>>> c = Collective("all_gather", "x", "x", "x@1", "float32", "tp", ((0, 1),),
...                ((((0, 2), (0, 4))), (((2, 4), (0, 4)))), (((0, 4), (0, 4)),) * 2, dim=0)
>>> str(c), c.rank(1), c.group(1)
('x@1 = all_gather(tp) dim 0(x)', 1, (0, 1))
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from apportion.errors import ExecutionError
from apportion.ir.kinds import REDUCERS
from apportion.ir.program import Program
from apportion.plans.plan import Plan
from apportion.target.target import Target

#: ``(start, stop)`` per tensor dim, in the program's coordinates
Box = tuple[tuple[int, int], ...]

KINDS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "slice")
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


def box_shape(box: Box) -> tuple[int, ...]:
    """The shape of a box.

    >>> box_shape(((2, 5), (0, 4)))
    (3, 4)
    """
    return tuple(hi - lo for lo, hi in box)


def intersect(a: Box, b: Box) -> Box | None:
    """The part two boxes share (None: nothing).

    >>> intersect(((0, 4), (0, 8)), ((2, 6), (4, 8))), intersect(((0, 2),), ((2, 4),))
    (((2, 4), (4, 8)), None)
    """
    out = tuple((max(p, q), min(r, s)) for (p, r), (q, s) in zip(a, b, strict=True))
    return None if any(lo >= hi for lo, hi in out) else out


def within(inner: Box, outer: Box) -> Box:
    """``inner`` in the coordinates of ``outer``'s array (``inner`` must lie in it).

    >>> within(((2, 4), (4, 8)), ((2, 6), (0, 8)))
    ((0, 2), (4, 8))
    """
    return tuple((lo - o, hi - o) for (lo, hi), (o, _) in zip(inner, outer, strict=True))


@dataclass(frozen=True)
class DeviceLaunch:
    """One device's compute segment: ``program`` (its shards of a run of ops) run with the
    core plan ``plan`` on the device's cores. ``name`` is the device's own name for it;
    devices whose segments are equal share one ``program`` and ``plan`` (named after the first
    of them), so a backend compiles or plans it once."""

    name: str
    program: Program
    plan: Plan


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
    devices along ``axis`` with the other coordinates fixed). ``dim`` is the tensor dim
    gathered, scattered or cut (an all-to-all's source dim), ``to_dim`` an all-to-all's
    destination dim. ``reducer`` combines an all-reduce's or reduce-scatter's arrays (a name
    of ``ir.kinds.REDUCERS``; ``argmax`` reduces keys by max); ``unpack``: the reduction ends
    the argmax's last pending axis, so the result is the index in the keys (``argmax_index``).
    ``dtype`` is the arrays' element dtype."""

    kind: str
    tensor: str
    source: str
    result: str
    dtype: str
    axis: str
    groups: tuple[tuple[int, ...], ...]
    src_boxes: tuple[Box, ...]
    dst_boxes: tuple[Box, ...]
    dim: int | None = None
    to_dim: int | None = None
    reducer: str | None = None
    unpack: bool = False

    def __post_init__(self) -> None:
        what = f"collective on tensor {self.tensor!r} along axis {self.axis!r}"
        if self.kind not in KINDS:
            raise ExecutionError(f"{what}: kind {self.kind!r}; valid: {', '.join(KINDS)}")
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
    box: Box


@dataclass(frozen=True)
class Layout:
    """How the mesh holds one value of a program tensor, as the shard dialect's sharding says
    it: ``tensor`` (the program's tensor) under the local name ``local`` every device gives
    it; ``split[i]`` the mesh axes that cut tensor dim ``i``, outermost cut first;
    ``partial`` the axes over which each device holds a partial value still to be combined
    by ``reducer`` (a name of ``ir.kinds.REDUCERS``: a mean waits as ``sum``, an argmax's
    keys as ``argmax``); an axis named nowhere replicates the value. ``boxes`` is each
    device's box of the tensor, in device order, as the plan cuts it (uneven cuts included),
    so a runner whose own cut differs (DTensor's ``torch.chunk``) can tell.

    >>> lay = Layout("h", "h", (("dp",), ("tp",)), boxes=((((0, 2), (0, 4))),) * 4)
    >>> str(lay), lay.axis_placement("tp"), lay.axis_placement("pp")
    ('h = h[dp, tp]', ('shard', 1), ('replicate', None))
    """

    tensor: str
    local: str
    split: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()
    reducer: str | None = None
    boxes: tuple[Box, ...] = ()

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
        """Device ``device``'s segment programs in order, each with its core plan."""
        return tuple(s.launches[device] for s in self.stages if isinstance(s, Compute))

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
