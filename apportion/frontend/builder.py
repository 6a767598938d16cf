"""The Python builder: named dims, tensors with operators, and hint scopes for coarse tiling.

>>> A, B = dim("A", 4), dim("B", 8)
>>> with program("demo") as p:
...     x = p.input("x", [A, B], "float16")
...     with hint(slices={A: 2}):
...         y = OP_FUNCTIONS["exp"](x) * x   # ap.exp(x) * x
...     p.output(y)
>>> [str(o) for o in p.program.ops]
['exp0: exp0_out[A, B] = exp(x[A, B])', 'mul1: mul1_out[A, B] = mul(exp0_out[A, B], x[A, B])']

Index letters come from dim names (sanitised to identifiers, unique in the program), so a dim
has the same letter in every op, which is what a tiling group's loop levels name. A size-1 axis
is indexed with a literal ``0`` (broadcast). The result is read from ``p.program``.

Every op kind of the registry (``apportion.ir.kinds``) with a builder name has a function here,
made from its entry (``OP_FUNCTIONS``; ``ap.exp``, ``ap.where``, ``ap.amax``, ...).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, Protocol

from apportion.errors import ProgramError
from apportion.frontend.json_format import inferred_dtype, number_attr
from apportion.ir.affine import AffineExpr
from apportion.ir.dtypes import check_dtype, check_name
from apportion.ir.kinds import Category, OpKind, builder_kinds, kind
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
    "BinaryOp", "Dim", "Hint", "ProgramBuilder", "Reduction", "Tensor", "UnaryOp",
    "avg_pool", "cast", "conv", "dim", "fill", "gather", "hint", "matmul", "max_pool", "merge",
    "program", "topk",
    *(k.builder for k in builder_kinds() if k.builder),
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


def _anonymous(size: int) -> Dim:
    return Dim(f"_{size}", size)


def _dims_text(dims: Sequence[Dim]) -> str:
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
        return _unary("neg", "neg", self, None)

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
            builder._register(d, "hint")
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
        self._check_open(where)
        if not isinstance(name, str) or not re.fullmatch(r"[^\[\],\s]+", name):
            raise ProgramError(f"{where}: a tensor name must be non-empty, without spaces, "
                               "brackets or commas")
        if name in self._types:
            raise ProgramError(f"{where}: name already used in program {self.name!r}")
        dims = _sequence(dims, f"{where}: dims", "a list of Dims or positive ints")
        for axis, d in enumerate(dims):
            if not isinstance(d, Dim) and (isinstance(d, bool) or not isinstance(d, int) or d <= 0):
                raise ProgramError(f"{where}: axis {axis} must be a Dim or a positive int, "
                                   f"got {d!r}")
        full = tuple(d if isinstance(d, Dim) else _anonymous(d) for d in dims)
        for d in full:
            self._register(d, where)
        self._types[name] = TensorType(name, tuple(d.size for d in full), check_dtype(dtype, where))
        self._inputs.append(name)
        return Tensor(name, full, dtype, self)

    def output(self, *tensors: Tensor) -> None:
        """Mark tensors as program outputs: ``p.output(z)``."""
        self._check_open(f"output of program {self.name!r}")
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

    # -- internals -------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ProgramError(f"{what}: program {self.name!r} is closed (its `with` block "
                               "ended), so it takes no more inputs, ops or outputs")

    def _register(self, d: Dim, where: str) -> None:
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

    def _slot_letters(self, slots: Sequence[Dim | None]) -> list[str | None]:
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

    def _op_name(self, base: str, name: str | None) -> str:
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

    def _add(self, op_name: str, fn: str, out_dims: tuple[Dim, ...],
             out_index: Sequence[AffineExpr], ins: Sequence[tuple[Tensor, Sequence[AffineExpr]]],
             sizes: dict[str, int], attrs: dict[str, str] | None = None) -> Tensor:
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


# -- op construction ---------------------------------------------------------------------------

def _start(base: str, name: str | None, *operands: object) -> tuple[ProgramBuilder, str]:
    """The operands' program and the op's name, after checking the operands are its tensors."""
    first = next((t for t in operands if isinstance(t, Tensor)), None)
    if first is None:
        raise ProgramError(f"{base}: needs a tensor operand, got {operands!r}")
    b = first.builder
    op_name = b._op_name(base, name)
    for t in operands:
        b._own(t, f"op {op_name!r}")
    b._check_open(f"op {op_name!r} on tensor {first.name!r}")
    return b, op_name


def _same_dtype(op_name: str, x: Tensor, y: Tensor) -> None:
    if x.dtype != y.dtype:
        raise ProgramError(f"op {op_name!r}: tensors {x.name!r} ({x.dtype}) and {y.name!r} "
                           f"({y.dtype}) have different dtypes; use ap.cast")


def _match(p: Dim, q: Dim) -> Dim | None:
    """The common dim of two axes: equal, or an anonymous dim of the same size as the other."""
    if p == q:
        return p
    if p.size == q.size and (p.anonymous or q.anonymous):
        return q if p.anonymous else p
    return None


def _ix(letter: str | None) -> AffineExpr:
    return _ZERO if letter is None else AffineExpr.dim(letter)


def _elementwise(b: ProgramBuilder, op_name: str, fn: str, ins: Sequence[Tensor],
                 out_dims: tuple[Dim, ...], attrs: dict[str, str] | None = None) -> Tensor:
    letters = b._slot_letters([d if d.size > 1 else None for d in out_dims])
    sizes = {lt: d.size for lt, d in zip(letters, out_dims, strict=True) if lt}
    accesses = []
    for t in ins:  # inputs align with the output's trailing axes; their size-1 axes read index 0
        off = len(out_dims) - len(t.dims)
        accesses.append((t, [_ix(letters[off + j] if d.size > 1 else None)
                             for j, d in enumerate(t.dims)]))
    return b._add(op_name, fn, out_dims, [_ix(lt) for lt in letters], accesses, sizes, attrs)


def _binary(fn: str, base: str, x: object, y: object, name: str | None) -> Tensor:
    return _nary(kind(fn, Category.POINTWISE), base, (x, y), name, {})


def _nary(k: OpKind, base: str, operands: Sequence[object], name: str | None,
          attrs: dict[str, str]) -> Tensor:
    """An elementwise op of ``k`` over ``operands`` broadcast against each other."""
    b, op_name = _start(base, name, *operands)
    xs = [t for t in operands if isinstance(t, Tensor)]
    values = [xs[i] for i in k.value_inputs(len(xs))]
    for other in values[1:]:
        _same_dtype(op_name, values[0], other)
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
                common = _match(m, p)
                if common is None:
                    raise ProgramError(
                        f"op {op_name!r}: tensor {first.name!r} dims {_dims_text(first.dims)} "
                        f"and tensor {t.name!r} dims {_dims_text(t.dims)} do not broadcast: "
                        f"dim {m} vs dim {p} at axis {axis}")
                m = common
        assert m is not None
        out.append(m)
    return _elementwise(b, op_name, k.name, xs, tuple(out), attrs)


def _unary(fn: str, base: str, x: Tensor, name: str | None,
           attrs: dict[str, str] | None = None) -> Tensor:
    b, op_name = _start(base, name, x)
    return _elementwise(b, op_name, fn, (x,), x.dims, attrs)


def _reduce(fn: str, base: str, x: Tensor, over: Dim | int, keepdim: bool,
            name: str | None) -> Tensor:
    b, op_name = _start(base, name, x)
    where, x_rank = f"op {op_name!r}", len(x.dims)
    if not isinstance(keepdim, bool):
        raise ProgramError(f"{where}: keepdim must be True or False, got "
                           f"{type(keepdim).__name__} {keepdim!r}"[:200])
    if isinstance(over, Dim):
        b._register(over, where)
        axes = [j for j, d in enumerate(x.dims) if d == over]
        if not axes:
            raise ProgramError(f"{where}: tensor {x.name!r} {_dims_text(x.dims)} has no dim "
                               f"{over.name!r} to reduce over")
        if len(axes) > 1:
            raise ProgramError(f"{where}: tensor {x.name!r} has dim {over.name!r} at axes "
                               f"{axes}; pass the axis index to reduce over")
        axis = axes[0]
    elif isinstance(over, int) and not isinstance(over, bool) and -x_rank <= over < x_rank:
        axis = over % x_rank
    else:
        raise ProgramError(f"{where}: cannot reduce tensor {x.name!r} {_dims_text(x.dims)} over "
                           f"{over!r}; give one of its dims or an axis index")
    letters = b._slot_letters([d if d.size > 1 or j == axis else None
                               for j, d in enumerate(x.dims)])
    sizes = {lt: d.size for lt, d in zip(letters, x.dims, strict=True) if lt}
    index = [_ix(lt) for lt in letters]
    out_index = [_ZERO if j == axis else e for j, e in enumerate(index) if keepdim or j != axis]
    out_dims = tuple(_anonymous(1) if j == axis else d for j, d in enumerate(x.dims)
                     if keepdim or j != axis)
    return b._add(op_name, fn, out_dims, out_index, [(x, index)], sizes)


class UnaryOp(Protocol):
    """An elementwise function of one tensor: ``ap.exp(x)``, ``ap.exp(x, name="e")``."""

    def __call__(self, x: Tensor, *, name: str | None = None) -> Tensor: ...


class BinaryOp(Protocol):
    """An elementwise function of two tensors with broadcast: ``ap.maximum(x, y)``."""

    def __call__(self, x: Tensor, y: Tensor, *, name: str | None = None) -> Tensor: ...


class Reduction(Protocol):
    """A reduction over a Dim of ``x`` (or an axis index): ``ap.sum(x, B)``.

    ``keepdim=True`` (the default, as softmax wants) keeps the dim as size 1 so the result
    broadcasts back against ``x``; ``keepdim=False`` drops it.
    """

    def __call__(self, x: Tensor, dim: Dim | int, *, keepdim: bool = True,
                 name: str | None = None) -> Tensor: ...


def _number_attrs(k: OpKind, where: str, attrs: dict[str, object]) -> dict[str, str]:
    out = {}
    for key, value in attrs.items():
        if key not in k.attrs:
            valid = ", ".join(k.attrs) or "none"
            raise ProgramError(f"{where}: {k.name} takes no attribute {key!r}; attributes: {valid}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProgramError(f"{where}: attribute {key!r} must be a number, got {value!r}")
        out[key] = number_attr(value)
    return out


def _kind_function(k: OpKind) -> Callable[..., Tensor]:
    """The builder function of one registry kind (its ``builder`` name)."""
    base = k.builder or k.name
    if k.category is Category.REDUCTION:
        def reduction(x: Tensor, dim: Dim | int, *, keepdim: bool = True,
                      name: str | None = None) -> Tensor:
            return _reduce(k.name, base, x, dim, keepdim, name)
        fn: Callable[..., Tensor] = reduction
        doc = (f"{k.doc[0].upper()}{k.doc[1:]}: ``ap.{base}(x, B)``. ``keepdim=True`` (default) "
               "keeps ``dim`` as size 1.")
    elif k.category is Category.FALLBACK:
        def whole(x: Tensor, *, name: str | None = None) -> Tensor:
            return _unary(k.name, base, x, name)
        fn = whole
        doc = f"{k.doc[0].upper()}{k.doc[1:]}, on one core (a fallback): ``ap.{base}(x)``."
    else:
        def elementwise(*xs: Tensor, name: str | None = None, **attrs: object) -> Tensor:
            if len(xs) != k.arity:
                raise ProgramError(f"ap.{base} takes {k.arity} tensor"
                                   f"{'s' if k.arity != 1 else ''}, got {len(xs)}")
            return _nary(k, base, xs, name, _number_attrs(k, f"ap.{base}", attrs))
        fn = elementwise
        doc = f"Elementwise {k.doc}, with broadcast."
    fn.__name__ = fn.__qualname__ = base
    fn.__doc__ = doc
    return fn


#: builder name -> function, one per registry kind that has a builder name
OP_FUNCTIONS: dict[str, Callable[..., Tensor]] = {k.builder: _kind_function(k)
                                                  for k in builder_kinds() if k.builder}


def __getattr__(name: str) -> Callable[..., Tensor]:
    # module attributes, not globals: ``sum``, ``any``, ``abs`` must not shadow the builtins here
    try:
        return OP_FUNCTIONS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def cast(x: Tensor, dtype: str, *, name: str | None = None) -> Tensor:
    """A copy of ``x`` with element type ``dtype``: ``ap.cast(x, "float32")``."""
    return _unary("copy", "cast", x, name, {"dtype": check_dtype(dtype, "ap.cast")})


def merge(x: Tensor, dims: Sequence[Dim], into: Dim | None = None, *,
          name: str | None = None) -> Tensor:
    """A copy of ``x`` with the consecutive ``dims`` merged into one (``into``, or an anonymous
    dim of their product), the first outermost: heads side by side, ``ap.merge(o, (H, D))``
    writes ``y[t, 64*h+d] = o[t, h, d]``, an output written through a merge of dims.

    >>> T, H, D = dim("T", 4), dim("H", 2), dim("D", 64)
    >>> with program("m") as p:
    ...     y = merge(p.input("o", [T, H, D], "float16"), (H, D))
    ...     p.output(y)
    >>> str(p.program.ops[0])
    'merge0: merge0_out[T, 64*H+D] = copy(o[T, H, D])'
    """
    b, op_name = _start("merge", name, x)
    where = f"op {op_name!r}"
    dims = _sequence(dims, f"{where}: dims", "a tuple of dims to merge")
    if into is not None and not isinstance(into, Dim):
        raise ProgramError(f"{where}: into must be a Dim made with ap.dim, or None; got "
                           f"{type(into).__name__} {into!r}"[:200])
    names = [d.name for d in x.dims]
    if len(dims) < 2 or any(not isinstance(d, Dim) for d in dims):
        raise ProgramError(f"{where}: merge needs two or more dims of {x.name!r} "
                           f"{_dims_text(x.dims)}, got {dims!r}")
    first = next((i for i, d in enumerate(x.dims) if d == dims[0]), None)
    if first is None or tuple(x.dims[first:first + len(dims)]) != dims:
        raise ProgramError(f"{where}: dims {_dims_text(dims)} are not consecutive dims of "
                           f"{x.name!r} {_dims_text(x.dims)} ({', '.join(names)})")
    size = math.prod(d.size for d in dims)
    merged = into if into is not None else _anonymous(size)
    if merged.size != size:
        raise ProgramError(f"{where}: merging {_dims_text(dims)} gives {size} elements, but "
                           f"dim {merged} has {merged.size}")
    letters = b._slot_letters([d if d.size > 1 else None for d in x.dims])
    sizes = {lt: d.size for lt, d in zip(letters, x.dims, strict=True) if lt}
    stride, terms = 1, []
    for lt, d in reversed(list(zip(letters[first:first + len(dims)], dims, strict=True))):
        if lt is not None:
            terms.append((lt, stride))
        stride *= d.size
    out_index = [_ix(lt) for lt in letters[:first]]
    out_index.append(AffineExpr(tuple(reversed(terms))) if terms else _ZERO)
    out_index += [_ix(lt) for lt in letters[first + len(dims):]]
    out_dims = (*x.dims[:first], merged, *x.dims[first + len(dims):])
    return b._add(op_name, "copy", out_dims, out_index,
                  [(x, [_ix(lt) for lt in letters])], sizes)


def matmul(x: Tensor, w: Tensor, *, name: str | None = None) -> Tensor:
    """Contract the last dim of ``x`` with the first of ``w``: ``ap.matmul(x, w)`` or ``x @ w``.

    The two dims must be the same dim, or one anonymous with the size of the other.
    The result has ``x``'s other dims, then ``w``'s.
    """
    b, op_name = _start("matmul", name, x, w)
    where = f"op {op_name!r}"
    if not x.dims or not w.dims:
        raise ProgramError(f"{where}: matmul needs tensors of rank >= 1, got {x.name!r} "
                           f"{_dims_text(x.dims)} and {w.name!r} {_dims_text(w.dims)}")
    _same_dtype(op_name, x, w)
    k = _match(x.dims[-1], w.dims[0])
    if k is None:
        raise ProgramError(f"{where}: contraction dims differ: last dim {x.dims[-1]} of tensor "
                           f"{x.name!r} vs first dim {w.dims[0]} of tensor {w.name!r}")
    out_dims = x.dims[:-1] + w.dims[1:]
    letters = b._slot_letters([d if d.size > 1 else None for d in out_dims] + [k])
    sizes = {lt: d.size for lt, d in zip(letters, (*out_dims, k), strict=True) if lt}
    out_letters, kl = letters[:-1], letters[-1]
    split = len(x.dims) - 1
    x_index = [_ix(lt) for lt in (*out_letters[:split], kl)]
    w_index = [_ix(lt) for lt in (kl, *out_letters[split:])]
    return b._add(op_name, "matmul", out_dims, [_ix(lt) for lt in out_letters],
                  [(x, x_index), (w, w_index)], sizes)


# -- constants, convolution, pooling, top-k, gather (their structure is in their accesses) ----

def _sequence(value: object, what: str, expected: str) -> tuple[Any, ...]:
    """``value`` (a list or tuple) as a tuple, else a ProgramError naming ``what``."""
    if not isinstance(value, list | tuple):
        raise ProgramError(f"{what} must be {expected}, got {type(value).__name__} "
                           f"{value!r}"[:200])
    return tuple(value)


def _active(what: str) -> ProgramBuilder:
    b = _PROGRAM.get()
    if b is None:
        raise ProgramError(f"{what} must be used inside `with ap.program(...)`")
    return b


def _window(x: Tensor, axes: Sequence[Dim | int], what: str) -> list[int]:
    """Axis indices of ``x`` named by dims or indices."""
    out = []
    for a in _sequence(axes, f"{what}: axes", "a list of dims or axis indices"):
        if isinstance(a, Dim):
            hits = [j for j, d in enumerate(x.dims) if d == a]
            if len(hits) != 1:
                raise ProgramError(f"{what}: tensor {x.name!r} {_dims_text(x.dims)} has "
                                   f"{'no' if not hits else 'more than one'} dim {a.name!r}")
            out.append(hits[0])
        elif isinstance(a, int) and not isinstance(a, bool) and -len(x.dims) <= a < len(x.dims):
            out.append(a % len(x.dims))
        else:
            raise ProgramError(f"{what}: {a!r} is not a dim or an axis of tensor {x.name!r}")
    return out


def _sum(*parts: tuple[int, str | None]) -> AffineExpr:
    """``coeff * letter + ...`` (a None letter: a size-1 dim, index 0)."""
    terms = tuple((lt, c) for c, lt in parts if lt is not None)
    return AffineExpr(terms, 0)


def fill(dims: Sequence[Dim | int], value: float, dtype: str = "float32", *,
         name: str | None = None) -> Tensor:
    """A constant tensor: ``ap.fill([A, B], 0.0, "float16")``, divided over cores like any
    pointwise op (kind ``fill``)."""
    b = _active("ap.fill")
    op_name = b._op_name("fill", name)
    b._check_open(f"op {op_name!r}")
    where = f"op {op_name!r}"
    dims = _sequence(dims, f"{where}: dims", "a list of Dims or positive ints")
    for axis, d in enumerate(dims):
        if not isinstance(d, Dim) and (isinstance(d, bool) or not isinstance(d, int) or d <= 0):
            raise ProgramError(f"{where}: axis {axis} must be a Dim or a positive int, got {d!r}")
    full = tuple(d if isinstance(d, Dim) else _anonymous(d) for d in dims)
    for d in full:
        b._register(d, where)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProgramError(f"{where}: value must be a number, got {value!r}")
    letters = b._slot_letters([d if d.size > 1 else None for d in full])
    sizes = {lt: d.size for lt, d in zip(letters, full, strict=True) if lt}
    return b._add(op_name, "fill", full, [_ix(lt) for lt in letters], [], sizes,
                  {"value": number_attr(value), "dtype": check_dtype(dtype, where)})


def conv(x: Tensor, w: Tensor, *, stride: int = 1, name: str | None = None) -> Tensor:
    """A convolution without padding, as a matmul over index sums (kind ``conv``).

    ``x`` is ``[*spatial, C]`` and ``w`` ``[*window, C, F]`` with one window dim per spatial dim
    (1-D or 2-D); the result is ``[*out, F]`` with ``out = (size - window) // stride + 1``:
    ``y[o, f] = sum over k, c of x[stride*o + k, c] * w[k, c, f]``.
    """
    b, op_name = _start("conv", name, x, w)
    where = f"op {op_name!r}"
    _same_dtype(op_name, x, w)
    n = len(x.dims) - 1
    if n < 1 or len(w.dims) != n + 2:
        raise ProgramError(f"{where}: conv takes x [*spatial, C] and w [*window, C, F] with one "
                           f"window dim per spatial dim; got {x.name!r} {_dims_text(x.dims)} "
                           f"and {w.name!r} {_dims_text(w.dims)}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ProgramError(f"{where}: stride must be a positive int, got {stride!r}")
    c = _match(x.dims[-1], w.dims[n])
    if c is None:
        raise ProgramError(f"{where}: channels differ: {x.dims[-1]} of {x.name!r} vs "
                           f"{w.dims[n]} of {w.name!r}")
    out_sizes = [(x.dims[i].size - w.dims[i].size) // stride + 1 for i in range(n)]
    if any(s < 1 for s in out_sizes):
        raise ProgramError(f"{where}: window {_dims_text(w.dims[:n])} is larger than the input "
                           f"{_dims_text(x.dims[:n])}")
    out_dims = (*(_anonymous(s) for s in out_sizes), w.dims[-1])
    window = w.dims[:n]
    letters = b._slot_letters([d if d.size > 1 else None for d in (*out_dims, *window, c)])
    outs, fl = letters[:n], letters[n]
    ks, cl = letters[n + 1:2 * n + 1], letters[2 * n + 1]
    sizes = {lt: d.size for lt, d in zip(letters, (*out_dims, *window, c), strict=True) if lt}
    x_index = [_sum((stride, o), (1, k)) for o, k in zip(outs, ks, strict=True)] + [_ix(cl)]
    w_index = [*(_ix(k) for k in ks), _ix(cl), _ix(fl)]
    return b._add(op_name, "conv", out_dims, [*(_ix(o) for o in outs), _ix(fl)],
                  [(x, x_index), (w, w_index)], sizes)


def _pool(fn: str, x: Tensor, axes: Sequence[Dim | int], window: int | Sequence[int],
          stride: int | Sequence[int] | None, name: str | None) -> Tensor:
    b, op_name = _start(fn, name, x)
    where = f"op {op_name!r}"
    pooled = _window(x, axes, where)
    if not isinstance(window, int | list | tuple) or not isinstance(stride,
                                                                   int | list | tuple | None):
        raise ProgramError(f"{where}: window and stride must be ints or lists of ints, got "
                           f"window {window!r}, stride {stride!r}"[:200])
    wins = [window] * len(pooled) if isinstance(window, int) else list(window)
    steps = wins if stride is None else ([stride] * len(pooled) if isinstance(stride, int)
                                         else list(stride))
    if len(wins) != len(pooled) or len(steps) != len(pooled) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (*wins, *steps)):
        raise ProgramError(f"{where}: give one positive window (and stride) per pooled axis, "
                           f"got window {window!r}, stride {stride!r}")
    out_dims = list(x.dims)
    for j, k, s in zip(pooled, wins, steps, strict=True):
        size = (x.dims[j].size - k) // s + 1
        if size < 1:
            raise ProgramError(f"{where}: window {k} is larger than axis {j} of {x.name!r}")
        out_dims[j] = _anonymous(size)
    windows = [_anonymous(k) for k in wins]
    letters = b._slot_letters([d if d.size > 1 else None for d in (*out_dims, *windows)])
    outs, ks = letters[:len(out_dims)], letters[len(out_dims):]
    sizes = {lt: d.size for lt, d in zip(letters, (*out_dims, *windows), strict=True) if lt}
    x_index = [_ix(lt) for lt in outs]
    for (j, s), k in zip(zip(pooled, steps, strict=True), ks, strict=True):
        x_index[j] = _sum((s, outs[j]), (1, k))
    return b._add(op_name, fn, tuple(out_dims), [_ix(lt) for lt in outs], [(x, x_index)], sizes)


def max_pool(x: Tensor, axes: Sequence[Dim | int], window: int | Sequence[int],
             stride: int | Sequence[int] | None = None, *, name: str | None = None) -> Tensor:
    """Max pooling without padding over ``axes`` of ``x`` (stride defaults to the window):
    ``y[o, c] = max over k of x[stride*o + k, c]`` (kind ``max_pool``, a reduction)."""
    return _pool("max_pool", x, axes, window, stride, name)


def avg_pool(x: Tensor, axes: Sequence[Dim | int], window: int | Sequence[int],
             stride: int | Sequence[int] | None = None, *, name: str | None = None) -> Tensor:
    """Average pooling without padding: ``y[o, c] = mean over k of x[stride*o + k, c]``."""
    return _pool("avg_pool", x, axes, window, stride, name)


def topk(x: Tensor, k: int, *, name: str | None = None) -> Tensor:
    """The ``k`` largest along the last axis, largest first: a fallback, whole, on one core."""
    b, op_name = _start("topk", name, x)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= x.dims[-1].size:
        raise ProgramError(f"op {op_name!r}: k must be an int in 1..{x.dims[-1].size}, got {k!r}")
    out_dims = (*x.dims[:-1], _anonymous(k))
    letters = b._slot_letters([*x.dims, out_dims[-1]])
    sizes = {lt: d.size for lt, d in zip(letters, (*x.dims, out_dims[-1]), strict=True) if lt}
    return b._add(op_name, "topk", out_dims, [*(_ix(lt) for lt in letters[:-2]),
                                              _ix(letters[-1])],
                  [(x, [_ix(lt) for lt in letters[:-1]])], sizes)


def gather(table: Tensor, ids: Tensor, *, name: str | None = None) -> Tensor:
    """Rows of ``table`` picked by the integer ``ids`` (an embedding): the result is
    ``ids.dims + table.dims[1:]``; a fallback, whole, on one core (kind ``gather``)."""
    b, op_name = _start("gather", name, table, ids)
    out_dims = (*ids.dims, *table.dims[1:])
    letters = b._slot_letters([*table.dims, *ids.dims])
    t_l, i_l = letters[:len(table.dims)], letters[len(table.dims):]
    sizes = {lt: d.size for lt, d in zip(letters, (*table.dims, *ids.dims), strict=True)}
    return b._add(op_name, "gather", out_dims, [*(_ix(lt) for lt in i_l),
                                                *(_ix(lt) for lt in t_l[1:])],
                  [(table, [_ix(lt) for lt in t_l]), (ids, [_ix(lt) for lt in i_l])], sizes)


#: builder functions whose structure is their accesses, exported with the registry's ones
OP_FUNCTIONS.update({"fill": fill, "conv": conv, "max_pool": max_pool, "avg_pool": avg_pool,
                     "topk": topk, "gather": gather, "merge": merge})
