"""LoopSpec / OpSpec / TensorArg: the planned program as nested loops of kernel launches.

Values only, below the mlir layer that renders them (``mlir.bundle``); the bundle backend
builds them from a schedule (``backends.bundle.loopspec``) and prints and parses them
(``backends.bundle.spec_text``).
Fields given as dicts or lists are canonicalised to immutable ones, so specs are hashable and
compare equal however they were made.

>>> from dataclasses import replace
>>> arg = TensorArg(is_input=True, arg_index=0, dtype="float16", device_size=[16, 512, 64],
...                 device_coordinates=["n floordiv 64", "m", "n mod 64"],
...                 allocation={"hbm": 0}, tensor="a")
>>> arg.allocation["hbm"], arg.memory
(0, 'hbm')
>>> op = OpSpec(op="exp", is_reduction=False, iteration_space={"m": (512, 16), "n": (1024, 2)},
...             args=[arg, replace(arg, is_input=False, arg_index=1, allocation={"lx": 0},
...                                tensor="y")], tiled_symbols=["m", "n"], name="e")
>>> LoopSpec(count=4, body=[op])
LoopSpec(count=4, body=[OpSpec(e=exp: m 512/16, n 1024/2; a hbm:0 -> y lx:0)])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from apportion.errors import EmitError

MEMORIES = ("hbm", "lx")


class FrozenMap(Mapping[str, Any]):
    """An immutable, hashable, insertion-ordered dict that prints and compares like a dict."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | Any = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        object.__setattr__(self, "_items", dict(pairs))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other.items())

    def __repr__(self) -> str:
        return repr(self._items)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenMap is immutable")


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def call_text(obj: object, names: tuple[str, ...]) -> str:
    """``Name(a=..., b=...)``: the constructor call that rebuilds ``obj`` (bodies as lists)."""
    parts = []
    for n in names:
        v = getattr(obj, n)
        parts.append(f"{n}={list(v)!r}" if n in ("body", "args") else f"{n}={v!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"


@dataclass(frozen=True, repr=False)
class TensorArg:
    """One tensor an op's kernel reads or writes.

    ``arg_index`` is the operand's position in the op (inputs first, the output last);
    ``device_size`` the device-layout shape of what the kernel sees (one tile's for per-tile
    buffers and scratchpad tensors); ``device_coordinates`` one affine expression of the op dims
    per device dim; ``allocation`` is ``{"hbm": byte address}`` or ``{"lx": scratchpad
    offset}``. ``per_tile_fixed`` marks a tensor holding one tile at an address that stays put
    across loop iterations (a scratchpad tensor read in loops deeper than its tile buffer
    moves within it: not fixed). ``tile_strides`` gives, per enclosing loop level (outermost
    first), the bytes its address advances per iteration (0: not tiled at that level; an
    expression over count names such as ``"8388608 floordiv T"`` when a count is symbolic).
    """

    is_input: bool
    arg_index: int
    dtype: str
    device_size: tuple[int, ...]
    device_coordinates: tuple[str, ...]
    allocation: FrozenMap
    per_tile_fixed: bool = False
    tensor: str = ""
    tile_strides: tuple[int | str, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "device_size", tuple(self.device_size))
        _set(self, "device_coordinates", tuple(self.device_coordinates))
        _set(self, "allocation", FrozenMap(self.allocation))
        _set(self, "tile_strides", tuple(self.tile_strides))
        where = f"tensor arg {self.tensor or self.arg_index!r}"
        if len(self.device_coordinates) != len(self.device_size):
            raise EmitError(f"{where}: {len(self.device_coordinates)} device coordinates for "
                            f"{len(self.device_size)} device dims")
        if len(self.allocation) != 1 or self.memory not in MEMORIES:
            raise EmitError(f"{where}: allocation {dict(self.allocation)} must be one of "
                            f"{{'hbm': address}}, {{'lx': offset}}")
        if self.address < 0:
            raise EmitError(f"{where}: negative {self.memory} address {self.address}")
        if self.per_tile_fixed and any(self.tile_strides):
            raise EmitError(f"{where}: a tile fixed in place cannot move across loop iterations "
                            f"(tile strides {self.tile_strides})")

    @property
    def memory(self) -> str:
        """``"hbm"`` (device memory) or ``"lx"`` (scratchpad)."""
        return next(iter(self.allocation))

    @property
    def address(self) -> int:
        """The byte address in device memory or the scratchpad offset."""
        return int(self.allocation[self.memory])

    def __repr__(self) -> str:
        return call_text(self, TENSOR_ARG_FIELDS)


@dataclass(frozen=True, repr=False)
class OpSpec:
    """One kernel launch: an op's (per-iteration) iteration space, its splits and its tensors.

    ``iteration_space`` maps each dim to ``(size, splits)``; ``tiled_symbols`` lists, outermost
    first, the dims an enclosing loop divides (empty outside loops); ``name`` is the op's name
    in the program (its kernel file is ``<name>.kernel``), ``op`` its scalar function.
    """

    op: str
    is_reduction: bool
    iteration_space: FrozenMap
    args: tuple[TensorArg, ...]
    tiled_symbols: tuple[str, ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        space = FrozenMap((d, tuple(v)) for d, v in dict(self.iteration_space).items())
        _set(self, "iteration_space", space)
        _set(self, "args", tuple(self.args))
        _set(self, "tiled_symbols", tuple(self.tiled_symbols))
        where = f"op spec {self.name or self.op!r}"
        for d, v in space.items():
            if len(v) != 2 or not all(isinstance(x, int) and x >= 1 for x in v):
                raise EmitError(f"{where}: dim {d!r} needs (size, splits) of positive ints, "
                                f"got {v!r}")
        for d in self.tiled_symbols:
            if d not in space:
                raise EmitError(f"{where}: tiled dim {d!r} is not in its iteration space "
                                f"{list(space)}")
        if not all(isinstance(a, TensorArg) for a in self.args):
            raise EmitError(f"{where}: args must be TensorArgs")

    @property
    def kernel(self) -> str:
        """The kernel file the bundle names for this op."""
        return f"{self.name or self.op}.kernel"

    def __repr__(self) -> str:
        # The user-facing view: short enough that a whole loop nest fits a few lines;
        # ``spec_text.to_source`` prints the full constructor form.
        name = self.name if self.name in ("", self.op) else f"{self.name}={self.op}"
        dims = ", ".join(f"{d} {n}/{k}" for d, (n, k) in self.iteration_space.items())
        arg = [f"{a.tensor or a.arg_index} {a.memory}:{a.address}" for a in self.args]
        ins = ", ".join(x for x, a in zip(arg, self.args, strict=True) if a.is_input)
        outs = ", ".join(x for x, a in zip(arg, self.args, strict=True) if not a.is_input)
        return f"OpSpec({name or self.op}: {dims}; {ins} -> {outs})"


@dataclass(frozen=True, repr=False)
class LoopSpec:
    """A counted loop (``count`` an int, or a symbol name for a run-time count) around a body."""

    count: int | str
    body: tuple[LoopSpec | OpSpec, ...] = field(default=())

    def __post_init__(self) -> None:
        _set(self, "body", tuple(self.body))
        c = self.count
        if isinstance(c, bool) or not (isinstance(c, int) and c >= 1
                                       or isinstance(c, str) and c.isidentifier()):
            raise EmitError(f"loop count must be a positive int or a symbol name, got {c!r}")
        if not all(isinstance(b, LoopSpec | OpSpec) for b in self.body):
            raise EmitError("a loop body holds only LoopSpecs and OpSpecs")

    def __repr__(self) -> str:
        return call_text(self, LOOP_SPEC_FIELDS)


TENSOR_ARG_FIELDS = ("is_input", "arg_index", "dtype", "device_size", "device_coordinates",
                     "allocation", "per_tile_fixed", "tensor", "tile_strides")
OP_SPEC_FIELDS = ("op", "is_reduction", "iteration_space", "args", "tiled_symbols", "name")
LOOP_SPEC_FIELDS = ("count", "body")
Spec = LoopSpec | OpSpec


class SpecProgram(tuple[Spec, ...]):
    """The top-level specs of a program, in order: a tuple that prints one spec per line.

    >>> print(SpecProgram([LoopSpec(count=2), LoopSpec(count="T")]))
    LoopSpec(count=2, body=[])
    LoopSpec(count='T', body=[])
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "\n".join(map(repr, self))


def walk(specs: tuple[Spec, ...], depth: int = 0) -> Iterator[tuple[int, Spec]]:
    """Every spec with its loop depth, in program order (a loop before its body)."""
    for s in specs:
        yield depth, s
        if isinstance(s, LoopSpec):
            yield from walk(s.body, depth + 1)
