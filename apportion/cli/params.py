"""``--param NAME=VALUE`` on the command line: symbolic loop counts, run-time sizes and symbolic
mesh axis sizes share one syntax."""

from __future__ import annotations

from collections.abc import Sequence

from apportion.errors import ApportionError


def parse_params(pairs: Sequence[str] | None, error: type[ApportionError]) -> dict[str, int]:
    """``--param`` values as a dict; the syntax only (``error`` is the command's usage error).

    >>> parse_params(["T=4", " N = 2"], ValueError)   # doctest: +SKIP
    {'T': 4, 'N': 2}
    """
    out: dict[str, int] = {}
    for text in pairs or []:
        name, eq, value = text.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier():
            raise error(f"--param {text!r}: expected NAME=VALUE, such as --param T=4")
        try:
            number = int(value)
        except ValueError:
            raise error(f"--param {text!r}: value {value!r} is not an integer") from None
        if name in out:
            raise error(f"--param {name} given twice ({name}={out[name]}, {name}={number})")
        out[name] = number
    return out
