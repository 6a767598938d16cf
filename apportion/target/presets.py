"""Built-in targets and the TOML loader."""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

from apportion.errors import TargetError
from apportion.settings import sencores
from apportion.target.target import Target, describe, finite, is_int, is_real

MiB = 1 << 20

# Spyre figures: 32 cores, 256 MiB per-core span, 128-byte sticks, 2 MiB scratchpad with a fifth
# held back. Compute and bandwidth are round public figures (about 150 TFLOP/s fp16 over 32 cores,
# LPDDR5 at about 200 GB/s, partial sums combined over the on-chip ring in about half a
# microsecond); they shape the cost model's choices, not correctness.
_SPYRE = Target(
    name="spyre", cores=32, max_cores=32, span_limit=256 * MiB, stick_bytes=128,
    scratchpad_bytes=2 * MiB, scratchpad_reserve=0.2, peak_flops_per_core=4.7e12,
    core_bandwidth=12.8e9, mem_bandwidth=204.8e9, combine_latency_us=0.5,
)


def spyre(cores: int | None = None, environ: dict[str, str] | None = None) -> Target:
    """The Spyre preset: ``cores`` in 1..32, else ``SENCORES``, else 32.

    >>> spyre(cores=4).cores
    4
    """
    if cores is None:
        from_env = sencores(environ)
        cores = _SPYRE.max_cores if from_env is None else from_env
    return replace(_SPYRE, cores=cores)


def cpu(cores: int | None = None) -> Target:
    """This machine's CPU: all its cores, 64-byte cache lines as sticks, no span limit."""
    n = os.cpu_count() or 1
    return Target(
        # a bad cores is left for Target to name; max() would fail on it first
        name="cpu", cores=n if cores is None else cores,
        max_cores=max(n, cores) if is_int(cores) else n,
        span_limit=1 << 62, stick_bytes=64, scratchpad_bytes=1 * MiB, scratchpad_reserve=0.25,
        peak_flops_per_core=5e10, core_bandwidth=1e10, mem_bandwidth=2e10, combine_latency_us=5.0,
    )


PRESETS = {"spyre": spyre, "cpu": cpu}


# Fields that may be given in MiB as ``<field>_mib``: the byte sizes.
MIB_FIELDS = ("span_limit", "stick_bytes", "scratchpad_bytes", "alignment")


def _mib_to_bytes(where: str, key: str, value: object) -> int:
    """``value`` MiB as a whole number of bytes, or a TargetError naming ``key``."""
    if not is_real(value) or not finite(value) or value <= 0:
        raise TargetError(f"{where}: {key} must be a finite number of MiB > 0, "
                          f"got {describe(value)}")
    n = value * MiB
    if isinstance(n, float):
        if not math.isfinite(n):
            raise TargetError(f"{where}: {key} = {value} is too large")
        # MiB is a power of two, so value * MiB is exact: a fraction here is a fraction of a byte
        if not n.is_integer():
            raise TargetError(f"{where}: {key} = {value} is not a whole number of bytes "
                              f"({n} bytes)")
        n = int(n)
    return n


def load_toml(path: str | Path, cores: int | None = None) -> Target:
    """A target from a TOML file: ``preset = "spyre"`` (optional) then any Target field.

    The fields may sit at the top level or in a ``[target]`` table. Byte sizes may be given with
    ``_mib`` suffixed names instead (``span_limit_mib = 256``). Any bad field raises TargetError
    naming the file and the field.
    """
    where = f"target file {str(path)!r}"
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise TargetError(f"cannot read {where}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TargetError(f"{where} is not UTF-8 text (bad byte at offset {e.start})") from None
    try:
        doc: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TargetError(f"{where} is not valid TOML: {e}") from None
    table = doc.get("target", doc)
    outside = sorted(k for k in doc if k != "target") if "target" in doc else []
    if outside:  # with a [target] table, a key outside it would be silently ignored
        raise TargetError(f"{where}: field {outside[0]!r} is outside the [target] table; put "
                          "every field inside it (or drop the table header)")
    if not isinstance(table, dict):
        raise TargetError(f"{where}: target must be a table ([target]), got "
                          f"{describe(table)}")
    table = dict(table)  # popped below; leave the parsed document alone
    base_name = table.pop("preset", None)
    if base_name is not None and not (isinstance(base_name, str) and base_name in PRESETS):
        raise TargetError(f"{where}: preset must be one of {', '.join(PRESETS)}, "
                          f"got {describe(base_name)}")
    valid = {f.name for f in fields(Target)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key.endswith("_mib") and key[:-4] in MIB_FIELDS:
            field = key[:-4]
            if field in table:
                raise TargetError(f"{where}: both {field} and {key} given; set one")
            values[field] = _mib_to_bytes(where, key, value)
        elif key in valid:
            values[key] = value
        else:
            raise TargetError(f"{where}: unknown field {key!r}; valid: "
                              f"{', '.join(sorted(valid))} (sizes also as "
                              f"{', '.join(f + '_mib' for f in MIB_FIELDS)})")
    if cores is not None:
        values["cores"] = cores
    # The Target's own checks name the field; the prefix names the file it came from.
    try:
        if base_name is not None:
            base = PRESETS[base_name]()
            if "cores" not in values and is_int(values.get("max_cores")):
                values["cores"] = min(base.cores, values["max_cores"])
            return replace(base, **values)
        optional = {f.name for f in fields(Target) if f.default is not MISSING} | {"name"}
        missing = valid - set(values) - optional
        if missing:
            raise TargetError(f"missing fields {', '.join(sorted(missing))} "
                              "(or set preset = \"spyre\" to start from a preset)")
        values.setdefault("name", Path(path).stem)
        return Target(**values)
    except TargetError as e:
        raise TargetError(f"{where}: {e}") from None


def resolve(spec: str, cores: int | None = None) -> Target:
    """A preset name or a path to a TOML file, with ``cores`` (if given) overriding its count."""
    choices = f"{', '.join(PRESETS)} or a .toml file"
    if not isinstance(spec, str):
        raise TargetError(f"target must be a name or path as a str ({choices}), "
                          f"got {describe(spec, typed=True)}")
    if cores is not None and not is_int(cores):
        raise TargetError(f"target {spec!r}: cores must be an int, got {describe(cores)}")
    if spec in PRESETS:
        return PRESETS[spec](cores)
    if spec.endswith(".toml"):
        return load_toml(spec, cores)
    raise TargetError(f"unknown target {spec!r}; valid: {choices}")
