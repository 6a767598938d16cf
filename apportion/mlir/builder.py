"""The one builder of MLIR text: names (``symbol_name``, ``alias_name``, SSA names unique across
a function), regions as blocks of lines, index arithmetic (``affine.apply``, ``affine.min``,
``arith`` on ``index`` where an expression is not affine, index constants at the top of the
function), scalar constants, and checking the text (``check_index``, ``verify_mlir``).

The renderers print MLIR as text and never build it through MLIR's Python bindings: text is
what every backend takes (iree-compile, mlir-opt, the CUDA build), it stays readable and
byte-stable (``tools/ir_snapshot.py``), and the renderers import no bindings. The bindings
shipped in iree-base-compiler are needed only to check the text; they are imported on first use.

>>> blk = Block(Builder(), 1)
>>> i = Ix.atom("%i")
>>> blk.value(i * 4 + 2), blk.value(i * 4 + 2), blk.value(3)
('%ix', '%ix', '%c3')
>>> print("\\n".join([*blk.builder.const_lines, *blk.lines]))
  %c3 = arith.constant 3 : index
  %ix = affine.apply affine_map<(d0) -> (d0 * 4 + 2)>(%i)
>>> verify_mlir('func.func @f() { "apportion.execute"() : () -> ()\\n return }')
>>> verify_mlir("func.func @f() { %x = nope }")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
apportion.errors.EmitError: emitted MLIR does not verify: ...
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence

from apportion.errors import EmitError
from apportion.mlir.index import Ix, IxLike, affine_map
from apportion.mlir.types import literal

INDENT = "  "


def symbol_name(name: str) -> str:
    """A valid MLIR identifier made from a tensor, op or program name.

    >>> symbol_name("model.layers-0"), symbol_name("0x")
    ('model.layers_0', '_0x')
    """
    out = re.sub(r"[^A-Za-z0-9_$.]", "_", name) or "t"
    return out if out[0].isalpha() or out[0] == "_" else f"_{out}"


#: the largest size, index or address MLIR holds: sizes and ``index`` values are signed 64-bit
INT64_MAX = 2**63 - 1


def check_index(value: int, what: str) -> int:
    """``value``, or an EmitError naming ``what`` when MLIR cannot hold it (past ``INT64_MAX``;
    the bindings would say only "invalid dimension").

    >>> check_index(2**63, "tensor 'x' dim 0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    apportion.errors.EmitError: tensor 'x' dim 0 is 9223372036854775808, past MLIR's limit ...
    """
    if value > INT64_MAX:
        raise EmitError(f"{what} is {value}, past MLIR's limit of 2**63 - 1 = {INT64_MAX} "
                        "(its sizes and index values are signed 64-bit)")
    return value


def alias_name(name: str) -> str:
    """An MLIR attribute alias name (after ``#``) made from a tensor name: a bare identifier
    without ``.`` (dotted alias names are reserved for dialects) or ``$``; the caller keeps
    aliases unique.

    >>> alias_name("tile_x.y"), alias_name("tile_a$b")
    ('tile_x_y', 'tile_a_b')
    """
    return symbol_name(name).replace(".", "_").replace("$", "_")


class SsaNames:
    """Hands out SSA names, unique across a function, so no region shadows another.

    >>> names = SsaNames()
    >>> names.fresh("x"), names.fresh("x"), names.fresh("a-b")
    ('%x', '%x_1', '%a_b')
    """

    def __init__(self) -> None:
        self.used: set[str] = set()

    def fresh(self, stem: str) -> str:
        stem = symbol_name(stem)
        for i in itertools.count():
            name = stem if i == 0 else f"{stem}_{i}"
            if name not in self.used:
                self.used.add(name)
                return f"%{name}"
        raise AssertionError("unreachable")


class Builder:
    """What every block of one function shares: SSA names, index constants (printed at the top
    of the function), how each index value it made is computed (``defs``, so that tests can
    evaluate the geometry without MLIR), and the count of body templates formatted (each
    gets its own prefix for its temporaries)."""

    def __init__(self) -> None:
        self.names = SsaNames()
        self.defs: dict[str, Callable[[Mapping[str, int]], int]] = {}
        self.consts: dict[int, str] = {}
        self.const_lines: list[str] = []
        self.templates = 0

    def evaluate(self, ix: IxLike, env: Mapping[str, int]) -> int:
        """The value of ``ix`` given the values of the thread and loop ids in ``env`` (index
        values the builder made are computed from how it made them; for tests)."""
        defs = self.defs

        class Resolver(dict[str, int]):
            def __missing__(self, key: str) -> int:
                value = defs[key](self)
                self[key] = value
                return value

        return Ix.of(ix).evaluate(Resolver(env))

    def index_const(self, v: int) -> str:
        if v not in self.consts:
            name = self.names.fresh(f"c{v}" if v >= 0 else f"cm{-v}")
            self.consts[v] = name
            self.const_lines.append(f"{INDENT}{name} = arith.constant {v} : index")
        return self.consts[v]

    def template_prefix(self) -> str:
        """A prefix for the temporaries of one more body template: ``-`` never occurs in names
        from ``SsaNames.fresh``, so they cannot collide."""
        self.templates += 1
        return f"b{self.templates}-"


class Block:
    """Lines of one region at one indentation, with the index values it has materialized
    (visible to its nested regions, not to its siblings)."""

    def __init__(self, builder: Builder, depth: int, parent: Block | None = None) -> None:
        self.builder, self.depth, self.parent = builder, depth, parent
        self.lines: list[str] = []
        self.cache: dict[object, str] = {}

    def child(self) -> Block:
        return Block(self.builder, self.depth + 1, self)

    def emit(self, line: str) -> None:
        self.lines.append(INDENT * self.depth + line)

    def extend(self, block: Block) -> None:
        self.lines.extend(block.lines)

    def fresh(self, stem: str) -> str:
        return self.builder.names.fresh(stem)

    def _cached(self, key: object) -> str | None:
        b: Block | None = self
        while b is not None:
            if key in b.cache:
                return b.cache[key]
            b = b.parent
        return None

    # index arithmetic: affine where it can be, arith where it cannot

    def operand(self, ix: IxLike, stem: str = "ix") -> str:
        """``ix`` as an operand of a mixed static/dynamic list (an int, or an SSA value)."""
        ix = Ix.of(ix)
        return str(ix.value) if ix.is_const else self.value(ix, stem)

    def operands(self, items: Sequence[Ix], stem: str = "ix") -> str:
        """``items`` as a mixed static/dynamic list (``[4, %n]``'s inside)."""
        return ", ".join(self.operand(i, stem) for i in items)

    def value(self, ix: IxLike, stem: str = "ix") -> str:
        """``ix`` as an SSA ``index`` value (constants at the top of the function)."""
        ix = Ix.of(ix)
        if ix.is_const:
            return self.builder.index_const(ix.value)
        if ix.ssa is not None:
            return ix.ssa
        found = self._cached(ix)
        if found is not None:
            return found
        atoms = ix.atoms()
        dims = {a: f"d{i}" for i, a in enumerate(atoms)}
        name = self.fresh(stem)
        self.emit(f"{name} = affine.apply {affine_map(len(atoms), [ix.render(dims)])}"
                  f"({', '.join(atoms)})")
        self.builder.defs[name] = lambda env, ix=ix: ix.evaluate(env)
        self.cache[ix] = name
        return name

    def min(self, items: Sequence[IxLike], stem: str = "min") -> Ix:
        """The least of ``items``: folded when constant, else one ``affine.min``."""
        exprs = list(dict.fromkeys(Ix.of(i) for i in items))
        consts = [e.value for e in exprs if e.is_const]
        rest = [e for e in exprs if not e.is_const]
        if consts:
            rest.append(Ix(min(consts)))
        if len(rest) == 1:
            return rest[0]
        key = ("min", tuple(rest))
        found = self._cached(key)
        if found is not None:
            return Ix.atom(found)
        atoms = list(dict.fromkeys(a for e in rest for a in e.atoms()))
        dims = {a: f"d{i}" for i, a in enumerate(atoms)}
        name = self.fresh(stem)
        self.emit(f"{name} = affine.min "
                  f"{affine_map(len(atoms), [e.render(dims) for e in rest])}"
                  f"({', '.join(atoms)})")
        self.builder.defs[name] = lambda env, rest=rest: min(e.evaluate(env) for e in rest)
        self.cache[key] = name
        return Ix.atom(name)

    def mul(self, a: IxLike, b: IxLike) -> Ix:
        """``a * b``: affine when one is constant, else ``arith.muli``."""
        a, b = Ix.of(a), Ix.of(b)
        if a.is_const or b.is_const:
            return a * b.value if b.is_const else b * a.value
        return self._arith("muli", a, b, lambda x, y: x * y)

    def div(self, a: IxLike, b: IxLike) -> Ix:
        """``a floordiv b`` of non-negative values: affine when ``b`` is constant, else
        ``arith.divui``."""
        a, b = Ix.of(a), Ix.of(b)
        if b.is_const:
            return a.floordiv(b.value)
        return self._arith("divui", a, b, lambda x, y: x // y)

    def _arith(self, op: str, a: Ix, b: Ix, fold: Callable[[int, int], int]) -> Ix:
        key = (op, a, b)
        found = self._cached(key)
        if found is None:
            va, vb = self.value(a), self.value(b)
            found = self.fresh(op)
            self.emit(f"{found} = arith.{op} {va}, {vb} : index")
            self.builder.defs[found] = lambda env, a=a, b=b: fold(a.evaluate(env),
                                                                  b.evaluate(env))
            self.cache[key] = found
        return Ix.atom(found)

    def index_op(self, op: str, x: str, y: str, stem: str = "ix") -> str:
        """``arith.<op>`` on two ``index`` SSA values, uncached (inside a body, where each
        element computes its own)."""
        name = self.fresh(stem)
        self.emit(f"{name} = arith.{op} {x}, {y} : index")
        return name

    def linalg_index(self, dim: int, stem: str) -> str:
        """The current point's index along ``dim`` of the enclosing ``linalg.generic``."""
        name = self.fresh(stem)
        self.emit(f"{name} = linalg.index {dim} : index")
        return name

    # scalars in bodies

    def const(self, value: float | int | bool, ty: str) -> str:
        name = self.fresh("cst")
        self.emit(f"{name} = arith.constant {literal(value, ty)}")
        return name


def verify_mlir(text: str) -> None:
    """Parse and verify ``text``; raise EmitError carrying the MLIR diagnostics when it fails.

    Unregistered ops are allowed, so that ``"apportion.execute"`` (generic syntax) passes; every
    other op must belong to a dialect the bindings register (func, scf, arith, affine, ...).
    """
    try:
        from iree.compiler import ir
    except ImportError as e:  # the package is a dependency; this guards broken installs
        raise EmitError(f"cannot verify MLIR: the iree-base-compiler bindings are missing ({e})"
                        ) from None
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    try:
        module = ir.Module.parse(text, ctx)
        module.operation.verify()
    except ir.MLIRError as e:
        notes = "; ".join(_diagnostic(d) for d in e.error_diagnostics) or str(e)
        raise EmitError(f"emitted MLIR does not verify: {notes}") from None


def _diagnostic(d: object) -> str:
    """One diagnostic with its location and notes on one line."""
    loc = str(getattr(d, "location", ""))
    notes = [str(n) for n in getattr(d, "notes", ())]
    return " ".join([f"{loc}: {d}" if loc else str(d), *(f"(note: {n})" for n in notes)])
