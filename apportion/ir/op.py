"""Ops: a scalar function over an iteration space, each operand read through an index map."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from apportion.errors import ProgramError
from apportion.ir.affine import AffineExpr
from apportion.ir.dtypes import check_name
from apportion.ir.kinds import Category, OpKind, resolve

#: the most dims an op or a tensor may have: numpy's limit on an array's rank, which the
#: executors reach (a tensor, an op's iteration space); planning also walks one level per dim
MAX_DIMS = 64


@dataclass(frozen=True)
class Access:
    """One operand: a tensor and one index expression per tensor dim (``x[m, 128*h+d]``)."""

    tensor: str
    index: tuple[AffineExpr, ...]

    @staticmethod
    def parse(text: str) -> Access:
        """Parse ``"x[m, 128*h+d]"``; ``"s[]"`` is a rank-0 access."""
        expected = 'expected a tensor name then its indices, like "x[m, 128*h+d]" or "s[]"'
        if not isinstance(text, str):
            raise ProgramError(f"an access must be a string; {expected}; got a "
                               f"{type(text).__name__}")
        name, bracket, rest = text.strip().partition("[")
        name, body = name.strip(), rest[:-1]
        # exactly one [...] pair, closing the text: "x[m", "x[m]]", "x[m][k]" are refused
        if not bracket or not rest.endswith("]") or "[" in body or "]" in body:
            raise ProgramError(f"cannot parse access {text!r}: {expected}")
        # the builder's rule for tensor names: "x y[m]" and "[m]" are refused
        if not name or any(c in "[]," or c.isspace() for c in name):
            raise ProgramError(f"cannot parse access {text!r}: the tensor name must be "
                               "non-empty, without spaces, brackets or commas")
        if not body.strip():
            return Access(name, ())
        index = []
        for i, part in enumerate(body.split(",")):
            if not part.strip():  # "x[m,,k]", "x[m,]"
                raise ProgramError(f"cannot parse access {text!r}: index {i} is empty; "
                                   f"{expected}")
            try:
                index.append(AffineExpr.parse(part.strip()))
            except ProgramError as e:  # AffineExpr does not know the access it is part of
                raise ProgramError(f"cannot parse access {text!r}: {e}") from None
        return Access(name, tuple(index))

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
    >>> op.category, op.reduction_dims
    (<Category.MATMUL: 'matmul'>, ('k',))
    """

    name: str
    fn: str
    out: Access
    ins: tuple[Access, ...]
    dims: tuple[tuple[str, int], ...]
    attrs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        check_name(self.name, "op")
        where = f"op {self.name!r}"
        if len(self.dims) > MAX_DIMS:
            raise ProgramError(f"{where} has {len(self.dims)} dims; at most {MAX_DIMS} are "
                               "supported (numpy's limit on an array's rank)")
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
            if e.single_dim is None and (e.const or e.terms) and e.radix_digits(sizes) is None:
                raise ProgramError(
                    f"{where}: output {self.out.tensor!r} index {e.to_source()!r} must be one dim, "
                    "0, or a merge of dims that writes each index once (64*h+d with d of size 64)")
        out_dims = [d for e in self.out.index for d in e.dims]
        if len(set(out_dims)) != len(out_dims):
            raise ProgramError(f"{where}: output {self.out.tensor!r} repeats a dim in {self.out}")
        if not self.kind.divisible and any(e.single_dim is None and e.terms
                                           for e in self.out.index):
            raise ProgramError(f"{where}: fallback {self.kind.name} writes {self.out} through a "
                               "merge of dims; a fallback writes one dim (or literal 0) per axis")
        kind = self.kind
        if len(self.ins) != kind.arity:
            raise ProgramError(f"{where}: {kind.name} takes {kind.arity} input"
                               f"{'s' if kind.arity != 1 else ''}, got {len(self.ins)}")
        kind.check_attrs(dict(self.attrs), where)
        if kind.elementwise and self.reduction_dims:
            raise ProgramError(
                f"{where}: {kind.category} {kind.name} reads dims {self.reduction_dims} that the "
                f"output {self.out.tensor!r} does not index; use a reduction")
        if kind.category is Category.FALLBACK:
            self._check_fallback(where)

    def _check_fallback(self, where: str) -> None:
        if self.kind.whole:
            self._check_whole(where)
            return
        # a fallback runs whole; its output lays out the input's dims (a transpose at most)
        src = self.ins[0]
        if self.reduction_dims or sorted(self.out.dims) != sorted(src.dims):
            raise ProgramError(
                f"{where}: fallback {self.kind.name} writes {self.out} from {src}; its output "
                "must index exactly the dims of its input")
        if any(e.single_dim is None and e.terms for e in src.index):
            raise ProgramError(f"{where}: fallback {self.kind.name} reads {src} through a sum; "
                               "a fallback reads whole dims (or literal 0)")
        if len(set(src.dims)) != len(src.dims):
            raise ProgramError(f"{where}: fallback {self.kind.name} reads {src} with a dim twice")

    def _check_whole(self, where: str) -> None:
        # a whole-tensor fallback reads its inputs and writes its output as stored: every index
        # is a dim of its own or the literal 0 (program validation checks the sizes)
        for acc in (*self.ins, self.out):
            alone = [e.single_dim for e in acc.index]
            if any(d is None and (e.terms or e.const) for d, e in zip(alone, acc.index,
                                                                       strict=True)):
                raise ProgramError(f"{where}: fallback {self.kind.name} indexes {acc} through a "
                                   "sum or an offset; it reads and writes whole tensors, one dim "
                                   "(or literal 0) per axis")
            named = [d for d in alone if d is not None]
            if len(set(named)) != len(named):
                raise ProgramError(f"{where}: fallback {self.kind.name} indexes {acc} with a dim "
                                   "twice")

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

    @cached_property
    def out_digits(self) -> tuple[tuple[str, ...], ...]:
        """Per output axis, the dims that write it, outermost first (``()`` for a literal 0).

        An axis written through a merge (``y[t, 64*h+d]``) has several: the output is then
        the row-major view of the tensor with that axis split into them (``split_out``).
        """
        return tuple(e.radix_digits(self.sizes) or () if e.terms else () for e in self.out.index)

    @cached_property
    def merged_axes(self) -> tuple[bool, ...]:
        """Per output axis, whether it is written through a merge of dims (``64*h+d``; also a
        lone dim of size 1 with a coefficient, ``3*u``)."""
        return tuple(bool(e.terms) and e.single_dim is None for e in self.out.index)

    @property
    def merges_output(self) -> bool:
        """True when an output axis is written through a merge of dims (``merged_axes``)."""
        return any(self.merged_axes)

    @cached_property
    def split_out(self) -> Access:
        """The output as written: one dim (or literal 0) per axis of the split view.

        >>> op = Op.build("m", "copy", Access.parse("y[t,4*h+d]"), (Access.parse("x[t,h,d]"),),
        ...               {"t": 2, "h": 3, "d": 4})
        >>> str(op.split_out), op.split_shape((2, 12))
        ('y[t, h, d]', (2, 3, 4))
        """
        if not self.merges_output:
            return self.out
        index: list[AffineExpr] = []
        for e, ds, merged in zip(self.out.index, self.out_digits, self.merged_axes,
                                 strict=True):
            index.extend((AffineExpr.dim(d) for d in ds) if merged else (e,))
        return Access(self.out.tensor, tuple(index))

    def split_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The output tensor's ``shape`` with every merged axis split into its dims' sizes."""
        out: list[int] = []
        for n, ds, merged in zip(shape, self.out_digits, self.merged_axes, strict=True):
            out.extend(self.sizes[d] for d in ds) if merged else out.append(n)
        return tuple(out)

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
    def kind(self) -> OpKind:
        """The registry entry of this op's kind (see ``apportion.ir.kinds``)."""
        return resolve(self.fn, len(self.ins), bool(self.reduction_dims), self.attr("fn"))

    @property
    def category(self) -> Category:
        return self.kind.category

    @property
    def operands(self) -> tuple[Access, ...]:
        """Inputs then the output."""
        return (*self.ins, self.out)

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
