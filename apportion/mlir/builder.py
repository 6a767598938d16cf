"""Text blocks of the parallel IR (``mlir.forall``): the lines of one region, the index
values it materializes (``affine.apply``, ``affine.min``, ``arith`` on ``index`` where an
expression is not affine), what every block of one function shares (SSA names, index
constants), and the start and size of a thread's slice of a dim."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from apportion.mlir.index import Ix, IxLike, _map
from apportion.mlir.text import SsaNames
from apportion.mlir.types import literal
from apportion.plans.views import dim_slices

INDENT = "  "


class _Block:
    """Lines of one region at one indentation, with the index values it has materialized
    (visible to its nested regions, not to its siblings)."""

    def __init__(self, fn: _Emitter, depth: int, parent: _Block | None = None) -> None:
        self.fn, self.depth, self.parent = fn, depth, parent
        self.lines: list[str] = []
        self.cache: dict[object, str] = {}

    def child(self) -> _Block:
        return _Block(self.fn, self.depth + 1, self)

    def emit(self, line: str) -> None:
        self.lines.append(INDENT * self.depth + line)

    def extend(self, block: _Block) -> None:
        self.lines.extend(block.lines)

    def fresh(self, stem: str) -> str:
        return self.fn.names.fresh(stem)

    def _cached(self, key: object) -> str | None:
        b: _Block | None = self
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

    def value(self, ix: IxLike, stem: str = "ix") -> str:
        """``ix`` as an SSA ``index`` value (constants at the top of the function)."""
        ix = Ix.of(ix)
        if ix.is_const:
            return self.fn.index_const(ix.value)
        if ix.ssa is not None:
            return ix.ssa
        found = self._cached(ix)
        if found is not None:
            return found
        atoms = ix.atoms()
        dims = {a: f"d{i}" for i, a in enumerate(atoms)}
        name = self.fresh(stem)
        self.emit(f"{name} = affine.apply {_map(len(atoms), [ix.render(dims)])}"
                  f"({', '.join(atoms)})")
        self.fn.defs[name] = lambda env, ix=ix: ix.evaluate(env)
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
        self.emit(f"{name} = affine.min {_map(len(atoms), [e.render(dims) for e in rest])}"
                  f"({', '.join(atoms)})")
        self.fn.defs[name] = lambda env, rest=rest: min(e.evaluate(env) for e in rest)
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
            self.fn.defs[found] = lambda env, a=a, b=b: fold(a.evaluate(env), b.evaluate(env))
            self.cache[key] = found
        return Ix.atom(found)

    # scalars in bodies

    def const(self, value: float | int | bool, ty: str) -> str:
        name = self.fresh("cst")
        self.emit(f"{name} = arith.constant {literal(value, ty)}")
        return name


class _Emitter:
    """What every block of one function shares: SSA names, index constants (printed at the top
    of the function), and how each index value it made is computed (``defs``, so that tests can
    evaluate the geometry without MLIR)."""

    def __init__(self) -> None:
        self.names = SsaNames()
        self.defs: dict[str, Callable[[Mapping[str, int]], int]] = {}
        self.consts: dict[int, str] = {}
        self.const_lines: list[str] = []
        self.templates = 0

    def evaluate(self, ix: IxLike, env: Mapping[str, int]) -> int:
        """The value of ``ix`` given the values of the thread and loop ids in ``env`` (index
        values the emitter made are computed from how it made them; for tests)."""
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


def slice_of(blk: _Block, n: IxLike, per: int, split: int, s: IxLike, stem: str = "s"
             ) -> tuple[Ix, Ix]:
    """(start, size) of slice ``s`` of a dim of ``n`` elements cut into ``split`` slices of
    whole units of ``per`` elements, larger slices first (``plans.views.dim_slices``);
    ``stem`` names the index values it makes."""
    n, s = Ix.of(n), Ix.of(s)
    if split == 1:
        return Ix(0), n
    if s.is_const:
        if not n.is_const:
            return _slice_general(blk, n, per, split, s, stem)
        lo, hi = dim_slices(n.value, per, split)[s.value]
        return Ix(lo), Ix(hi - lo)
    if n.is_const:
        sizes = [hi - lo for lo, hi in dim_slices(n.value, per, split)]
        if len(set(sizes)) == 1:  # even: static sizes
            return s * sizes[0], Ix(sizes[0])
        units = -(-n.value // per)
        base, extra = divmod(units, split)
        if base > 0:  # every slice holds units; only the last can be short (a padded unit)
            if extra == 0:
                start = s * (per * base)
                return start, blk.min([Ix(per * base), n - start], f"{stem}_len")
            start = blk.min([s * (per * (base + 1)), s * (per * base) + per * extra],
                            f"{stem}_lo")
            units_s = per * (base + 1) - (s + (split - extra)).floordiv(split) * per
            return start, blk.min([units_s, n - start], f"{stem}_len")
    return _slice_general(blk, n, per, split, s, stem)


def _slice_general(blk: _Block, n: Ix, per: int, split: int, s: Ix, stem: str
                   ) -> tuple[Ix, Ix]:
    # slices of a run-time size: start = min(per * (s * base + min(s, extra)), n)
    units = n.ceildiv(per)
    base, extra = units.floordiv(split), units.mod(split)
    lo_units = blk.mul(s, base) + blk.min([s, extra], f"{stem}_extra")
    hi_units = blk.mul(s + 1, base) + blk.min([s + 1, extra], f"{stem}_extra")
    start = blk.min([lo_units * per, n], f"{stem}_lo")
    stop = blk.min([hi_units * per, n], f"{stem}_hi")
    return start, stop - start
