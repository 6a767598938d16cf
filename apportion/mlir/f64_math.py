"""Math ops as arithmetic every backend of the parallel IR runs alike: where the compute type
is f64, ``tanh``, ``sin``, ``cos``, ``erf`` and ``powf`` expanded into ops IREE's executables can
lower without libm (``expand_f64_math``), and where it is f32, ``sin`` and ``cos`` computed in f64
and rounded once (``widen_f32_math``). The emitters apply them to the body templates of
``mlir.bodies`` as they format them.

>>> out = expand_f64_math("{r} = math.erf {a} : {t}")
>>> "math.erf" in out, out.splitlines()[-1].startswith("{r} = arith.addf ")
(False, True)
"""

from __future__ import annotations

import math
import re
import sys

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
        return "\n".join([*self.lines, f"{{r}} = arith.addf {value}, {z} : {{t}}"])


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
