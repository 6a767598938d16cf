"""``--param NAME=VALUE`` on the command line: symbolic loop counts, run-time sizes and symbolic
mesh axis sizes share one syntax."""

from __future__ import annotations

import re
from collections.abc import Sequence

from apportion.errors import ApportionError

_DECIMAL = re.compile(r"\s*-?[0-9]+\s*")


def is_decimal(text: str) -> bool:
    """``text`` is an integer in plain ASCII digits (an optional minus sign, blanks around):
    ``int`` alone also takes ``4_0`` as 40 and other scripts' digits (``'٤'``) as 4."""
    return _DECIMAL.fullmatch(text) is not None


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
        if not is_decimal(value):
            raise error(f"--param {text!r}: value {value!r} is not an integer in decimal "
                        "digits 0-9")
        number = int(value)
        if name in out:
            raise error(f"--param {name} given twice ({name}={out[name]}, {name}={number})")
        out[name] = number
    return out
