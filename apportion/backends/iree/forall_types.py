"""Scalar types of the parallel IR (``backends.iree.forall``): tensor dtypes as MLIR element
types, the type classes its bodies compute in, and ``arith.constant`` literals."""

from __future__ import annotations

import math

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


def mlir_type(dtype: str) -> str:
    """The MLIR element type of a tensor dtype.

    >>> mlir_type("bfloat16"), mlir_type("bool")
    ('bf16', 'i1')
    """
    return MLIR_TYPES[dtype]


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
