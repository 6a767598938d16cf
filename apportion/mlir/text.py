"""The MLIR text helpers, now the builder's (``mlir.builder``), under the names the renderers
that do not build through it yet import them by."""

from __future__ import annotations

from apportion.mlir.builder import (
    INT64_MAX,
    SsaNames,
    alias_name,
    check_index,
    symbol_name,
    verify_mlir,
)

__all__ = ["INT64_MAX", "SsaNames", "alias_name", "check_index", "symbol_name", "verify_mlir"]
