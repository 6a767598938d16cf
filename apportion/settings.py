"""The one place apportion reads its environment variables."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from apportion.errors import TargetError


def sencores(environ: Mapping[str, str] | None = None) -> int | None:
    """The core count ``SENCORES`` asks for, or None when it is unset or empty."""
    env = os.environ if environ is None else environ
    raw = env.get("SENCORES", "").strip()
    if not raw:
        return None
    # ASCII digits only: int() also reads '1_6' as 16 and other scripts' digits ('١٦')
    if not re.fullmatch(r"-?[0-9]+", raw):
        raise TargetError(f"SENCORES={raw!r} is not an integer core count in digits 0-9")
    return int(raw)


#: ``APPORTION_CPU_SPLIT_K``'s values: the host's measured table, or the shipped one
CPU_SPLIT_K_SOURCES = ("host", "shipped")


def cpu_split_k(environ: Mapping[str, str] | None = None) -> str:
    """Where the ``cpu`` target's split-K table comes from: ``APPORTION_CPU_SPLIT_K``, ``host``
    (the default: measured on this machine, ``target/host.py``) or ``shipped``.

    >>> cpu_split_k({}), cpu_split_k({"APPORTION_CPU_SPLIT_K": "shipped"})
    ('host', 'shipped')
    """
    env = os.environ if environ is None else environ
    raw = env.get("APPORTION_CPU_SPLIT_K", "").strip() or "host"
    if raw not in CPU_SPLIT_K_SOURCES:
        raise TargetError(f"APPORTION_CPU_SPLIT_K={raw!r}: valid values are "
                          f"{', '.join(CPU_SPLIT_K_SOURCES)}")
    return raw
