"""The iree backend's per-kind code: each op kind's scalar computation as MLIR text templates,
keyed by kind name (``BODIES``), and each reducer's combine, keyed by reducer name
(``COMBINES``). The parallel-IR emitter (``mlir.forall``) formats them; the registry
(``ir.kinds``) knows nothing of MLIR. A kind this table lacks is refused in one place,
``body_of`` (and ``combine_of`` for reducers), with an ``EmitError`` naming the kind and the
backend.

>>> from apportion.ir.kinds import kind
>>> print(BODIES["add"].float.format(r="%r", a="%x", b="%y", t="f32"))
%r = arith.addf %x, %y : f32
>>> supported(kind("gather")), supported(kind("uniform"))
(True, False)
"""

from __future__ import annotations

import math
import re
import sys
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


#: kind name -> its body (elementwise, matmul and fallback kinds; reductions use ``COMBINES``)
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


# --- f64 tanh, sin, cos and erf -----------------------------------------------------------------
# IREE's llvm-cpu executables link no libm, and LLVM lowers these four in f64 to libm calls
# ("undefined symbol: tanh"); in f32 IREE expands them itself. So where the compute type is f64
# the emitter swaps each for the arithmetic below (``expand_f64_math``), built only of ops that
# lower to instructions or to IREE's own f64 expansions (exp, log, floor).


class _Seq:
    """Builds one expansion's template lines: each op gets a fresh ``%{p}vN`` name."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def op(self, text: str) -> str:
        name = f"%{{p}}v{len(self.lines)}"
        self.lines.append(f"{name} = {text}")
        return name

    def c(self, value: float) -> str:
        return self.op(f"arith.constant {value:.17e} : {{t}}")

    def f(self, name: str, *args: str) -> str:
        return self.op(f"{name} {', '.join(args)} : {{t}}")

    def cmp(self, pred: str, a: str, b: str) -> str:
        return self.op(f"arith.cmpf {pred}, {a}, {b} : {{t}}")

    def sel(self, cond: str, a: str, b: str) -> str:
        return self.op(f"arith.select {cond}, {a}, {b} : {{t}}")

    def done(self, value: str) -> str:
        # {a} + -0.0 is {a} for every value, -0.0 and NaN included: names the result {r}
        z = self.c(-0.0)
        return _lines(*self.lines, f"{{r}} = arith.addf {value}, {z} : {{t}}")


def _tanh_f64() -> str:
    # fdlibm's s_tanh.c split: for |x| < 1, -e / (2 + e) with e = expm1(-2|x|), expm1 by
    # Kahan's identity expm1(y) = (exp(y) - 1) * y / log(exp(y)) (exact y where exp(y) rounds
    # to 1), which keeps full relative accuracy near 0; for |x| >= 1, 1 - 2 / (exp(2|x|) + 1),
    # whose rounding to 1.0 near |x| = 19 is numpy's (overflow to inf gives exactly 1)
    s = _Seq()
    one, two = s.c(1.0), s.c(2.0)
    ax = s.op("math.absf {a} : {t}")
    y = s.f("arith.mulf", ax, s.c(-2.0))
    u = s.op(f"math.exp {y} : {{t}}")
    um1 = s.f("arith.subf", u, one)
    lu = s.op(f"math.log {u} : {{t}}")
    e = s.f("arith.mulf", s.f("arith.divf", um1, lu), y)
    e = s.sel(s.cmp("oeq", u, one), y, e)
    small = s.f("arith.divf", s.f("arith.negf", e), s.f("arith.addf", two, e))
    big_e = s.op(f"math.exp {s.f('arith.mulf', ax, two)} : {{t}}")
    large = s.f("arith.subf", one, s.f("arith.divf", two, s.f("arith.addf", big_e, one)))
    mag = s.sel(s.cmp("olt", ax, one), small, large)
    return s.done(s.f("math.copysign", mag, "{a}"))


# fdlibm e_rem_pio2.c: pi/2 in 33-bit pieces, each product with a quotient under 2**20 exact
_INVPIO2 = 6.36619772367581382433e-01
_PIO2 = ((1.57079632673412561417e+00, 6.07710050650619224932e-11),
         (6.07710050630396597660e-11, 2.02226624879595063154e-21),
         (2.02226624871116645580e-21, 8.47842766036889956997e-32))
# fdlibm k_sin.c / k_cos.c minimax polynomials on [-pi/4, pi/4]
_SIN = (-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
        2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
_COS = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
        -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)


def _horner(s: _Seq, z: str, coeffs: tuple[float, ...]) -> str:
    """coeffs[0] + z * (coeffs[1] + z * (...))"""
    acc = s.c(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = s.f("arith.addf", s.c(c), s.f("arith.mulf", z, acc))
    return acc


def _reduce_medium(s: _Seq) -> tuple[str, str, str]:
    """Cody-Waite reduction of ``{a}`` as fdlibm's __ieee754_rem_pio2 medium path: x = n * pi/2
    + (y + ylo), |y| <= pi/4 (three pieces of pi/2: exact for |x| < 2**20 * pi/2, which covers
    1e5 with the tail ylo kept); returns n (a whole float), y and ylo. There is no Payne-Hanek
    step here: past 2**20 * pi/2 the reduction loses bits (measured within 1 ulp of numpy on
    random values up to 1e12, wrong by 1e16, NaN by 1e300)."""
    half = s.c(0.5)
    fn = s.op(f"math.floor {s.f('arith.addf', s.f('arith.mulf', '{a}', s.c(_INVPIO2)), half)}"
              " : {t}")
    (p1, p1t), (p2, p2t), (p3, p3t) = _PIO2
    del p1t  # the two-piece step is subsumed by the three-piece one below
    t = s.f("arith.subf", "{a}", s.f("arith.mulf", fn, s.c(p1)))
    r = t
    for p, pt in ((p2, p2t), (p3, p3t)):
        w = s.f("arith.mulf", fn, s.c(p))
        t, r = r, s.f("arith.subf", r, w)
        w = s.f("arith.subf", s.f("arith.mulf", fn, s.c(pt)),
                s.f("arith.subf", s.f("arith.subf", t, r), w))
    y = s.f("arith.subf", r, w)
    return fn, y, s.f("arith.subf", s.f("arith.subf", r, y), w)


def _whole_to_i64(s: _Seq, fn: str) -> str:
    """The whole float ``fn`` as i64; a NaN or infinite one (whose y is NaN) reads 0, never an
    out-of-range conversion."""
    ok = s.cmp("olt", s.op(f"math.absf {fn} : {{t}}"), s.c(2.0 ** 52))
    return s.op(f"arith.fptosi {s.sel(ok, fn, s.c(0.0))} : {{t}} to i64")


def _sincos_kernels(s: _Seq, n: str, y: str, ylo: str, cos: bool) -> str:
    """fdlibm's __kernel_sin/__kernel_cos on (y, ylo), |y| <= pi/4, chosen and signed by the
    quadrant n (i64) of x = n * pi/2 + y + ylo."""
    half, one = s.c(0.5), s.c(1.0)
    # __kernel_sin(y, ylo): y - ((z * (ylo/2 - v * r) - ylo) - v * S1), v = z * y
    z = s.f("arith.mulf", y, y)
    v = s.f("arith.mulf", z, y)
    rs = _horner(s, z, _SIN[1:])
    inner = s.f("arith.subf", s.f("arith.mulf", half, ylo), s.f("arith.mulf", v, rs))
    ks = s.f("arith.subf", y, s.f("arith.subf", s.f("arith.subf", s.f("arith.mulf", z, inner),
                                                           ylo),
                                  s.f("arith.mulf", v, s.c(_SIN[0]))))
    # __kernel_cos(y, ylo): w + (((1 - w) - z/2) + (z * r - y * ylo)), w = 1 - z/2
    rc = s.f("arith.mulf", z, _horner(s, z, _COS))
    hz = s.f("arith.mulf", half, z)
    w = s.f("arith.subf", one, hz)
    kc = s.f("arith.addf", w, s.f("arith.addf",
                                  s.f("arith.subf", s.f("arith.subf", one, w), hz),
                                  s.f("arith.subf", s.f("arith.mulf", z, rc),
                                      s.f("arith.mulf", y, ylo))))
    # the quadrant from n mod 4
    if cos:  # cos(n pi/2 + y): kc, -ks, -kc, ks
        n = s.op(f"arith.addi {n}, {s.op('arith.constant 1 : i64')} : i64")
    odd = s.op(f"arith.trunci {n} : i64 to i1")
    one_i = s.op("arith.constant 1 : i64")
    neg = s.op(f"arith.trunci {s.op(f'arith.shrui {n}, {one_i} : i64')} : i64 to i1")
    mag = s.sel(odd, kc, ks)
    return s.done(s.sel(neg, s.f("arith.negf", mag), mag))


def _sincos_f64(cos: bool) -> str:
    s = _Seq()
    fn, y, ylo = _reduce_medium(s)
    return _sincos_kernels(s, _whole_to_i64(s, fn), y, ylo, cos)


# the first 256 bits of 2/pi after the binary point (fdlibm k_rem_pio2.c's ipio2 table)
_TWO_OVER_PI = (0xA2F9836E4E441529, 0xFC2757D1F534DDC0, 0xDB6295993C439041,
                0xFE5163ABDEBBC561)
_BIG = 2.0 ** 20  # below it the medium path is exact (2**20 < 2**20 * pi/2)


def _i64(s: _Seq, value: int) -> str:
    """An i64 constant of the bits of ``value`` (0 <= value < 2**64)."""
    return s.op(f"arith.constant {value - (1 << 64) if value >= 1 << 63 else value} : i64")


def _reduce_float32(s: _Seq) -> tuple[str, str]:
    """Payne-Hanek reduction of ``{a}``, a float32 held in f64 with |x| >= 2**20: x = M * 2**E
    (M < 2**24 whole), so x * 2/pi mod 4 needs only the 128 bits of 2/pi from bit E - 1 on (the
    bits before it make multiples of 4): (M * window mod 2**128) / 2**126, in i64 arithmetic.
    Returns n (i64, the nearest quadrant, sign included) and y = x - n * pi/2, |y| <= pi/4,
    within 2**-52 relatively (ylo is 0)."""
    def i(op: str, a: str, b: str) -> str:
        return s.op(f"arith.{op} {a}, {b} : i64")

    def isel(cond: str, a: str, b: str) -> str:
        return s.op(f"arith.select {cond}, {a}, {b} : i64")

    bits = s.op("arith.bitcast {a} : {t} to i64")
    mant = i("andi", bits, _i64(s, (1 << 52) - 1))
    m = i("shrui", i("ori", mant, _i64(s, 1 << 52)), _i64(s, 29))  # the float32's 24 bits
    # E = exponent - 1075 + 29; the window starts at bit E - 1 of 2/pi, bit E + 63 of the
    # words below, whose first is 64 zero bits (E + 63 >= 1 wherever |x| >= 2**20)
    e11 = i("andi", i("shrui", bits, _i64(s, 52)), _i64(s, 0x7FF))
    start = i("subi", e11, _i64(s, 1075 - 29 - 63 + 1))  # E + 63 - 1: bits before the window
    q = i("shrui", start, _i64(s, 6))
    r = i("andi", start, _i64(s, 63))
    words = [_i64(s, 0)] + [_i64(s, w) for w in _TWO_OVER_PI]

    def word(k: int) -> str:  # words[q + k], q in 0..2 (other q only where the path is unused)
        at1, at2 = (s.op(f"arith.cmpi eq, {q}, {_i64(s, v)} : i64") for v in (1, 2))
        return isel(at2, words[2 + k], isel(at1, words[1 + k], words[k]))

    w0, w1, w2 = word(0), word(1), word(2)
    one, inv = _i64(s, 1), i("subi", _i64(s, 63), r)

    def window(a: str, b: str) -> str:  # (a << r) | (b >> (64 - r)), no shift by 64
        return i("ori", i("shli", a, r), i("shrui", i("shrui", b, one), inv))

    hi_w, lo_w = window(w0, w1), window(w1, w2)
    # M * (hi_w * 2**64 + lo_w) mod 2**128: the high word needs M * lo_w's top bits, from
    # 32-bit halves of lo_w (M * half < 2**56)
    k32, mask32 = _i64(s, 32), _i64(s, (1 << 32) - 1)
    lo_top = i("addi", i("muli", m, i("shrui", lo_w, k32)),
               i("shrui", i("muli", m, i("andi", lo_w, mask32)), k32))
    hi = i("addi", i("muli", m, hi_w), i("shrui", lo_top, k32))
    lo = i("muli", m, lo_w)
    # the nearest quadrant (top 2 bits, rounded) and the signed rest, in 2**-62 quadrants
    rounded = i("addi", hi, _i64(s, 1 << 61))
    n = i("shrui", rounded, _i64(s, 62))
    rest = i("subi", i("andi", rounded, _i64(s, (1 << 62) - 1)), _i64(s, 1 << 61))
    frac = s.f("arith.addf",
               s.f("arith.mulf", s.op(f"arith.sitofp {rest} : i64 to {{t}}"), s.c(2.0 ** -62)),
               s.f("arith.mulf", s.op(f"arith.sitofp {i('shrui', lo, _i64(s, 11))} : i64 to {{t}}"),
                   s.c(2.0 ** -115)))
    y = s.f("arith.mulf", frac, s.c(math.pi / 2))
    # sin and cos of -x: n and y negated
    negx = s.cmp("olt", "{a}", s.c(0.0))
    return (isel(negx, i("subi", _i64(s, 0), n), n), s.sel(negx, s.f("arith.negf", y), y))


def _sincos_float32_f64(cos: bool) -> str:
    # a float32's sin or cos in f64: the medium path below 2**20, Payne-Hanek above (finite)
    s = _Seq()
    fn, y, ylo = _reduce_medium(s)
    n = _whole_to_i64(s, fn)
    nb, yb = _reduce_float32(s)
    ax = s.op("math.absf {a} : {t}")
    finite = s.cmp("ole", ax, s.c(sys.float_info.max))
    big = s.op(f"arith.andi {s.cmp('oge', ax, s.c(_BIG))}, {finite} : i1")
    return _sincos_kernels(s, s.op(f"arith.select {big}, {nb}, {n} : i64"), s.sel(big, yb, y),
                           s.sel(big, s.c(0.0), ylo), cos)


# W. J. Cody, "Rational Chebyshev approximations for the error function", Math. Comp. 23
# (1969) 631-637, as in his SPECFUN CALERF (netlib specfun/erf): erf on [0, 0.46875] (A/B),
# erfc * exp(x^2) on [0.46875, 4] (C/D) and, in 1/x^2, beyond 4 (P/Q)
_CODY_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
           3.20937758913846947e03, 1.85777706184603153e-1)
_CODY_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
           2.84423683343917062e03)
_CODY_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
           2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
           2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_CODY_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
           1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
           3.43936767414372164e03, 1.23033935480374942e03)
_CODY_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
           1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_CODY_Q = (2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
           6.05183413124413191e-2, 2.33520497626869185e-3)
_SQRPI = 5.6418958354775628695e-1  # 1 / sqrt(pi)


def _cody(s: _Seq, z: str, num: tuple[float, ...], den: tuple[float, ...]) -> str:
    """CALERF's loop: xnum = num[-1] z, xden = z, then (xnum + num[i]) z and (xden + den[i]) z
    for all but the last den term; returns (xnum + num[-2]) / (xden + den[-1])."""
    xnum, xden = s.f("arith.mulf", s.c(num[-1]), z), z
    for cn, cd in zip(num[:-2], den[:-1], strict=True):
        xnum = s.f("arith.mulf", s.f("arith.addf", xnum, s.c(cn)), z)
        xden = s.f("arith.mulf", s.f("arith.addf", xden, s.c(cd)), z)
    return s.f("arith.divf", s.f("arith.addf", xnum, s.c(num[-2])),
               s.f("arith.addf", xden, s.c(den[-1])))


def _erf_f64() -> str:
    s = _Seq()
    half, four = s.c(0.5), s.c(4.0)
    y = s.op("math.absf {a} : {t}")
    small = s.f("arith.mulf", "{a}", _cody(s, s.f("arith.mulf", y, y), _CODY_A, _CODY_B))
    # past 30 erf is 1.0 and erfc underflows: clamping keeps inf from making inf - inf below
    yc = s.f("arith.minimumf", y, s.c(30.0))
    mid = _cody(s, yc, _CODY_C, _CODY_D)
    inv = s.f("arith.divf", s.c(1.0), s.f("arith.mulf", yc, yc))
    tail = s.f("arith.divf", s.f("arith.subf", s.c(_SQRPI),
                                 s.f("arith.mulf", inv, _cody(s, inv, _CODY_P, _CODY_Q))), yc)
    scaled = s.sel(s.cmp("ole", yc, four), mid, tail)
    # erfc = exp(-ysq^2) exp(-(y - ysq)(y + ysq)) * scaled, ysq = y to 4 bits: CALERF's split
    # keeps exp(-y^2) accurate where y^2 rounds
    sixteen = s.c(16.0)
    ysq = s.f("arith.divf", s.op(f"math.floor {s.f('arith.mulf', yc, sixteen)} : {{t}}"), sixteen)
    dl = s.f("arith.mulf", s.f("arith.subf", yc, ysq), s.f("arith.addf", yc, ysq))
    e1 = s.op(f"math.exp {s.f('arith.negf', s.f('arith.mulf', ysq, ysq))} : {{t}}")
    e2 = s.op(f"math.exp {s.f('arith.negf', dl)} : {{t}}")
    erfc = s.f("arith.mulf", s.f("arith.mulf", e1, e2), scaled)
    large = s.f("math.copysign", s.f("arith.addf", s.f("arith.subf", half, erfc), half), "{a}")
    return s.done(s.sel(s.cmp("ole", y, s.c(0.46875)), small, large))


_POW_BITS = 11  # whole exponents under 2**11 multiply out; any larger one over- or underflows


def _split(s: _Seq, x: str) -> tuple[str, str]:
    """Dekker's split of ``x`` into two halves of 26 bits, whose products are exact."""
    c = s.f("arith.mulf", s.c(134217729.0), x)  # 2**27 + 1
    hi = s.f("arith.subf", c, s.f("arith.subf", c, x))
    return hi, s.f("arith.subf", x, hi)


def _mul_dd(s: _Seq, a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    """The double-double product of ``a`` and ``b`` (pairs hi, lo): Dekker's exact product of
    the highs (no fma: IREE may not fuse, and a fused one would change nothing), plus the
    cross terms, renormalized so hi is the sum rounded."""
    p = s.f("arith.mulf", a[0], b[0])
    (ah, al), (bh, bl) = _split(s, a[0]), _split(s, b[0])
    err = s.f("arith.subf", s.f("arith.mulf", ah, bh), p)
    err = s.f("arith.addf", err, s.f("arith.mulf", ah, bl))
    err = s.f("arith.addf", err, s.f("arith.mulf", al, bh))
    err = s.f("arith.addf", err, s.f("arith.mulf", al, bl))
    cross = s.f("arith.addf", s.f("arith.mulf", a[0], b[1]), s.f("arith.mulf", a[1], b[0]))
    lo = s.f("arith.addf", err, cross)
    hi = s.f("arith.addf", p, lo)
    return hi, s.f("arith.subf", lo, s.f("arith.subf", hi, p))


def _powf_f64() -> str:
    # IREE expands f64 powf as exp(b * log(a)), a few ulps off even where a ** b is a whole
    # number (2 ** 3 gives 7.999...), which truncation to an integer output turns into an off-by
    # one. For a whole |b| < 2**11 this multiplies by squaring in double-double instead: the
    # result rounded once, as numpy's pow (exact wherever it is representable, 103 ** 9 to the
    # nearest double); where a split overflows (|a| near the largest double) the plain product
    # stands in; other exponents keep powf
    s = _Seq()
    zero, one = s.c(0.0), s.c(1.0)
    ab = s.op("math.absf {b} : {t}")
    whole = s.cmp("oeq", s.op(f"math.floor {ab} : {{t}}"), ab)
    small = s.cmp("olt", ab, s.c(float(2 ** _POW_BITS)))
    use = s.op(f"arith.andi {whole}, {small} : i1")
    e = s.op(f"arith.fptosi {s.sel(use, ab, zero)} : {{t}} to i64")
    one_i = s.op("arith.constant 1 : i64")
    plain, base = one, "{a}"
    acc, dbase = (one, zero), ("{a}", zero)
    for i in range(_POW_BITS):
        bit = s.op(f"arith.trunci {e} : i64 to i1")
        plain = s.sel(bit, s.f("arith.mulf", plain, base), plain)
        prod = _mul_dd(s, acc, dbase)
        acc = (s.sel(bit, prod[0], acc[0]), s.sel(bit, prod[1], acc[1]))
        if i + 1 < _POW_BITS:
            base = s.f("arith.mulf", base, base)
            dbase = _mul_dd(s, dbase, dbase)
            e = s.op(f"arith.shrui {e}, {one_i} : i64")
    dd = s.f("arith.addf", acc[0], acc[1])
    finite = s.cmp("ole", s.op(f"math.absf {dd} : {{t}}"), s.c(sys.float_info.max))
    mag = s.sel(finite, dd, plain)
    neg = s.cmp("olt", "{b}", zero)
    sq = s.sel(neg, s.f("arith.divf", one, mag), mag)
    general = s.op("math.powf {a}, {b} : {t}")
    return s.done(s.sel(use, sq, general))


#: the f64 expansion of each math op IREE cannot link (or computes inexactly) in f64, as
#: templates over ``{a}`` (and ``{b}``)
F64_MATH: dict[str, str] = {"tanh": _tanh_f64(), "sin": _sincos_f64(cos=False),
                            "cos": _sincos_f64(cos=True), "erf": _erf_f64(),
                            "powf": _powf_f64()}
_MATH_LINE = re.compile(r"^(?P<r>\S+) = math\.(?P<op>tanh|sin|cos|erf|powf) (?P<a>[^\s,]+)"
                        r"(, (?P<b>\S+))? : \{t\}$")


def expand_f64_math(template: str) -> str:
    """The template with each ``math.tanh``, ``math.sin``, ``math.cos``, ``math.erf`` and
    ``math.powf`` line replaced by its f64 arithmetic (``F64_MATH``); the emitter applies it
    where the compute type is f64, and every other line passes unchanged.

    >>> out = expand_f64_math("{r} = math.tanh {a} : {t}")
    >>> "math.tanh" in out, "math.exp" in out, out.splitlines()[-1].startswith("{r} = ")
    (False, True, True)
    """
    out = []
    for i, line in enumerate(template.splitlines()):
        m = _MATH_LINE.match(line)
        if m is None:
            out.append(line)
            continue
        # the expansion's temporaries take the body's prefix plus the line's own tag
        out.append(F64_MATH[m["op"]].format(r=m["r"], a=m["a"], b=m["b"], p=f"{{p}}x{i}-",
                                            t="{t}"))
    return "\n".join(out)


# --- f32 sin and cos through f64 ---------------------------------------------------------------
# MLIR's f32 expansion of sin and cos (IREE's, there being no libm) subtracts k * pi/2 with
# pi/2 rounded to one float32, 4.4e-8 off: its error grows as 2.8e-8 * |x| (1.1e-4 at 4096,
# 2.7e-3 at 1e5) where numpy's and libm's stay at float32 rounding. So the emitter computes them
# in f64 (``widen_f32_math``): a float32 is exact in f64, reduced exactly (the Cody-Waite
# medium path below 2**20, Payne-Hanek above, to the largest float32) and the kernels' result
# is within an ulp of f64, so the f32 result is the sine rounded once to float32 (bar a
# near-tie), on every backend and at every float32 input.
#: sin and cos of a float32 operand held in f64, as templates over ``{a}``
F32_WIDE_MATH: dict[str, str] = {"sin": _sincos_float32_f64(cos=False),
                                 "cos": _sincos_float32_f64(cos=True)}
_WIDE_LINE = re.compile(r"^(?P<r>\S+) = math\.(?P<op>sin|cos) (?P<a>\S+) : \{t\}$")


def widen_f32_math(template: str) -> str:
    """The template with each ``math.sin`` and ``math.cos`` line computed in f64 (its operand
    extended, ``F32_WIDE_MATH``'s arithmetic, the result truncated back); the emitter applies it
    where the compute type is f32, and every other line passes unchanged.

    >>> out = widen_f32_math("{r} = math.sin {a} : {t}")
    >>> "math.sin" in out, "arith.extf {a} : {t} to f64" in out
    (False, True)
    >>> out.splitlines()[-1]
    '{r} = arith.truncf %{p}w0-r : f64 to {t}'
    """
    out = []
    for i, line in enumerate(template.splitlines()):
        m = _WIDE_LINE.match(line)
        if m is None:
            out.append(line)
            continue
        # the widened temporaries take the body's prefix plus the line's own tag
        p = f"{{p}}w{i}-"
        out.append(f"%{p}a = arith.extf {m['a']} : {{t}} to f64")
        out.append(F32_WIDE_MATH[m["op"]].format(r=f"%{p}r", a=f"%{p}a", p=p, t="f64"))
        out.append(f"{m['r']} = arith.truncf %{p}r : f64 to {{t}}")
    return "\n".join(out)


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



#: reducer name -> its combine of one accumulated element ``{a}`` with a new one ``{b}``
COMBINES: dict[str, MlirBody] = {
    "sum": _bin("arith.addf", "arith.addi"),
    "mean": _bin("arith.addf", "arith.addi"),  # the sum; the emitter divides by the count after
    "max": _bin("arith.maximumf", "arith.maxsi"),
    "min": _bin("arith.minimumf", "arith.minsi"),
    "prod": _bin("arith.mulf", "arith.muli"),
    "any": MlirBody(*["{r} = arith.ori {a}, {b} : i1"] * 2),
    "argmax": _ARGMAX_COMBINE,
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
    found = COMBINES.get(r.name)
    if found is None:
        name = k.name if k is not None else r.name
        raise _refuse(op, "kind", name, f" (no combine for its reducer {r.name!r})")
    return found


def supported(k: OpKind) -> bool:
    """True when the backend emits ops of kind ``k`` (its body, and its reducer's combine)."""
    if k.category is not Category.REDUCTION and k.name not in BODIES:
        return False
    return k.reducer is None or k.reducer.name in COMBINES


#: kinds the backend runs on the host, between modules: numpy's random generators, which no
#: compiled module reproduces
_HOST = frozenset({"uniform", "normal"})


@dataclass(frozen=True)
class _Check:
    """Table consistency, checked at import: every body names a kind, every combine a reducer,
    every kind is emitted or run on the host, and a kind's integer template exists exactly
    where the registry says it computes integers exactly (``OpKind.exact_integers``)."""

    def __post_init__(self) -> None:
        names = {k.name for k in KINDS}
        stray = sorted(set(BODIES) - names) + sorted(set(COMBINES) - set(REDUCERS))
        if stray:
            raise EmitError(f"{BACKEND} bodies for unknown kinds or reducers: {stray}")
        for k in KINDS:
            if not supported(k) and k.name not in _HOST:
                raise EmitError(f"kind {k.name!r} has no MLIR body in the {BACKEND} backend")
            bodies = [b for b in (None if k.category is Category.REDUCTION else
                                  BODIES.get(k.name),
                                  k.reducer and COMBINES.get(k.reducer.name)) if b is not None]
            if k.whole or not bodies:
                continue
            ints = all(b.int is not None for b in bodies)
            if ints != k.exact_integers:
                raise EmitError(f"kind {k.name!r}: integer template {ints}, registry "
                                f"exact_integers {k.exact_integers}")


_Check()
