"""Built-in targets and the TOML loader."""

from __future__ import annotations

import os
import tomllib
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from apportion.errors import TargetError
from apportion.settings import sencores
from apportion.target.target import Target

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
        name="cpu", cores=n if cores is None else cores, max_cores=max(n, cores or 1),
        span_limit=1 << 62, stick_bytes=64, scratchpad_bytes=1 * MiB, scratchpad_reserve=0.25,
        peak_flops_per_core=5e10, core_bandwidth=1e10, mem_bandwidth=2e10, combine_latency_us=5.0,
    )


PRESETS = {"spyre": spyre, "cpu": cpu}


def load_toml(path: str | Path, cores: int | None = None) -> Target:
    """A target from a TOML file: ``preset = "spyre"`` (optional) then any Target field.

    Sizes may be given in bytes or with ``_mib`` suffixed field names (``span_limit_mib = 256``).
    """
    try:
        doc: dict[str, Any] = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise TargetError(f"cannot read target file {str(path)!r}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise TargetError(f"target file {str(path)!r} is not valid TOML: {e}") from None
    doc = doc.get("target", doc)
    base_name = doc.pop("preset", None)
    if base_name is not None and base_name not in PRESETS:
        raise TargetError(f"target file {str(path)!r}: unknown preset {base_name!r}; valid: "
                          f"{', '.join(PRESETS)}")
    valid = {f.name for f in fields(Target)}
    values: dict[str, Any] = {}
    for key, value in doc.items():
        if key.endswith("_mib") and key[:-4] in valid:
            values[key[:-4]] = int(value * MiB)
        elif key in valid:
            values[key] = value
        else:
            raise TargetError(f"target file {str(path)!r}: unknown field {key!r}; valid: "
                              f"{', '.join(sorted(valid))}")
    if cores is not None:
        values["cores"] = cores
    if base_name is not None:
        base = PRESETS[base_name]()
        if "max_cores" in values and "cores" not in values:
            values["cores"] = min(base.cores, values["max_cores"])
        return replace(base, **values)
    missing = valid - set(values) - {"layout", "alignment", "name"}
    if missing:
        raise TargetError(f"target file {str(path)!r}: missing fields {', '.join(sorted(missing))} "
                          "(or set preset = \"spyre\" to start from a preset)")
    values.setdefault("name", Path(path).stem)
    return Target(**values)


def resolve(spec: str, cores: int | None = None) -> Target:
    """A preset name or a path to a TOML file."""
    if spec in PRESETS:
        return PRESETS[spec](cores)
    if spec.endswith(".toml"):
        return load_toml(spec, cores)
    raise TargetError(f"unknown target {spec!r}; valid: {', '.join(PRESETS)} or a .toml file")
