"""The PyTorch frontend's core: torch values as apportion tensors read through index maps.

A torch value (``Value``) is an apportion tensor read through an affine index map. Each torch
dim is a mixed radix of *digits* (outermost first: ``index = 64*h + d`` for a dim of digits
``h: 4, d: 64``), and each axis of the tensor is an affine form of the digits. Views only
change that description: a permute reorders dims, a slice offsets or fixes digits, an expand
adds a digit nobody reads, a view that splits a dim splits its digits, and one that merges dims
``[t, h, d] -> [t, h*d]`` gives the merged dim the digits ``h, d``. No op is made for them; the
next op reads the tensor through the map (``x[t, 64*h+d]``) and iterates over the digits.

An op (``Lowering.op``) is built over torch-level *axes*: each operand maps its dims to axes,
the digits of an axis are the common refinement of its operands' digits (``[4, 64]`` and
``[256]`` give ``[4, 64]``), each digit becomes one loop dim of the op, and the output is
written one digit per tensor axis, so its stored row-major order is torch's (a *canonical*
layout). Only what has no affine form needs data movement: a copy (``contiguous``) and, for a
view that splits digits no affine map can name, a ``reshape`` fallback (``plain``).

``torch_aten`` lowers each ATen op with these; ``torch_export`` is the entry. This module
imports no torch.

>>> lw = Lowering("demo")
>>> x = lw.input("x", "float32", (8, 256))
>>> heads = permute(view(x, (8, 4, 64)), (1, 0, 2))   # [4, 8, 64]: no op
>>> lw.at(Origin("exp_1", "aten.exp.default"))        # the torch node being lowered
>>> y = lw.elementwise("exp", [heads])
>>> str(lw.ops[0])
'exp_1: exp_1[a, b, c] = exp(x[b, 64*a+c])'
>>> merged = view(permute(y, (1, 0, 2)), (8, 256))    # back to [t, h*d]: no op either
>>> [tuple(n for _, n in ds) for ds in merged.digits]
[(8,), (4, 64)]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apportion.errors import ProgramError
from apportion.ir.affine import AffineExpr
from apportion.ir.dtypes import DTYPE_BYTES
from apportion.ir.kinds import Category
from apportion.ir.op import Access, Op
from apportion.ir.program import TensorType

#: one digit of a torch dim: (id, size)
Digit = tuple[int, int]

#: the most bytes of one tensor a whole-tensor fallback may make or gather from: it runs whole,
#: on one core, which must address all of it. Half Spyre's 256 MiB span limit, the smallest of
#: any preset, leaving room for layout padding. Larger constants are planned ``fill`` ops
#: (``Lowering.fill``); larger embedding tables are gathered in row blocks (``torch_export``).
BLOCK_BYTES = 128 * 2**20

_IDS = itertools.count()
_ZERO = AffineExpr.constant(0)


def fresh() -> int:
    """A new digit id (ids only need to differ within one value)."""
    return next(_IDS)


@dataclass(frozen=True)
class Lin:
    """``sum(coeff * digit) + const`` over digit ids."""

    terms: tuple[tuple[int, int], ...] = ()
    const: int = 0

    def subst(self, by: Mapping[int, Lin]) -> Lin:
        """Each digit in ``by`` replaced by its form there."""
        acc: dict[int, int] = {}
        const = self.const
        for d, c in self.terms:
            parts = by.get(d, Lin(((d, 1),)))
            const += c * parts.const
            for e, c2 in parts.terms:
                acc[e] = acc.get(e, 0) + c * c2
        return Lin(tuple(acc.items()), const)


@dataclass(frozen=True)
class Origin:
    """Where an apportion op comes from: the torch node, its target, the last user frame of its
    stack trace (``file:line``) and the ``nn.Module`` that made it."""

    node: str
    target: str
    source: str | None = None
    module: str | None = None

    def __str__(self) -> str:
        at = f" at {self.source}" if self.source else ""
        mod = f" in {self.module}" if self.module else ""
        return f"torch node {self.node!r} ({self.target}){at}{mod}"


@dataclass(frozen=True)
class Value:
    """A torch value: the tensor that holds it, its torch shape and dtype, the digits of each
    torch dim (outermost first; none for a dim of size 1) and the index of each tensor axis."""

    tensor: str
    dtype: str
    shape: tuple[int, ...]
    digits: tuple[tuple[Digit, ...], ...]
    index: tuple[Lin, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def substituted(self, by: Mapping[int, Lin], **changes: object) -> Value:
        fields = {"tensor": self.tensor, "dtype": self.dtype, "shape": self.shape,
                  "digits": self.digits, "index": tuple(e.subst(by) for e in self.index)}
        fields.update(changes)
        return Value(**fields)  # type: ignore[arg-type]


def plain_value(tensor: str, dtype: str, shape: Sequence[int]) -> Value:
    """The value a tensor of exactly this torch shape holds, read as stored."""
    digits: list[tuple[Digit, ...]] = []
    index: list[Lin] = []
    for n in shape:
        if n == 1:
            digits.append(())
            index.append(Lin())
        else:
            i = fresh()
            digits.append(((i, n),))
            index.append(Lin(((i, 1),)))
    return Value(tensor, dtype, tuple(shape), tuple(digits), tuple(index))


# --- views: new descriptions of the same tensor ---------------------------------------------

def dim_index(d: int, rank: int) -> int:
    """A torch dim argument (negative counts from the end) as an index."""
    if not -max(rank, 1) <= d < max(rank, 1):
        raise ProgramError(f"dim {d} is out of range for rank {rank}")
    return d % max(rank, 1)


def permute(v: Value, perm: Sequence[int]) -> Value:
    perm = [dim_index(p, v.rank) for p in perm]
    if sorted(perm) != list(range(v.rank)):
        raise ProgramError(f"permutation {list(perm)} of rank {v.rank}")
    return Value(v.tensor, v.dtype, tuple(v.shape[p] for p in perm),
                 tuple(v.digits[p] for p in perm), v.index)


def unsqueeze(v: Value, d: int) -> Value:
    d = d % (v.rank + 1)
    return Value(v.tensor, v.dtype, v.shape[:d] + (1,) + v.shape[d:],
                 v.digits[:d] + ((),) + v.digits[d:], v.index)


def squeeze(v: Value, dims: Sequence[int] | None = None) -> Value:
    drop = set(range(v.rank)) if dims is None else {dim_index(d, v.rank) for d in dims}
    keep = [i for i in range(v.rank) if not (i in drop and v.shape[i] == 1)]
    return Value(v.tensor, v.dtype, tuple(v.shape[i] for i in keep),
                 tuple(v.digits[i] for i in keep), v.index)


def expand(v: Value, sizes: Sequence[int]) -> Value:
    """Size-1 dims broadcast to ``sizes`` (-1 keeps a dim): a digit that no axis reads."""
    lead = len(sizes) - v.rank
    if lead < 0:
        raise ProgramError(f"cannot expand shape {list(v.shape)} to {list(sizes)}")
    shape: list[int] = []
    digits: list[tuple[Digit, ...]] = []
    for j, n in enumerate(sizes):
        old = v.shape[j - lead] if j >= lead else 1
        ds = v.digits[j - lead] if j >= lead else ()
        if n == -1 or n == old:
            if j < lead and n == -1:
                raise ProgramError(f"expand to {list(sizes)}: -1 for a new leading dim")
            shape.append(old)
            digits.append(ds)
        elif old == 1:
            shape.append(n)
            digits.append(((fresh(), n),))
        else:
            raise ProgramError(f"cannot expand dim {j} of size {old} to {n}")
    return Value(v.tensor, v.dtype, tuple(shape), tuple(digits), v.index)


def slice_bounds(n: int, start: int | None, end: int | None, step: int = 1) -> tuple[int, int]:
    """torch's slice bounds of a dim of size ``n``: (start, length)."""
    if step < 1:
        raise ProgramError(f"slice step {step}: only positive steps have an index map")
    lo = 0 if start is None else start + n if start < 0 else start
    hi = n if end is None else end + n if end < 0 else end
    lo, hi = min(max(lo, 0), n), min(max(hi, 0), n)
    length = max(0, -(-(hi - lo) // step))
    if length == 0:
        raise ProgramError(f"slice [{start}:{end}:{step}] of a dim of size {n} is empty; empty "
                           "tensors are not supported")
    return lo, length


def slice_dim(v: Value, d: int, start: int, length: int, step: int = 1) -> Value | None:
    """Elements ``start, start+step, ...`` (``length`` of them) of dim ``d``; None when no affine
    map of ``v``'s digits names them (a slice across merged digits)."""
    d = dim_index(d, v.rank)
    if start == 0 and length == v.shape[d] and step == 1:
        return v
    found = _slice_digits(v.digits[d], start, length, step)
    if found is None:
        return None
    digits, by = found
    return v.substituted(by, shape=v.shape[:d] + (length,) + v.shape[d + 1:],
                         digits=v.digits[:d] + (digits,) + v.digits[d + 1:])


def _slice_digits(ds: tuple[Digit, ...], start: int, length: int, step: int
                  ) -> tuple[tuple[Digit, ...], dict[int, Lin]] | None:
    if not ds:
        return (), {}
    (u, _), rest = ds[0], ds[1:]
    if not rest:
        if length == 1:
            return (), {u: Lin((), start)}
        v = fresh()
        return ((v, length),), {u: Lin(((v, step),), start)}
    inner = math.prod(s for _, s in rest)
    if step != 1:
        return None
    if start % inner == 0 and length % inner == 0:
        outer = length // inner
        if outer == 1:
            return rest, {u: Lin((), start // inner)}
        v = fresh()
        return ((v, outer), *rest), {u: Lin(((v, 1),), start // inner)}
    if start // inner == (start + length - 1) // inner:
        found = _slice_digits(rest, start % inner, length, 1)
        if found is None:
            return None
        digits, by = found
        return digits, {**by, u: Lin((), start // inner)}
    return None


def view(v: Value, shape: Sequence[int]) -> Value | None:
    """``v`` viewed as ``shape`` (one -1 allowed): a regrouping of its digits; None when the
    digits cannot be cut at the new dims' boundaries (``[3, 4] -> [2, 6]``)."""
    numel = math.prod(v.shape)
    shape = resolve_shape(shape, numel)
    flat = [dg for ds in v.digits for dg in ds]
    points = {1, numel, *_inner_products([s for _, s in flat]), *_inner_products(shape)}
    pts = sorted(points)
    if any(b % a for a, b in itertools.pairwise(pts)):
        return None
    # split each digit at the points inside it (innermost first)
    by: dict[int, Lin] = {}
    refined: list[Digit] = []
    inner = 1
    for u, s in reversed(flat):
        cuts = [q for q in pts if inner < q < inner * s]
        bounds = [inner, *cuts, inner * s]
        if len(bounds) == 2:
            refined.append((u, s))
        else:
            terms = []
            for lo, hi in itertools.pairwise(bounds):
                w = fresh()
                refined.append((w, hi // lo))
                terms.append((w, lo // inner))
            by[u] = Lin(tuple(terms))
        inner *= s
    refined.reverse()
    # group the refined digits into the new dims, innermost first
    pos = len(refined)
    grouped: list[tuple[Digit, ...]] = []
    for n in reversed(shape):
        group: list[Digit] = []
        prod = 1
        while prod < n:
            pos -= 1
            group.append(refined[pos])
            prod *= refined[pos][1]
        assert prod == n, "digit refinement went wrong"
        grouped.append(tuple(reversed(group)))
    assert pos == 0, "digit refinement went wrong"
    return v.substituted(by, shape=tuple(shape), digits=tuple(reversed(grouped)))


def resolve_shape(shape: Sequence[int], numel: int) -> tuple[int, ...]:
    shape = [int(n) for n in shape]
    if shape.count(-1) > 1:
        raise ProgramError(f"shape {shape} has more than one -1")
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    if math.prod(shape) != numel or any(n < 1 for n in shape):
        raise ProgramError(f"cannot view {numel} elements as {shape}")
    return tuple(shape)


def refine(size: int, parts: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
    """The common refinement of mixed radices of ``size`` (outermost first), or None.

    >>> refine(256, [(4, 64), (256,)]), refine(256, [(4, 64), (8, 32)])
    ((4, 64), (4, 2, 32))
    >>> refine(12, [(3, 4), (2, 6)]) is None   # [3, 4] -> [2, 6] has no common radix
    True
    """
    points = {1, size}
    for sizes in parts:
        points.update(_inner_products(sizes))
    pts = sorted(points)
    if any(b % a for a, b in itertools.pairwise(pts)):
        return None
    return tuple(b // a for a, b in reversed(list(itertools.pairwise(pts))))


def _letters() -> Iterator[str]:
    yield from "abcdefghijklmnopqrstuvwxyz"
    for n in itertools.count(26):
        yield f"d{n}"


def _num(value: float) -> str:
    return repr(float(value))


# --- the lowering: ops, inputs and constants of one program ----------------------------------

class Lowering:
    """The program being built: tensors, inputs (with the values of constants), ops and where
    each op comes from. ``at(origin)`` names the torch node the next ops lower."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.types: dict[str, TensorType] = {}
        self.inputs: list[str] = []
        self.ops: list[Op] = []
        self.constants: dict[str, np.ndarray] = {}
        self.origins: dict[str, Origin] = {}
        self.origin = Origin(name, "input")
        self._scalars: dict[tuple[str, str], Value] = {}
        self._seeds = itertools.count()

    # -- names, inputs, constants -------------------------------------------------------------

    def at(self, origin: Origin) -> None:
        self.origin = origin

    def fresh_name(self, base: str) -> str:
        """``base``, or ``base.<n>`` for the first ``n`` that names no tensor yet: the name of
        a new op (its output tensor takes it)."""
        name = base
        for n in itertools.count(2):
            if name not in self.types:  # an op's output tensor takes the op's name
                return name
            name = f"{base}.{n}"
        raise AssertionError("unreachable")

    def input(self, name: str, dtype: str, shape: Sequence[int],
              value: np.ndarray | None = None) -> Value:
        """A program input (a constant when ``value`` is given)."""
        if name in self.types:
            raise ProgramError(f"input {name!r} is declared twice")
        self.types[name] = TensorType(name, tuple(shape), dtype)
        self.inputs.append(name)
        if value is not None:
            self.constants[name] = value
        return plain_value(name, dtype, shape)

    def constant(self, base: str, array: np.ndarray, dtype: str) -> Value:
        """A constant tensor: a program input whose value the lowering knows."""
        return self.input(self.fresh_name(base), dtype, array.shape, array)

    def scalar(self, value: float | int | bool, dtype: str) -> Value:
        """A rank-0 constant (one per value and dtype in the program)."""
        key = (dtype, repr(value) if not isinstance(value, float) else _num(value))
        if key not in self._scalars:
            array = np.asarray(value).astype(_NUMPY[dtype])
            self._scalars[key] = self.constant(f"scalar.{len(self._scalars)}", array, dtype)
        return self._scalars[key]

    def mark(self) -> tuple[int, int]:
        """Where the program stands now, for ``rollback``: its op and input counts."""
        return len(self.ops), len(self.inputs)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Forget the ops, inputs and constants made since ``mark``: what a node whose lowering
        failed halfway left behind (the nodes after it must not read it)."""
        ops, inputs = mark
        for op in self.ops[ops:]:
            del self.types[op.name]
            self.origins.pop(op.name, None)
        for name in self.inputs[inputs:]:
            del self.types[name]
            self.constants.pop(name, None)
        del self.ops[ops:], self.inputs[inputs:]
        self._scalars = {k: v for k, v in self._scalars.items() if v.tensor in self.types}

    def seed(self) -> int:
        """A seed for the next random op (runs are reproducible, not torch's numbers)."""
        return next(self._seeds)

    # -- ops ----------------------------------------------------------------------------------

    def op(self, fn: str, sizes: Sequence[int], out: Sequence[int | None],
           ins: Sequence[tuple[Value, Sequence[int | None]]],
           attrs: Mapping[str, str] | None = None, part: str | None = None,
           merge: bool = False) -> Value:
        """One op of kind ``fn`` over torch-level axes of ``sizes``.

        ``out`` lists the output's dims as axes (None: a size-1 dim, as keepdim reductions
        write); the axes it leaves out are reduced. Each input maps each of its dims to an axis
        (None, or a size-1 dim against a larger axis: broadcast). ``merge`` writes each output
        dim as one tensor axis through the merge of its digits (a plain result) rather than one
        axis per digit.
        """
        sizes = [int(n) for n in sizes]
        ins = list(ins)
        for v, amap in ins:
            if len(amap) != v.rank:
                raise ProgramError(f"{fn}: {len(amap)} axes for a value of rank {v.rank}")
            for j, a in enumerate(amap):
                if (v.shape[j] != 1 if a is None else v.shape[j] not in (1, sizes[a])):
                    raise ProgramError(f"{fn}: dim {j} of size {v.shape[j]} does not fit "
                                       f"axis {a} of sizes {sizes}")
        refined = self._refined(sizes, ins)
        if refined is None:  # digits no common radix refines: read those operands plainly
            ins = [(self.plain(v) if any(len(ds) > 1 for ds in v.digits) else v, amap)
                   for v, amap in ins]
            refined = self._refined(sizes, ins)
            assert refined is not None, "plain operands always refine"
        out_axes = [a for a in out if a is not None]
        order = out_axes + [a for a in range(len(sizes)) if a not in out_axes]
        names = _letters()
        letters = {a: [(next(names), t) for t in refined[a]] for a in order}
        rank = {lt: i for i, lt in enumerate(lt for a in order for lt, _ in letters[a])}
        accesses = tuple(self._access(v, amap, letters, rank) for v, amap in ins)
        name = self.fresh_name(self.origin.node if part is None else
                               f"{self.origin.node}.{part}")
        out_index: list[AffineExpr] = []
        out_shape: list[int] = []
        digits: list[tuple[Digit, ...]] = []
        index: list[Lin] = []
        for a in out:
            if a is None or sizes[a] == 1:
                out_index.append(_ZERO)
                out_shape.append(1)
                digits.append(())
                index.append(Lin())
                continue
            if merge:
                strides = _inner_products([t for _, t in letters[a]])
                terms = [(lt, stride // t) for (lt, t), stride
                         in zip(letters[a], reversed(strides), strict=True)]
                i = fresh()
                out_index.append(AffineExpr(tuple(terms)))
                out_shape.append(sizes[a])
                digits.append(((i, sizes[a]),))
                index.append(Lin(((i, 1),)))
                continue
            ds = []
            for lt, t in letters[a]:
                i = fresh()
                out_index.append(AffineExpr.dim(lt))
                out_shape.append(t)
                ds.append((i, t))
                index.append(Lin(((i, 1),)))
            digits.append(tuple(ds))
        dims = tuple((lt, t) for a in order for lt, t in letters[a])
        op = Op(name, fn, Access(name, tuple(out_index)), accesses, dims,
                tuple(sorted((attrs or {}).items())))
        dtype = self.add_op(op, tuple(out_shape))
        shape = tuple(1 if a is None else sizes[a] for a in out)
        return Value(name, dtype, shape, tuple(digits), tuple(index))

    def _refined(self, sizes: Sequence[int], ins: Sequence[tuple[Value, Sequence[int | None]]]
                 ) -> dict[int, tuple[int, ...]] | None:
        refined: dict[int, tuple[int, ...]] = {}
        for a, n in enumerate(sizes):
            parts = [tuple(s for _, s in v.digits[j]) for v, amap in ins
                     for j, b in enumerate(amap) if b == a and v.shape[j] == n and n > 1]
            r = refine(n, parts) if n > 1 else ()
            if r is None:
                return None
            refined[a] = r
        return refined

    def _access(self, v: Value, amap: Sequence[int | None],
                letters: Mapping[int, list[tuple[str, int]]], rank: Mapping[str, int]) -> Access:
        by: dict[int, list[tuple[str, int]]] = {}
        for ds, a in zip(v.digits, amap, strict=True):
            if not ds:
                continue
            assert a is not None
            group = letters[a]
            pos = len(group)
            for u, s in reversed(ds):  # innermost digit first
                terms, prod = [], 1
                while prod < s:
                    pos -= 1
                    lt, t = group[pos]
                    terms.append((lt, prod))
                    prod *= t
                assert prod == s, "digits do not refine"
                by[u] = terms
        index = []
        for e in v.index:
            acc: dict[str, int] = {}
            for d, c in e.terms:
                for lt, c2 in by[d]:
                    acc[lt] = acc.get(lt, 0) + c * c2
            index.append(AffineExpr(tuple(sorted(acc.items(), key=lambda t: rank[t[0]])),
                                    e.const))
        return Access(v.tensor, tuple(index))

    def add_op(self, op: Op, shape: tuple[int, ...]) -> str:
        """Add ``op`` (named by ``fresh_name``), its output of ``shape``, lowered from the
        current node; returns the output's dtype."""
        dtype = op.kind.out_dtype([self.types[a.tensor].dtype for a in op.ins], dict(op.attrs),
                                  f"op {op.name!r}")
        self.types[op.name] = TensorType(op.name, shape, dtype)
        self.ops.append(op)
        self.origins[op.name] = self.origin
        return dtype

    def whole(self, fn: str, ins: Sequence[Value], shape: Sequence[int], dtype: str | None = None,
              attrs: Mapping[str, float] | None = None, part: str | None = None) -> Value:
        """A whole-tensor fallback: reads its inputs as stored (canonical layouts, so row-major
        order is torch's) and writes a tensor of exactly ``shape``."""
        ins = [self.contiguous(v) for v in ins]
        names = _letters()
        sizes: dict[str, int] = {}

        def whole_index(dims: Sequence[int]) -> tuple[AffineExpr, ...]:
            out = []
            for n in dims:
                if n == 1:
                    out.append(_ZERO)
                else:
                    lt = next(names)
                    sizes[lt] = n
                    out.append(AffineExpr.dim(lt))
            return tuple(out)

        name = self.fresh_name(self.origin.node if part is None else
                               f"{self.origin.node}.{part}")
        out = Access(name, whole_index(shape))
        accesses = tuple(Access(v.tensor, whole_index(self.types[v.tensor].shape)) for v in ins)
        text = {k: _num(x) for k, x in (attrs or {}).items()}
        if not ins:
            text["dtype"] = dtype or "float32"
        op = Op(name, fn, out, accesses, tuple(sizes.items()), tuple(sorted(text.items())))
        dtype = self.add_op(op, tuple(shape))
        return plain_value(name, dtype, shape)

    def fill(self, shape: Sequence[int], dtype: str, value: float) -> Value:
        """A tensor of ``value``: a whole ``full`` fallback, or over ``BLOCK_BYTES`` (such as
        an attention mask of a long sequence) a ``fill`` divided over cores like any pointwise
        op (``fill`` takes finite values only: a larger non-finite one stays ``full``)."""
        if math.prod(shape) * DTYPE_BYTES[dtype] <= BLOCK_BYTES or not math.isfinite(value):
            return self.whole("full", [], shape, dtype, {"value": value})
        axes = list(range(len(shape)))
        return self.op("fill", shape, axes, [], {"value": _num(value), "dtype": dtype})

    # -- layouts ------------------------------------------------------------------------------

    def is_canonical(self, v: Value) -> bool:
        """``v`` is its tensor read as stored, in torch's row-major order (size-1 axes aside)."""
        shape = self.types[v.tensor].shape
        kept = [(e, n) for e, n in zip(v.index, shape, strict=True)
                if not (n == 1 and e == Lin())]
        flat = [dg for ds in v.digits for dg in ds]
        return len(kept) == len(flat) and all(
            e == Lin(((i, 1),)) and n == s for (e, n), (i, s) in zip(kept, flat, strict=True))

    def is_plain(self, v: Value) -> bool:
        return self.is_canonical(v) and self.types[v.tensor].shape == v.shape

    def contiguous(self, v: Value) -> Value:
        """``v`` in a tensor of its own, stored in torch's row-major order (a copy unless it is
        already)."""
        if self.is_canonical(v):
            return v
        axes = list(range(v.rank))
        return self.op("copy", v.shape, axes, [(v, axes)], part="copy")

    def plain(self, v: Value) -> Value:
        """``v`` in a tensor of exactly its torch shape: as it is when it already is, else one
        copy that writes each torch dim through the merge of its digits (``y[t, 64*h+d]``)."""
        if self.is_plain(v):
            return v
        axes = list(range(v.rank))
        return self.op("copy", v.shape, axes, [(v, axes)], part="copy", merge=True)

    def sliced(self, v: Value, d: int, start: int, length: int, step: int = 1) -> Value:
        """``length`` elements of dim ``d`` of ``v`` from ``start`` by ``step``: a view
        (``slice_dim``), of ``v``'s plain copy where its digits cannot be sliced."""
        found = slice_dim(v, d, start, length, step)
        if found is None:
            found = slice_dim(self.plain(v), d, start, length, step)
        assert found is not None, "a plain value slices along any dim"
        return found

    def cast(self, v: Value, dtype: str) -> Value:
        if v.dtype == dtype:
            return v
        axes = list(range(v.rank))
        return self.op("copy", v.shape, axes, [(v, axes)], {"dtype": dtype}, part="cast")

    # -- common shapes of ops -----------------------------------------------------------------

    def elementwise(self, fn: str, vals: Sequence[Value], attrs: Mapping[str, str] | None = None,
                    part: str | None = None) -> Value:
        """An elementwise op with torch's broadcasting (dims aligned at the end)."""
        shape = broadcast_shapes([v.shape for v in vals])
        r = len(shape)
        ins = [(v, list(range(r - v.rank, r))) for v in vals]
        return self.op(fn, shape, list(range(r)), ins, attrs, part)

    def reduce(self, fn: str, v: Value, dims: Sequence[int] | None, keepdim: bool,
               part: str | None = None) -> Value:
        """A reduction of ``v`` over ``dims`` (None or empty: all of them)."""
        red = set(range(v.rank)) if not dims else {dim_index(d, v.rank) for d in dims}
        out = [None if a in red else a for a in range(v.rank) if keepdim or a not in red]
        if all(v.shape[a] == 1 for a in red):  # nothing to reduce: the kind's value of one point
            if fn in ("max", "min", "sum", "prod", "mean"):
                return self.op("copy", v.shape, out, [(v, list(range(v.rank)))], part=part)
            if fn == "argmax":
                shape = [1 if a is None else v.shape[a] for a in out]
                return self.whole("full", [], shape, "int64", {"value": 0}, part=part)
        return self.op(fn, v.shape, out, [(v, list(range(v.rank)))], part=part)


def broadcast_shapes(shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    r = max((len(s) for s in shapes), default=0)
    out = [1] * r
    for s in shapes:
        for j, n in enumerate(s):
            k = r - len(s) + j
            if n != 1:
                if out[k] not in (1, n):
                    raise ProgramError(f"shapes {[list(x) for x in shapes]} do not broadcast")
                out[k] = n
    return tuple(out)


#: numpy dtype of a constant of each apportion dtype (bfloat16 constants are held in float32)
_NUMPY: dict[str, type[np.generic]] = {
    "float16": np.float16, "bfloat16": np.float32, "float32": np.float32, "int8": np.int8,
    "int32": np.int32, "int64": np.int64, "bool": np.bool_,
}
assert set(_NUMPY) == set(DTYPE_BYTES)


def is_fallback(op: Op) -> bool:
    return op.kind.category is Category.FALLBACK


def _inner_products(sizes: Sequence[int]) -> list[int]:
    """The products of the innermost 1, 2, ... sizes (row-major strides times their size)."""
    out, p = [], 1
    for n in reversed(sizes):
        p *= n
        out.append(p)
    return out
