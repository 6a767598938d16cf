"""Affine index expressions, as every MLIR renderer writes them (``mlir.builder``): ``Ix``,
integer coefficients times SSA ``index`` values (or their floordiv, ceildiv and mod by
constants) plus a constant, rendered as the results of an ``affine_map``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Key = str | tuple[str, "Ix", int]  # an SSA value, or (floordiv|ceildiv|mod, expr, const)


@dataclass(frozen=True)
class Ix:
    """An affine index expression: integer coefficients times atoms plus a constant. An atom is
    an SSA ``index`` value or a floordiv, ceildiv or mod of an expression by a constant.

    >>> i = Ix.atom("%i")
    >>> (i * 3 + 2).render({"%i": "d0"}), (i + 2).floordiv(4).render({"%i": "d0"})
    ('d0 * 3 + 2', '(d0 + 2) floordiv 4')
    """

    const: int = 0
    terms: tuple[tuple[Key, int], ...] = ()

    @staticmethod
    def atom(name: str) -> Ix:
        return Ix(0, ((name, 1),))

    @staticmethod
    def of(value: IxLike) -> Ix:
        if isinstance(value, Ix):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"not an index: {value!r}")
        return Ix(value)

    @property
    def is_const(self) -> bool:
        return not self.terms

    @property
    def value(self) -> int:
        if self.terms:
            raise ValueError(f"{self} is not constant")
        return self.const

    @property
    def ssa(self) -> str | None:
        """The SSA value when the expression is exactly one."""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1 and isinstance(
                self.terms[0][0], str):
            return self.terms[0][0]
        return None

    def __add__(self, other: IxLike) -> Ix:
        o = Ix.of(other)
        merged: dict[Key, int] = dict(self.terms)
        for k, c in o.terms:
            merged[k] = merged.get(k, 0) + c
        return Ix(self.const + o.const, tuple((k, c) for k, c in merged.items() if c))

    __radd__ = __add__

    def __neg__(self) -> Ix:
        return Ix(-self.const, tuple((k, -c) for k, c in self.terms))

    def __sub__(self, other: IxLike) -> Ix:
        return self + (-Ix.of(other))

    def __rsub__(self, other: IxLike) -> Ix:
        return Ix.of(other) - self

    def __mul__(self, c: int) -> Ix:
        if isinstance(c, Ix):
            c = c.value
        if c == 0:
            return Ix(0)
        return Ix(self.const * c, tuple((k, v * c) for k, v in self.terms))

    __rmul__ = __mul__

    def _divides(self, c: int) -> bool:
        return self.const % c == 0 and all(v % c == 0 for _, v in self.terms)

    def floordiv(self, c: int) -> Ix:
        if self.is_const:
            return Ix(self.const // c)
        if c == 1:
            return self
        if self._divides(c):
            return Ix(self.const // c, tuple((k, v // c) for k, v in self.terms))
        return Ix(0, ((("floordiv", self, c), 1),))

    def ceildiv(self, c: int) -> Ix:
        if self.is_const:
            return Ix(-(-self.const // c))
        if c == 1 or self._divides(c):
            return self.floordiv(c)
        return Ix(0, ((("ceildiv", self, c), 1),))

    def mod(self, c: int) -> Ix:
        if self.is_const:
            return Ix(self.const % c)
        if c == 1 or self._divides(c):
            return Ix(0)
        return Ix(0, ((("mod", self, c), 1),))

    def atoms(self) -> list[str]:
        """The SSA values the expression uses, in order of appearance."""
        out: list[str] = []
        for k, _ in self.terms:
            for a in ([k] if isinstance(k, str) else k[1].atoms()):
                if a not in out:
                    out.append(a)
        return out

    def render(self, dims: Mapping[str, str]) -> str:
        """The affine expression with each SSA value replaced by its name in ``dims``."""
        parts: list[str] = []
        for k, c in self.terms:
            if isinstance(k, str):
                piece = dims[k]
            else:
                inner = k[1].render(dims)
                piece = f"({inner}) {k[0]} {k[2]}"
                if len(self.terms) > 1 or c != 1 or self.const:
                    piece = f"({piece})"
            mag = piece if abs(c) == 1 else f"{piece} * {abs(c)}"
            if not parts:
                parts.append(mag if c > 0 else f"-{mag}")
            else:
                parts.append(f"+ {mag}" if c > 0 else f"- {mag}")
        if self.const or not parts:
            if not parts:
                parts.append(str(self.const))
            else:
                parts.append(f"+ {self.const}" if self.const > 0 else f"- {-self.const}")
        return " ".join(parts)

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value with each SSA value taken from ``env`` (for tests of the geometry)."""
        total = self.const
        for k, c in self.terms:
            if isinstance(k, str):
                v = env[k]
            else:
                x = k[1].evaluate(env)
                v = {"floordiv": x // k[2], "ceildiv": -(-x // k[2]), "mod": x % k[2]}[k[0]]
            total += c * v
        return total

    def __str__(self) -> str:
        return self.render({a: a for a in self.atoms()})


IxLike = Ix | int


def affine_map(n_dims: int, results: Sequence[str]) -> str:
    """An ``affine_map`` of ``n_dims`` dims with these results.

    >>> affine_map(2, ["d0 * 4 + d1"])
    'affine_map<(d0, d1) -> (d0 * 4 + d1)>'
    """
    dims = ", ".join(f"d{i}" for i in range(n_dims))
    return f"affine_map<({dims}) -> ({', '.join(results)})>"
