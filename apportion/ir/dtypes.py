"""Element types and their sizes in bytes."""

from __future__ import annotations

from apportion.errors import ProgramError

#: dtype name -> size of one element in bytes
DTYPE_BYTES: dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "int8": 1,
    "int32": 4,
    "int64": 8,
    "bool": 1,
}

FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32"})


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``.

    >>> dtype_bytes("float16")
    2
    """
    check_dtype(dtype)
    return DTYPE_BYTES[dtype]


def check_dtype(dtype: str, where: str = "") -> str:
    """Return ``dtype`` if known, else raise a ProgramError listing the valid ones."""
    if dtype not in DTYPE_BYTES:
        at = f"{where}: " if where else ""
        raise ProgramError(f"{at}unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    return dtype
