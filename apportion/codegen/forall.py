"""Thread-first parallel IR on tensors: a planned program as MLIR ``scf.forall`` loops.

``forall_mlir`` prints one ``func.func`` named after the program: it takes the program inputs as
tensors (then one ``index`` argument per symbolic loop count, named after it) and returns the
outputs. Every op is one ``scf.forall`` over its core grid, one induction variable per dim the
plan splits (an op on one core has no forall). A thread's box of the iteration space is the
plan's slice (``plans.views.dim_slices``: whole planning units, larger slices first): its start
an ``affine.apply`` of the thread id, its size static where the slices are equal and an
``affine.min`` where they are not. Each operand is read as the ``tensor.extract_slice`` of its
bounding box over the thread's box (``plans.tiles.region``; literal indices drop their axis) and
the op runs on the slices as a ``linalg.generic`` whose indexing maps are the accesses relative
to the slice (``x[t, 128*h+d]`` reads a wider slice through ``d1, d0 * 128 + d3``; a dim that no
access names alone gets a shape-only ``tensor.empty`` operand so that the generic knows its
range). The body is the registry's (``ir.kinds.MlirBody``): value inputs convert to the compute
type (``f32`` for float16, bfloat16 and bool operands, as the reference executor computes;
``f32`` for float32 too, where the reference uses float64; ``i64`` for integers; ``f64`` where
integers meet floats or a kind has no integer body), the result converts once to the output
type. Each thread writes its piece with ``tensor.parallel_insert_slice``.

Reductions and matmul accumulate into a ``linalg.fill`` of the reducer's identity (``f32`` for
float16/bfloat16, ``i64`` for integers, ``i1`` for ``any``); a reduction dim split over cores
makes the forall write one partial per slice into a ``[slices, ...output dims]`` tensor that a
``linalg.reduce`` then combines with the reducer's combine (``argmax`` carries value-index
pairs: the greater value wins, equal values the lower flat index, so any order gives numpy's
first maximum); ``mean`` divides by its count after. Fallbacks (sort, cumsum, flip) run whole
along the last axis of their input, with upstream linalg only: cumsum a running combine over
``j <= i``, flip a gather (``tensor.extract`` at ``n-1-i``: IREE tiles a reversed indexing map
wrongly), sort by rank (``O(n^2)`` per row: each element's rank counts the smaller ones, ties
by position, NaN last, then each rank picks its element).

A coarse-tiling loop group is ``scf.for`` loops, outermost level first (a symbolic count is its
function argument), around the foralls of one iteration's tile (``plans.tiles.tile_box``): its
``iter_args`` carry the group's results read after it and its accumulators (a reduction tiled
by the loops, reset to its identity before the level that tiles it, finished after the nest);
a tensor only read inside the group is one iteration's tile, a fresh tensor every iteration.
A tiled reduction computes each tile's partial from its identity and combines it into the
accumulator elementwise, as the reference executor does. Static tile geometry is affine maps of
the loop and thread ids; a symbolic count divides with ``arith.divui``, slices of a run-time
tile size use ``arith`` on ``index``, and a forall's shared tensor keeps a static shape (the
whole dim bounds a run-time tile: IREE cannot size a dynamic tensor carried through a loop).

A kind the registry gives no MLIR body raises ``EmitError`` naming the op and the kind.

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
>>> text = forall_mlir(planned.program, planned.plan, planned.target)
>>> text.splitlines()[0]
'func.func @mlp(%x: tensor<256x1024xf16>, %wg: tensor<1024x2816xf16>, \
%wu: tensor<1024x2816xf16>, %wd: tensor<2816x1024xf16>) -> tensor<256x1024xf16> {'
>>> verify_mlir(text)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from apportion.codegen.mlir import SsaNames, symbol_name
from apportion.codegen.mlir import verify_mlir as verify_mlir
from apportion.errors import ApportionError, EmitError
from apportion.ir.dtypes import FLOAT_DTYPES
from apportion.ir.kinds import Category, MlirBody, OpKind, Reducer
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.plans.memory import GroupPlan
from apportion.plans.plan import LoopInfo, OpPlan, Plan
from apportion.plans.views import dim_slices
from apportion.target.target import Target

INDENT = "  "

#: tensor dtype -> MLIR element type
MLIR_TYPES: dict[str, str] = {
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "int8": "i8",
    "int32": "i32",
    "int64": "i64",
    "bool": "i1",
}
_FLOAT_TYPES = ("f16", "bf16", "f32", "f64")
_FLOAT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
_INT_BITS = {"i1": 1, "i8": 8, "i32": 32, "i64": 64}
#: float types' infinities as bit patterns (MLIR float literals have no ``inf``)
_INF = {"f16": 0x7C00, "bf16": 0x7F80, "f32": 0x7F800000, "f64": 0x7FF0000000000000}
_NARROW = frozenset({"float16", "bfloat16", "bool"})
_INTS = frozenset({"int8", "int32", "int64"})
INDEX_MAX = 2**63 - 1  # the index a fresh argmax accumulator holds: any real one is lower


def forall_mlir(program: Program, plan: Plan, target: Target | None = None) -> str:
    """The planned program as thread-first parallel IR on tensors (MLIR text, not verified;
    ``verify_mlir`` checks it). ``target`` is the plan's, for symmetry with the other emitters.
    """
    if target is not None and (plan.target, plan.cores) != (target.name, target.cores):
        raise EmitError(f"plan is for {plan.target!r} with {plan.cores} cores, not "
                        f"{target.name!r} with {target.cores}")
    return _Function(program, plan).text()


def symbols(plan: Plan) -> tuple[str, ...]:
    """The symbolic loop counts, in the order the emitted function takes them (after the
    inputs)."""
    return tuple(dict.fromkeys(c for g in plan.groups for c in g.counts if isinstance(c, str)))


def mlir_type(dtype: str) -> str:
    """The MLIR element type of a tensor dtype.

    >>> mlir_type("bfloat16"), mlir_type("bool")
    ('bf16', 'i1')
    """
    return MLIR_TYPES[dtype]


# --- index expressions ----------------------------------------------------------------------

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


def _map(n_dims: int, results: Sequence[str]) -> str:
    dims = ", ".join(f"d{i}" for i in range(n_dims))
    return f"affine_map<({dims}) -> ({', '.join(results)})>"


# --- text blocks ----------------------------------------------------------------------------



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
        self.emit(f"{name} = arith.constant {_literal(value, ty)}")
        return name


def _literal(value: float | int | bool, ty: str) -> str:
    """An ``arith.constant`` attribute of ``value`` in type ``ty`` (infinities as bit patterns,
    integers clamped to the type's range: an identity of -inf is the least integer)."""
    if ty == "i1":
        return "true" if value else "false"
    if ty in _INT_BITS or ty == "index":
        bits = 64 if ty == "index" else _INT_BITS[ty]
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        v = hi if value == math.inf else lo if value == -math.inf else int(value)
        return f"{min(max(v, lo), hi)} : {ty}"
    v = float(value)
    if math.isinf(v):
        bits = _INF[ty] | (1 << (_FLOAT_BITS[ty] - 1) if v < 0 else 0)
        return f"0x{bits:X} : {ty}"
    text = repr(v)
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exp = text.split("e")
        text = f"{mantissa}.0e{exp}"
    return f"{text} : {ty}"


def _ttype(shape: Sequence[IxLike], elt: str) -> str:
    """``tensor<4x?xf16>`` (``?`` where a size is not constant); rank 0: ``tensor<f16>``."""
    dims = ["?" if not Ix.of(s).is_const else str(Ix.of(s).value) for s in shape]
    return f"tensor<{'x'.join([*dims, elt])}>"


def _convert(blk: _Block, value: str, src: str, dst: str) -> str:
    """``value`` of scalar type ``src`` as type ``dst``: floats to ints truncate toward zero,
    anything to ``i1`` is ``!= 0``, ``i1`` to numbers is 0 or 1."""
    if src == dst:
        return value
    name = blk.fresh("v")
    if dst == "i1":
        if src in _FLOAT_TYPES:
            zero = blk.const(0.0, src)
            blk.emit(f"{name} = arith.cmpf une, {value}, {zero} : {src}")
        else:
            zero = blk.const(0, src)
            blk.emit(f"{name} = arith.cmpi ne, {value}, {zero} : {src}")
        return name
    if src in _FLOAT_TYPES and dst in _FLOAT_TYPES:
        op = "extf" if _FLOAT_BITS[dst] > _FLOAT_BITS[src] else "truncf"
        if _FLOAT_BITS[dst] == _FLOAT_BITS[src]:  # f16 <-> bf16: through f32
            return _convert(blk, _convert(blk, value, src, "f32"), "f32", dst)
    elif src in _FLOAT_TYPES:
        op = "fptosi"
    elif dst in _FLOAT_TYPES:
        op = "uitofp" if src == "i1" else "sitofp"
    elif src == "i1":
        op = "extui"
    else:
        op = "extsi" if _INT_BITS[dst] > _INT_BITS[src] else "trunci"
    blk.emit(f"{name} = arith.{op} {value} : {src} to {dst}")
    return name


def _apply(blk: _Block, body: MlirBody, integer: bool, ty: str, operands: Mapping[str, str],
           results: Sequence[str] = ("r",)) -> list[str]:
    """Format a registry template into ``blk``; returns the SSA names of its results."""
    text = body.text(integer)
    if not text.strip():
        return [operands["a"]]
    names = {r: blk.fresh(r) for r in results}
    # "-" never occurs in names from SsaNames.fresh, so template temporaries cannot collide
    blk.fn.templates += 1
    prefix = f"b{blk.fn.templates}-"
    for line in text.splitlines():
        blk.emit(line.format(p=prefix, t=ty, **operands, **names))
    return [names[r] for r in results]


# --- values and per-op geometry -------------------------------------------------------------

@dataclass(frozen=True)
class TensorVal:
    """A tensor SSA value: its shape and element type, and the global index of its first
    element per axis (zeros for a whole tensor, a tile's corner for one iteration's tile)."""

    ssa: str
    shape: tuple[Ix, ...]
    elt: str
    origin: tuple[Ix, ...] = ()

    def __post_init__(self) -> None:
        if not self.origin:
            object.__setattr__(self, "origin", tuple(Ix(0) for _ in self.shape))

    @property
    def type(self) -> str:
        return _ttype(self.shape, self.elt)

    def renamed(self, ssa: str) -> TensorVal:
        return TensorVal(ssa, self.shape, self.elt, self.origin)


#: dim -> (start, size) in elements of the whole op's iteration space
Box = dict[str, tuple[Ix, Ix]]


@dataclass
class _Slice:
    """An operand read over a box: the sliced value, its type, and its indexing map results."""

    ssa: str
    type: str
    elt: str
    results: list[str]


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


def _region(access: Access, box: Box) -> list[tuple[Ix, Ix, bool]]:
    """Per tensor axis: (start, extent, literal) of ``access`` over ``box``."""
    out = []
    for e in access.index:
        if not e.terms:
            out.append((Ix(e.const), Ix(1), True))
            continue
        lo = Ix(e.const)
        ext = Ix(1)
        for d, c in e.terms:
            lo = lo + box[d][0] * c
            ext = ext + (box[d][1] - 1) * c
        out.append((lo, ext, False))
    return out


# --- the function ---------------------------------------------------------------------------

@dataclass
class _Carried:
    """A tensor a loop group carries in ``iter_args``: a result or an accumulator."""

    tensor: str
    op: Op
    accumulates: bool
    val: TensorVal
    init_level: int = 0


@dataclass
class _Env:
    """Tensor name -> its current value (whole tensors, or one iteration's tile)."""

    vals: dict[str, TensorVal] = field(default_factory=dict)


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


def thread_slices(n: int, per: int, split: int, dynamic: bool = False) -> list[tuple[int, int]]:
    """(start, size) of every thread's slice as the emitted index arithmetic computes them,
    with the size ``n`` a constant or (``dynamic``) a run-time value; equals
    ``plans.views.dim_slices`` as (start, stop - start).

    >>> thread_slices(10, 1, 4), thread_slices(10, 1, 4, dynamic=True)
    ([(0, 3), (3, 3), (6, 2), (8, 2)], [(0, 3), (3, 3), (6, 2), (8, 2)])
    """
    em = _Emitter()
    blk = _Block(em, 1)
    size = Ix.atom("%n") if dynamic else Ix(n)
    start, length = slice_of(blk, size, per, split, Ix.atom("%s"))
    return [(em.evaluate(start, {"%n": n, "%s": s}), em.evaluate(length, {"%n": n, "%s": s}))
            for s in range(split)]


class _Function(_Emitter):
    def __init__(self, program: Program, plan: Plan) -> None:
        super().__init__()
        self.program, self.plan = program, plan
        if plan.program != program.name or [o.name for o in plan.ops] != [
                o.name for o in program.ops]:
            raise EmitError(f"plan of {plan.program!r} does not fit program {program.name!r}")

    def op_plan(self, op: Op) -> OpPlan:
        try:
            return self.plan.op(op.name)
        except ApportionError as e:  # the plan lacks the op
            raise EmitError(f"op {op.name!r}: {e}") from None

    def dtype(self, tensor: str) -> str:
        return self.program.tensor(tensor).dtype

    # -- the whole function ---------------------------------------------------------------

    def text(self) -> str:
        p = self.program
        top = _Block(self, 1)
        env = _Env()
        args = []
        for name in p.inputs:
            t = p.tensor(name)
            ssa = self.names.fresh(name)
            env.vals[name] = TensorVal(ssa, tuple(Ix(s) for s in t.shape), mlir_type(t.dtype))
            args.append(f"{ssa}: {env.vals[name].type}")
        self.symbols: dict[str, str] = {}
        for c in symbols(self.plan):
            self.symbols[c] = self.names.fresh(c)
            args.append(f"{self.symbols[c]}: index")
        i = 0
        while i < len(p.ops):
            op = p.ops[i]
            loop = self.op_plan(op).loop
            if loop is None:
                self.whole_op(top, op, env)
                i += 1
                continue
            group = self.plan.group(loop.group)
            names = tuple(o.name for o in p.ops[i:i + len(group.ops)])
            if names != group.ops:
                raise EmitError(f"loop group {list(group.path)} runs ops {list(group.ops)}, but "
                                f"the program has {list(names)} there")
            self.group(top, group, env)
            i += len(group.ops)
        outs = [env.vals[n] for n in p.outputs]
        types = ", ".join(v.type for v in outs)
        result = types if len(outs) == 1 else f"({types})"
        lines = [f"func.func @{symbol_name(p.name)}({', '.join(args)}) -> {result} {{",
                 *self.const_lines, *top.lines,
                 f"{INDENT}return {', '.join(v.ssa for v in outs)} : {types}", "}"]
        return "\n".join(lines) + "\n"

    # -- ops outside loops ----------------------------------------------------------------

    def whole_op(self, blk: _Block, op: Op, env: _Env) -> None:
        opl = self.op_plan(op)
        if opl.sizes != op.sizes:
            raise EmitError(f"op {op.name!r}: plan's iteration space {opl.sizes} differs from "
                            f"the op's {op.sizes}")
        t = self.program.tensor(op.out.tensor)
        dest = self.empty(blk, op.out.tensor, tuple(Ix(s) for s in t.shape), mlir_type(t.dtype))
        tile = {d: (Ix(0), Ix(n)) for d, n in op.dims}
        env.vals[op.out.tensor] = self.op(blk, op, opl, tile, dest, env, None)

    def empty(self, blk: _Block, stem: str, shape: Sequence[Ix], elt: str,
              origin: Sequence[Ix] = ()) -> TensorVal:
        dyn = [blk.value(s) for s in shape if not s.is_const]
        name = blk.fresh(f"{stem}_init")
        blk.emit(f"{name} = tensor.empty({', '.join(dyn)}) : {_ttype(shape, elt)}")
        return TensorVal(name, tuple(shape), elt, tuple(origin))

    def filled(self, blk: _Block, stem: str, shape: Sequence[Ix], elt: str, value: float
               ) -> TensorVal:
        e = self.empty(blk, stem, shape, elt)
        c = blk.const(value, elt)
        name = blk.fresh(f"{stem}_fill")
        blk.emit(f"{name} = linalg.fill ins({c} : {elt}) outs({e.ssa} : {e.type}) -> {e.type}")
        return e.renamed(name)

    # -- one op over a tile ---------------------------------------------------------------

    def op(self, blk: _Block, op: Op, opl: OpPlan, tile: Box, dest: TensorVal, env: _Env,
           carried: _Carried | None) -> TensorVal:
        """Emit ``op`` over ``tile`` writing into ``dest`` (the accumulator when ``carried``
        accumulates); returns the new value of ``dest``."""
        kind = op.kind
        if kind.category is Category.FALLBACK:
            return self.fallback(blk, op, dest, env)
        self.check_body(op)
        splits = opl.split_map
        per = dict(opl.unit_elems)
        split_dims = [d for d in op.dim_names if splits[d] > 1]
        red_split = [d for d in op.reduction_dims if splits[d] > 1]
        if red_split:
            return self.split_reduction(blk, op, opl, tile, dest, env, carried, split_dims,
                                        red_split)
        accumulate = carried is not None and carried.accumulates
        if not split_dims:
            piece = self.core(blk, op, tile, dest, env, accumulate)
            return self.insert(blk, piece, dest, self.out_region(op, tile), parallel=False)
        ivs = {d: blk.fresh(f"{op.name}_{d}") for d in split_dims}
        shared = blk.fresh(f"{symbol_name(op.out.tensor)}_shared")
        new = blk.fresh(op.out.tensor)
        inner = blk.child()
        box = {d: self.thread_slice(inner, tile[d], per[d], splits[d], ivs.get(d))
               for d in op.dim_names}
        sh = dest.renamed(shared)
        piece = self.core(inner, op, box, sh, env, accumulate)
        blk.emit(f"{new} = scf.forall ({', '.join(ivs.values())}) in "
                 f"({', '.join(str(splits[d]) for d in split_dims)}) shared_outs({shared} = "
                 f"{dest.ssa}) -> ({dest.type}) {{")
        inner2 = inner.child()
        self.parallel_insert(inner2, piece, sh, self.out_region(op, box))
        blk.extend(inner)  # after the insert, which may compute offsets in the thread body
        blk.emit(f"{INDENT}scf.forall.in_parallel {{")
        blk.extend(inner2)
        blk.emit(f"{INDENT}}}")
        blk.emit("}")
        return dest.renamed(new)

    def thread_slice(self, blk: _Block, tile: tuple[Ix, Ix], per: int, split: int,
                     iv: str | None) -> tuple[Ix, Ix]:
        start, size = tile
        if split == 1 or iv is None:
            return start, size
        lo, n = slice_of(blk, size, per, split, Ix.atom(iv), iv[1:])
        return start + lo, n

    def check_body(self, op: Op) -> None:
        kind = op.kind
        if kind.reducer is not None and kind.reducer.mlir_combine is None:
            raise EmitError(f"op {op.name!r}: kind {kind.name!r} has no MLIR combine for its "
                            f"reducer {kind.reducer.name!r}; it cannot be emitted as parallel IR")
        if kind.category is not Category.REDUCTION and kind.mlir_body is None:
            raise EmitError(f"op {op.name!r}: kind {kind.name!r} has no MLIR body; it cannot be "
                            "emitted as parallel IR")

    # -- typing -----------------------------------------------------------------------------

    def compute_type(self, op: Op) -> str:
        """The scalar type ``op`` computes in (see the module docstring)."""
        kind = op.kind
        dtypes = [self.dtype(a.tensor) for a in op.ins]
        values = [dtypes[i] for i in kind.value_inputs(len(dtypes))]
        if not values:
            return "i1"
        bodies = [b for b in (kind.mlir_body, kind.reducer and kind.reducer.mlir_combine)
                  if b is not None]
        if all(d in _NARROW for d in values):
            return "f32"
        if all(d in _INTS | {"bool"} for d in values) and all(b.int is not None
                                                              for b in bodies):
            return "i64"
        if all(d in FLOAT_DTYPES | {"bool"} for d in values):
            return "f32"
        return "f64"

    def inputs_to(self, blk: _Block, op: Op, args: Sequence[str], ty: str) -> list[str]:
        """Block arguments of ``op``'s inputs converted: values to ``ty``, conditions to i1."""
        out = []
        for i, (a, arg) in enumerate(zip(op.ins, args, strict=True)):
            elt = mlir_type(self.dtype(a.tensor))
            out.append(_convert(blk, arg, elt, "i1" if i in op.kind.conditions else ty))
        return out

    # -- reading and writing slices ---------------------------------------------------------

    def read(self, blk: _Block, val: TensorVal, access: Access, box: Box, dims: Sequence[str]
             ) -> _Slice:
        region = _region(access, box)
        offsets = [lo - o for (lo, _, _), o in zip(region, val.origin, strict=True)]
        sizes = [ext for _, ext, _ in region]
        keep = [not lit for _, _, lit in region]
        results = []
        for e, k in zip(access.index, keep, strict=True):
            if k:
                terms = [f"d{dims.index(d)}" if c == 1 else f"d{dims.index(d)} * {c}"
                         for d, c in e.terms]
                results.append(" + ".join(terms))
        whole = all(k for k in keep) and all(
            off.is_const and off.value == 0 for off in offsets) and all(
            s == v for s, v in zip(sizes, val.shape, strict=True))
        if whole:
            return _Slice(val.ssa, val.type, val.elt, results)
        kept = [s for s, k in zip(sizes, keep, strict=True) if k]
        ty = _ttype(kept, val.elt)
        name = blk.fresh(f"{access.tensor}_s")
        stem = symbol_name(access.tensor)
        offs, lens = self.list(blk, offsets, f"{stem}_off"), self.list(blk, sizes, f"{stem}_len")
        blk.emit(f"{name} = tensor.extract_slice {val.ssa}[{offs}][{lens}]"
                 f"[{', '.join('1' for _ in sizes)}] : {val.type} to {ty}")
        return _Slice(name, ty, val.elt, results)

    def list(self, blk: _Block, items: Sequence[Ix], stem: str = "ix") -> str:
        return ", ".join(blk.operand(i, stem) for i in items)

    def out_region(self, op: Op, box: Box) -> list[tuple[Ix, Ix, bool]]:
        return _region(op.out, box)

    def out_shape(self, op: Op, box: Box) -> list[Ix]:
        """The sizes of the output's non-literal axes over ``box`` (the op's parallel dims in the
        output's order)."""
        return [box[e.single_dim][1] for e in op.out.index if e.single_dim]

    def out_dims(self, op: Op) -> list[str]:
        return [e.single_dim for e in op.out.index if e.single_dim]

    def extract_out(self, blk: _Block, dest: TensorVal, region: list[tuple[Ix, Ix, bool]],
                    stem: str) -> TensorVal:
        """The slice of ``dest`` a piece over ``region`` overwrites (literal axes dropped)."""
        offsets = [lo - o for (lo, _, _), o in zip(region, dest.origin, strict=True)]
        sizes = [ext for _, ext, _ in region]
        kept = tuple(s for s, (_, _, lit) in zip(sizes, region, strict=True) if not lit)
        if all(off.is_const and off.value == 0 for off in offsets) and tuple(sizes) == \
                dest.shape and len(kept) == len(sizes):
            return dest
        name = blk.fresh(f"{stem}_o")
        ty = _ttype(kept, dest.elt)
        stem = symbol_name(stem)
        offs, lens = self.list(blk, offsets, f"{stem}_off"), self.list(blk, sizes, f"{stem}_len")
        blk.emit(f"{name} = tensor.extract_slice {dest.ssa}[{offs}][{lens}]"
                 f"[{', '.join('1' for _ in sizes)}] : {dest.type} to {ty}")
        return TensorVal(name, kept, dest.elt)

    def insert(self, blk: _Block, piece: TensorVal, dest: TensorVal,
               region: list[tuple[Ix, Ix, bool]], parallel: bool) -> TensorVal:
        offsets = [lo - o for (lo, _, _), o in zip(region, dest.origin, strict=True)]
        sizes = [ext for _, ext, _ in region]
        if piece.ssa == dest.ssa:
            return dest
        if not parallel and all(off.is_const and off.value == 0 for off in offsets) and \
                tuple(sizes) == dest.shape and piece.shape == dest.shape:
            return dest.renamed(piece.ssa)
        stem = symbol_name(dest.ssa[1:])
        # scf.forall.in_parallel holds only the inserts: offsets go in the thread's body
        at = blk.parent if parallel and blk.parent is not None else blk
        offs, lens = self.list(at, offsets, f"{stem}_off"), self.list(at, sizes, f"{stem}_len")
        text = (f"{piece.ssa} into {dest.ssa}[{offs}][{lens}]"
                f"[{', '.join('1' for _ in sizes)}] : {piece.type} into {dest.type}")
        if parallel:
            blk.emit(f"tensor.parallel_insert_slice {text}")
            return dest
        name = blk.fresh(dest.ssa[1:].split("_init")[0])
        blk.emit(f"{name} = tensor.insert_slice {text}")
        return dest.renamed(name)

    def parallel_insert(self, blk: _Block, piece: TensorVal, dest: TensorVal,
                        region: list[tuple[Ix, Ix, bool]]) -> None:
        self.insert(blk, piece, dest, region, parallel=True)

    # -- linalg.generic ---------------------------------------------------------------------

    def generic(self, blk: _Block, dims: Sequence[str], sizes: Mapping[str, Ix],
                reductions: Sequence[str], ins: list[_Slice], outs: list[TensorVal],
                out_results: list[str], body: Callable[[_Block, list[str], list[str]],
                                                      list[str]], stem: str) -> list[TensorVal]:
        """A ``linalg.generic`` over ``dims``; ``body(block, in_args, out_args)`` returns the
        yielded values. Dims no operand indexes alone get a shape-only operand."""
        n = len(dims)
        maps = [s.results for s in ins] + [out_results for _ in outs]
        pure = {r for m in maps for r in m}
        n_ins = len(ins)
        ins = list(ins)
        for i, d in enumerate(dims):
            if f"d{i}" not in pure:
                shape = self.empty(blk, f"range_{d}", [sizes[d]], "i8")
                ins.append(_Slice(shape.ssa, shape.type, "i8", [f"d{i}"]))
        all_maps = [s.results for s in ins] + [out_results for _ in outs]
        iters = ", ".join('"reduction"' if d in reductions else '"parallel"' for d in dims)
        maps_text = ", ".join(_map(n, m) for m in all_maps)
        res = blk.fresh(stem)
        head = f"{res}:{len(outs)}" if len(outs) > 1 else res
        ins_text = (f" ins({', '.join(s.ssa for s in ins)} : "
                    f"{', '.join(s.type for s in ins)})") if ins else ""
        out_types = ", ".join(o.type for o in outs)
        blk.emit(f"{head} = linalg.generic {{indexing_maps = [{maps_text}], iterator_types = "
                 f"[{iters}]}}{ins_text} outs({', '.join(o.ssa for o in outs)} : {out_types}) {{")
        inner = blk.child()
        in_args = [inner.fresh("in") for _ in ins]
        out_args = [inner.fresh("out") for _ in outs]
        header = ", ".join(f"{a}: {s.elt}" for a, s in zip(in_args, ins, strict=True))
        header += (", " if ins else "") + ", ".join(
            f"{a}: {o.elt}" for a, o in zip(out_args, outs, strict=True))
        blk.emit(f"^bb0({header}):")
        yields = body(inner, in_args[:n_ins], out_args)
        blk.extend(inner)
        blk.emit(f"{INDENT}linalg.yield {', '.join(yields)} : "
                 f"{', '.join(o.elt for o in outs)}")
        blk.emit(f"}} -> {out_types if len(outs) == 1 else f'({out_types})'}")
        names = [res] if len(outs) == 1 else [f"{res}#{i}" for i in range(len(outs))]
        return [o.renamed(nm) for o, nm in zip(outs, names, strict=True)]

    # -- a thread's computation ---------------------------------------------------------------

    def core(self, blk: _Block, op: Op, box: Box, dest: TensorVal, env: _Env, accumulate: bool
             ) -> TensorVal:
        """``op`` over ``box``: the finished piece of the output (the accumulated piece of
        the accumulator when ``accumulate``), literal axes dropped."""
        kind = op.kind
        dims = list(op.dim_names)
        sizes = {d: box[d][1] for d in dims}
        ins = [self.read(blk, env.vals[a.tensor], a, box, dims) for a in op.ins]
        out_results = [f"d{dims.index(d)}" for d in self.out_dims(op)]
        ty = self.compute_type(op)
        integer = ty == "i64"
        out_elt = dest.elt
        if kind.elementwise:
            o = self.extract_out(blk, dest, self.out_region(op, box), op.out.tensor)
            result_ty = "i1" if kind.result_dtype == "bool" else ty
            attrs = self.attr_values(op)
            assert kind.mlir_body is not None

            def body(b: _Block, args: list[str], outs: list[str]) -> list[str]:
                xs = self.inputs_to(b, op, args, ty)
                consts = {k: b.const(v, ty) for k, v in attrs.items()}
                named = dict(zip("abc", xs, strict=False))
                r = _apply(b, kind.mlir_body, integer, ty, {**named, **consts})[0]
                return [_convert(b, r, result_ty, out_elt)]

            return self.generic(blk, dims, sizes, [], ins, [o], out_results, body,
                                symbol_name(op.out.tensor))[0]
        acc = self.reduce_into(blk, op, box, ins, out_results, ty, dest if accumulate else None)
        if accumulate:
            return acc[0]
        return self.finish(blk, op, acc, lambda: self.extract_out(
            blk, dest, self.out_region(op, box), op.out.tensor))

    def accumulators(self, op: Op, ty: str) -> list[tuple[str, float]]:
        """(element type, identity) of each accumulator of ``op``."""
        r = op.kind.reducer
        assert r is not None
        if r.pairs:
            return [(ty, r.identity), ("i64", INDEX_MAX)]
        return [(ty, r.identity)]

    def reduce_into(self, blk: _Block, op: Op, box: Box, ins: list[_Slice],
                    out_results: list[str], ty: str, acc: TensorVal | None) -> list[TensorVal]:
        """The reduction or matmul of ``op`` over ``box`` accumulated into fresh identities, then
        (with ``acc``) combined into the slice of the accumulator ``acc``, as the reference
        combines a tile's partial. Returns the accumulators (two for argmax)."""
        kind = op.kind
        reducer = kind.reducer
        assert reducer is not None and reducer.mlir_combine is not None
        dims = list(op.dim_names)
        sizes = {d: box[d][1] for d in dims}
        shape = self.out_shape(op, box)
        integer = ty == "i64"
        outs = [self.filled(blk, symbol_name(op.out.tensor), shape, elt, ident)
                for elt, ident in self.accumulators(op, ty)]
        starts = {d: blk.value(box[d][0]) for d in op.reduction_dims} if reducer.pairs else {}

        def body(b: _Block, args: list[str], outs_: list[str]) -> list[str]:
            xs = self.inputs_to(b, op, args, ty)
            if kind.category is Category.MATMUL:
                assert kind.mlir_body is not None
                value = _apply(b, kind.mlir_body, integer, ty, {"a": xs[0], "b": xs[1]})[0]
            else:
                value = xs[0]
            if not reducer.pairs:
                return _apply(b, reducer.mlir_combine, integer, ty, {"a": outs_[0], "b": value})
            flat = self.flat_index(b, op, dims, starts)
            return _apply(b, reducer.mlir_combine, integer, ty,
                          {"a": outs_[0], "ai": outs_[1], "b": value, "bi": flat},
                          results=("r", "ri"))

        parts = self.generic(blk, dims, sizes, op.reduction_dims, ins, outs, out_results, body,
                             f"{symbol_name(op.out.tensor)}_acc")
        if acc is None:
            return parts
        return [self.combine_into(blk, op, self.extract_out(
            blk, acc, self.out_region(op, box), op.out.tensor), parts[0], ty)]

    def combine_into(self, blk: _Block, op: Op, acc: TensorVal, part: TensorVal, ty: str
                     ) -> TensorVal:
        """``acc`` combined elementwise with the partial ``part`` of the same shape (a generic
        that reads a slice of a loop-carried accumulator as its init does not compile in IREE
        when its sizes are dynamic; this elementwise form does)."""
        reducer = op.kind.reducer
        assert reducer is not None and reducer.mlir_combine is not None
        ident = [f"d{i}" for i in range(len(acc.shape))]
        sizes = {f"p{i}": n for i, n in enumerate(acc.shape)}

        def body(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            return _apply(b, reducer.mlir_combine, ty == "i64", ty, {"a": args[0], "b": args[1]})

        return self.generic(blk, list(sizes), sizes, [],
                            [_Slice(acc.ssa, acc.type, acc.elt, ident),
                             _Slice(part.ssa, part.type, part.elt, ident)],
                            [acc], ident, body, f"{symbol_name(op.out.tensor)}_comb")[0]

    def flat_index(self, b: _Block, op: Op, dims: list[str], starts: Mapping[str, str]) -> str:
        """Inside a body: the row-major flat index (i64) over the op's whole reduction dims of
        the current point (``starts``: the box's start in each reduction dim)."""
        flat: str | None = None
        stride = 1
        for d in reversed(op.reduction_dims):
            i = b.fresh(f"i_{d}")
            b.emit(f"{i} = linalg.index {dims.index(d)} : index")
            g = b.fresh(f"g_{d}")
            b.emit(f"{g} = arith.addi {i}, {starts[d]} : index")
            if stride != 1:
                sc = b.fresh("stride")
                b.emit(f"{sc} = arith.constant {stride} : index")
                m = b.fresh(f"m_{d}")
                b.emit(f"{m} = arith.muli {g}, {sc} : index")
                g = m
            if flat is None:
                flat = g
            else:
                s = b.fresh("flat")
                b.emit(f"{s} = arith.addi {flat}, {g} : index")
                flat = s
            stride *= op.sizes[d]
        if flat is None:
            flat = b.fresh("flat")
            b.emit(f"{flat} = arith.constant 0 : index")
        out = b.fresh("idx")
        b.emit(f"{out} = arith.index_cast {flat} : index to i64")
        return out

    def finish(self, blk: _Block, op: Op, accs: list[TensorVal],
               out: Callable[[], TensorVal]) -> TensorVal:
        """The output piece of finished accumulators: argmax's indices, a mean divided by its
        count, converted to the output type; ``out()`` gives the slice it overwrites (of the
        accumulators' shape)."""
        reducer = op.kind.reducer
        assert reducer is not None
        acc = accs[-1] if reducer.pairs else accs[0]
        is_mean = reducer.finish is not None and not reducer.pairs
        out_elt = mlir_type(self.dtype(op.out.tensor))
        if acc.elt == out_elt and not is_mean:
            return acc
        o = out()
        rank = len(acc.shape)
        ident = [f"d{i}" for i in range(rank)]
        count = math.prod(op.sizes[d] for d in op.reduction_dims)

        def body(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            v = args[0]
            src = acc.elt
            if is_mean:
                fty = src if src in _FLOAT_TYPES else "f64"
                v = _convert(b, v, src, fty)
                c = b.const(float(count), fty)
                q = b.fresh("mean")
                b.emit(f"{q} = arith.divf {v}, {c} : {fty}")
                v, src = q, fty
            return [_convert(b, v, src, out_elt)]

        sizes = {f"p{i}": s for i, s in enumerate(acc.shape)}
        return self.generic(blk, list(sizes), sizes, [], [_Slice(acc.ssa, acc.type, acc.elt,
                                                                 ident)],
                            [o], ident, body, f"{symbol_name(op.out.tensor)}_fin")[0]

    def attr_values(self, op: Op) -> dict[str, float]:
        body = op.kind.mlir_body
        values = dict(body.defaults) if body is not None else {}
        values.update(op.kind.numeric_attrs(dict(op.attrs)))
        return values

    # -- split reductions ---------------------------------------------------------------------

    def split_reduction(self, blk: _Block, op: Op, opl: OpPlan, tile: Box, dest: TensorVal,
                        env: _Env, carried: _Carried | None, split_dims: list[str],
                        red_split: list[str]) -> TensorVal:
        """One partial per slice of the split reduction dims, written by a forall into a
        ``[slices, ...output dims]`` tensor, then combined by ``linalg.reduce``."""
        splits = opl.split_map
        per = dict(opl.unit_elems)
        ty = self.compute_type(op)
        integer = ty == "i64"
        reducer = op.kind.reducer
        assert reducer is not None and reducer.mlir_combine is not None
        count = math.prod(splits[d] for d in red_split)
        tile_shape = self.out_shape(op, tile)
        stem = symbol_name(op.out.tensor)
        # a forall's shared tensor has a static shape (IREE cannot resolve the sizes of a
        # dynamic one carried through the loop it becomes): the whole dim bounds a run-time tile
        bound = [s if s.is_const else Ix(op.sizes[d])
                 for s, d in zip(tile_shape, self.out_dims(op), strict=True)]
        parts = [self.empty(blk, f"{stem}_parts", [Ix(count), *bound], elt)
                 for elt, _ in self.accumulators(op, ty)]
        ivs = {d: blk.fresh(f"{op.name}_{d}") for d in split_dims}
        shared = [p.renamed(blk.fresh(f"{stem}_part")) for p in parts]
        new = blk.fresh(f"{stem}_parts")
        inner = blk.child()
        box = {d: self.thread_slice(inner, tile[d], per[d], splits[d], ivs.get(d))
               for d in op.dim_names}
        dims = list(op.dim_names)
        ins = [self.read(inner, env.vals[a.tensor], a, box, dims) for a in op.ins]
        out_results = [f"d{dims.index(d)}" for d in self.out_dims(op)]
        pieces = self.reduce_into(inner, op, box, ins, out_results, ty, None)
        slot = Ix(0)
        for d in red_split:
            slot = slot * splits[d] + Ix.atom(ivs[d])
        heads = [s.ssa for s in shared]
        types = ", ".join(p.type for p in parts)
        shared_text = ", ".join(f"{s} = {p.ssa}" for s, p in zip(heads, parts, strict=True))
        head = f"{new}:{len(parts)}" if len(parts) > 1 else new
        blk.emit(f"{head} = scf.forall ({', '.join(ivs.values())}) in "
                 f"({', '.join(str(splits[d]) for d in split_dims)}) shared_outs("
                 f"{shared_text}) -> ({types}) {{")
        ins_blk = inner.child()
        region = [(slot, Ix(1), True)] + [
            (box[d][0] - tile[d][0], box[d][1], False) for d in self.out_dims(op)]
        for piece, sh in zip(pieces, shared, strict=True):
            self.parallel_insert(ins_blk, piece, sh, region)
        blk.extend(inner)
        blk.emit(f"{INDENT}scf.forall.in_parallel {{")
        blk.extend(ins_blk)
        blk.emit(f"{INDENT}}}")
        blk.emit("}")
        results = [p.renamed(f"{new}#{i}" if len(parts) > 1 else new)
                   for i, p in enumerate(parts)]
        if bound != tile_shape:  # the run-time tile of the bounding partials
            whole = [(Ix(0), Ix(count), False)] + [(Ix(0), s, False) for s in tile_shape]
            results = [self.extract_out(blk, r, whole, f"{stem}_parts") for r in results]
        # combine in slice order into fresh identities or the accumulator's tile
        accumulate = carried is not None and carried.accumulates
        out_region = self.out_region(op, tile)
        inits = [self.filled(blk, f"{stem}_comb", tile_shape, elt, ident)
                 for elt, ident in self.accumulators(op, ty)]
        red = blk.fresh(f"{stem}_red")
        head = f"{red}:{len(inits)}" if len(inits) > 1 else red
        in_types = ", ".join(r.type for r in results)
        init_types = ", ".join(i.type for i in inits)
        inner = blk.child().child()
        a_args = [inner.fresh("in") for _ in results]
        b_args = [inner.fresh("acc") for _ in inits]
        names = {"a": b_args[0], "b": a_args[0]}
        res_names: tuple[str, ...] = ("r",)
        if reducer.pairs:
            names.update(ai=b_args[1], bi=a_args[1])
            res_names = ("r", "ri")
        yields = _apply(inner, reducer.mlir_combine, integer, ty, names, res_names)
        args = ", ".join(f"{a}: {r.elt}" for a, r in zip(a_args, results, strict=True))
        args += ", " + ", ".join(f"{b}: {i.elt}" for b, i in zip(b_args, inits, strict=True))
        blk.emit(f"{head} = linalg.reduce ins({', '.join(r.ssa for r in results)} : {in_types}) "
                 f"outs({', '.join(i.ssa for i in inits)} : {init_types}) dimensions = [0]")
        blk.emit(f"{INDENT}({args}) {{")
        blk.extend(inner)
        blk.emit(f"{INDENT}{INDENT}linalg.yield {', '.join(yields)} : "
                 f"{', '.join(i.elt for i in inits)}")
        blk.emit(f"{INDENT}}}")
        combined = [i.renamed(red if len(inits) == 1 else f"{red}#{k}")
                    for k, i in enumerate(inits)]
        if accumulate:
            whole = self.combine_into(blk, op, self.extract_out(
                blk, dest, out_region, op.out.tensor), combined[0], ty)
            return self.insert(blk, whole, dest, out_region, parallel=False)
        piece = self.finish(blk, op, combined, lambda: self.extract_out(
            blk, dest, out_region, op.out.tensor))
        return self.insert(blk, piece, dest, out_region, parallel=False)

    # -- fallbacks ----------------------------------------------------------------------------

    def fallback(self, blk: _Block, op: Op, dest: TensorVal, env: _Env) -> TensorVal:
        """A fallback runs whole along the last axis of its whole input; the result is then read
        through the input's access and written through the output's (a transpose at most)."""
        kind = op.kind
        body = kind.mlir_body
        if body is None or body.construction not in _CONSTRUCTIONS:
            raise EmitError(f"op {op.name!r}: kind {kind.name!r} has no MLIR construction; it "
                            "cannot be emitted as parallel IR")
        src = env.vals[op.ins[0].tensor]
        if not src.shape:
            raise EmitError(f"op {op.name!r}: {kind.name} of a rank-0 tensor has no last axis")
        ty = self.compute_type(op)
        res = _CONSTRUCTIONS[body.construction](self, blk, op, body, src, ty)
        dims = list(op.dim_names)
        box = {d: (Ix(0), Ix(n)) for d, n in op.dims}
        read = self.read(blk, res, op.ins[0], box, dims)
        o = self.extract_out(blk, dest, self.out_region(op, box), op.out.tensor)
        out_results = [f"d{dims.index(d)}" for d in self.out_dims(op)]

        def convert(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            return [_convert(b, args[0], ty, dest.elt)]

        piece = self.generic(blk, dims, {d: Ix(n) for d, n in op.dims}, [], [read], [o],
                             out_results, convert, symbol_name(op.out.tensor))[0]
        return self.insert(blk, piece, dest, self.out_region(op, box), parallel=False)

    def along_last(self, src: TensorVal, extra: bool) -> tuple[list[str], list[str], list[str]]:
        """Maps over (..., i[, j]) of ``src``: (x at i, x at j, out at i) results."""
        r = len(src.shape)
        lead = [f"d{k}" for k in range(r - 1)]
        at_i = [*lead, f"d{r - 1}"]
        at_j = [*lead, f"d{r}"] if extra else at_i
        return at_i, at_j, at_i

    def scan(self, blk: _Block, op: Op, body: MlirBody, src: TensorVal, ty: str) -> TensorVal:
        r = len(src.shape)
        at_i, at_j, out = self.along_last(src, True)
        init = self.filled(blk, f"{op.name}_scan", src.shape, ty, body.identity)
        sizes = {f"a{k}": s for k, s in enumerate(src.shape)} | {"j": src.shape[-1]}
        integer = ty == "i64"

        def run(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            x = _convert(b, args[0], src.elt, ty)
            i, j, le = b.fresh("i"), b.fresh("j"), b.fresh("le")
            b.emit(f"{i} = linalg.index {r - 1} : index")
            b.emit(f"{j} = linalg.index {r} : index")
            b.emit(f"{le} = arith.cmpi ule, {j}, {i} : index")
            s = _apply(b, body, integer, ty, {"a": outs[0], "b": x})[0]
            sel = b.fresh("sel")
            b.emit(f"{sel} = arith.select {le}, {s}, {outs[0]} : {ty}")
            return [sel]

        return self.generic(blk, list(sizes), sizes, ["j"],
                            [_Slice(src.ssa, src.type, src.elt, at_j)], [init], out, run,
                            f"{op.name}_scan")[0]

    def reverse(self, blk: _Block, op: Op, body: MlirBody, src: TensorVal, ty: str
                ) -> TensorVal:
        # a gather (tensor.extract at n-1-i): IREE tiles a reversed indexing map wrongly
        r = len(src.shape)
        at_i, _, out = self.along_last(src, False)
        init = self.empty(blk, f"{op.name}_rev", src.shape, ty)
        sizes = {f"a{k}": s for k, s in enumerate(src.shape)}
        last = blk.value(src.shape[-1] - 1)

        def run(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            idx = []
            for k in range(r):
                i = b.fresh(f"i{k}")
                b.emit(f"{i} = linalg.index {k} : index")
                idx.append(i)
            rev = b.fresh("rev")
            b.emit(f"{rev} = arith.subi {last}, {idx[-1]} : index")
            x = b.fresh("x")
            b.emit(f"{x} = tensor.extract {src.ssa}[{', '.join([*idx[:-1], rev])}] : "
                   f"{src.type}")
            return [_convert(b, x, src.elt, ty)]

        return self.generic(blk, list(sizes), sizes, [], [], [init], out, run,
                            f"{op.name}_rev")[0]

    def sort(self, blk: _Block, op: Op, body: MlirBody, src: TensorVal, ty: str) -> TensorVal:
        r = len(src.shape)
        at_i, at_j, out = self.along_last(src, True)
        integer = ty == "i64"
        sizes = {f"a{k}": s for k, s in enumerate(src.shape)} | {"j": src.shape[-1]}
        ranks0 = self.filled(blk, f"{op.name}_rank", src.shape, "i64", 0)

        def rank(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            xi = _convert(b, args[0], src.elt, ty)
            xj = _convert(b, args[1], src.elt, ty)
            lt_ji = _apply(b, body, integer, ty, {"a": xj, "b": xi})[0]
            lt_ij = _apply(b, body, integer, ty, {"a": xi, "b": xj})[0]
            i, j = b.fresh("i"), b.fresh("j")
            b.emit(f"{i} = linalg.index {r - 1} : index")
            b.emit(f"{j} = linalg.index {r} : index")
            names = {k: b.fresh(k) for k in ("first", "true", "nlt", "tie", "before", "one",
                                             "inc", "rank")}
            b.emit(f"{names['first']} = arith.cmpi ult, {j}, {i} : index")
            b.emit(f"{names['true']} = arith.constant true")
            b.emit(f"{names['nlt']} = arith.xori {lt_ij}, {names['true']} : i1")
            b.emit(f"{names['tie']} = arith.andi {names['nlt']}, {names['first']} : i1")
            b.emit(f"{names['before']} = arith.ori {lt_ji}, {names['tie']} : i1")
            b.emit(f"{names['one']} = arith.constant 1 : i64")
            b.emit(f"{names['inc']} = arith.addi {outs[0]}, {names['one']} : i64")
            b.emit(f"{names['rank']} = arith.select {names['before']}, {names['inc']}, "
                   f"{outs[0]} : i64")
            return [names["rank"]]

        ranks = self.generic(blk, list(sizes), sizes, ["j"],
                             [_Slice(src.ssa, src.type, src.elt, at_i),
                              _Slice(src.ssa, src.type, src.elt, at_j)],
                             [ranks0], out, rank, f"{op.name}_rank")[0]
        init = self.filled(blk, f"{op.name}_sorted", src.shape, ty, 0)

        def pick(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            x = _convert(b, args[0], src.elt, ty)
            i, ic, hit, sel = b.fresh("pos"), b.fresh("pos64"), b.fresh("hit"), b.fresh("pick")
            b.emit(f"{i} = linalg.index {r - 1} : index")
            b.emit(f"{ic} = arith.index_cast {i} : index to i64")
            b.emit(f"{hit} = arith.cmpi eq, {args[1]}, {ic} : i64")
            b.emit(f"{sel} = arith.select {hit}, {x}, {outs[0]} : {ty}")
            return [sel]

        return self.generic(blk, list(sizes), sizes, ["j"],
                            [_Slice(src.ssa, src.type, src.elt, at_j),
                             _Slice(ranks.ssa, ranks.type, "i64", at_j)],
                            [init], out, pick, f"{op.name}_sorted")[0]

    # -- loop groups --------------------------------------------------------------------------

    def group(self, blk: _Block, group: GroupPlan, env: _Env) -> None:
        p = self.program
        ops = [p.op(n) for n in group.ops]
        plans = {op.name: self.op_plan(op) for op in ops}
        for op in ops:
            loop = plans[op.name].loop
            if loop is None or loop.group != group.path or loop.count != group.counts:
                raise EmitError(f"op {op.name!r}: plan's loop {loop} is not group "
                                f"{list(group.path)} with counts {list(group.counts)}")
            if not op.kind.divisible:
                raise EmitError(f"op {op.name!r}: a fallback op cannot sit in a loop group")
        counts = [Ix.atom(self.symbols[c]) if isinstance(c, str) else Ix(c)
                  for c in group.counts]
        accumulating = {c.op for c in group.combines}
        inits = {i.op: i.level for i in group.inits}
        names = set(group.ops)
        after = {a.tensor for o in p.ops if o.name not in names for a in o.ins} | set(p.outputs)
        carried: list[_Carried] = []
        for op in ops:
            t = op.out.tensor
            tt = p.tensor(t)
            shape = tuple(Ix(s) for s in tt.shape)
            if op.name in accumulating:
                if op.kind.reducer is None or op.kind.reducer.pairs:
                    raise EmitError(f"op {op.name!r}: {op.kind.name} cannot accumulate across "
                                    "loop iterations")
                ty = self.compute_type(op)
                level = inits.get(op.name, 0)
                if level == 0:
                    val = self.filled(blk, f"{t}_acc", shape, ty, op.kind.reducer.identity)
                else:
                    val = self.empty(blk, f"{t}_acc", shape, ty)
                carried.append(_Carried(t, op, True, val, level))
            elif t in after:
                carried.append(_Carried(t, op, False, self.empty(blk, t, shape,
                                                                 mlir_type(tt.dtype))))
        results = self.loop(blk, group, ops, plans, counts, [], carried, env)
        for c, val in zip(carried, results, strict=True):
            if not c.accumulates:
                env.vals[c.tensor] = val
                continue
            elt = mlir_type(p.tensor(c.tensor).dtype)
            piece = self.finish(blk, c.op, [val], lambda c=c, val=val, elt=elt: self.empty(
                blk, c.tensor, val.shape, elt))
            env.vals[c.tensor] = TensorVal(piece.ssa, val.shape, piece.elt)

    def tile(self, blk: _Block, op: Op, loop: LoopInfo, ivs: Sequence[Ix], counts: Sequence[Ix]
             ) -> Box:
        """The box of ``op`` at loop indices ``ivs`` (levels ``len(ivs)`` and deeper whole), as
        ``plans.tiles.tile_box`` cuts it."""
        box = {d: (Ix(0), Ix(n)) for d, n in op.dims}
        for level, iv in enumerate(ivs):
            for d in loop.tiled_dims[level]:
                lo, n = box[d]
                step = blk.div(n, counts[level])
                box[d] = (lo + blk.mul(iv, step), step)
        return box

    def loop(self, blk: _Block, group: GroupPlan, ops: list[Op], plans: Mapping[str, OpPlan],
             counts: list[Ix], ivs: list[Ix], carried: list[_Carried], env: _Env
             ) -> list[TensorVal]:
        """Emit loop level ``len(ivs)`` (and those inside it); returns the carried values."""
        level = len(ivs)
        iv = blk.fresh(f"i{level}")
        args = [c.val.renamed(blk.fresh(f"{c.tensor}_{'acc' if c.accumulates else 'it'}"))
                for c in carried]
        res = blk.fresh(f"loop{level}")
        types = ", ".join(a.type for a in args)
        head = f"{res}:{len(args)}" if len(args) > 1 else res
        iter_text = ", ".join(f"{a.ssa} = {c.val.ssa}" for a, c in zip(args, carried,
                                                                        strict=True))
        bound = blk.value(counts[level])
        if args:
            blk.emit(f"{head} = scf.for {iv} = {blk.value(0)} to {bound} step {blk.value(1)} "
                     f"iter_args({iter_text}) -> ({types}) {{")
        else:
            blk.emit(f"scf.for {iv} = {blk.value(0)} to {bound} step {blk.value(1)} {{")
        inner = blk.child()
        ivs = [*ivs, Ix.atom(iv)]
        current = [c.__class__(c.tensor, c.op, c.accumulates, a, c.init_level)
                   for c, a in zip(carried, args, strict=True)]
        # accumulators reset before the level that tiles their reduction
        for c in current:
            if c.accumulates and c.init_level == level + 1:
                loop = plans[c.op.name].loop
                assert loop is not None
                box = self.tile(inner, c.op, loop, ivs, counts)
                region = self.out_region(c.op, box)
                shape = [ext for _, ext, lit in region if not lit]
                assert c.op.kind.reducer is not None
                f = self.filled(inner, f"{c.tensor}_reset", shape, c.val.elt,
                                c.op.kind.reducer.identity)
                c.val = self.insert(inner, f, c.val, region, parallel=False)
        if level + 1 < len(counts):
            vals = self.loop(inner, group, ops, plans, counts, ivs, current, env)
        else:
            vals = self.iteration(inner, ops, plans, counts, ivs, current, env)
        blk.extend(inner)
        if args:
            blk.emit(f"{INDENT}scf.yield {', '.join(v.ssa for v in vals)} : {types}")
        blk.emit("}")
        names = [res] if len(args) == 1 else [f"{res}#{i}" for i in range(len(args))]
        return [c.val.renamed(n) for c, n in zip(carried, names, strict=True)]

    def iteration(self, blk: _Block, ops: list[Op], plans: Mapping[str, OpPlan],
                  counts: list[Ix], ivs: list[Ix], carried: list[_Carried], env: _Env
                  ) -> list[TensorVal]:
        """One iteration's tile: every op of the group; returns the carried values after it."""
        by_tensor = {c.tensor: c for c in carried}
        local = _Env(dict(env.vals))
        for c in carried:
            if not c.accumulates:
                local.vals[c.tensor] = c.val
        for op in ops:
            opl = plans[op.name]
            assert opl.loop is not None
            tile = self.tile(blk, op, opl.loop, ivs, counts)
            c = by_tensor.get(op.out.tensor)
            if c is not None:
                c.val = self.op(blk, op, opl, tile, c.val, local, c)
                if not c.accumulates:
                    local.vals[c.tensor] = c.val
                continue
            region = self.out_region(op, tile)
            out_t = self.program.tensor(op.out.tensor)
            # static: a run-time tile size is bounded by the whole dim (see split_reduction)
            shape = [ext if ext.is_const else Ix(n)
                     for (_, ext, _), n in zip(region, out_t.shape, strict=True)]
            dest = self.empty(blk, f"{op.out.tensor}_tile", shape, mlir_type(out_t.dtype),
                              [lo for lo, _, _ in region])
            local.vals[op.out.tensor] = self.op(blk, op, opl, tile, dest, local, None)
        return [c.val for c in carried]


_CONSTRUCTIONS: dict[str, Callable[..., TensorVal]] = {
    "scan": _Function.scan,
    "reverse": _Function.reverse,
    "sort": _Function.sort,
}


def supported(kind: OpKind) -> bool:
    """True when the emitter can emit ops of ``kind``."""
    if kind.category is Category.REDUCTION:
        return kind.reducer is not None and kind.reducer.mlir_combine is not None
    if kind.category is Category.FALLBACK:
        return kind.mlir_body is not None and kind.mlir_body.construction in _CONSTRUCTIONS
    reducer: Reducer | None = kind.reducer
    return kind.mlir_body is not None and (reducer is None or reducer.mlir_combine is not None)


