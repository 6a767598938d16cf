"""The Python builder: named dims, tensors with operators, and hint scopes for coarse tiling.

>>> import apportion as ap
>>> A, B = dim("A", 4), dim("B", 8)
>>> with program("demo") as p:
...     x = p.input("x", [A, B], "float16")
...     with hint(slices={A: 2}):
...         y = ap.exp(x) * x
...     p.output(y)
>>> [str(o) for o in p.program.ops]
['exp0: exp0_out[A, B] = exp(x[A, B])', 'mul1: mul1_out[A, B] = mul(exp0_out[A, B], x[A, B])']

Index letters come from dim names (sanitised to identifiers, unique in the program), so a dim
has the same letter in every op, which is what a tiling group's loop levels name. A size-1 axis
is indexed with a literal ``0`` (broadcast). The result is read from ``p.program``.

This module holds the program being built (``ProgramBuilder``, its ``Tensor``s and ``Dim``s),
the hint scopes, and the ops a tensor's operators make (broadcast elementwise ops, ``matmul``).
The op functions, one per op kind of the registry (``ap.exp``, ``ap.where``, ``ap.amax``, ...)
and those whose structure is in their accesses (``ap.conv``, ``ap.merge``, ...), are in
``builder_ops``; they add ops through the builder's op interface (``start_op``,
``ProgramBuilder.add_op``, ``slot_letters``, ``index_of``).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from apportion.errors import ProgramError
from apportion.frontend.json_format import inferred_dtype
from apportion.ir.affine import AffineExpr
from apportion.ir.dtypes import check_dtype, check_name
from apportion.ir.kinds import Category, OpKind, kind
from apportion.ir.op import Access, Op
from apportion.ir.program import (
    SPLIT_K_AUTO,
    LoopLevel,
    Program,
    SplitKPin,
    TensorType,
    TilingGroup,
)

__all__ = [
    "Dim", "Hint", "ProgramBuilder", "Tensor", "active_builder", "anonymous_dim", "as_tuple",
    "broadcast_op", "common_dim", "dim", "dims_text", "hint", "index_of", "matmul", "program",
    "same_dtype", "start_op", "unary_op",
]

_ZERO = AffineExpr.constant(0)
# The active program and hint scopes: the only state, restored by the `with` that set it.
_PROGRAM: ContextVar[ProgramBuilder | None] = ContextVar("apportion_program", default=None)
_HINTS: ContextVar[tuple[Hint, ...]] = ContextVar("apportion_hints", default=())


@dataclass(frozen=True)
class Dim:
    """A named dimension of a fixed size; names starting with ``_`` are anonymous (generated)."""

    name: str
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProgramError(f"a dim name must be a non-empty string, got {self.name!r}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size <= 0:
            raise ProgramError(f"dim {self.name!r}: size must be a positive int, got {self.size!r}")

    @property
    def anonymous(self) -> bool:
        return self.name.startswith("_")

    def __str__(self) -> str:
        return f"{self.name}={self.size}"


def dim(name: str, size: int) -> Dim:
    """A named dim: ``A = ap.dim("A", 1024)``. Names starting with ``_`` are reserved."""
    if isinstance(name, str) and name.startswith("_"):
        raise ProgramError(f"dim name {name!r}: names starting with '_' are reserved for "
                           "anonymous dims (pass an int size instead)")
    return Dim(name, size)


def anonymous_dim(size: int) -> Dim:
    """An unnamed dim of ``size`` (what an int stands for where a dim is asked).

    >>> anonymous_dim(8).anonymous, dims_text([dim("A", 4), anonymous_dim(8)])
    (True, '[A=4, _8=8]')
    """
    return Dim(f"_{size}", size)


def dims_text(dims: Sequence[Dim]) -> str:
    """Dims as error messages show them: ``[A=4, _8=8]``."""
    return "[" + ", ".join(str(d) for d in dims) + "]"


@dataclass(frozen=True, eq=False)
class Tensor:
    """A tensor of a program being built; ``+ - * / @`` and unary ``-`` add ops.

    >>> with program("t") as p:
    ...     x = p.input("x", [dim("A", 4), 8], "float32")
    ...     (x + x).shape, [d.name for d in (x * x).dims]
    ((4, 8), ['A', '_8'])
    """

    name: str
    dims: tuple[Dim, ...]
    dtype: str
    builder: ProgramBuilder = field(repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    def __add__(self, other: Tensor) -> Tensor:
        return _binary("add", "add", self, other, None)

    def __sub__(self, other: Tensor) -> Tensor:
        return _binary("sub", "sub", self, other, None)

    def __mul__(self, other: Tensor) -> Tensor:
        return _binary("mul", "mul", self, other, None)

    def __truediv__(self, other: Tensor) -> Tensor:
        return _binary("div", "div", self, other, None)

    def __matmul__(self, other: Tensor) -> Tensor:
        return matmul(self, other)

    def __neg__(self) -> Tensor:
        return unary_op("neg", "neg", self, None)

    # A number on the left (``1 + x``) reaches these; the builder names it, as for ``x + 1``.
    def __radd__(self, other: object) -> Tensor:
        return _binary("add", "add", other, self, None)

    def __rsub__(self, other: object) -> Tensor:
        return _binary("sub", "sub", other, self, None)

    def __rmul__(self, other: object) -> Tensor:
        return _binary("mul", "mul", other, self, None)

    def __rtruediv__(self, other: object) -> Tensor:
        return _binary("div", "div", other, self, None)

    def __rmatmul__(self, other: object) -> Tensor:
        return matmul(other, self)  # type: ignore[arg-type]  # matmul names a non-tensor


class Hint:
    """A scope whose ops get one loop level (``slices``) and/or pinned splits (``work_division``).

    Made by :func:`hint`; single use. ``builder`` and ``ops`` are set while the scope is entered.
    """

    def __init__(self, slices: Mapping[Dim, int | str] | None = None,
                 work_division: Mapping[Dim, int] | None = None,
                 min: int | None = None, max: int | None = None,
                 split_k: int | str | Mapping[Dim, int] | None = None,
                 split_k_tile: int | Mapping[Dim, int] | None = None) -> None:
        for arg, value in (("slices", slices), ("work_division", work_division)):
            if value is not None and not isinstance(value, Mapping):
                raise ProgramError(f"hint {arg} must be a dict of dims made with ap.dim to "
                                   f"{'counts' if arg == 'slices' else 'splits'} (like {{A: 2}}), "
                                   f"got {type(value).__name__} {value!r}"[:200])
        self.slices = dict(slices or {})
        self.work_division = dict(work_division or {})
        self.split_k = _split_k_hint(split_k, split_k_tile)
        if not self.slices and not self.work_division and self.split_k is None:
            raise ProgramError("hint needs slices={dim: count}, work_division={dim: splits} or "
                               "split_k")
        for d in (*self.slices, *self.work_division):
            if not isinstance(d, Dim):
                raise ProgramError(f"hint keys must be dims made with ap.dim, got {d!r}")
        for d, n in self.slices.items():
            if not isinstance(n, int | str):
                raise ProgramError(f"hint slices: the count of dim {getattr(d, 'name', d)!r} "
                                   f"must be an int or a symbol name, got {n!r}"[:200])
        counts = list(dict.fromkeys(self.slices.values()))
        if len(counts) > 1:
            raise ProgramError(f"hint slices {_hint_text(self.slices)}: one hint is one loop level "
                               "with one count; nest hints for different counts")
        if (min is not None or max is not None) and not (counts and isinstance(counts[0], str)):
            raise ProgramError(f"hint slices {_hint_text(self.slices)}: min and max bound a "
                               "symbolic count (a name like \"T\"), not an int")
        bounds = {k: v for k, v in (("min", min), ("max", max)) if v is not None}
        self.level = LoopLevel(counts[0], tuple(d.name for d in self.slices), **bounds) \
            if counts else None
        for d, n in self.work_division.items():
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ProgramError(f"hint work_division: split of dim {d.name!r} must be a "
                                   f"positive int, got {n!r}")
        self.builder: ProgramBuilder | None = None
        self.ops: list[Op] = []
        self._token: Token[tuple[Hint, ...]] | None = None

    def __enter__(self) -> Hint:
        builder = _PROGRAM.get()
        if builder is None:
            raise ProgramError("ap.hint must be used inside `with ap.program(...)`")
        if self.builder is not None:
            raise ProgramError("a hint scope is single use; call ap.hint(...) again")
        for d in (*self.slices, *self.work_division, *self.split_k_dims):
            builder.register(d, "hint")
        self.builder = builder
        self._token = _HINTS.set((*_HINTS.get(), self))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _HINTS.reset(self._token)
            self._token = None

    @property
    def split_k_dims(self) -> tuple[Dim, ...]:
        pin = self.split_k
        return tuple(d for d, _ in (pin[1] if isinstance(pin, tuple) else ()))


#: a hint's split-K pin: slices, "?", or ("slices" | "tile", ((dim, n), ...)) per dim ("" dim:
#: the op's widest reduction dim)
_SplitKHint = int | str | tuple[str, tuple[tuple[Any, int], ...]]


def _split_k_hint(split_k: object, tile: object) -> _SplitKHint | None:
    """A hint's split-K pin, checked (the values again with each op, by ``Program``)."""
    if split_k is not None and tile is not None:
        raise ProgramError("hint takes split_k (slices) or split_k_tile (elements per slice), "
                           "not both")
    if tile is not None:
        if isinstance(tile, Mapping):
            if not tile or not all(isinstance(d, Dim) for d in tile):
                raise ProgramError(f"hint split_k_tile must map dims made with ap.dim to tile "
                                   f"sizes, got {tile!r}"[:200])
            return ("tile", tuple(tile.items()))
        return ("tile", (("", tile),))
    if split_k is None or split_k == SPLIT_K_AUTO or isinstance(split_k, int):
        return split_k  # type: ignore[return-value]
    if isinstance(split_k, Mapping) and split_k and all(isinstance(d, Dim) for d in split_k):
        return ("slices", tuple(split_k.items()))
    raise ProgramError(f"hint split_k must be slices (an int), \"?\" (the target decides) or "
                       f"a dict of dims made with ap.dim to slices, got {split_k!r}"[:200])


def _hint_text(slices: Mapping[Dim, Any]) -> str:
    return "{" + ", ".join(f"{d.name}: {n!r}" for d, n in slices.items()) + "}"


def hint(slices: Mapping[Dim, int | str] | None = None,
         work_division: Mapping[Dim, int] | None = None,
         min: int | None = None, max: int | None = None,
         split_k: int | str | Mapping[Dim, int] | None = None,
         split_k_tile: int | Mapping[Dim, int] | None = None) -> Hint:
    """Tile the ops made inside: ``with ap.hint(slices={A: 2}): ...`` loops twice over rows of A.

    Nested hints are nested loop levels, outermost first; consecutive ops with the same hint
    scopes form one tiling group. A count is an int or a symbol name; ``min`` and ``max`` bound
    a symbolic count (``ap.hint(slices={A: "T"}, min=4)``: tiles are planned for T = 4, the
    smallest it may be). ``work_division={A: 4}`` pins the split of A for each op made inside
    that uses A. ``split_k`` pins the reduction split of each reducing op made inside (the
    program's ``split_k``): slices of its widest reduction dim (``split_k=8``), ``"?"`` (the
    target's resolver decides) or slices per dim (``split_k={K: 4}``); ``split_k_tile`` gives
    tile sizes instead (``split_k_tile=512``: slices of 512 elements; ``{K: 512}`` per dim).
    """
    return Hint(slices, work_division, min, max, split_k, split_k_tile)


@dataclass(frozen=True)
class _Record:
    """An op as built, with the hint scopes it was made in (outermost first)."""

    op: Op
    scopes: tuple[Hint, ...]

    @property
    def loop_scopes(self) -> tuple[Hint, ...]:
        return tuple(s for s in self.scopes if s.level is not None)


class ProgramBuilder:
    """Collects inputs, ops and outputs of one program; read the result from :attr:`program`.

    >>> import apportion as ap
    >>> with program("p") as p:
    ...     x = p.input("x", [dim("T", 2), dim("H", 4)], "float16")
    ...     p.output(ap.relu(x))
    >>> p.program.outputs
    ('relu0_out',)
    """

    def __init__(self, name: str) -> None:
        self.name = check_name(name, "program")
        self._inputs: list[str] = []
        self._outputs: list[str] = []
        self._types: dict[str, TensorType] = {}
        self._records: list[_Record] = []
        self._sizes: dict[str, int] = {}  # dim name -> size
        self._letters: dict[tuple[str, int], str] = {}  # (dim name, occurrence in an op) -> letter
        self._token: Token[ProgramBuilder | None] | None = None
        self._closed = False  # its `with` block ended: the program is complete

    def __enter__(self) -> ProgramBuilder:
        if self._token is not None:
            raise ProgramError(f"program {self.name!r} is already active")
        if self._closed:
            raise ProgramError(f"program {self.name!r} is closed (its `with` block ended); "
                               "start a new one with ap.program(...)")
        self._token = _PROGRAM.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _PROGRAM.reset(self._token)
            self._token = None
        self._closed = True

    def input(self, name: str, dims: Sequence[Dim | int], dtype: str) -> Tensor:
        """A program input: ``x = p.input("x", [A, B], "float16")``; an int is an anonymous dim."""
        where = f"tensor {name!r}"
        self.check_open(where)
        if not isinstance(name, str) or not re.fullmatch(r"[^\[\],\s]+", name):
            raise ProgramError(f"{where}: a tensor name must be non-empty, without spaces, "
                               "brackets or commas")
        if name in self._types:
            raise ProgramError(f"{where}: name already used in program {self.name!r}")
        dims = as_tuple(dims, f"{where}: dims", "a list of Dims or positive ints")
        for axis, d in enumerate(dims):
            if not isinstance(d, Dim) and (isinstance(d, bool) or not isinstance(d, int) or d <= 0):
                raise ProgramError(f"{where}: axis {axis} must be a Dim or a positive int, "
                                   f"got {d!r}")
        full = tuple(d if isinstance(d, Dim) else anonymous_dim(d) for d in dims)
        for d in full:
            self.register(d, where)
        self._types[name] = TensorType(name, tuple(d.size for d in full), check_dtype(dtype, where))
        self._inputs.append(name)
        return Tensor(name, full, dtype, self)

    def output(self, *tensors: Tensor) -> None:
        """Mark tensors as program outputs: ``p.output(z)``."""
        self.check_open(f"output of program {self.name!r}")
        for t in tensors:
            self._own(t, f"output of program {self.name!r}")
            if t.name in self._outputs:
                raise ProgramError(f"tensor {t.name!r} is already an output of {self.name!r}")
            self._outputs.append(t.name)

    @property
    def program(self) -> Program:
        """The validated IR program of everything built so far (inputs first, then op results)."""
        produced = [self._types[r.op.out.tensor] for r in self._records]
        return Program(self.name, tuple(self._types[n] for n in self._inputs) + tuple(produced),
                       tuple(self._inputs), tuple(self._outputs),
                       tuple(r.op for r in self._records), self._tiling(), self._pins(),
                       self._split_k())

    # -- the op functions' interface (``builder_ops``), and internals ------------------------

    def check_open(self, what: str) -> None:
        """Refuse (naming ``what``) to add to a program whose ``with`` block ended."""
        if self._closed:
            raise ProgramError(f"{what}: program {self.name!r} is closed (its `with` block "
                               "ended), so it takes no more inputs, ops or outputs")

    def register(self, d: Dim, where: str) -> None:
        """Record the size of a named dim, refusing another size under the same name."""
        if d.anonymous:
            return
        known = self._sizes.setdefault(d.name, d.size)
        if known != d.size:
            raise ProgramError(f"{where}: dim {d.name!r} has size {d.size} here but {known} "
                               f"elsewhere in program {self.name!r}; a dim name means one size")

    def _own(self, t: object, where: str) -> Tensor:
        if not isinstance(t, Tensor):
            raise ProgramError(f"{where}: {t!r} is not a tensor; scalar constants are not "
                               "supported, make them inputs")
        if t.builder is not self:
            raise ProgramError(f"{where}: tensor {t.name!r} belongs to program "
                               f"{t.builder.name!r}, not {self.name!r}")
        return t

    def _letter(self, d: Dim, occurrence: int) -> str:
        key = (d.name, occurrence)
        if key not in self._letters:
            base = f"d{d.size}" if d.anonymous else re.sub(r"[^A-Za-z0-9_]", "_", d.name)
            if base[0].isdigit():
                base = "d" + base
            if occurrence:
                base += f"_{occurrence + 1}"
            taken = set(self._letters.values())
            letter = base
            for n in itertools.count(2):
                if letter not in taken:
                    break
                letter = f"{base}{n}"
            self._letters[key] = letter
        return self._letters[key]

    def slot_letters(self, slots: Sequence[Dim | None]) -> list[str | None]:
        """One letter per iteration slot of an op; a dim seen again in the op gets its own."""
        seen: dict[str, int] = {}
        out: list[str | None] = []
        for d in slots:
            if d is None:
                out.append(None)
                continue
            out.append(self._letter(d, seen.get(d.name, 0)))
            seen[d.name] = seen.get(d.name, 0) + 1
        return out

    def op_name(self, base: str, name: str | None) -> str:
        """``name`` checked unique, or the next free ``base<n>``."""
        if name is not None:
            if not isinstance(name, str) or not name:
                raise ProgramError(f"an op name must be a non-empty string, got {name!r}")
            if any(r.op.name == name for r in self._records):
                raise ProgramError(f"op {name!r}: name already used in program {self.name!r}")
            return name
        taken = {r.op.name for r in self._records}
        for n in itertools.count(len(self._records)):
            if f"{base}{n}" not in taken:
                return f"{base}{n}"
        raise AssertionError("unreachable")

    def add_op(self, op_name: str, fn: str, out_dims: tuple[Dim, ...],
               out_index: Sequence[AffineExpr],
               ins: Sequence[tuple[Tensor, Sequence[AffineExpr]]], sizes: dict[str, int],
               attrs: dict[str, str] | None = None) -> Tensor:
        """Add op ``op_name`` of kind ``fn`` writing a new tensor of ``out_dims`` at
        ``out_index`` from ``ins`` (each tensor with its index), over dims of ``sizes``; the
        hint scopes active here record it. Returns the tensor it writes."""
        out_name = f"{op_name}_out"
        while out_name in self._types:
            out_name += "_"
        op = Op.build(op_name, fn, Access(out_name, tuple(out_index)),
                      tuple(Access(t.name, tuple(ix)) for t, ix in ins), sizes, attrs)
        dtype = inferred_dtype(op, self._types)
        self._types[out_name] = TensorType(out_name, tuple(d.size for d in out_dims), dtype)
        scopes = tuple(s for s in _HINTS.get() if s.builder is self)
        for s in scopes:
            s.ops.append(op)
        self._records.append(_Record(op, scopes))
        return Tensor(out_name, out_dims, dtype, self)

    def _uses(self, op: Op, d: Dim) -> bool:
        return self._letters.get((d.name, 0)) in op.sizes

    def _tiling(self) -> tuple[TilingGroup, ...]:
        """Tiling groups from the hint scopes: consecutive ops whose loop scopes nest in one
        chain; an op made in the outer scopes only sits at a lesser depth of the same nest."""
        runs: list[tuple[list[Hint], list[_Record]]] = []
        for r in self._records:
            chain = list(r.loop_scopes)
            if not chain:
                runs.append(([], []))
                continue
            cur = runs[-1] if runs and runs[-1][0] else None
            if cur is not None and _nests(cur[0], chain):
                cur[0].extend(chain[len(cur[0]):])
                cur[1].append(r)
            else:
                runs.append((chain, [r]))
        groups: list[TilingGroup] = []
        for chain, records in runs:
            if not chain:
                continue
            ops = [r.op for r in records]
            names = tuple(o.name for o in ops)
            levels = []
            for depth, s in enumerate(chain):
                inside = [r.op for r in records if len(r.loop_scopes) > depth]
                scopes = {id(r.loop_scopes[depth]): r.loop_scopes[depth] for r in records
                          if len(r.loop_scopes) > depth}
                for scope in scopes.values():
                    for d in scope.slices:
                        if not any(self._uses(o, d) for o in inside):
                            raise ProgramError(
                                f"hint slices {_hint_text(scope.slices)}: no op of tiling group "
                                f"{list(names)} uses dim {d.name!r}")
                assert s.level is not None
                letters = tuple(self._letters[(d.name, 0)] for d in s.slices)
                levels.append(dataclasses.replace(s.level, dims=letters))
            depths = tuple((r.op.name, len(r.loop_scopes)) for r in records
                           if len(r.loop_scopes) < len(chain))
            groups.append(TilingGroup(names, tuple(levels), depths))
        return tuple(groups)

    def _pins(self) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
        scopes = dict.fromkeys(s for r in self._records for s in r.scopes if s.work_division)
        for s in scopes:
            for d in s.work_division:
                if not any(self._uses(o, d) for o in s.ops):
                    raise ProgramError(f"hint work_division {_hint_text(s.work_division)}: no op "
                                       f"inside uses dim {d.name!r}")
        pins = []
        for r in self._records:
            merged = {self._letters[(d.name, 0)]: n for s in r.scopes
                      for d, n in s.work_division.items() if self._uses(r.op, d)}
            if merged:
                pins.append((r.op.name, tuple(merged.items())))
        return tuple(pins)

    def _split_k(self) -> tuple[tuple[str, int | str | SplitKPin], ...]:
        """The split-K pins of the ops made in ``split_k`` hints (the innermost hint wins): each
        op with reduction dims, its dims named by the op's letters."""
        out = []
        scopes = dict.fromkeys(s for r in self._records for s in r.scopes if s.split_k is not None)
        for s in scopes:
            if not any(r.op.reduction_dims for r in self._records if s in r.scopes):
                raise ProgramError("hint split_k: no op inside reduces a dim")
        for r in self._records:
            pin = next((s.split_k for s in reversed(r.scopes) if s.split_k is not None), None)
            if pin is None or not r.op.reduction_dims:
                continue
            if isinstance(pin, tuple):
                what, given = pin
                dims = tuple((d if d == "" else self._letters.get((d.name, 0), d.name), n)
                             for d, n in given)
                pin = SplitKPin(tiles=dims) if what == "tile" else SplitKPin(slices=dims)
            out.append((r.op.name, pin))
        return tuple(out)


def _nests(chain: list[Hint], scopes: list[Hint]) -> bool:
    """True when an op made in ``scopes`` joins the nest of ``chain``: one is a prefix of the
    other (the same scope objects; another scope, even an equal one, is another nest)."""
    return all(a is b for a, b in zip(chain, scopes, strict=False))


def program(name: str) -> ProgramBuilder:
    """Start a program: ``with ap.program("fused") as p: ...``, then ``p.program``."""
    return ProgramBuilder(name)


# -- op construction: what every op function (here and in ``builder_ops``) goes through --------

def active_builder(what: str) -> ProgramBuilder:
    """The program of the innermost ``with ap.program(...)``; ``what`` names the caller in the
    error outside one."""
    b = _PROGRAM.get()
    if b is None:
        raise ProgramError(f"{what} must be used inside `with ap.program(...)`")
    return b


def start_op(base: str, name: str | None, *operands: object) -> tuple[ProgramBuilder, str]:
    """The operands' program and the op's name, after checking the operands are its tensors."""
    first = next((t for t in operands if isinstance(t, Tensor)), None)
    if first is None:
        raise ProgramError(f"{base}: needs a tensor operand, got {operands!r}")
    b = first.builder
    op_name = b.op_name(base, name)
    for t in operands:
        b._own(t, f"op {op_name!r}")
    b.check_open(f"op {op_name!r} on tensor {first.name!r}")
    return b, op_name


def as_tuple(value: object, what: str, expected: str) -> tuple[Any, ...]:
    """``value`` (a list or tuple) as a tuple, else a ProgramError naming ``what``."""
    if not isinstance(value, list | tuple):
        raise ProgramError(f"{what} must be {expected}, got {type(value).__name__} "
                           f"{value!r}"[:200])
    return tuple(value)


def same_dtype(op_name: str, x: Tensor, y: Tensor) -> None:
    """Refuse two operands of op ``op_name`` whose dtypes differ."""
    if x.dtype != y.dtype:
        raise ProgramError(f"op {op_name!r}: tensors {x.name!r} ({x.dtype}) and {y.name!r} "
                           f"({y.dtype}) have different dtypes; use ap.cast")


def common_dim(p: Dim, q: Dim) -> Dim | None:
    """The common dim of two axes: equal, or an anonymous dim of the same size as the other.

    >>> common_dim(dim("K", 64), anonymous_dim(64)), common_dim(dim("K", 64), dim("L", 64))
    (Dim(name='K', size=64), None)
    """
    if p == q:
        return p
    if p.size == q.size and (p.anonymous or q.anonymous):
        return q if p.anonymous else p
    return None


def index_of(letter: str | None) -> AffineExpr:
    """The index of an op's slot: its letter, or ``0`` for a size-1 dim (no letter).

    >>> str(index_of("A")), str(index_of(None))
    ('A', '0')
    """
    return _ZERO if letter is None else AffineExpr.dim(letter)


def _elementwise(b: ProgramBuilder, op_name: str, fn: str, ins: Sequence[Tensor],
                 out_dims: tuple[Dim, ...], attrs: dict[str, str] | None = None) -> Tensor:
    letters = b.slot_letters([d if d.size > 1 else None for d in out_dims])
    sizes = {lt: d.size for lt, d in zip(letters, out_dims, strict=True) if lt}
    accesses = []
    for t in ins:  # inputs align with the output's trailing axes; their size-1 axes read index 0
        off = len(out_dims) - len(t.dims)
        accesses.append((t, [index_of(letters[off + j] if d.size > 1 else None)
                             for j, d in enumerate(t.dims)]))
    return b.add_op(op_name, fn, out_dims, [index_of(lt) for lt in letters], accesses, sizes,
                    attrs)


def _binary(fn: str, base: str, x: object, y: object, name: str | None) -> Tensor:
    return broadcast_op(kind(fn, Category.POINTWISE), base, (x, y), name, {})


def broadcast_op(k: OpKind, base: str, operands: Sequence[object], name: str | None,
                 attrs: dict[str, str]) -> Tensor:
    """An elementwise op of ``k`` over ``operands`` broadcast against each other."""
    b, op_name = start_op(base, name, *operands)
    xs = [t for t in operands if isinstance(t, Tensor)]
    values = [xs[i] for i in k.value_inputs(len(xs))]
    for other in values[1:]:
        same_dtype(op_name, values[0], other)
    rank = max(len(t.dims) for t in xs)
    out: list[Dim] = []
    for axis in range(rank):
        axes = [t.dims[axis - rank + len(t.dims)] if axis - rank + len(t.dims) >= 0 else None
                for t in xs]
        m: Dim | None = None
        for t, p in zip(xs, axes, strict=True):
            if p is None:
                continue
            if m is None or m.size == 1:
                m, first = p, t
            elif p.size != 1:
                common = common_dim(m, p)
                if common is None:
                    raise ProgramError(
                        f"op {op_name!r}: tensor {first.name!r} dims {dims_text(first.dims)} "
                        f"and tensor {t.name!r} dims {dims_text(t.dims)} do not broadcast: "
                        f"dim {m} vs dim {p} at axis {axis}")
                m = common
        assert m is not None
        out.append(m)
    return _elementwise(b, op_name, k.name, xs, tuple(out), attrs)


def unary_op(fn: str, base: str, x: Tensor, name: str | None,
             attrs: dict[str, str] | None = None) -> Tensor:
    """An elementwise op of kind ``fn`` over ``x`` alone (its name from ``base``)."""
    b, op_name = start_op(base, name, x)
    return _elementwise(b, op_name, fn, (x,), x.dims, attrs)


def matmul(x: Tensor, w: Tensor, *, name: str | None = None) -> Tensor:
    """Contract the last dim of ``x`` with the first of ``w``: ``ap.matmul(x, w)`` or ``x @ w``.

    The two dims must be the same dim, or one anonymous with the size of the other.
    The result has ``x``'s other dims, then ``w``'s.
    """
    b, op_name = start_op("matmul", name, x, w)
    where = f"op {op_name!r}"
    if not x.dims or not w.dims:
        raise ProgramError(f"{where}: matmul needs tensors of rank >= 1, got {x.name!r} "
                           f"{dims_text(x.dims)} and {w.name!r} {dims_text(w.dims)}")
    same_dtype(op_name, x, w)
    k = common_dim(x.dims[-1], w.dims[0])
    if k is None:
        raise ProgramError(f"{where}: contraction dims differ: last dim {x.dims[-1]} of tensor "
                           f"{x.name!r} vs first dim {w.dims[0]} of tensor {w.name!r}")
    out_dims = x.dims[:-1] + w.dims[1:]
    letters = b.slot_letters([d if d.size > 1 else None for d in out_dims] + [k])
    sizes = {lt: d.size for lt, d in zip(letters, (*out_dims, k), strict=True) if lt}
    out_letters, kl = letters[:-1], letters[-1]
    split = len(x.dims) - 1
    x_index = [index_of(lt) for lt in (*out_letters[:split], kl)]
    w_index = [index_of(lt) for lt in (kl, *out_letters[split:])]
    return b.add_op(op_name, "matmul", out_dims, [index_of(lt) for lt in out_letters],
                    [(x, x_index), (w, w_index)], sizes)
