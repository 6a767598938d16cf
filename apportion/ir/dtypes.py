"""Element types and their sizes in bytes."""

from __future__ import annotations

from collections.abc import Iterable

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

#: float dtype -> its machine epsilon, the gap between 1.0 and the next value (2**-mantissa
#: bits): the precision a comparison of results in that dtype follows
FLOAT_EPS: dict[str, float] = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "float32": 2.0**-23}


def least_precise(dtypes: Iterable[str]) -> str | None:
    """The float dtype of ``dtypes`` with the largest epsilon (None without floats).

    >>> least_precise(["float32", "int64", "bfloat16", "float16"])
    'bfloat16'
    >>> least_precise(["int32"]) is None
    True
    """
    floats = [d for d in dtypes if d in FLOAT_EPS]
    return max(floats, key=FLOAT_EPS.__getitem__, default=None)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``.

    >>> dtype_bytes("float16")
    2
    """
    check_dtype(dtype)
    return DTYPE_BYTES[dtype]


def check_dtype(dtype: str, where: str = "") -> str:
    """Return ``dtype`` if known, else raise a ProgramError listing the valid ones."""
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        at = f"{where}: " if where else ""
        raise ProgramError(f"{at}unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    return dtype


#: characters a name may not hold: program text delimiters, quotes and escapes that emitted MLIR
#: strings and symbols could not carry as they are
_NAME_FORBIDDEN = frozenset('"\\[],')


def check_name(name: object, what: str) -> str:
    """Return ``name`` if it can name a ``what`` (tensor, op, program) everywhere apportion
    prints it: a non-empty string of printable characters without spaces, quotes, backslashes,
    brackets or commas.

    >>> check_name("model.layers.0.mlp", "op")
    'model.layers.0.mlp'
    >>> check_name('a"b', "tensor")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    apportion.errors.ProgramError: tensor name 'a"b' holds '"'; names are printable text ...
    """
    if not isinstance(name, str) or not name:
        raise ProgramError(f"a {what} name must be a non-empty string, got {name!r}")
    bad = next((c for c in name if c in _NAME_FORBIDDEN or not c.isprintable() or c.isspace()),
               None)
    if bad is not None:
        raise ProgramError(f"{what} name {name!r} holds {bad!r}; names are printable text without "
                           "spaces, quotes, backslashes, brackets or commas")
    return name
