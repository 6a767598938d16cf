"""Checking emitted MLIR text with the MLIR Python bindings shipped in iree-base-compiler.

The emitters print MLIR as text and never build it through the bindings, so the bindings are
needed only to check the text; they are imported on first use.

>>> verify_mlir('func.func @f() { "apportion.execute"() : () -> ()\\n return }')
>>> verify_mlir("func.func @f() { %x = nope }")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
apportion.errors.EmitError: emitted MLIR does not verify: ...
"""

from __future__ import annotations

import itertools
import re

from apportion.errors import EmitError


def symbol_name(name: str) -> str:
    """A valid MLIR identifier made from a tensor, op or program name.

    >>> symbol_name("model.layers-0"), symbol_name("0x")
    ('model.layers_0', '_0x')
    """
    out = re.sub(r"[^A-Za-z0-9_$.]", "_", name) or "t"
    return out if out[0].isalpha() or out[0] == "_" else f"_{out}"


#: the largest size, index or address MLIR holds: sizes and ``index`` values are signed 64-bit
INT64_MAX = 2**63 - 1


def check_index(value: int, what: str) -> int:
    """``value``, or an EmitError naming ``what`` when MLIR cannot hold it (past ``INT64_MAX``;
    the bindings would say only "invalid dimension").

    >>> check_index(2**63, "tensor 'x' dim 0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    apportion.errors.EmitError: tensor 'x' dim 0 is 9223372036854775808, past MLIR's limit ...
    """
    if value > INT64_MAX:
        raise EmitError(f"{what} is {value}, past MLIR's limit of 2**63 - 1 = {INT64_MAX} "
                        "(its sizes and index values are signed 64-bit)")
    return value


def alias_name(name: str) -> str:
    """An MLIR attribute alias name (after ``#``) made from a tensor name: a bare identifier
    without ``.`` (dotted alias names are reserved for dialects) or ``$``; the caller keeps
    aliases unique.

    >>> alias_name("tile_x.y"), alias_name("tile_a$b")
    ('tile_x_y', 'tile_a_b')
    """
    return symbol_name(name).replace(".", "_").replace("$", "_")


class SsaNames:
    """Hands out SSA names, unique across a function, so no region shadows another.

    >>> names = SsaNames()
    >>> names.fresh("x"), names.fresh("x"), names.fresh("a-b")
    ('%x', '%x_1', '%a_b')
    """

    def __init__(self) -> None:
        self.used: set[str] = set()

    def fresh(self, stem: str) -> str:
        stem = symbol_name(stem)
        for i in itertools.count():
            name = stem if i == 0 else f"{stem}_{i}"
            if name not in self.used:
                self.used.add(name)
                return f"%{name}"
        raise AssertionError("unreachable")


def verify_mlir(text: str) -> None:
    """Parse and verify ``text``; raise EmitError carrying the MLIR diagnostics when it fails.

    Unregistered ops are allowed, so that ``"apportion.execute"`` (generic syntax) passes; every
    other op must belong to a dialect the bindings register (func, scf, arith, affine, ...).
    """
    try:
        from iree.compiler import ir
    except ImportError as e:  # the package is a dependency; this guards broken installs
        raise EmitError(f"cannot verify MLIR: the iree-base-compiler bindings are missing ({e})"
                        ) from None
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    try:
        module = ir.Module.parse(text, ctx)
        module.operation.verify()
    except ir.MLIRError as e:
        notes = "; ".join(_diagnostic(d) for d in e.error_diagnostics) or str(e)
        raise EmitError(f"emitted MLIR does not verify: {notes}") from None


def _diagnostic(d: object) -> str:
    """One diagnostic with its location and notes on one line."""
    loc = str(getattr(d, "location", ""))
    notes = [str(n) for n in getattr(d, "notes", ())]
    return " ".join([f"{loc}: {d}" if loc else str(d), *(f"(note: {n})" for n in notes)])
