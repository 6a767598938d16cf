"""Strict JSON reading shared by every document format (program, plan, sharding, measurements,
LoopSpec): an object that names a key twice is refused rather than keeping the last value, as
``json.loads`` would silently do."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from apportion.errors import ApportionError


def unique_keys(error: type[ApportionError], where: str
                ) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """An ``object_pairs_hook`` raising ``error`` on a key given twice in one object."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise error(f"{where}: key {key!r} appears twice in one JSON object "
                            f"(keys: {', '.join(repr(k) for k, _ in pairs)[:120]})")
            out[key] = value
        return out

    return hook


def loads(text: str | bytes | bytearray, error: type[ApportionError], where: str) -> Any:
    """``json.loads(text)`` refusing duplicate keys with ``error``; a ``text`` of another type
    is ``error`` too. JSON syntax errors propagate as ``json.JSONDecodeError``."""
    if not isinstance(text, str | bytes | bytearray):
        raise error(f"{where}: expected JSON text (str or bytes), got {type(text).__name__} "
                    f"{repr(text)[:60]}")
    return json.loads(text, object_pairs_hook=unique_keys(error, where))
