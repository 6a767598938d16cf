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

An axis size may be *symbolic*: a name bound later, with a planning size and optional bounds
(``dp=N~4``: ``N`` devices along ``dp``, planned at 4; ``dp=N~2..8``: ``N`` in 2..8, planned at
its max, as a program's run-time size is; ``dp=N~4~2..8``: both). Shardings, propagation, the
strategy search and the plan's report work at the planning size and show the symbol; the
per-device programs and the distributed run need the device count, so they bind it first
(``Mesh.bind({"N": 2})``; ``--param N=2`` on the command line) and refuse a mesh left unbound,
naming the axis. Axes may share a symbol (with one planning size and bounds).

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
import os
import re
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
#: the most devices a mesh may have: a sharding plan is checked, unrolled and run device by
#: device (milliseconds each), so a mesh of a million devices ran for the better part of an hour
MAX_DEVICES = 4096
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
    ``peered``: they read one another's memory directly.

    A symbolic axis names its size ``symbol``, bounded by ``min`` and ``max`` (None:
    unbounded); ``size`` is then its planning size, within the bounds.

    >>> Axis("dp", 4, symbol="N", max=8).size_text
    'N~4~1..8'
    """

    name: str
    size: int
    level: str = "device"
    peered: bool = False
    symbol: str | None = None
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TargetError(f"mesh axis name {self.name!r} must be an identifier")
        if not is_int(self.size) or self.size < 1:
            what = "planning size" if self.symbol is not None else "size"
            raise TargetError(f"mesh axis {self.name!r}: {what} must be an int >= 1, got "
                              f"{describe(self.size)}")
        if self.symbol is None:
            if self.min != 1 or self.max is not None:
                raise TargetError(f"mesh axis {self.name!r}: bounds (min, max) belong to a "
                                  "symbolic size")
        else:
            if not isinstance(self.symbol, str) or not self.symbol.isidentifier():
                raise TargetError(f"mesh axis {self.name!r}: symbolic size "
                                  f"{describe(self.symbol)} must be an identifier")
            for what, v in (("min", self.min), ("max", self.max)):
                if v is not None and (not is_int(v) or v < 1):
                    raise TargetError(f"mesh axis {self.name!r}: {what} of {self.symbol} must "
                                      f"be an int >= 1, got {describe(v)}")
            if self.max is not None and self.max < self.min:
                raise TargetError(f"mesh axis {self.name!r}: max {self.max} of {self.symbol} "
                                  f"is below its min {self.min}")
            if not self.min <= self.size <= (self.max or self.size):
                raise TargetError(f"mesh axis {self.name!r}: planning size {self.size} of "
                                  f"{self.symbol} is outside its bounds {self.bounds}")
        if self.level not in LEVELS:
            raise TargetError(f"mesh axis {self.name!r}: level must be one of "
                              f"{', '.join(LEVELS)}, got {describe(self.level)}")
        if not isinstance(self.peered, bool):
            raise TargetError(f"mesh axis {self.name!r}: peered must be true or false, got "
                              f"{describe(self.peered)}")

    @property
    def symbolic(self) -> bool:
        return self.symbol is not None

    @property
    def bounds(self) -> str:
        """``2..8``, or ``>= 2`` when unbounded above."""
        return f"{self.min}..{self.max}" if self.max is not None else f">= {self.min}"

    @property
    def size_text(self) -> str:
        """The size as a spec writes it: ``4``, or ``N~4`` with its bounds when it has any."""
        if self.symbol is None:
            return str(self.size)
        text = f"{self.symbol}~{self.size}"
        if self.min != 1 or self.max is not None:
            text += f"~{self.min}..{self.max if self.max is not None else ''}"
        return text

    @property
    def spec_tail(self) -> str:
        """``@level`` and ``:peered`` as a spec writes them ('' for a plain device axis)."""
        text = f"@{self.level}" if self.level != "device" or self.peered else ""
        return text + (":peered" if self.peered else "")

    def bind(self, value: object) -> Axis:
        """This axis at ``value`` devices (a static axis), within the symbol's bounds."""
        if self.symbol is None:
            return self
        if not is_int(value):
            raise TargetError(f"mesh axis {self.name!r}: its size {self.symbol} needs an int, "
                              f"got {describe(value, typed=True)}")
        if value < self.min or (self.max is not None and value > self.max):  # type: ignore
            raise TargetError(f"mesh axis {self.name!r}: {self.symbol}={value} is outside its "
                              f"bounds {self.bounds}")
        return Axis(self.name, value, self.level, self.peered)  # type: ignore[arg-type]


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
        count = math.prod(a.size for a in self.axes)
        if count > MAX_DEVICES:
            spec = ", ".join(f"{a.name}={a.size}" + (f" ({a.symbol} planned at {a.size})"
                                                      if a.symbol else "") for a in self.axes)
            raise TargetError(f"{where}: {spec} makes {count} devices, more than the "
                              f"{MAX_DEVICES} a mesh may have (every device's program is built "
                              "and checked one by one)")
        for a in self.axes:
            if a.max is not None and a.max > MAX_DEVICES:
                raise TargetError(f"{where}: axis {a.name!r} may take up to {a.max} devices "
                                  f"({a.symbol} max), more than the {MAX_DEVICES} a mesh may "
                                  "have")
        first: dict[str, Axis] = {}
        for a in self.axes:
            if a.symbol is None:
                continue
            if a.symbol in names:
                raise TargetError(f"{where}: axis {a.name!r} names its size {a.symbol!r}, "
                                  "which is an axis name; name the size apart (dp=N~4)")
            b = first.setdefault(a.symbol, a)
            if (b.size, b.min, b.max) != (a.size, a.min, a.max):
                raise TargetError(f"{where}: axes {b.name!r} and {a.name!r} share size "
                                  f"{a.symbol} with different planning sizes or bounds "
                                  f"({b.size_text} and {a.size_text})")

    # -- symbolic sizes -----------------------------------------------------------------------

    @property
    def symbolic(self) -> bool:
        """True when an axis size is a symbol (the mesh is then planned at planning sizes)."""
        return any(a.symbolic for a in self.axes)

    @property
    def symbols(self) -> dict[str, Axis]:
        """Symbol -> the first axis it sizes (its planning size and bounds)."""
        out: dict[str, Axis] = {}
        for a in self.axes:
            if a.symbol is not None:
                out.setdefault(a.symbol, a)
        return out

    def planning_text(self) -> str:
        """``N=4`` per symbol: the sizes the mesh is planned at ('' for a static mesh)."""
        return ", ".join(f"{s}={a.size}" for s, a in self.symbols.items())

    def bind(self, sizes: Mapping[str, object] | None = None) -> Mesh:
        """This mesh with every symbolic axis size bound by ``sizes`` (symbol -> devices): a
        static mesh. An unbound symbol, a value outside its bounds or not an int, and a name
        the mesh lacks are ``TargetError``s naming the axis.

        >>> m = parse("dp=N~4,tp=2").bind({"N": 3})
        >>> m.shape, m.name, m.symbolic
        ((3, 2), 'dp=3,tp=2', False)
        """
        given = dict(sizes or {})
        syms = self.symbols
        unknown = sorted(set(given) - set(syms))
        if unknown:
            have = (f"its symbolic sizes: {', '.join(syms)}" if syms else
                    "it has no symbolic size")
            raise TargetError(f"mesh {self.name!r} has no size {unknown[0]!r}; {have}")
        if not syms:
            return self
        missing = [a for a in self.axes if a.symbol is not None and a.symbol not in given]
        if missing:
            a = missing[0]
            raise TargetError(f"mesh {self.name!r}: axis {a.name!r} has symbolic size "
                              f"{a.symbol} (planned at {a.size}); the per-device programs need "
                              f"its device count: bind it (--param {a.symbol}=SIZE, or "
                              f"sizes={{{a.symbol!r}: SIZE}})")
        try:
            axes = tuple(a.bind(given[a.symbol]) if a.symbol is not None else a
                         for a in self.axes)
        except TargetError as e:
            raise TargetError(f"mesh {self.name!r}: {str(e).removeprefix('mesh ')}") from None
        name = self.name
        if self._named_by_spec():  # a mesh named by its spec is named by the bound one
            name = ",".join(a.name + "=" + a.size_text + a.spec_tail for a in axes)
        return replace(self, axes=axes, name=name)

    def _named_by_spec(self) -> bool:
        if self.name == self.spec():
            return True
        try:
            return parse(self.name).axes == self.axes
        except TargetError:
            return False

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

    def spec(self) -> str:
        """The spec string that makes this mesh's axes (``parse`` reads it back)."""
        return ",".join(f"{a.name}={a.size_text}{a.spec_tail}" for a in self.axes)

    def __str__(self) -> str:
        at = f" at {self.planning_text()}" if self.symbolic else ""
        return f"{self.name} ({self.spec()}, {self.devices} devices{at})"

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "axes": [{"name": a.name, "size": a.size, "level": a.level, "peered": a.peered,
                      **({"symbol": a.symbol, "min": a.min, "max": a.max} if a.symbolic
                         else {})}
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

def size_fields(text: str, where: str) -> dict[str, Any]:
    """An axis size as a spec writes it: ``4``, or a symbol with a planning size and bounds,
    ``N~4``, ``N~2..8`` (planned at the max), ``N~4~2..8`` (``~``-separated, in any order);
    the ``Axis`` fields it gives.

    >>> size_fields("N~2..8", "axis"), size_fields("6", "axis")
    ({'size': 8, 'symbol': 'N', 'min': 2, 'max': 8}, {'size': 6})
    """
    head, *parts = text.split("~")
    if not head.isidentifier():
        try:
            value = _decimal(head)
        except ValueError:
            raise TargetError(f"{where}: size {text!r} is neither an integer nor a symbol "
                              "(like 4, or N~4: N devices, planned at 4)") from None
        if parts:
            raise TargetError(f"{where}: size {text!r}: only a symbolic size takes a planning "
                              "size and bounds (N~4~2..8)")
        return {"size": value}
    plan: int | None = None
    lo, hi = 1, None
    ranged = False

    def number(s: str) -> int:
        try:
            return _decimal(s)
        except ValueError:
            raise TargetError(f"{where}: size {text!r}: {s!r} is not an integer; write "
                              f"{head}~PLAN and/or {head}~MIN..MAX") from None

    for part in parts:
        if ".." in part:
            if ranged:
                raise TargetError(f"{where}: size {text!r} gives bounds twice")
            a, _, b = part.partition("..")
            lo = number(a) if a else 1
            hi = number(b) if b else None
            ranged = True
        else:
            if plan is not None:
                raise TargetError(f"{where}: size {text!r} gives a planning size twice")
            plan = number(part)
    if plan is None:
        if hi is None:
            raise TargetError(f"{where}: symbolic size {head} needs a planning size or a "
                              f"max: {head}~4 (planned at 4 devices) or {head}~2..8 (planned "
                              "at its max, 8)")
        plan = hi
    return {"size": plan, "symbol": head, "min": lo, "max": hi}


def parse(spec: str, base: Mesh | None = None) -> Mesh:
    """A mesh from ``"dp=2,tp=4"``; an axis may name its level and peering,
    ``"tp=4@chiplet:peered"``, and its size may be symbolic, ``"dp=N~4"`` (``size_fields``).
    ``base`` lends links, memory and target.

    >>> parse("tp=4@chiplet:peered").axes[0].size_text, parse("dp=N~4").axes[0].size_text
    ('4', 'N~4')
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
        size = size_fields(size_text.strip(), f"mesh spec {spec!r}: axis {name.strip()!r}")
        axes.append(Axis(name.strip(), level=level.strip(), peered=peered, **size))
    if base is None:
        return Mesh(tuple(axes), name=spec)
    return replace(base, axes=tuple(axes), name=spec)


def _decimal(text: str) -> int:
    """``int(text)`` for plain ASCII digits only (``int`` also takes ``4_0`` and ``'٤'``)."""
    if not re.fullmatch(r"\s*-?[0-9]+\s*", text):
        raise ValueError(text)
    return int(text)


def mesh_of(mesh: object, where: str) -> Mesh:
    """``mesh`` if it is a Mesh, else a TargetError naming ``where`` and how to make one."""
    if isinstance(mesh, Mesh):
        return mesh
    hint = (f": make one with ap.sharding.resolve_mesh({mesh!r})" if isinstance(mesh, str)
            else "")
    raise TargetError(f"{where}: mesh must be a Mesh (ap.sharding.parse_mesh('dp=2,tp=4'), a "
                      f"preset, load_toml(path)), got {describe(mesh, typed=True)}{hint}")


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
    ``name``, ``size``, ``level``, ``peered``; a size may be symbolic, ``"N~4"``, or ``"N"``
    with ``plan``, ``min``, ``max``), ``links`` (per level ``bandwidth_gbs``,
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
            size = size_fields(s, f"{where}: axis {n!r}") if isinstance(s, str) else {"size": s}
            axes.append(Axis(n, **size))
    elif isinstance(raw_axes, list):
        fields = {"name", "size", "level", "peered", "plan", "min", "max"}
        for i, a in enumerate(raw_axes):
            if not isinstance(a, dict) or set(a) - fields or "name" not in a or "size" not in a:
                raise TargetError(f"{where}: axes[{i}] must be a table with name, size and "
                                  f"optionally level, peered (a symbolic size: plan, min, max); "
                                  f"got {describe(a)}")
            axes.append(Axis(a["name"], level=a.get("level", "device"),
                             peered=a.get("peered", False), **_toml_size(a, where)))
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


def _toml_size(a: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The size fields of one axis table: ``size = 4``, or ``size = "N"`` with ``plan``,
    ``min``, ``max`` (or all in one string, ``size = "N~4~2..8"``)."""
    s = a["size"]
    bounds = {k: a[k] for k in ("plan", "min", "max") if k in a}
    if not isinstance(s, str):
        if bounds:
            raise TargetError(f"{where}: axis {a['name']!r}: plan, min and max belong to a "
                              f"symbolic size (size = \"N\"); its size is {describe(s)}")
        return {"size": s}
    if "~" in s and bounds:
        raise TargetError(f"{where}: axis {a['name']!r}: size {s!r} carries its planning size "
                          "and bounds; drop plan, min and max")
    if "~" in s or not s.isidentifier():
        return size_fields(s, f"{where}: axis {a['name']!r}")
    hi = bounds.get("max")
    plan = bounds.get("plan", hi)
    if plan is None:
        raise TargetError(f"{where}: axis {a['name']!r}: symbolic size {s} needs plan (the "
                          "planning size) or max")
    return {"size": plan, "symbol": s, "min": bounds.get("min", 1), "max": hi}


def load_toml(path: str | Path) -> Mesh:
    """A mesh from a TOML file: its ``[mesh]`` table (a target file carries one beside its
    target fields, and the mesh then carries that target), or the whole file."""
    if not isinstance(path, str | os.PathLike):
        raise TargetError(f"load_toml: path must be a str or a path (a mesh .toml file), got "
                          f"{describe(path, typed=True)}")
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
        if rest and "target" in table:  # two device targets: which one is meant is unclear
            raise TargetError(f"{where}: [mesh] target = {table['target']!r} conflicts with "
                              "the target this file describes (its other fields); drop "
                              "[mesh] target: a target file's mesh runs on the file's target")
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
