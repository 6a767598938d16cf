"""The one place apportion reads its environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping

from apportion.errors import TargetError


def sencores(environ: Mapping[str, str] | None = None) -> int | None:
    """The core count ``SENCORES`` asks for, or None when it is unset or empty."""
    env = os.environ if environ is None else environ
    raw = env.get("SENCORES", "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise TargetError(f"SENCORES={raw!r} is not an integer core count") from None
