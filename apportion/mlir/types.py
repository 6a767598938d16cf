"""Scalar types of the MLIR the emitters write (the parallel IR, the mesh modules, the shard
forms): tensor dtypes as MLIR element types (``mlir_type``), the type an op computes in
(``compute_type``), and ``arith.constant`` literals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from apportion.errors import EmitError
from apportion.ir.dtypes import FLOAT_DTYPES
from apportion.ir.kinds import Category, OpKind

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
#: the MLIR float element types, and each one's width in bits (and each integer type's)
FLOAT_TYPES = ("f16", "bf16", "f32", "f64")
FLOAT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
INT_BITS = {"i1": 1, "i8": 8, "i32": 32, "i64": 64}
#: float types' infinities as bit patterns (MLIR float literals have no ``inf``)
_INF = {"f16": 0x7C00, "bf16": 0x7F80, "f32": 0x7F800000, "f64": 0x7FF0000000000000}
_NARROW = frozenset({"float16", "bfloat16", "bool"})
_INTS = frozenset({"int8", "int32", "int64"})
INDEX_MAX = 2**63 - 1  # the index a fresh argmax accumulator holds: any real one is lower
#: the reducers a float32 op accumulates in f64; max, min and the argument reductions are exact
#: in any float type
WIDE_REDUCERS = frozenset({"sum", "mean", "prod"})


def mlir_type(dtype: str) -> str:
    """The MLIR element type of a tensor dtype.

    >>> mlir_type("bfloat16"), mlir_type("bool")
    ('bf16', 'i1')
    >>> mlir_type("float64")
    Traceback (most recent call last):
    apportion.errors.EmitError: dtype 'float64' has no MLIR element type
    """
    try:
        return MLIR_TYPES[dtype]
    except KeyError:
        raise EmitError(f"dtype {dtype!r} has no MLIR element type") from None


def compute_type(kind: OpKind, dtypes: Sequence[str]) -> str:
    """The scalar type an op of ``kind`` computes in, given its inputs' dtypes, in every
    emitter: a kind without inputs (a constant) in ``f64``, as the reference executor's Python
    float, converted once to the output type; one with only truth-value inputs in ``i1``;
    float16, bfloat16 and bool values in ``f32``; integers in ``i64`` where the kind computes
    them exactly; floats in ``f32``, but a float32 sum, mean or product in ``f64``; anything
    else (integers meeting floats, integers a kind computes through floats) in ``f64``.

    >>> from apportion.ir.kinds import kind
    >>> compute_type(kind("add"), ["float16", "bfloat16"]), compute_type(kind("sum"), ["float32"])
    ('f32', 'f64')
    >>> compute_type(kind("add"), ["int8", "int32"]), compute_type(kind("div"), ["int32"] * 2)
    ('i64', 'f64')
    """
    values = [dtypes[i] for i in kind.value_inputs(len(dtypes))]
    if not dtypes:
        return "f64"
    if not values:
        return "i1"
    if all(d in _NARROW for d in values):
        return "f32"
    if all(d in _INTS | {"bool"} for d in values) and kind.exact_integers:
        return "i64"
    if all(d in FLOAT_DTYPES | {"bool"} for d in values):
        # a float32 sum, mean or product accumulates in f64, as the reference does: a row
        # mean's float32 error (a few ulps of the row's sum) recurs in every element the
        # mean is subtracted from, and a later sum of them multiplies it by the row's length
        # (conformance seed 142: a mean 4.7e-7 off gave a cumsum 6e-5 off)
        wide = kind.category is Category.REDUCTION and kind.reducer is not None and \
            kind.reducer.name in WIDE_REDUCERS  # a matmul stays f32: IREE's kernels
        return "f64" if wide and "float32" in values else "f32"
    return "f64"


def literal(value: float | int | bool, ty: str) -> str:
    """An ``arith.constant`` attribute of ``value`` in type ``ty`` (infinities as bit patterns,
    integers clamped to the type's range: an identity of -inf is the least integer).

    >>> literal(-math.inf, "f32"), literal(-math.inf, "i8"), literal(0.5, "f64")
    ('0xFF800000 : f32', '-128 : i8', '0.5 : f64')
    """
    if ty == "i1":
        return "true" if value else "false"
    if ty in INT_BITS or ty == "index":
        bits = 64 if ty == "index" else INT_BITS[ty]
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        v = hi if value == math.inf else lo if value == -math.inf else int(value)
        return f"{min(max(v, lo), hi)} : {ty}"
    v = float(value)
    if math.isinf(v):
        bits = _INF[ty] | (1 << (FLOAT_BITS[ty] - 1) if v < 0 else 0)
        return f"0x{bits:X} : {ty}"
    text = repr(v)
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exp = text.split("e")
        text = f"{mantissa}.0e{exp}"
    return f"{text} : {ty}"


class Emits(Protocol):
    """What ``fptosi_saturating`` and the argmax keys (``mlir.keys``) write into: the parallel
    IR's blocks and the shard forms'."""

    def fresh(self, stem: str, /) -> str: ...

    def const(self, value: float | int | bool, ty: str, /) -> str: ...

    def emit(self, line: str, /) -> None: ...


def cast_op(src: str, dst: str) -> str:
    """The ``arith`` op that converts ``src`` to ``dst`` in one step, in every emitter (floats
    to integers, to ``i1`` and bf16 from f16 each emitter writes its own way).

    >>> cast_op("f16", "f32"), cast_op("i1", "f32"), cast_op("i64", "i32")
    ('extf', 'uitofp', 'trunci')
    """
    if src in FLOAT_TYPES and dst in FLOAT_TYPES:
        return "extf" if FLOAT_BITS[dst] > FLOAT_BITS[src] else "truncf"
    if dst in FLOAT_TYPES:
        return "uitofp" if src == "i1" else "sitofp"
    if src == "i1":
        return "extui"
    return "extsi" if INT_BITS[dst] > INT_BITS[src] else "trunci"


def fptosi_saturating(blk: Emits, value: str, src: str, dst: str) -> str:
    """``value`` of float type ``src`` as the integer type ``dst`` (not ``i1``), as
    ``kernels.saturate`` converts: truncated toward zero, clamped to ``dst``'s range, NaN to 0.
    ``arith.fptosi`` alone is poison out of range; here it only sees values in range (others
    are replaced by 0 first) and the out-of-range ones select the bounds. The bounds compare
    as -2**(n-1) and 2**(n-1), exact in every float type from f32 up (2**63 - 1 is not), so
    f16 and bf16 (whose range may not reach 2**(n-1)) compare in f32, exactly.

    >>> from apportion.mlir.builder import Block, Builder
    >>> blk = Block(Builder(), 0)
    >>> fptosi_saturating(blk, "%x", "f64", "i8")
    '%v_8'
    >>> for line in blk.lines[:3] + blk.lines[-4:]:
    ...     print(line)
    %cst = arith.constant 128.0 : f64
    %cst_1 = arith.constant -128.0 : f64
    %v = arith.cmpf oge, %x, %cst : f64
    %cst_3 = arith.constant 127 : i8
    %cst_4 = arith.constant -128 : i8
    %v_7 = arith.select %v, %cst_3, %v_6 : i8
    %v_8 = arith.select %v_1, %cst_4, %v_7 : i8
    """
    if FLOAT_BITS[src] < 32:
        wide = blk.fresh("v")
        blk.emit(f"{wide} = arith.extf {value} : {src} to f32")
        value, src = wide, "f32"
    edge = 2.0 ** (INT_BITS[dst] - 1)
    hi, lo = blk.const(edge, src), blk.const(-edge, src)
    over, under, nan, either, bad, safe, conv, top, out = (blk.fresh("v") for _ in range(9))
    blk.emit(f"{over} = arith.cmpf oge, {value}, {hi} : {src}")
    blk.emit(f"{under} = arith.cmpf olt, {value}, {lo} : {src}")
    blk.emit(f"{nan} = arith.cmpf uno, {value}, {value} : {src}")
    blk.emit(f"{either} = arith.ori {over}, {under} : i1")
    blk.emit(f"{bad} = arith.ori {either}, {nan} : i1")
    blk.emit(f"{safe} = arith.select {bad}, {blk.const(0.0, src)}, {value} : {src}")
    blk.emit(f"{conv} = arith.fptosi {safe} : {src} to {dst}")
    imax, imin = blk.const(int(edge) - 1, dst), blk.const(-int(edge), dst)
    blk.emit(f"{top} = arith.select {over}, {imax}, {conv} : {dst}")
    blk.emit(f"{out} = arith.select {under}, {imin}, {top} : {dst}")
    return out
