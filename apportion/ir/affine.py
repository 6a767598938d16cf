"""Affine index expressions and indexing maps (the access of an operand from the loop dims)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from apportion.errors import ProgramError


@dataclass(frozen=True)
class AffineExpr:
    """``sum(coeff * dim) + const`` with positive integer coefficients.

    >>> str(AffineExpr.parse("128*h+d"))
    '128*h + d'
    """

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    def __post_init__(self) -> None:
        seen = set()
        for dim, coeff in self.terms:
            if coeff <= 0:
                raise ProgramError(f"index coefficient of {dim!r} must be positive, got {coeff}")
            if dim in seen:
                raise ProgramError(f"dim {dim!r} appears twice in one index expression")
            seen.add(dim)
        if self.const < 0:
            raise ProgramError(f"index constant must be non-negative, got {self.const}")

    @staticmethod
    def dim(name: str) -> AffineExpr:
        return AffineExpr(((name, 1),), 0)

    @staticmethod
    def constant(value: int) -> AffineExpr:
        return AffineExpr((), value)

    @staticmethod
    def parse(text: str) -> AffineExpr:
        """Parse ``"m"``, ``"0"``, ``"128*h+d"``, ``"11008+f"``."""
        terms: list[tuple[str, int]] = []
        const = 0
        limit = sys.get_int_max_str_digits()  # 0: no limit
        if not text.strip():
            raise ProgramError("empty index expression")
        for part in text.split("+"):
            # spaces only around "+" and "*": "m k" is an error, not the dim "mk";
            # [0-9], not \d: \d also matches non-ASCII digits, which int() would accept
            m = re.fullmatch(r"\s*(?:(?:([0-9]+)\s*\*\s*)?([A-Za-z_][A-Za-z0-9_]*)|([0-9]+))\s*",
                             part)
            if not m:
                raise ProgramError(f"cannot parse index expression {text!r} at {part.strip()!r}")
            number = m.group(3) if m.group(3) is not None else m.group(1) or "1"
            if limit and len(number) > limit:  # int() would raise ValueError
                raise ProgramError(f"index expression {text[:40]!r}...: a number has "
                                   f"{len(number)} digits; at most {limit} are allowed")
            if m.group(3) is not None:
                const += int(number)
            else:
                terms.append((m.group(2), int(number)))
        if limit and const.bit_length() > 3 * limit:  # so str(const) cannot raise either
            raise ProgramError(f"index expression {text[:40]!r}...: its constant is too large "
                               f"(over {3 * limit} bits)")
        return AffineExpr(tuple(terms), const)

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(d for d, _ in self.terms)

    @property
    def single_dim(self) -> str | None:
        """The dim when the expression is one dim alone (coefficient 1, no constant)."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == 0:
            return self.terms[0][0]
        return None

    def radix_digits(self, sizes: dict[str, int]) -> tuple[str, ...] | None:
        """The dims outermost first when the expression is a mixed radix over ``sizes``
        (``64*h + d`` with ``d < 64``): every value in ``0 .. prod(sizes)-1`` is reached by
        exactly one point. None otherwise. Size-1 dims take any coefficient.

        >>> AffineExpr.parse("64*h+d").radix_digits({"h": 4, "d": 64})
        ('h', 'd')
        >>> AffineExpr.parse("64*h+d").radix_digits({"h": 4, "d": 65}) is None
        True
        """
        if self.const:
            return None
        ordered = sorted(self.terms, key=lambda t: (sizes[t[0]] > 1, t[1]))
        stride = 1
        for d, c in ordered:
            if sizes[d] == 1:
                continue
            if c != stride:
                return None
            stride *= sizes[d]
        return tuple(d for d, _ in reversed(ordered))

    def coeff(self, dim: str) -> int:
        return dict(self.terms).get(dim, 0)

    def max_value(self, sizes: dict[str, int]) -> int:
        """Largest value over the iteration space ``sizes``."""
        return self.const + sum(c * (sizes[d] - 1) for d, c in self.terms)

    def extent(self, extents: dict[str, int]) -> int:
        """Index values a box of per-dim ``extents`` touches (first to last, not a count)."""
        return 1 + sum(c * (extents[d] - 1) for d, c in self.terms)

    def __str__(self) -> str:
        parts = [d if c == 1 else f"{c}*{d}" for d, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)

    def to_source(self) -> str:
        """The compact form used in program files (``128*h+d``)."""
        return str(self).replace(" ", "")


@dataclass(frozen=True)
class IndexingMap:
    """An affine map from the op's loop dims to one operand's tensor dims.

    >>> str(IndexingMap(("m", "n", "k"), (AffineExpr.dim("m"), AffineExpr.dim("k"))))
    '(m, n, k) -> (m, k)'
    """

    dims: tuple[str, ...]
    results: tuple[AffineExpr, ...]

    def __post_init__(self) -> None:
        for r in self.results:
            for d in r.dims:
                if d not in self.dims:
                    raise ProgramError(f"index uses dim {d!r} not in the map's dims {self.dims}")

    @staticmethod
    def identity(dims: tuple[str, ...]) -> IndexingMap:
        return IndexingMap(dims, tuple(AffineExpr.dim(d) for d in dims))

    @staticmethod
    def permutation(dims: tuple[str, ...], order: tuple[int, ...]) -> IndexingMap:
        return IndexingMap(dims, tuple(AffineExpr.dim(dims[i]) for i in order))

    @property
    def used_dims(self) -> tuple[str, ...]:
        used = {d for r in self.results for d in r.dims}
        return tuple(d for d in self.dims if d in used)

    def __str__(self) -> str:
        return f"({', '.join(self.dims)}) -> ({', '.join(str(r) for r in self.results)})"
