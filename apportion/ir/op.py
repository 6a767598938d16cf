"""Ops: a scalar function over an iteration space, each operand read through an index map."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from apportion.errors import ProgramError
from apportion.ir.affine import AffineExpr, IndexingMap

#: pointwise function -> number of inputs
POINTWISE: dict[str, int] = {
    "add": 2, "sub": 2, "mul": 2, "div": 2, "max": 2, "min": 2, "pow": 2,
    "neg": 1, "abs": 1, "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1,
    "sigmoid": 1, "relu": 1, "silu": 1, "gelu": 1, "copy": 1, "square": 1, "reciprocal": 1,
}
#: reduction function -> its identity (the value a fresh accumulator starts from)
REDUCTIONS: dict[str, float] = {
    "sum": 0.0, "mean": 0.0, "max": float("-inf"), "min": float("inf"), "prod": 1.0,
    "any": 0.0, "argmax": float("-inf"),
}
#: whole-tensor functions with no iteration-space model; they run on one core
FALLBACKS: frozenset[str] = frozenset({"sort", "cumsum", "flip"})

KINDS = ("pointwise", "reduction", "matmul", "fallback")


def op_kind(fn: str, n_ins: int, has_reduction_dims: bool) -> str:
    """Classify ``fn``; ``max``/``min`` are pointwise with two inputs, reductions with one."""
    if fn == "matmul":
        return "matmul"
    if fn == "fallback":
        return "fallback"
    if fn in REDUCTIONS and (fn not in POINTWISE or (n_ins == 1 and has_reduction_dims)):
        return "reduction"
    if fn in POINTWISE:
        return "pointwise"
    valid = sorted({*POINTWISE, *REDUCTIONS, "matmul", "fallback"})
    raise ProgramError(f"unknown op {fn!r}; valid: {', '.join(valid)}")


@dataclass(frozen=True)
class Access:
    """One operand: a tensor and one index expression per tensor dim (``x[m, 128*h+d]``)."""

    tensor: str
    index: tuple[AffineExpr, ...]

    @staticmethod
    def parse(text: str) -> Access:
        text = text.strip()
        if not text.endswith("]") or "[" not in text:
            raise ProgramError(f"cannot parse access {text!r}; expected name[i, j, ...]")
        name, _, rest = text.partition("[")
        body = rest[:-1].strip()
        index = tuple(AffineExpr.parse(p) for p in body.split(",")) if body else ()
        return Access(name.strip(), index)

    @property
    def dims(self) -> tuple[str, ...]:
        out: list[str] = []
        for e in self.index:
            out.extend(d for d in e.dims if d not in out)
        return tuple(out)

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(e.to_source() for e in self.index)}]"


@dataclass(frozen=True)
class Op:
    """An op over named loop dims.

    ``dims`` is the iteration space in order: the output's dims first, then the
    reduction dims in order of appearance.

    >>> op = Op.build("up", "matmul", Access.parse("h[m,n]"),
    ...               (Access.parse("x[m,k]"), Access.parse("w[k,n]")), {"m": 8, "n": 4, "k": 2})
    >>> op.kind, op.reduction_dims
    ('matmul', ('k',))
    """

    name: str
    fn: str
    out: Access
    ins: tuple[Access, ...]
    dims: tuple[tuple[str, int], ...]
    attrs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        where = f"op {self.name!r}"
        sizes = dict(self.dims)
        if len(sizes) != len(self.dims):
            raise ProgramError(f"{where}: a dim is listed twice in {self.dims}")
        for d, n in self.dims:
            if n <= 0:
                raise ProgramError(f"{where}: dim {d!r} has size {n}; sizes must be positive")
        for acc in (self.out, *self.ins):
            for d in acc.dims:
                if d not in sizes:
                    raise ProgramError(
                        f"{where}: tensor {acc.tensor!r} uses dim {d!r} of unknown size")
        for e in self.out.index:
            if e.single_dim is None and not (not e.terms and e.const == 0):
                raise ProgramError(
                    f"{where}: output {self.out.tensor!r} index {e.to_source()!r} must be one dim "
                    "or 0; writes through sums are not supported")
        out_dims = [e.single_dim for e in self.out.index if e.single_dim]
        if len(set(out_dims)) != len(out_dims):
            raise ProgramError(f"{where}: output {self.out.tensor!r} repeats a dim in {self.out}")
        kind = op_kind(self.fn, len(self.ins), bool(self.reduction_dims))
        if kind == "pointwise":
            if len(self.ins) != POINTWISE[self.fn]:
                raise ProgramError(
                    f"{where}: {self.fn} takes {POINTWISE[self.fn]} inputs, got {len(self.ins)}")
            if self.reduction_dims:
                raise ProgramError(
                    f"{where}: pointwise {self.fn} reads dims {self.reduction_dims} that the "
                    f"output {self.out.tensor!r} does not index; use a reduction")
        elif kind == "reduction" and len(self.ins) != 1:
            raise ProgramError(f"{where}: reduction {self.fn} takes 1 input, got {len(self.ins)}")
        elif kind == "matmul" and len(self.ins) != 2:
            raise ProgramError(f"{where}: matmul takes 2 inputs, got {len(self.ins)}")
        elif kind == "fallback" and dict(self.attrs).get("fn") not in FALLBACKS:
            raise ProgramError(
                f"{where}: fallback needs \"fn\" naming one of {', '.join(sorted(FALLBACKS))}")

    @staticmethod
    def build(name: str, fn: str, out: Access, ins: tuple[Access, ...],
              sizes: dict[str, int], attrs: dict[str, str] | None = None) -> Op:
        """Make an op, ordering its dims output-first from the accesses."""
        order: list[str] = list(out.dims)
        for a in ins:
            order.extend(d for d in a.dims if d not in order)
        order.extend(d for d in sizes if d not in order)
        missing = [d for d in order if d not in sizes]
        if missing:
            raise ProgramError(f"op {name!r}: size of dim {missing[0]!r} is unknown")
        return Op(name, fn, out, tuple(ins), tuple((d, sizes[d]) for d in order),
                  tuple(sorted((attrs or {}).items())))

    @cached_property
    def sizes(self) -> dict[str, int]:
        return dict(self.dims)

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(d for d, _ in self.dims)

    @cached_property
    def reduction_dims(self) -> tuple[str, ...]:
        out = set(self.out.dims)
        return tuple(d for d, _ in self.dims if d not in out)

    @property
    def parallel_dims(self) -> tuple[str, ...]:
        red = set(self.reduction_dims)
        return tuple(d for d, _ in self.dims if d not in red)

    @cached_property
    def kind(self) -> str:
        return op_kind(self.fn, len(self.ins), bool(self.reduction_dims))

    @property
    def operands(self) -> tuple[Access, ...]:
        """Inputs then the output."""
        return (*self.ins, self.out)

    def indexing_map(self, access: Access) -> IndexingMap:
        return IndexingMap(self.dim_names, access.index)

    @property
    def points(self) -> int:
        n = 1
        for _, s in self.dims:
            n *= s
        return n

    def attr(self, key: str, default: str | None = None) -> str | None:
        return dict(self.attrs).get(key, default)

    def __str__(self) -> str:
        ins = ", ".join(str(a) for a in self.ins)
        return f"{self.name}: {self.out} = {self.fn}({ins})"
