"""Numbers on the command line: ``--param NAME=VALUE`` (symbolic loop counts, run-time sizes and
symbolic mesh axis sizes share one syntax), checked against the program (``check_params``), and
the argparse ``type`` of every numeric option (``int_in``, ``seconds``), all in plain ASCII
digits."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from apportion.errors import ApportionError, ProgramError, UsageError

if TYPE_CHECKING:
    from apportion.ir.program import Program
    from apportion.target.target import Target

_DECIMAL = re.compile(r"\s*-?[0-9]+\s*")
# a plain decimal number: digits with an optional point and exponent, ASCII only
_NUMBER = re.compile(r"\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*")


#: the most threads ``--threads`` takes: OpenMP and torch hold a team size in a C int (10**20
#: failed inside them), and no cpu target plans for more cores (``target.presets.MAX_CPU_CORES``)
MAX_THREADS = 4096


def is_decimal(text: str) -> bool:
    """``text`` is an integer in plain ASCII digits (an optional minus sign, blanks around):
    ``int`` alone also takes ``4_0`` as 40 and other scripts' digits (``'٤'``) as 4.

    >>> is_decimal("40"), is_decimal("4_0"), is_decimal("٤٠"), is_decimal("⁴⁰")
    (True, False, False, False)
    """
    return _DECIMAL.fullmatch(text) is not None


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``low..high`` (``high`` None: no upper bound) in plain
    ASCII digits; argparse names the option in its error line.

    >>> int_in(1, 32)("8")
    8
    >>> int_in(0)("١")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected an integer >= 0 in digits 0-9, got '١'
    """
    span = f"in {low}..{high}" if high is not None else f">= {low}"

    def parse(text: str) -> int:
        if not is_decimal(text):
            raise argparse.ArgumentTypeError(f"expected an integer {span} in digits 0-9, "
                                             f"got {text!r}")
        value = int(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {value}")
        return value

    return parse


#: the longest ``--timeout``: torch.distributed's clocks count nanoseconds in an int64 (about
#: 9.2e9 s; --timeout 1e11 hung the ranks, 1e13 and over failed in them)
MAX_SECONDS = 10 ** 9


def seconds(text: str) -> float:
    """An argparse ``type``: a number of seconds in (0, ``MAX_SECONDS``] in plain ASCII digits
    (``float`` alone also takes ``1_0``, other scripts' digits, ``inf`` and ``nan``).

    >>> seconds("2.5"), seconds("1e2")
    (2.5, 100.0)
    """
    if _NUMBER.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0 in digits 0-9 "
                                         f"(like 30 or 2.5), got {text!r}")
    value = float(text)
    if not 0 < value <= MAX_SECONDS:  # nan fails both
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0 and at most "
                                         f"{MAX_SECONDS:g}, got {text!r}")
    return value


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


def loop_symbols(program: Program) -> tuple[str, ...]:
    """The program's symbolic loop counts, in order of appearance."""
    return tuple(dict.fromkeys(level.count for g in program.tiling for level in g.loops
                               if isinstance(level.count, str)))


def check_params(program: Program, target: Target, params: dict[str, int],
                  needed: Sequence[str]) -> None:
    """Refuse a ``--param`` the program has no use for, out of range, or one ``needed``
    missing."""
    top = target.max_loop_count
    known = loop_symbols(program)
    for name, value in params.items():
        if name in program.symbol_map:  # a run-time size, within its bounds
            try:
                program.symbol_map[name].check(value)
            except ProgramError as e:
                raise UsageError(f"--param {name}={value}: {e}") from None
            continue
        if name not in known:
            sizes = ", ".join(program.symbol_map)
            raise UsageError(f"--param {name}={value}: {name!r} is not a symbolic loop count of "
                             f"program {program.name!r}; its symbolic counts: "
                             f"{', '.join(known) or 'none'}"
                             + (f"; its symbolic sizes: {sizes}" if sizes else ""))
        if not 1 <= value <= top:
            raise UsageError(f"--param {name}={value}: a loop count must be in 1..{top} "
                             f"(the max_loop_count of target {target.name!r})")
        for g in program.tiling:  # the bounds the program gives the count, before planning
            for lv in g.loops:
                high = top if lv.max is None else lv.max
                if lv.count == name and not lv.min <= value <= high:
                    raise UsageError(f"--param {name}={value}: loop count {name!r} of tiling "
                                     f"group {list(g.ops)} takes {lv.min}..{high}")
    missing = [n for n in needed if n not in params]
    if missing:
        flags = " ".join(f"--param {n}=N" for n in missing)
        raise UsageError(f"program {program.name!r} has symbolic loop count"
                         f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}: pass "
                         f"{flags} (N in 1..{top})")


def sizes_text(program: Program, sizes: dict[str, int]) -> str:
    """``K=4096 (given), M=64 (planning size)``."""
    return ", ".join(f"{n}={sizes[n]} (given)" if n in sizes else
                     f"{n}={s.planning_size} (planning size)"
                     for n, s in program.symbol_map.items())
