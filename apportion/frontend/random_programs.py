"""Random programs, targets and strategies for conformance testing: every op kind of the
registry, tiled and not, writes through a merge of dims, run-time sizes.

One generator serves two drivers. Each family is a function of a ``Draw`` (integers, a choice,
a coin): ``tests/conformance`` passes one over hypothesis's ``draw`` (so a failing example
shrinks), ``apportion bench conformance`` one over a seeded ``random.Random`` (so a failing case
is reproduced from its seed: ``case(seed)``). The families are the ones the property tests
drew from first: chains of pointwise, reduction, matmul, broadcast and merged ops
(``tests/passes/test_pipeline_properties.py``); masks, wheres, scalars, row statistics, and
fallbacks or a loop over rows (``test_kinds_properties.py``); one op of a merged write with
pinned splits (``tests/mlir/test_forall.py``); plus one op of any registry kind with
a consumer, chains in one or two nested loops, and programs with run-time sizes run at a
drawn size.

>>> c = case(7)
>>> c.seed, c.family in FAMILIES, c.program.ops[0].name != ""
(7, True, True)
>>> case(7) == case(7)
True
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from apportion.frontend.json_format import from_dict
from apportion.ir.kinds import KINDS, Category
from apportion.ir.program import Program
from apportion.target.presets import cpu, spyre
from apportion.target.target import Target

T = TypeVar("T")

FLOATS = ("float16", "bfloat16", "float32")
INTS = ("int8", "int32", "int64")
UNARY = ("exp", "neg", "relu", "silu", "sigmoid", "tanh", "sqrt")
BINARY = ("add", "mul", "sub", "max")
REDUCE = ("sum", "max", "mean", "min")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
STRATEGIES = ("greedy", "greedy-multiples", "balanced")
#: elements of one 128-byte stick per dtype (merged writes pad a last stick)
_STICK = {"float16": 64, "bfloat16": 64, "float32": 32, "int8": 128, "int32": 32,
          "int64": 16, "bool": 128}
#: kinds the planner makes itself (a transposed read's copy), never written in a program
_PLANNER_MADE = frozenset({"relayout"})
#: kinds of the registry, one op of each drawn by ``single`` (``every_kind`` lists them)
KIND_NAMES = tuple(k.name for k in KINDS if k.name not in _PLANNER_MADE)


class Draw(Protocol):
    """A source of choices: hypothesis's ``draw`` or a seeded ``random.Random``."""

    def integers(self, low: int, high: int) -> int: ...

    def sampled_from(self, values: Sequence[T]) -> T: ...

    def booleans(self) -> bool: ...


class Seeded:
    """A ``Draw`` over ``random.Random(seed)``: the same seed, the same choices.

    >>> Seeded(3).integers(1, 6) == Seeded(3).integers(1, 6)
    True
    """

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def integers(self, low: int, high: int) -> int:
        return self._rng.randint(low, high)

    def sampled_from(self, values: Sequence[T]) -> T:
        return values[self._rng.randrange(len(values))]

    def booleans(self) -> bool:
        return self._rng.random() < 0.5


@dataclass(frozen=True)
class Case:
    """One random program to plan and run: the program, the target and strategy to plan it
    for, the run-time sizes to run it at (empty: its planning sizes), its family, the seed that
    made it (None: drawn by hypothesis), and what it exercises (``features``)."""

    program: Program
    target: Target
    strategy: str
    family: str
    seed: int | None = None
    sizes: Mapping[str, int] = field(default_factory=dict)
    features: tuple[str, ...] = ()


def _doc(tensors: Mapping[str, tuple[list[Any], str]], ops: list[dict[str, Any]],
         outputs: list[str], inputs: Sequence[str] | None = None, **extra: Any) -> Program:
    """A program from declared tensors and op dicts in program format v1 (every declared
    tensor an input unless ``inputs`` says which)."""
    return from_dict({"format": "apportion.program/1", "name": extra.pop("name", "rand"),
                      "tensors": {n: {"shape": s, "dtype": d} for n, (s, d) in tensors.items()},
                      "inputs": list(tensors) if inputs is None else list(inputs),
                      "outputs": outputs, "ops": ops, **extra})


# -- targets --------------------------------------------------------------------------------------

def _spyre(d: Draw) -> Target:
    return spyre(cores=d.integers(1, 32))


def _cpu(d: Draw) -> Target:
    return dataclasses.replace(cpu(), cores=d.integers(1, 8), max_cores=8)


def _tiny(d: Draw) -> Target:
    return dataclasses.replace(spyre(), name="tiny", cores=d.integers(1, 24),
                               span_limit=d.sampled_from((128, 256, 1024, 4096)),
                               stick_bytes=d.sampled_from((8, 16, 32)))


#: the targets ``target`` draws from, each a function of the draw (Spyre twice as likely)
TARGET_DRAWS = (_spyre, _spyre, _cpu, _tiny)


def target(d: Draw) -> Target:
    """Spyre with 1 to 32 cores, the cpu preset with 1 to 8, or a tiny target (a small span
    limit and small sticks, so that span reduction and uneven splits bite).

    >>> target(Seeded(1)).name, [f.__name__ for f in TARGET_DRAWS]
    ('spyre', ['_spyre', '_spyre', '_cpu', '_tiny'])
    """
    return d.sampled_from(TARGET_DRAWS)(d)


# -- families -------------------------------------------------------------------------------------

def chain(d: Draw) -> Program:
    """1 to 4 ops in a chain: unary, binary, reduction (of rows or columns), matmul,
    broadcast, and columns written back through a merge of dims (a pointwise op or a matmul)."""
    dtype = d.sampled_from(FLOATS)
    m, n = d.integers(1, 48), d.integers(1, 96)
    tensors: dict[str, tuple[list[Any], str]] = {"x": ([m, n], dtype)}
    ops: list[dict[str, Any]] = []
    cur, shape = "x", [m, n]
    for i in range(d.integers(1, 4)):
        kind = d.sampled_from(("unary", "binary", "reduce", "matmul", "broadcast", "merge"))
        out = f"t{i}"
        factors = [a for a in range(2, shape[1]) if shape[1] % a == 0]
        if kind == "merge" and factors:
            a = d.sampled_from(factors)
            b = shape[1] // a
            if d.booleans():  # columns as digits (p, q) written back with the digits swapped
                ops.append({"name": f"op{i}", "op": d.sampled_from(UNARY),
                            "out": f"{out}[i,{a}*q+p]", "ins": [f"{cur}[i,{b}*p+q]"],
                            "dims": {"p": a, "q": b}})
            else:
                tensors[f"w{i}"] = ([shape[1], a, b], dtype)
                ops.append({"name": f"op{i}", "op": "matmul", "out": f"{out}[i,{b}*p+q]",
                            "ins": [f"{cur}[i,k]", f"w{i}[k,p,q]"]})
        elif kind in ("unary", "merge"):
            ops.append({"name": f"op{i}", "op": d.sampled_from(UNARY), "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]"]})
        elif kind == "binary":
            tensors[f"in{i}"] = (list(shape), dtype)
            ops.append({"name": f"op{i}", "op": d.sampled_from(BINARY), "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", f"in{i}[i,j]"]})
        elif kind == "reduce":
            rows = d.booleans()
            ops.append({"name": f"op{i}", "op": d.sampled_from(REDUCE),
                        "out": f"{out}[i,0]" if rows else f"{out}[0,j]",
                        "ins": [f"{cur}[i,j]"]})
            shape = [shape[0], 1] if rows else [1, shape[1]]
        elif kind == "broadcast":
            tensors[f"in{i}"] = ([shape[0], 1], dtype)
            ops.append({"name": f"op{i}", "op": "mul", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", f"in{i}[i,0]"]})
        else:
            k2 = d.integers(1, 80)
            tensors[f"w{i}"] = ([shape[1], k2], dtype)
            ops.append({"name": f"op{i}", "op": "matmul", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,k]", f"w{i}[k,j]"]})
            shape = [shape[0], k2]
        cur = out
    return _doc(tensors, ops, [cur], name="chain")


def masks(d: Draw) -> Program:
    """1 to 6 steps of comparisons, logic and wheres, a rank-0 scale, row statistics broadcast
    back; then the whole chain in one loop over rows, or fallbacks (cumsum), a reduction to a
    scalar and a literal index outside loops."""
    dtype = d.sampled_from(FLOATS)
    m, n = d.sampled_from((1, 2, 3, 4, 8, 16)), d.sampled_from((1, 5, 64, 128, 192))
    tensors: dict[str, tuple[list[Any], str]] = {"x": ([m, n], dtype), "s": ([], dtype)}
    ops: list[dict[str, Any]] = []
    cur = "x"
    for i in range(d.integers(1, 6)):
        what = d.sampled_from(("unary", "mask", "scale", "rowstat"))
        out = f"t{i}"
        if what == "unary":
            fn = d.sampled_from(("sin", "cos", "erf", "softplus", "clamp", "exp", "tanh"))
            extra = {"min": -0.25, "max": 0.5} if fn == "clamp" else {}
            ops.append({"name": f"u{i}", "op": fn, "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]"], **extra})
        elif what == "mask":
            tensors[f"o{i}"] = ([m, n], dtype)
            ops.append({"name": f"c{i}", "op": d.sampled_from(COMPARE), "out": f"k{i}[i,j]",
                        "ins": [f"{cur}[i,j]", f"o{i}[i,j]"]})
            logic = d.sampled_from(("logical_not", "logical_and", "logical_or"))
            ins = [f"k{i}[i,j]"] if logic == "logical_not" else [f"k{i}[i,j]", f"{cur}[i,j]"]
            ops.append({"name": f"l{i}", "op": logic, "out": f"q{i}[i,j]", "ins": ins})
            ops.append({"name": f"w{i}", "op": "where", "out": f"{out}[i,j]",
                        "ins": [f"q{i}[i,j]", f"{cur}[i,j]", f"o{i}[i,j]"]})
        elif what == "scale":
            ops.append({"name": f"m{i}", "op": "mul", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", "s[]"]})
        else:
            ops.append({"name": f"r{i}", "op": d.sampled_from(("max", "sum", "mean")),
                        "out": f"r{i}[i,0]", "ins": [f"{cur}[i,j]"]})
            ops.append({"name": f"a{i}", "op": "add", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", f"r{i}[i,0]"]})
        cur = out
    outputs = [cur]
    tiling: list[dict[str, Any]] = []
    if d.booleans() and m > 1:
        tiling = [{"ops": [o["name"] for o in ops],
                   "loops": [{"count": d.sampled_from((1, m)), "dims": ["i"]}]}]
    else:
        ops.append({"name": "cs", "op": "cumsum", "out": "cs[i,j]", "ins": [f"{cur}[i,j]"]})
        ops.append({"name": "tot", "op": d.sampled_from(("max", "min", "sum")),
                    "out": "tot[]", "ins": [f"{cur}[i,j]"]})
        ops.append({"name": "lit", "op": "copy", "out": "lit[0,0]", "ins": [f"{cur}[0,0]"]})
        outputs += ["cs", "tot", "lit"]
    return _doc(tensors, ops, outputs, name="masks", tiling=tiling)


def _dtype_for(d: Draw, name: str) -> str:
    """A dtype kind ``name`` accepts (integer products and sums of bools aside)."""
    accepts = next(k for k in KINDS if k.name == name).accepts
    floats = [t for t in FLOATS if t in accepts]
    ints = [t for t in INTS if t in accepts]
    if name in ("prod", "pow", "exp", "sigmoid", "silu", "gelu", "tanh", "softplus", "log",
                "sqrt", "rsqrt", "reciprocal", "erf", "sin", "cos", "uniform", "normal",
                "avg_pool", "mean"):
        return d.sampled_from(floats)
    return d.sampled_from(floats + ints if ints and d.booleans() else floats or ints)


def single(d: Draw, kind_name: str | None = None) -> Program:
    """One op of ``kind_name`` (default: any kind of the registry) over small random shapes,
    its output read by a pointwise op half the time, the two in a loop over rows sometimes."""
    name = kind_name or d.sampled_from(KIND_NAMES)
    k = next(kind for kind in KINDS if kind.name == name)
    dt = _dtype_for(d, name)
    m, n = d.integers(1, 12), d.integers(1, 3 * _STICK[dt])
    tensors: dict[str, tuple[list[Any], str]] = {}
    op: dict[str, Any] = {"name": "op", "op": name}
    out_shape: list[int] = [m, n]
    out_dtype = dt if k.result_dtype is None else k.result_dtype
    loopable = k.divisible
    if name == "fill":
        op |= {"out": "y[i,j]", "ins": [], "dims": {"i": m, "j": n}, "dtype": dt,
               "value": d.sampled_from((0.0, 0.25, -2.0, 3.0))}
    elif name in ("full", "uniform", "normal"):
        attrs = {"full": {"value": 1.5}, "uniform": {"low": -1.0, "high": 1.0, "seed": 3},
                 "normal": {"mean": 0.0, "std": 1.0, "seed": 5}}[name]
        op |= {"out": "y[i,j]", "ins": [], "dims": {"i": m, "j": n}, "dtype": dt, **attrs}
    elif name == "arange":
        if dt == "int8":  # 1..n must fit: validation refuses a constant its dtype cannot hold
            n = min(n, 127)
        out_shape = [n]
        op |= {"out": "y[j]", "ins": [], "dims": {"j": n}, "dtype": dt, "start": 1.0,
               "step": 1.0}
    elif name == "gather":
        rows = d.integers(4, 10)  # random int inputs are 1 to 3: every id is a row
        tensors = {"t": ([rows, n], dt), "ids": ([m], "int64")}
        op |= {"out": "y[i,j]", "ins": ["t[r,j]", "ids[i]"], "dims": {"r": rows}}
    elif name == "reshape":
        tensors = {"x": ([m, n], dt)}
        out_shape = [m * n]
        op |= {"out": "y[k]", "ins": ["x[i,j]"], "dims": {"k": m * n}}
    elif name == "concat":
        n2 = d.integers(1, 2 * _STICK[dt])
        tensors = {"x": ([m, n], dt), "z": ([m, n2], dt)}
        out_shape = [m, n + n2]
        op |= {"out": "y[a,b]", "ins": ["x[i,j]", "z[c,e]"], "axis": 1,
               "dims": {"a": m, "b": n + n2}}
    elif name == "topk":
        kk = d.integers(1, n)
        tensors = {"x": ([m, n], dt)}
        out_shape = [m, kk]
        op |= {"out": "y[i,t]", "ins": ["x[i,j]"], "dims": {"t": kk}}
    elif name == "conv":
        taps, c, f = d.integers(1, 3), d.integers(1, 8), d.integers(1, 2 * _STICK[dt])
        length = m + taps - 1
        tensors = {"x": ([length, c], dt), "w": ([taps, c, f], dt)}
        out_shape = [m, f]
        op |= {"out": "y[o,f]", "ins": ["x[o+t,c]", "w[t,c,f]"], "dims": {"o": m}}
    elif name in ("max_pool", "avg_pool"):
        window, stride = d.integers(1, 3), d.integers(1, 2)
        length = (m - 1) * stride + window
        tensors = {"x": ([length, n], dt)}
        op |= {"out": "y[o,j]", "ins": [f"x[{stride}*o+w,j]"], "dims": {"o": m, "w": window}}
    elif k.category is Category.MATMUL:
        kk = d.integers(1, 2 * _STICK[dt])
        tensors = {"x": ([m, kk], dt), "w": ([kk, n], dt)}
        op |= {"out": "y[i,j]", "ins": ["x[i,r]", "w[r,j]"]}
    elif k.category is Category.REDUCTION:
        tensors = {"x": ([m, n], "bool" if name == "any" and d.booleans() else dt)}
        if name == "argmax":
            out_shape = [m]
            op |= {"out": "y[i]", "ins": ["x[i,j]"]}
        else:
            out_shape = [m, 1]
            op |= {"out": "y[i,0]", "ins": ["x[i,j]"]}
    elif name == "copy":  # a transpose
        tensors = {"x": ([n, m], dt)}
        op |= {"out": "y[i,j]", "ins": ["x[j,i]"]}
    elif k.arity == 3:  # where
        tensors = {"c": ([m, n], "bool"), "x": ([m, n], dt), "z": ([1, n], dt)}
        op |= {"out": "y[i,j]", "ins": ["c[i,j]", "x[i,j]", "z[0,j]"]}
    elif k.arity == 2:
        tensors = {"x": ([m, n], dt), "z": ([m, n], dt)}
        second = "z[i,j]" if d.booleans() else "z[0,j]"
        op |= {"out": "y[i,j]", "ins": ["x[i,j]", second]}
    else:  # unary pointwise and fallbacks along the last axis
        tensors = {"x": ([m, n], dt)}
        op |= {"out": "y[i,j]", "ins": ["x[i,j]"]}
        if name == "clamp":
            op |= {"min": -0.25, "max": 0.5}
    ops = [op]
    outputs = ["y"]
    if len(out_shape) == 2 and out_dtype in FLOATS and d.booleans():  # a consumer reads it
        rows, cols = out_shape
        tensors["b"] = ([rows, cols], out_dtype)
        ix = "i,j" if out_shape == [m, n] else "a,b"  # the op's own dims where they are its
        ops.append({"name": "after", "op": "add", "out": f"z2[{ix}]",
                    "ins": [f"y[{ix}]", f"b[{ix}]"]})
        outputs = ["y", "z2"] if d.booleans() else ["z2"]
    tiling: list[dict[str, Any]] = []
    rows = out_shape[0]
    if loopable and all(_divisible(o) for o in ops) and len(out_shape) == 2 and rows > 1 \
            and (len(ops) == 1 or out_shape == [m, n]) and d.booleans():
        count = d.sampled_from([c for c in range(2, rows + 1) if rows % c == 0])
        dim = "o" if name in ("conv", "max_pool", "avg_pool") else "i"
        tiling = [{"ops": [o["name"] for o in ops], "loops": [{"count": count, "dims": [dim]}]}]
        if dim == "o" and len(ops) > 1:  # the consumer's rows are named i
            tiling = []
    inputs = list(tensors)
    return _doc(tensors, ops, outputs, inputs=inputs, name=f"one_{name}", tiling=tiling)


def _divisible(op: dict[str, Any]) -> bool:
    return next(k for k in KINDS if k.name == op["op"]).divisible


def merged(d: Draw) -> Program:
    """One matmul, reduction or broadcasting pointwise op writing through a merge of dims
    (``y[i, n*h+j]``, ``y[m*h+i, j]``, ``y[g*i+h]``), its reduction dim's split and others
    pinned sometimes, a padded last stick sometimes."""
    kind = d.sampled_from(("matmul", "reduction", "pointwise"))
    dtypes = {"matmul": ("float16", "bfloat16", "float32", "int32", "int64"),
              "reduction": ("float16", "bfloat16", "float32", "int8", "int32", "bool"),
              "pointwise": tuple(sorted(_STICK))}[kind]
    dt = d.sampled_from(dtypes)
    m = d.integers(1, 9)
    split = d.sampled_from((1, 2, 3, 4))
    pad = d.sampled_from((0, 1, _STICK[dt] - 1))
    length = max(1, _STICK[dt] * split * d.integers(1, 2) - pad)
    g = d.integers(1, 3)
    red: str | None
    if kind == "matmul":
        n = d.integers(1, 3 * _STICK[dt])
        tensors = {"x": ([m, g, length], dt), "w": ([g, length, n], dt)}
        ops = [{"name": "op", "op": "matmul", "out": f"y[i,{n}*h+j]",
                "ins": ["x[i,h,r]", "w[h,r,j]"]}]
        red = "r"
    elif kind == "reduction":
        floats = dt in FLOATS
        fn = d.sampled_from(("sum", "mean", "max", "min", "any", "argmax")
                            + (("prod",) if floats else ()))
        tensors = {"x": ([m, g, length], dt)}
        out = f"y[{g}*i+h]" if fn == "argmax" else f"y[{g}*i+h,0]"
        ops = [{"name": "op", "op": fn, "out": out, "ins": ["x[i,h,j]"]}]
        red = "j"
    else:
        fn = d.sampled_from(("add", "mul", "max", "sub", "eq", "lt", "where"))
        n = d.integers(1, 3 * _STICK[dt])
        tensors = {"x": ([m, g, n], dt), "z": ([1, g, n], dt)}
        ins = ["x[i,h,j]", "z[0,h,j]"]
        if fn == "where":
            tensors["c"] = ([m, g, n], "bool")
            ins = ["c[i,h,j]", *ins]
        out = f"y[{m}*h+i,j]" if d.booleans() else f"y[i,{n}*h+j]"
        ops = [{"name": "op", "op": fn, "out": out, "ins": ins}]
        red = None
    pins: dict[str, int] = {red: split} if red is not None and split > 1 else {}
    if d.booleans():  # a pin divides its dim (the planner refuses one that does not)
        pins["i"] = d.sampled_from([c for c in (1, 2, 3) if m % c == 0])
    if d.booleans():
        pins["h"] = d.sampled_from([c for c in range(1, g + 1) if g % c == 0])
    extra = {"work_division": {"op": pins}} if pins else {}
    return _doc(tensors, ops, ["y"], name="merged", **extra)


def nested(d: Draw) -> Program:
    """A chain of 2 to 4 row-wise ops (pointwise, a row statistic broadcast back, a matmul
    over columns) in one or two nested loops over rows and columns; sometimes an intermediate
    is an output too (a group writing several outputs), the first op sits in the outer loop
    only (``depths``), a fallback (cumsum along the row) ends the chain inside the loop, or a
    dead op (read by nothing) comes first."""
    dtype = d.sampled_from(FLOATS)
    m = d.sampled_from((2, 4, 6, 8, 12, 16))
    n = d.sampled_from((32, 64, 96, 128))
    tensors: dict[str, tuple[list[Any], str]] = {"x": ([m, n], dtype)}
    ops: list[dict[str, Any]] = []
    cur = "x"
    for i in range(d.integers(2, 4)):
        what = d.sampled_from(("unary", "binary", "rowstat", "matmul"))
        out = f"t{i}"
        if what == "unary":
            ops.append({"name": f"u{i}", "op": d.sampled_from(UNARY), "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]"]})
        elif what == "binary":
            tensors[f"b{i}"] = ([m, n], dtype)
            ops.append({"name": f"b{i}", "op": d.sampled_from(BINARY), "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", f"b{i}[i,j]"]})
        elif what == "rowstat":
            ops.append({"name": f"r{i}", "op": d.sampled_from(REDUCE), "out": f"r{i}[i,0]",
                        "ins": [f"{cur}[i,j]"]})
            ops.append({"name": f"s{i}", "op": "sub", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", f"r{i}[i,0]"]})
        else:
            tensors[f"w{i}"] = ([n, n], dtype)
            ops.append({"name": f"mm{i}", "op": "matmul", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,k]", f"w{i}[k,j]"]})
        cur = out
    outputs = [cur]
    if len(ops) > 1 and d.booleans():  # an intermediate read after the group too
        outputs.append(ops[0]["out"].split("[")[0])
    rows = d.sampled_from([c for c in (1, 2, 4) if m % c == 0])
    loops = [{"count": rows, "dims": ["i"]}]
    group: dict[str, Any] = {"ops": [o["name"] for o in ops], "loops": loops}
    if d.booleans() and all(o["name"][0] in "ub" for o in ops):  # columns too
        loops.append({"count": d.sampled_from((1, 2)), "dims": ["j"]})
        if len(ops) > 1 and d.booleans():  # the first op in the outer loop only
            group["depths"] = {ops[0]["name"]: 1}
    elif d.booleans():  # a fallback inside the loop: cumsum along each row
        ops.append({"name": "cs", "op": "cumsum", "out": "cs[i,j]", "ins": [f"{cur}[i,j]"]})
        group["ops"].append("cs")
        outputs[0] = "cs"
    if d.booleans():  # a dead op: its result is read by nothing
        ops.insert(0, {"name": "dead", "op": "exp", "out": "dead[i,j]", "ins": ["x[i,j]"]})
    return _doc(tensors, ops, outputs, name="nested", tiling=[group])


def symbolic(d: Draw) -> tuple[Program, dict[str, int]]:
    """A program with a run-time size (a matmul over K, or a row-wise exp and sum over T)
    and the size to run it at (its planning size, its minimum, or between)."""
    dtype = d.sampled_from(("float16", "float32"))
    if d.booleans():
        kmax = d.sampled_from((64, 256, 1024, 4096))
        m, n = d.integers(1, 32), d.integers(1, 64)
        doc = {"name": "dynk", "symbols": {"K": {"max": kmax}},
               "tensors": {"x": {"shape": [m, "K"], "dtype": dtype},
                           "w": {"shape": ["K", n], "dtype": dtype}},
               "inputs": ["x", "w"], "outputs": ["y"],
               "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]",
                        "ins": ["x[m,k]", "w[k,n]"]}]}
        top, name = kmax, "K"
    else:
        tmax = d.sampled_from((16, 128, 512))
        rows = d.integers(1, 16)
        doc = {"name": "dynsum", "symbols": {"T": {"max": tmax, "min": 8}},
               "tensors": {"x": {"shape": [rows, "T"], "dtype": dtype}},
               "inputs": ["x"], "outputs": ["z"],
               "ops": [{"name": "e", "op": d.sampled_from(("exp", "neg", "relu")),
                        "out": "y[r,t]", "ins": ["x[r,t]"]},
                       {"name": "s", "op": d.sampled_from(("sum", "max")), "out": "z[r]",
                        "ins": ["y[r,t]"]}]}
        top, name = tmax, "T"
    low = 8 if name == "T" else 1
    size = d.sampled_from((top, low, d.integers(low, top)))
    return from_dict(doc), {name: size}


#: family name -> what draws it (``symbolic`` also draws the sizes to run at)
FAMILIES: dict[str, Callable[[Draw], Any]] = {
    "chain": chain, "masks": masks, "single": single, "merged": merged, "nested": nested,
    "symbolic": symbolic,
}


def random_case(d: Draw, seed: int | None = None, family: str | None = None) -> Case:
    """A program of a family (drawn unless given), a target and a strategy to plan it with."""
    fam = family or d.sampled_from(tuple(FAMILIES))
    sizes: dict[str, int] = {}
    made = FAMILIES[fam](d)
    if fam == "symbolic":
        program, sizes = made
    else:
        program = made
    features = tuple(f for f, on in (
        ("tiled", bool(program.tiling)), ("merged", any(o.merges_output for o in program.ops)),
        ("run-time sizes", bool(program.symbols)),
        ("fallback", any(not o.kind.divisible for o in program.ops))) if on)
    kinds = tuple(dict.fromkeys(o.kind.name for o in program.ops))
    return Case(program, target(d), d.sampled_from(STRATEGIES), fam, seed, sizes,
                features + kinds)


def case(seed: int) -> Case:
    """The case of ``seed`` (what ``apportion bench conformance`` runs as case ``seed``)."""
    return random_case(Seeded(seed), seed)
