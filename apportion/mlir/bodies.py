"""The per-kind MLIR: each op kind's scalar computation as MLIR text templates, keyed by kind
name (``BODIES``), and each reducer's, keyed by reducer name (``REDUCER_OPS``): its combine,
and the ops and collective names its partials across devices combine by (every emitter's one
table of them: the parallel IR, the mesh modules and the shard forms). The emitters format
them; the registry (``ir.kinds``) knows nothing of MLIR. A kind this table lacks is refused in
one place, ``body_of`` (and ``combine_of`` for reducers), with an ``EmitError`` naming the kind
and the backend. Math the backends cannot link or compute exactly is expanded by
``mlir.f64_math``.

>>> from apportion.ir.kinds import kind
>>> print(BODIES["add"].float.format(r="%r", a="%x", b="%y", t="f32"))
%r = arith.addf %x, %y : f32
>>> supported(kind("gather")), supported(kind("uniform"))
(True, False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apportion.errors import EmitError
from apportion.ir.kinds import KINDS, REDUCERS, Category, OpKind, Reducer
from apportion.limits import cite

#: the backend's name, as refusals print it
BACKEND = "iree"


@dataclass(frozen=True)
class MlirBody:
    """A kind's scalar computation as MLIR text templates, formatted by the parallel-IR emitter
    (``apportion.mlir.forall``); the IR imports no MLIR bindings.

    A template is lines of MLIR whose placeholders the emitter fills with ``str.format``:
    ``{a}``, ``{b}``, ``{c}`` are the operands (value inputs converted to the compute type,
    condition inputs to ``i1``; for a reducer's combine ``{a}`` is the accumulated value and
    ``{b}`` the new one, and ``{ai}``/``{bi}`` their ``i64`` indices for a value-index
    reducer), ``{t}`` the compute type (``f32``, ``f64`` or ``i64``), ``%{p}`` a prefix that
    makes temporaries unique (``%{p}x``), and the lines must define ``{r}``, the result (and
    ``{ri}``, its index, for a value-index reducer). A template that defines nothing (``""``)
    passes ``{a}`` through. Numeric attributes are SSA constants ``{min}``, ``{max}`` in the
    compute type (``{value}`` for a fill), ``defaults`` standing in for those an op leaves out.
    A ``wide`` body computes in f64 where the compute type is f32 (its operands, all values of
    the compute type, extended; its result truncated once): for a formula whose float32
    arithmetic would magnify its own rounding past an ulp or two.

    ``float`` computes in a float type; ``int`` in ``i64``, or None where the kind computes
    integers through ``f64``, as the reference executor does (kinds over truth values only write
    ``i1`` in both). ``construction`` is None for a body applied point by point; a fallback
    names how the emitter runs it along the last axis: ``"scan"`` (a running combine from
    ``identity``), ``"sort"`` (the template is the order's strict less-than, ``{r}: i1``) or
    ``"reverse"``; a whole-tensor kind names the generic that reads its inputs by computed
    index (``"gather"``, ``"reshape"``, ``"concat"``, ``"full"``, ``"arange"``, ``"topk"``:
    the rank sort with the template as its less-than, read from its end).

    >>> print(BODIES["add"].float.format(r="%r", a="%x", b="%y", t="f32"))
    %r = arith.addf %x, %y : f32
    """

    float: str
    int: str | None = None
    construction: str | None = None
    identity: float = 0.0
    defaults: tuple[tuple[str, float], ...] = ()
    wide: bool = False

    def text(self, integer: bool) -> str:
        """The template for an integer (``i64``) or a float compute type."""
        return self.int if integer and self.int is not None else self.float


def _bin(fop: str, iop: str | None = None) -> MlirBody:
    """A body of one binary arith op per compute type."""
    return MlirBody("{r} = " + fop + " {a}, {b} : {t}",
                    None if iop is None else "{r} = " + iop + " {a}, {b} : {t}")


def _un(fop: str, iop: str | None = None) -> MlirBody:
    return MlirBody("{r} = " + fop + " {a} : {t}",
                    None if iop is None else "{r} = " + iop + " {a} : {t}")


def _cmp(fpred: str, ipred: str) -> MlirBody:
    return MlirBody("{r} = arith.cmpf " + fpred + ", {a}, {b} : {t}",
                    "{r} = arith.cmpi " + ipred + ", {a}, {b} : {t}")


def _lines(*lines: str) -> str:
    return "\n".join(lines)


def _sigmoid(x: str, out: str) -> tuple[str, ...]:
    """Lines setting ``out`` to the logistic sigmoid of ``x``, the registry's form: with
    e = exp(-|x|), 1 / (1 + e) for x >= 0 and e / (1 + e) below, accurate relatively in both
    tails (0.5 * (1 + tanh(x / 2)) cancels to 0 below about -17 in f32) and never overflowing."""
    return ("%{p}sz = arith.constant 0.0 : {t}",
            "%{p}sone = arith.constant 1.0 : {t}",
            f"%{{p}}sab = math.absf {x} : {{t}}",
            "%{p}sna = arith.negf %{p}sab : {t}",
            "%{p}se = math.exp %{p}sna : {t}",
            "%{p}sd = arith.addf %{p}sone, %{p}se : {t}",
            "%{p}spos = arith.divf %{p}sone, %{p}sd : {t}",
            "%{p}sneg = arith.divf %{p}se, %{p}sd : {t}",
            f"%{{p}}sge = arith.cmpf oge, {x}, %{{p}}sz : {{t}}",
            f"{out} = arith.select %{{p}}sge, %{{p}}spos, %{{p}}sneg : {{t}}")


# an integer division by 0, or of the least value by -1, traps (SIGFPE on x86) and would
# end the process: the divisor is 1 there, and the result is set to numpy's (0 for a divisor
# of 0; -a, wrapping, for -1)
_SAFE_DIVISOR = ("%{p}zi = arith.constant 0 : {t}",
                 "%{p}onei = arith.constant 1 : {t}",
                 "%{p}m1 = arith.constant -1 : {t}",
                 "%{p}bz = arith.cmpi eq, {b}, %{p}zi : {t}",
                 "%{p}bn1 = arith.cmpi eq, {b}, %{p}m1 : {t}",
                 "%{p}trap = arith.ori %{p}bz, %{p}bn1 : i1",
                 "%{p}sb = arith.select %{p}trap, %{p}onei, {b} : {t}")

# Python's % and //: the remainder takes the divisor's sign
_REMAINDER = ("%{p}m = {rem} {a}, {divisor} : {t}",
              "%{p}z = arith.constant {zero} : {t}",
              "%{p}nz = {cmp} {ne}, %{p}m, %{p}z : {t}",
              "%{p}mn = {cmp} {lt}, %{p}m, %{p}z : {t}",
              "%{p}bn = {cmp} {lt}, {b}, %{p}z : {t}",
              "%{p}d = arith.xori %{p}mn, %{p}bn : i1",
              "%{p}fix = arith.andi %{p}nz, %{p}d : i1",
              "%{p}adj = {add} %{p}m, {b} : {t}",
              "{r} = arith.select %{p}fix, %{p}adj, %{p}m : {t}")


def _remainder(divisor: str = "{b}", **ops: str) -> str:
    # fills the op names now and keeps the emitter's placeholders
    keep = {k: "{" + k + "}" for k in ("p", "a", "b", "t", "r")}
    return _lines(*(line.format(**ops, **keep, divisor=divisor.format(**keep))
                    for line in _REMAINDER))


#: kind name -> its body (elementwise, matmul and fallback kinds; reductions: ``REDUCER_OPS``)
BODIES: dict[str, MlirBody] = {
    "add": _bin("arith.addf", "arith.addi"),
    "sub": _bin("arith.subf", "arith.subi"),
    "mul": _bin("arith.mulf", "arith.muli"),
    "div": _bin("arith.divf"),  # integers: through f64, truncated, as the reference does
    "max": _bin("arith.maximumf", "arith.maxsi"),  # NaN wins, as numpy's maximum
    "min": _bin("arith.minimumf", "arith.minsi"),
    # math.powf is exp(b * log(a)) once lowered: NaN for every negative base. numpy's power
    # of a negative base is |a|**b signed by b's parity where b is whole, NaN elsewhere
    "pow": MlirBody(_lines("%{p}ab = math.absf {a} : {t}",
                           "%{p}m = math.powf %{p}ab, {b} : {t}",
                           "%{p}z = arith.constant 0.0 : {t}",
                           "%{p}neg = arith.cmpf olt, {a}, %{p}z : {t}",
                           "%{p}fb = math.floor {b} : {t}",
                           "%{p}whole = arith.cmpf oeq, %{p}fb, {b} : {t}",
                           "%{p}h = arith.constant 0.5 : {t}",
                           "%{p}hb = arith.mulf {b}, %{p}h : {t}",
                           "%{p}fh = math.floor %{p}hb : {t}",
                           "%{p}even = arith.cmpf oeq, %{p}fh, %{p}hb : {t}",
                           "%{p}nm = arith.negf %{p}m : {t}",
                           "%{p}signed = arith.select %{p}even, %{p}m, %{p}nm : {t}",
                           "%{p}nan = arith.divf %{p}z, %{p}z : {t}",
                           "%{p}nr = arith.select %{p}whole, %{p}signed, %{p}nan : {t}",
                           "%{p}pr = arith.select %{p}neg, %{p}nr, %{p}m : {t}",
                           # exp(b * log(a)) is NaN at 0**0 and 1**inf, where numpy gives 1
                           "%{p}one = arith.constant 1.0 : {t}",
                           "%{p}bz = arith.cmpf oeq, {b}, %{p}z : {t}",
                           "%{p}a1 = arith.cmpf oeq, {a}, %{p}one : {t}",
                           "%{p}inf = arith.divf %{p}one, %{p}z : {t}",
                           "%{p}abb = math.absf {b} : {t}",
                           "%{p}binf = arith.cmpf oeq, %{p}abb, %{p}inf : {t}",
                           "%{p}ab1 = arith.cmpf oeq, %{p}ab, %{p}one : {t}",
                           "%{p}unit = arith.andi %{p}ab1, %{p}binf : i1",
                           "%{p}o1 = arith.ori %{p}bz, %{p}a1 : i1",
                           "%{p}o2 = arith.ori %{p}o1, %{p}unit : i1",
                           "{r} = arith.select %{p}o2, %{p}one, %{p}pr : {t}")),
    "floor_div": MlirBody(_lines("%{p}q = arith.divf {a}, {b} : {t}",
                                 "{r} = math.floor %{p}q : {t}"),
                          _lines(*_SAFE_DIVISOR,
                                 "%{p}q = arith.floordivsi {a}, %{p}sb : {t}",
                                 # a // -1 is -a, wrapping at the least value as numpy's does
                                 "%{p}na = arith.subi %{p}zi, {a} : {t}",
                                 "%{p}q1 = arith.select %{p}bn1, %{p}na, %{p}q : {t}",
                                 "{r} = arith.select %{p}bz, %{p}zi, %{p}q1 : {t}")),
    "remainder": MlirBody(
        _remainder(rem="arith.remf", zero="0.0", cmp="arith.cmpf", ne="one", lt="olt",
                   add="arith.addf"),
        # x % 0 and x % -1 are 0, as numpy's: a remainder by 1 gives it without a trap
        _lines(*_SAFE_DIVISOR, _remainder(rem="arith.remsi", zero="0", cmp="arith.cmpi",
                                          ne="ne", lt="slt", add="arith.addi",
                                          divisor="%{p}sb"))),
    "eq": _cmp("oeq", "eq"),
    "ne": _cmp("une", "ne"),  # NaN != x is true
    "lt": _cmp("olt", "slt"),
    "le": _cmp("ole", "sle"),
    "gt": _cmp("ogt", "sgt"),
    "ge": _cmp("oge", "sge"),
    "logical_and": MlirBody("{r} = arith.andi {a}, {b} : i1", "{r} = arith.andi {a}, {b} : i1"),
    "logical_or": MlirBody("{r} = arith.ori {a}, {b} : i1", "{r} = arith.ori {a}, {b} : i1"),
    "logical_not": MlirBody(*[_lines("%{p}true = arith.constant true",
                                     "{r} = arith.xori {a}, %{p}true : i1")] * 2),
    "where": MlirBody(*["{r} = arith.select {a}, {b}, {c} : {t}"] * 2),
    "neg": MlirBody("{r} = arith.negf {a} : {t}",
                    _lines("%{p}z = arith.constant 0 : {t}", "{r} = arith.subi %{p}z, {a} : {t}")),
    "abs": _un("math.absf", "math.absi"),
    "exp": _un("math.exp"),
    "log": _un("math.log"),
    "sqrt": _un("math.sqrt"),
    "rsqrt": MlirBody(_lines("%{p}one = arith.constant 1.0 : {t}", "%{p}s = math.sqrt {a} : {t}",
                             "{r} = arith.divf %{p}one, %{p}s : {t}")),
    "tanh": _un("math.tanh"),
    "sigmoid": MlirBody(_lines(*_sigmoid("{a}", "{r}"))),
    "relu": MlirBody(_lines("%{p}z = arith.constant 0.0 : {t}",
                            "{r} = arith.maximumf {a}, %{p}z : {t}"),
                     _lines("%{p}z = arith.constant 0 : {t}",
                            "{r} = arith.maxsi {a}, %{p}z : {t}")),
    # the registry's x sigmoid(x) through h = exp(-|x| / 2): x / (1 + h h) from 0 up,
    # (x h) h / (1 + h h) below, so that no factor is subnormal where the result is not
    # (sigmoid(x) is subnormal in float32 from -103 to -87, flushed to 0 by IREE's CPU code,
    # where x sigmoid(x) is normal down to -91.8)
    "silu": MlirBody(_lines("%{p}one = arith.constant 1.0 : {t}",
                            "%{p}mh = arith.constant -0.5 : {t}",
                            "%{p}z = arith.constant 0.0 : {t}",
                            "%{p}ab = math.absf {a} : {t}",
                            "%{p}na = arith.mulf %{p}ab, %{p}mh : {t}",
                            "%{p}h = math.exp %{p}na : {t}",
                            "%{p}e = arith.mulf %{p}h, %{p}h : {t}",
                            "%{p}d = arith.addf %{p}one, %{p}e : {t}",
                            "%{p}pos = arith.divf {a}, %{p}d : {t}",
                            "%{p}xh = arith.mulf {a}, %{p}h : {t}",
                            "%{p}xe = arith.mulf %{p}xh, %{p}h : {t}",
                            "%{p}neg = arith.divf %{p}xe, %{p}d : {t}",
                            "%{p}ge = arith.cmpf oge, {a}, %{p}z : {t}",
                            "{r} = arith.select %{p}ge, %{p}pos, %{p}neg : {t}")),
    # the tanh form 0.5 x (1 + tanh(u)) as x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3):
    # the same function without the cancellation below -5; in f64 where the compute type is f32
    # (``wide``), as the tail's exp magnifies the argument's own rounding 2u times (150 float32
    # ulps near -10 in f32, where IREE also flushes the subnormal sigmoid of the result's factor)
    "gelu": MlirBody(_lines(f"%{{p}}c = arith.constant {2.0 * math.sqrt(2.0 / math.pi)!r} : {{t}}",
                            "%{p}k = arith.constant 0.044715 : {t}",
                            "%{p}x1 = arith.mulf %{p}k, {a} : {t}",
                            "%{p}x2 = arith.mulf %{p}x1, {a} : {t}",
                            "%{p}x3 = arith.mulf %{p}x2, {a} : {t}",
                            "%{p}in = arith.addf {a}, %{p}x3 : {t}",
                            "%{p}arg = arith.mulf %{p}c, %{p}in : {t}",
                            *_sigmoid("%{p}arg", "%{p}sg"),
                            "{r} = arith.mulf {a}, %{p}sg : {t}"), wide=True),
    "square": MlirBody("{r} = arith.mulf {a}, {a} : {t}", "{r} = arith.muli {a}, {a} : {t}"),
    "reciprocal": MlirBody(_lines("%{p}one = arith.constant 1.0 : {t}",
                                  "{r} = arith.divf %{p}one, {a} : {t}")),
    "sin": _un("math.sin"),
    "cos": _un("math.cos"),
    "erf": _un("math.erf"),
    "sign": MlirBody(_lines("%{p}z = arith.constant 0.0 : {t}",
                            "%{p}one = arith.constant 1.0 : {t}",
                            "%{p}m = arith.constant -1.0 : {t}",
                            "%{p}gt = arith.cmpf ogt, {a}, %{p}z : {t}",
                            "%{p}lt = arith.cmpf olt, {a}, %{p}z : {t}",
                            "%{p}s1 = arith.select %{p}gt, %{p}one, %{p}z : {t}",
                            "%{p}s2 = arith.select %{p}lt, %{p}m, %{p}s1 : {t}",
                            "%{p}nan = arith.cmpf uno, {a}, {a} : {t}",
                            "{r} = arith.select %{p}nan, {a}, %{p}s2 : {t}"),
                     _lines("%{p}z = arith.constant 0 : {t}",
                            "%{p}one = arith.constant 1 : {t}",
                            "%{p}m = arith.constant -1 : {t}",
                            "%{p}gt = arith.cmpi sgt, {a}, %{p}z : {t}",
                            "%{p}lt = arith.cmpi slt, {a}, %{p}z : {t}",
                            "%{p}s1 = arith.select %{p}gt, %{p}one, %{p}z : {t}",
                            "{r} = arith.select %{p}lt, %{p}m, %{p}s1 : {t}")),
    "softplus": MlirBody(_lines("%{p}th = arith.constant 20.0 : {t}",
                                "%{p}m = arith.minimumf {a}, %{p}th : {t}",
                                "%{p}e = math.exp %{p}m : {t}",
                                "%{p}l = math.log1p %{p}e : {t}",
                                "%{p}big = arith.cmpf ogt, {a}, %{p}th : {t}",
                                "{r} = arith.select %{p}big, {a}, %{p}l : {t}")),
    "clamp": MlirBody(_lines("%{p}lo = arith.maximumf {a}, {min} : {t}",
                             "{r} = arith.minimumf %{p}lo, {max} : {t}"),
                      defaults=(("min", -math.inf), ("max", math.inf))),
    "copy": MlirBody("", ""),  # the cast is the emitter's conversion to the output type
    "relayout": MlirBody("", ""),  # a copy: the new layout is the output tensor's
    # -0.0 is the additive identity of every float, -0.0 included: the value passes unchanged
    "fill": MlirBody(_lines("%{p}z = arith.constant -0.0 : {t}",
                            "{r} = arith.addf {value}, %{p}z : {t}"),
                     _lines("%{p}z = arith.constant 0 : {t}",
                            "{r} = arith.addi {value}, %{p}z : {t}")),
    "conv": _bin("arith.mulf", "arith.muli"),  # the product its reducer sums over the window
    "matmul": _bin("arith.mulf", "arith.muli"),  # the product its reducer sums
    # fallbacks, along the last axis of the whole input
    "sort": MlirBody(_lines("%{p}lt = arith.cmpf olt, {a}, {b} : {t}",
                            "%{p}an = arith.cmpf ord, {a}, {a} : {t}",
                            "%{p}bn = arith.cmpf uno, {b}, {b} : {t}",
                            "%{p}nan = arith.andi %{p}an, %{p}bn : i1",
                            "{r} = arith.ori %{p}lt, %{p}nan : i1"),  # NaN sorts last
                     "{r} = arith.cmpi slt, {a}, {b} : {t}", construction="sort"),
    "cumsum": MlirBody("{r} = arith.addf {a}, {b} : {t}", "{r} = arith.addi {a}, {b} : {t}",
                       construction="scan"),
    "flip": MlirBody("", "", construction="reverse"),
    # whole-tensor kinds, built over the whole output reading their inputs by computed index
    # (``tensor.extract``); numpy's random generators (uniform, normal) have none: they run on
    # the host between modules (``backends.iree.run``)
    "gather": MlirBody("", construction="gather"),
    "reshape": MlirBody("", construction="reshape"),
    "concat": MlirBody("", construction="concat"),
    "full": MlirBody("", construction="full"),
    "arange": MlirBody("", construction="arange"),
    "topk": MlirBody(_lines(
        "%{p}lt = arith.cmpf olt, {a}, {b} : {t}",
        "%{p}an = arith.cmpf ord, {a}, {a} : {t}",
        "%{p}bn = arith.cmpf uno, {b}, {b} : {t}",
        "%{p}nan = arith.andi %{p}an, %{p}bn : i1",
        "{r} = arith.ori %{p}lt, %{p}nan : i1"),
        "{r} = arith.cmpi slt, {a}, {b} : {t}", construction="topk"),
}


# The greater value wins (NaN above all), equal values the lower index: a total order, so any
# combine order gives numpy's first maximum.
_ARGMAX_COMBINE = MlirBody(
    _lines("%{p}true = arith.constant true",
           "%{p}gt = arith.cmpf ogt, {b}, {a} : {t}",
           "%{p}bn = arith.cmpf uno, {b}, {b} : {t}",
           "%{p}an = arith.cmpf uno, {a}, {a} : {t}",
           "%{p}na = arith.xori %{p}an, %{p}true : i1",
           "%{p}nanwin = arith.andi %{p}bn, %{p}na : i1",
           "%{p}eq = arith.cmpf oeq, {b}, {a} : {t}",
           "%{p}both = arith.andi %{p}bn, %{p}an : i1",
           "%{p}same = arith.ori %{p}eq, %{p}both : i1",
           "%{p}lower = arith.cmpi slt, {bi}, {ai} : i64",
           "%{p}tie = arith.andi %{p}same, %{p}lower : i1",
           "%{p}t1 = arith.ori %{p}gt, %{p}nanwin : i1",
           "%{p}take = arith.ori %{p}t1, %{p}tie : i1",
           "{r} = arith.select %{p}take, {b}, {a} : {t}",
           "{ri} = arith.select %{p}take, {bi}, {ai} : i64"),
    _lines("%{p}gt = arith.cmpi sgt, {b}, {a} : {t}",
           "%{p}eq = arith.cmpi eq, {b}, {a} : {t}",
           "%{p}lower = arith.cmpi slt, {bi}, {ai} : i64",
           "%{p}tie = arith.andi %{p}eq, %{p}lower : i1",
           "%{p}take = arith.ori %{p}gt, %{p}tie : i1",
           "{r} = arith.select %{p}take, {b}, {a} : {t}",
           "{ri} = arith.select %{p}take, {bi}, {ai} : i64"))



@dataclass(frozen=True)
class ReducerOps:
    """A reducer in MLIR, every name of it in one entry. ``combine`` folds one element ``{b}``
    into the accumulated ``{a}`` (a template, as the parallel IR and the shard forms' generics
    format it). Partials waiting across devices as this reducer (``DeviceCombine.waits_as``)
    combine elementwise on tensors by ``float_op`` or ``int_op`` (an ``arith`` op), reduce in
    IREE's ``flow.collective`` ops by ``collective`` and in the shard dialect by ``shard``; None
    where that form has no such combine. An argmax's partials are int64 keys
    (``schedule.mesh.argmax_keys``): they combine by the largest key, whatever the value's type.

    >>> ops = REDUCER_OPS["prod"]
    >>> ops.float_op, ops.collective, ops.shard, REDUCER_OPS["any"].shard
    ('arith.mulf', 'product', 'product', 'bitwise_or')
    """

    combine: MlirBody
    float_op: str | None = None
    int_op: str | None = None
    collective: str | None = None
    shard: str | None = None

    def elementwise(self, floats: bool) -> str | None:
        """The ``arith`` op combining two partial tensors of float (or integer) elements."""
        return self.float_op if floats else self.int_op


def _same(fop: str, iop: str, collective: str, shard: str) -> ReducerOps:
    """A reducer whose combine is one arith op per type, on elements and on tensors alike."""
    return ReducerOps(_bin(fop, iop), fop, iop, collective, shard)


#: reducer name -> its MLIR (``ReducerOps``): its combine of one accumulated element with a new
#: one, and the names its partials across devices combine and reduce by
REDUCER_OPS: dict[str, ReducerOps] = {
    "sum": _same("arith.addf", "arith.addi", "sum", "sum"),
    # the sum; the emitter divides by the count after (split over devices, it waits as a sum)
    "mean": ReducerOps(_bin("arith.addf", "arith.addi")),
    "max": _same("arith.maximumf", "arith.maxsi", "maximum", "max"),
    "min": _same("arith.minimumf", "arith.minsi", "minimum", "min"),
    "prod": _same("arith.mulf", "arith.muli", "product", "product"),
    # over truth values, its partials 0/1 bytes, which no IREE collective carries
    "any": ReducerOps(MlirBody(*["{r} = arith.ori {a}, {b} : i1"] * 2), int_op="arith.ori",
                      shard="bitwise_or"),
    "argmax": ReducerOps(_ARGMAX_COMBINE, int_op="arith.maxsi", collective="maximum",
                         shard="max"),
}


def _refuse(op: str | None, what: str, name: str, why: str) -> EmitError:
    where = f"op {op!r}: " if op is not None else ""
    return EmitError(f"{where}{what} {name!r} has no MLIR body in the {BACKEND} backend{why}; "
                     f"it cannot be emitted as parallel IR {cite('iree-kind-without-mlir')}")


def body_of(k: OpKind, op: str | None = None) -> MlirBody:
    """The body of kind ``k`` (an elementwise, matmul or fallback kind), or ``EmitError`` naming
    the op (where given), the kind and the backend: the one place a kind is refused.

    >>> from apportion.ir.kinds import kind
    >>> body_of(kind("flip")).construction
    'reverse'
    >>> body_of(kind("normal"), "noise")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    apportion.errors.EmitError: op 'noise': kind 'normal' has no MLIR body in the iree backend...
    """
    found = BODIES.get(k.name) if k.category is not Category.REDUCTION else None
    if found is None:
        why = " (numpy's random generator runs on the host)" if k.name in _HOST else ""
        raise _refuse(op, "kind", k.name, why)
    return found


def combine_of(r: Reducer, op: str | None = None, k: OpKind | None = None) -> MlirBody:
    """The combine of reducer ``r``, or ``EmitError`` naming the op, its kind and the backend.

    >>> from apportion.ir.kinds import kind
    >>> print(combine_of(kind("sum").reducer).int.format(r="%r", a="%a", b="%b", t="i64"))
    %r = arith.addi %a, %b : i64
    """
    found = REDUCER_OPS.get(r.name)
    if found is None:
        name = k.name if k is not None else r.name
        raise _refuse(op, "kind", name, f" (no combine for its reducer {r.name!r})")
    return found.combine


def supported(k: OpKind) -> bool:
    """True when the backend emits ops of kind ``k`` (its body, and its reducer's combine)."""
    if k.category is not Category.REDUCTION and k.name not in BODIES:
        return False
    return k.reducer is None or k.reducer.name in REDUCER_OPS


#: kinds the backend runs on the host, between modules: numpy's random generators, which no
#: compiled module reproduces
_HOST = frozenset({"uniform", "normal"})


@dataclass(frozen=True)
class _Check:
    """Table consistency, checked at import: every body names a kind, every combine a reducer,
    every kind is emitted or run on the host, a kind's integer template exists exactly where
    the registry says it computes integers exactly (``OpKind.exact_integers``), and every
    reducer partials wait as across devices has the shard dialect's reduction."""

    def __post_init__(self) -> None:
        names = {k.name for k in KINDS}
        stray = sorted(set(BODIES) - names) + sorted(set(REDUCER_OPS) - set(REDUCERS))
        if stray:
            raise EmitError(f"{BACKEND} bodies for unknown kinds or reducers: {stray}")
        for k in KINDS:
            if not supported(k) and k.name not in _HOST:
                raise EmitError(f"kind {k.name!r} has no MLIR body in the {BACKEND} backend")
            bodies = [b for b in (None if k.category is Category.REDUCTION else
                                  BODIES.get(k.name),
                                  k.reducer and combine_of(k.reducer, k=k)) if b is not None]
            if k.whole or not bodies:
                continue
            ints = all(b.int is not None for b in bodies)
            if ints != k.exact_integers:
                raise EmitError(f"kind {k.name!r}: integer template {ints}, registry "
                                f"exact_integers {k.exact_integers}")
        for r in REDUCERS.values():
            waits = r.across_devices and REDUCER_OPS[r.across_devices.waits_as]
            if waits and waits.shard is None:
                raise EmitError(f"reducer {r.name!r}: its partials wait as "
                                f"{r.across_devices.waits_as!r}, which has no shard reduction")


_Check()
