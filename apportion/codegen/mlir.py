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

from apportion.errors import EmitError


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
