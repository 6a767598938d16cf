"""Device meshes: named axes over devices, the topology their links cross, peered memory.

A ``Mesh`` lays its devices out row-major over named axes (``dp=2, tp=4``: device ``d`` has
coordinates ``(d // 4, d % 4)``). Each axis crosses one level of a hierarchical topology,
``node`` (between machines) > ``device`` (between the accelerators of one machine) >
``chiplet`` (between the dies of one package), and each level has a ``Link``: the bandwidth one
device moves data with to its peers at that level, and the latency of one message. A collective
along an axis is priced by that axis's link (``apportion.sharding.collectives``).

An axis may have *peered* memory (``peered=True``): its devices read one another's memory
directly, so a resharding along it is a remote read of the bytes a device needs (one latency),
not a ring collective of ``n - 1`` steps.

Every axis has a static size: a symbolic axis size is not supported (the per-device programs,
the shard offsets and the strategy search all need the device count).

A mesh may carry the ``Target`` of its devices (the cost model's per-device figures) and each
device's memory capacity (``memory_bytes``), which the strategy search must respect.

Presets (``PRESETS``), a spec string (``"dp=2,tp=4@chiplet:peered"``) and TOML files (a
``[mesh]`` table, which a target file may carry beside its own fields) make meshes:

>>> m = parse("dp=2,tp=4")
>>> m.shape, m.coords(5), m.group(5, "tp")
((2, 4), {'dp': 1, 'tp': 1}, (4, 5, 6, 7))
"""

from __future__ import annotations

import itertools
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from apportion.errors import TargetError
from apportion.target.presets import PRESETS as TARGET_PRESETS
from apportion.target.presets import load_toml as load_target_toml
from apportion.target.target import Target, describe, finite, is_int, is_real

#: the topology levels, outermost first
LEVELS = ("node", "device", "chiplet")
GB = 1e9
GiB = 1 << 30


@dataclass(frozen=True)
class Link:
    """One level of the topology: ``bandwidth`` in bytes per second that one device sends (and
    receives) to its peers at this level, ``latency_us`` per message."""

    level: str
    bandwidth: float
    latency_us: float = 0.0

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise TargetError(f"link level {self.level!r} is not one of {', '.join(LEVELS)}")
        if not is_real(self.bandwidth) or not finite(self.bandwidth) or self.bandwidth <= 0:
            raise TargetError(f"link {self.level!r}: bandwidth must be a finite number of "
                              f"bytes/s > 0, got {describe(self.bandwidth)}")
        if not is_real(self.latency_us) or not finite(self.latency_us) or self.latency_us < 0:
            raise TargetError(f"link {self.level!r}: latency_us must be a finite number >= 0, "
                              f"got {describe(self.latency_us)}")


# Default links. These are assumed figures, not measurements of one system:
# * node: a 200 Gb/s network port per device (InfiniBand NDR200 / 200 GbE class), 25 GB/s each
#   way, 5 us per message;
# * device: PCIe Gen5 x16 between the cards of one machine, 32 GT/s x 16 lanes with 128b/130b
#   coding, about 63 GB/s each way, 2 us per message;
# * chiplet: a die-to-die link inside one package, 500 GB/s, 0.5 us.
DEFAULT_LINKS = (Link("node", 25 * GB, 5.0), Link("device", 63 * GB, 2.0),
                 Link("chiplet", 500 * GB, 0.5))


@dataclass(frozen=True)
class Axis:
    """A named mesh axis: ``size`` devices along it, whose links cross topology ``level``;
    ``peered``: they read one another's memory directly."""

    name: str
    size: int
    level: str = "device"
    peered: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TargetError(f"mesh axis name {self.name!r} must be an identifier")
        if not is_int(self.size) or self.size < 1:
            raise TargetError(f"mesh axis {self.name!r}: size must be an int >= 1, got "
                              f"{describe(self.size)} (symbolic axis sizes are not supported)")
        if self.level not in LEVELS:
            raise TargetError(f"mesh axis {self.name!r}: level must be one of "
                              f"{', '.join(LEVELS)}, got {describe(self.level)}")
        if not isinstance(self.peered, bool):
            raise TargetError(f"mesh axis {self.name!r}: peered must be true or false, got "
                              f"{describe(self.peered)}")


@dataclass(frozen=True)
class Mesh:
    """Devices over named axes (row-major), their topology links, memory and device target.

    ``memory_bytes``: each device's memory capacity (None: not limited). ``target``: the
    hardware each device is (None: the strategy search takes the Spyre preset).
    """

    axes: tuple[Axis, ...]
    links: tuple[Link, ...] = DEFAULT_LINKS
    memory_bytes: int | None = None
    name: str = "mesh"
    target: Target | None = field(default=None, compare=True)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise TargetError(f"mesh name must be a non-empty string, got {describe(self.name)}")
        where = f"mesh {self.name!r}"
        if not self.axes:
            raise TargetError(f"{where} has no axes; give at least one, like dp=2")
        names = [a.name for a in self.axes]
        for n in names:
            if names.count(n) > 1:
                raise TargetError(f"{where}: axis {n!r} is named twice")
        levels = {lk.level for lk in self.links}
        for a in self.axes:
            if a.level not in levels:
                raise TargetError(f"{where}: axis {a.name!r} crosses level {a.level!r}, which "
                                  f"has no link (links: {', '.join(sorted(levels))})")
        if self.memory_bytes is not None and (not is_int(self.memory_bytes)
                                              or self.memory_bytes < 1):
            raise TargetError(f"{where}: memory_bytes must be an int >= 1 or None, got "
                              f"{describe(self.memory_bytes)}")
        if self.target is not None and not isinstance(self.target, Target):
            raise TargetError(f"{where}: target must be a Target, got "
                              f"{describe(self.target, typed=True)}")

    # -- shape and coordinates ----------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def devices(self) -> int:
        return math.prod(self.shape)

    @cached_property
    def axis_map(self) -> dict[str, Axis]:
        return {a.name: a for a in self.axes}

    def axis(self, name: str) -> Axis:
        try:
            return self.axis_map[name]
        except KeyError:
            raise TargetError(f"mesh {self.name!r} has no axis {name!r}; axes: "
                              f"{', '.join(self.names)}") from None

    def size(self, name: str) -> int:
        return self.axis(name).size

    def index(self, name: str) -> int:
        """The position of axis ``name`` (its mesh dim)."""
        return self.names.index(self.axis(name).name)

    def coords(self, device: int) -> dict[str, int]:
        """Axis -> coordinate of ``device`` (row-major)."""
        out: dict[str, int] = {}
        for a in reversed(self.axes):
            device, out[a.name] = divmod(device, a.size)
        return {n: out[n] for n in self.names}

    def device(self, coords: Mapping[str, int]) -> int:
        d = 0
        for a in self.axes:
            d = d * a.size + coords[a.name]
        return d

    def group(self, device: int, axis: str) -> tuple[int, ...]:
        """The devices that differ from ``device`` only along ``axis``, by coordinate."""
        c = self.coords(device)
        return tuple(self.device({**c, axis: i}) for i in range(self.size(axis)))

    def link(self, axis: str) -> Link:
        level = self.axis(axis).level
        return next(lk for lk in self.links if lk.level == level)

    @property
    def all_coords(self) -> tuple[dict[str, int], ...]:
        return tuple(self.coords(d) for d in range(self.devices))

    def spec(self) -> str:
        """The spec string that makes this mesh's axes (``parse`` reads it back)."""
        parts = []
        for a in self.axes:
            text = f"{a.name}={a.size}"
            if a.level != "device" or a.peered:
                text += f"@{a.level}"
            if a.peered:
                text += ":peered"
            parts.append(text)
        return ",".join(parts)

    def __str__(self) -> str:
        return f"{self.name} ({self.spec()}, {self.devices} devices)"

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "axes": [{"name": a.name, "size": a.size, "level": a.level, "peered": a.peered}
                     for a in self.axes],
            "links": {lk.level: {"bandwidth_gbs": lk.bandwidth / GB, "latency_us": lk.latency_us}
                      for lk in self.links},
        }
        if self.memory_bytes is not None:
            doc["memory_bytes"] = self.memory_bytes
        return doc


def combos(mesh: Mesh, axes: Sequence[str]) -> list[dict[str, int]]:
    """Every assignment of coordinates to ``axes``."""
    return [dict(zip(axes, c, strict=True))
            for c in itertools.product(*(range(mesh.size(a)) for a in axes))]


# --- presets ---------------------------------------------------------------------------------

#: IBM's Spyre card carries 128 GB of LPDDR5 memory
SPYRE_CARD_MEMORY = 128 * 10**9


def cards(n: int = 8, axis: str = "tp") -> Mesh:
    """``n`` Spyre cards in one machine over PCIe: a 1-D mesh at the device level."""
    return Mesh((Axis(axis, n),), name=f"spyre-x{n}", memory_bytes=SPYRE_CARD_MEMORY)


def cluster(nodes: int = 2, per_node: int = 8) -> Mesh:
    """``nodes`` machines of ``per_node`` Spyre cards: axis ``dp`` across machines (network
    links), ``tp`` across the cards of one machine (PCIe)."""
    return Mesh((Axis("dp", nodes, "node"), Axis("tp", per_node, "device")),
                name=f"spyre-{nodes}x{per_node}", memory_bytes=SPYRE_CARD_MEMORY)


def chiplets(devices: int = 4, dies: int = 2) -> Mesh:
    """``devices`` cards of ``dies`` chiplets each, the dies of one package with peered
    memory: axis ``tp`` across cards (PCIe), ``die`` across the package's dies."""
    return Mesh((Axis("tp", devices, "device"), Axis("die", dies, "chiplet", peered=True)),
                name=f"chiplets-{devices}x{dies}", memory_bytes=SPYRE_CARD_MEMORY // dies)


PRESETS = {"spyre-x2": lambda: cards(2), "spyre-x4": lambda: cards(4),
           "spyre-x8": lambda: cards(8), "spyre-2x8": lambda: cluster(2, 8),
           "chiplets-4x2": lambda: chiplets(4, 2)}


# --- spec strings and TOML -------------------------------------------------------------------

def parse(spec: str, base: Mesh | None = None) -> Mesh:
    """A mesh from ``"dp=2,tp=4"``; an axis may name its level and peering,
    ``"tp=4@chiplet:peered"``. ``base`` lends links, memory and target.

    >>> parse("tp=4@chiplet:peered").axes[0]
    Axis(name='tp', size=4, level='chiplet', peered=True)
    """
    if not isinstance(spec, str) or not spec.strip():
        raise TargetError(f"mesh spec must be a non-empty string like dp=2,tp=4, got "
                          f"{describe(spec, typed=True)}")
    axes = []
    for part in spec.split(","):
        name, eq, rest = part.strip().partition("=")
        if not eq:
            raise TargetError(f"mesh spec {spec!r}: {part.strip()!r} is not AXIS=SIZE (like "
                              "dp=2 or tp=4@chiplet:peered)")
        size_text, _, tail = rest.partition("@")
        level, peered = "device", False
        if tail:
            level, colon, flag = tail.partition(":")
            if colon and flag != "peered":
                raise TargetError(f"mesh spec {spec!r}: axis {name.strip()!r}: unknown flag "
                                  f"{flag!r}; the one flag is 'peered'")
            peered = bool(colon)
        elif ":" in size_text:
            size_text, _, flag = size_text.partition(":")
            if flag != "peered":
                raise TargetError(f"mesh spec {spec!r}: axis {name.strip()!r}: unknown flag "
                                  f"{flag!r}; the one flag is 'peered'")
            peered = True
        try:
            size = int(size_text)
        except ValueError:
            raise TargetError(f"mesh spec {spec!r}: axis {name.strip()!r} size {size_text!r} is "
                              "not an integer (symbolic axis sizes are not supported)") from None
        axes.append(Axis(name.strip(), size, level.strip(), peered))
    if base is None:
        return Mesh(tuple(axes), name=spec)
    return replace(base, axes=tuple(axes), name=spec)


def resolve(spec: str | Mesh) -> Mesh:
    """A mesh from a preset name, a ``.toml`` file or a spec string (``dp=2,tp=4``)."""
    if isinstance(spec, Mesh):
        return spec
    if isinstance(spec, str) and spec in PRESETS:
        return PRESETS[spec]()
    if isinstance(spec, str) and spec.endswith(".toml"):
        return load_toml(spec)
    return parse(spec)


def _number(where: str, key: str, value: object, positive: bool = True) -> float:
    if not is_real(value) or not finite(value) or value < 0 or (positive and value == 0):
        rel = "> 0" if positive else ">= 0"
        raise TargetError(f"{where}: {key} must be a finite number {rel}, got {describe(value)}")
    return float(value)


def from_dict(doc: Mapping[str, Any], where: str = "mesh", target: Target | None = None
              ) -> Mesh:
    """A mesh from its table: ``name``, ``axes`` (a table of sizes, or a list of tables with
    ``name``, ``size``, ``level``, ``peered``), ``links`` (per level ``bandwidth_gbs``,
    ``latency_us``), ``memory_gib`` or ``memory_bytes``, ``target`` (a preset name)."""
    known = {"name", "axes", "links", "memory_gib", "memory_bytes", "target", "preset"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise TargetError(f"{where}: unknown field {unknown[0]!r}; valid: "
                          f"{', '.join(sorted(known))}")
    base = None
    if "preset" in doc:
        p = doc["preset"]
        if not (isinstance(p, str) and p in PRESETS):
            raise TargetError(f"{where}: preset must be one of {', '.join(PRESETS)}, got "
                              f"{describe(p)}")
        base = PRESETS[p]()
    raw_axes = doc.get("axes")
    axes: list[Axis] = []
    if raw_axes is None:
        if base is None:
            raise TargetError(f"{where}: needs axes, like axes = {{dp = 2, tp = 4}}")
        axes = list(base.axes)
    elif isinstance(raw_axes, dict):
        for n, s in raw_axes.items():
            axes.append(Axis(n, s))
    elif isinstance(raw_axes, list):
        for i, a in enumerate(raw_axes):
            if not isinstance(a, dict) or set(a) - {"name", "size", "level", "peered"} or \
                    "name" not in a or "size" not in a:
                raise TargetError(f"{where}: axes[{i}] must be a table with name, size and "
                                  f"optionally level, peered; got {describe(a)}")
            axes.append(Axis(a["name"], a["size"], a.get("level", "device"),
                             a.get("peered", False)))
    else:
        raise TargetError(f"{where}: axes must be a table of sizes or a list of tables, got "
                          f"{describe(raw_axes)}")
    links = {lk.level: lk for lk in (base.links if base else DEFAULT_LINKS)}
    raw_links = doc.get("links", {})
    if not isinstance(raw_links, dict):
        raise TargetError(f"{where}: links must be a table of levels, got {describe(raw_links)}")
    for level, lk in raw_links.items():
        if level not in LEVELS or not isinstance(lk, dict) or \
                set(lk) - {"bandwidth_gbs", "latency_us"}:
            raise TargetError(f"{where}: links.{level} must be one of {', '.join(LEVELS)} with "
                              "bandwidth_gbs and latency_us")
        old = links.get(level, DEFAULT_LINKS[LEVELS.index(level)])
        bw = _number(f"{where}: links.{level}", "bandwidth_gbs",
                     lk.get("bandwidth_gbs", old.bandwidth / GB)) * GB
        lat = _number(f"{where}: links.{level}", "latency_us",
                      lk.get("latency_us", old.latency_us), positive=False)
        links[level] = Link(level, bw, lat)
    memory = base.memory_bytes if base else None
    if "memory_gib" in doc and "memory_bytes" in doc:
        raise TargetError(f"{where}: both memory_gib and memory_bytes given; set one")
    if "memory_gib" in doc:
        memory = int(_number(where, "memory_gib", doc["memory_gib"]) * GiB)
    elif "memory_bytes" in doc:
        memory = doc["memory_bytes"]
    if "target" in doc:
        t = doc["target"]
        if not (isinstance(t, str) and t in TARGET_PRESETS):
            raise TargetError(f"{where}: target must be a preset name ({', '.join(TARGET_PRESETS)})"
                              f"; a target file carries its mesh in a [mesh] table instead")
        target = TARGET_PRESETS[t]()
    name = doc.get("name", base.name if base else "mesh")
    return Mesh(tuple(axes), tuple(links[lv] for lv in LEVELS if lv in links), memory,
                name, target if target is not None else (base.target if base else None))


def load_toml(path: str | Path) -> Mesh:
    """A mesh from a TOML file: its ``[mesh]`` table (a target file carries one beside its
    target fields, and the mesh then carries that target), or the whole file."""
    where = f"mesh file {str(path)!r}"
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or e
        raise TargetError(f"cannot read {where}: {why}") from None
    if "mesh" in doc:
        table = doc["mesh"]
        if not isinstance(table, dict):
            raise TargetError(f"{where}: mesh must be a table ([mesh])")
        rest = set(doc) - {"mesh"}
        target = None
        if rest:  # a target file carrying a mesh
            try:
                target = load_target_toml(path)
            except TargetError as e:
                raise TargetError(f"{where}: {e}") from None
        return _named(where, lambda: from_dict(table, where, target))
    return _named(where, lambda: from_dict(doc, where))


def _named(where: str, make: Any) -> Mesh:
    """``make()``, its errors prefixed with ``where`` once."""
    try:
        return make()
    except TargetError as e:
        if str(e).startswith(where):
            raise
        raise TargetError(f"{where}: {e}") from None
