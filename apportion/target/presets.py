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
from apportion.target.host import host_table
from apportion.target.split_k import ByCost, ByTable, IreeGpu, TableRow
from apportion.target.target import Target, describe, finite, is_int, is_real

MiB = 1 << 20

# Spyre (AIU 1.0): 32 cores, 256 MiB per-core span, 128-byte sticks, 2 MiB scratchpad with a
# fifth held back. The cost figures are published facts of the device (torch-spyre's
# hardware-calibrated work-division model and its measurements) and a fit to measured kernel
# times (``apportion calibrate``, data in ``frontend/data/spyre_measurements.json``):
SPYRE_COST = {
    # fp16 (DL16) peak 98.304 TOPS over 32 cores, 2 operations per MAC: MACs/us/core
    "mac_rate": 98.304e12 / 2 / 32 / 1e6,
    # the systolic array streams rows in passes of 8; about 8 passes per core hide its start-up;
    # below that its efficiency falls roughly as the square root of the pass count
    "pt_rows": 8, "pt_full_passes": 8.0, "pt_exponent": 0.5,
    # elementwise (SFP) rate from a silu sweep, simple reductions from sums on [1,32,512,4096]
    "sfp_rate": 1.76e3, "reduce_rate": 1.2e4,
    # LPDDR5: 204.8 GB/s aggregate peak (166 GB/s measured on copies); the fit to the matmul
    # measurements sits at the peak. A core's own port is not published: 64 GB/s keeps it from
    # binding where the aggregate does not (the measured kernels move up to 27 GB/s per core)
    "mem_bandwidth": 204.8e9, "core_bandwidth": 64e9,
    # a slice broadcast over the ring reaches 8 cores cheaply; beyond, contention grows
    # as (cohort / 8) ** 0.75
    "broadcast_cohort": 8.0, "broadcast_exponent": 0.75,
    # fitted (apportion calibrate on the shipped measurements): compute and memory overlap,
    # leaving 0.8 of the shorter one exposed (all 8 records fit 0.797, RMS log error 0.167). A
    # batched matmul whose element fits the scratchpad once but not twice overlaps nothing
    # (cost/model.py): the large-K bmm 8x512x4096x512, 827 us measured, is predicted 614 us
    # with it and 579 us without (before it, the fit to every record moved to 0.91)
    "overlap": 0.80,
    # K split in 2 added about 3.4 ms to a kernel with 8.4 M output elements: on 32 cores that is
    # 16 output slices of 524,288 elements, one hop each: 3400 / 524288 us per element
    "ring_us_per_element": 3400 / 524288,
    # splitting a batch dim measured about 1.2x slower per extra batch slice (large-K bmm)
    "batch_split_factor": 1.2,
    # a batched matmul drains each element's output slice through the core's own port, shared
    # with no other core: at the 2.3 GB/s per core torch-spyre measured for a matmul's unshared
    # traffic (published, not fitted; the MoE and bmm kernels of torch-spyre's perf suite in the
    # shipped measurements, b x m x k x n 8x128x2048x8192, 8x128x8192x2048, 8x512x4096x512 and
    # 8x512x64x512, are predicted within 30% with it)
    "batch_drain_us_per_byte": 1e6 / 2.3e9,
    # a small per-byte cost for splitting a stick dim
    "stick_split_us_per_byte": 4.5e-7,
}
_SPYRE = Target(
    name="spyre", cores=32, max_cores=32, span_limit=256 * MiB, stick_bytes=128,
    scratchpad_bytes=2 * MiB, scratchpad_reserve=0.2, **SPYRE_COST,
    # the backend cannot mask a padded last stick spread over cores
    split_padded_reduction=False,
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


# The CPU: no matrix-unit pipeline, no broadcast ring; numpy kernels on one thread per core.
# Figures fitted (``apportion calibrate --measure``, rounded to 3 digits) to kernels timed with
# the planned executor on a 2-core machine of the project's CI kind (AMD EPYC, numpy's OpenBLAS
# on one thread per core): matmuls, exp, mul and sums on 1 and 2 cores, RMS log error 0.25.
# float32 kernels compute in float64. No record is bound by one core's port, so core_bandwidth
# only has to stay above where it would bind; compute and memory do not overlap (overlap 1:
# their sum). The terms that tell splits of one core count apart (core_sync_us, core_scaling,
# stick_split_us_per_byte, ring_us_per_element) are left neutral here, so the 2-core splits of
# a kernel tie: ``frontend/data/cpu_measurements.json`` holds every split of 13 kernels timed
# on a quiet 2-core host (AMD EPYC; the fastest split of each the same in two runs), whose fit
# (``apportion calibrate --measure -o cpu.toml``, a target file) ranks every measured best
# first; the preset keeps the figures every cpu plan has been made with.
CPU_COST = {
    "mac_rate": 1.28e4, "sfp_rate": 122.0, "reduce_rate": 1.4e3,
    "mem_bandwidth": 7.02e9, "core_bandwidth": 7.76e9, "overlap": 1.0,
}


# Split-K on the CPU: a split table from float32 matmuls (``y[m,n] = x[m,k] @ w[k,n]``) whose
# K was split 1, 2, 4, ..., 64 ways, compiled by IREE (llvm-cpu) and timed on a 2-core machine
# of the project's CI kind (AMD EPYC; ``apportion bench splitk``, data in
# ``frontend/data/cpu_splitk_measurements.json``). The fastest factors, within noise: about 512
# of K per slice for a matrix-vector product (M = 1: 1x4096x14336 fastest at 32, 1x6144x4096 at
# 4 to 8; whole K is 2 to 3 times slower), about 4096 per slice for outputs of 64 to 256 rows
# and columns (128x128x32768 at 2 to 8, 128x256x16384 at 2 to 4; whole K 1.2 to 1.8 times
# slower), and K whole for a 32x32 output (every split slower). Each row's bounds are inclusive;
# only matmul-like shapes match (every row asks N >= 8, a plain reduction's N is 1), and a shape
# no row holds is left to the cost model's search. Splits of K are capped at the target's cores.
# It is the shipped table, the same on every machine (``APPORTION_CPU_SPLIT_K=shipped``, what the
# test suite plans with); the stock ``cpu`` target reads the table measured on the host it runs
# on instead (``target/host.py``, measured on first use by ``workflows/host_splitk.py``).
CPU_SPLIT_K = (
    # matrix-vector (M = 1): about 512 of K per slice
    TableRow(32, k=(8192, None), m=(1, 1), n=(1024, None)),
    TableRow(8, k=(2048, 8191), m=(1, 1), n=(1024, None)),
    # 64..256 x 64..256 outputs: about 4096 of K per slice
    TableRow(8, k=(32768, None), m=(64, 256), n=(64, 256)),
    TableRow(4, k=(16384, 32767), m=(64, 256), n=(64, 256)),
    # small outputs: the combine costs more than the split gains
    TableRow(1, m=(1, 64), n=(8, 64)),
)


#: the most cores a ``cpu`` target plans for where this machine has fewer: the balanced search's
#: time grows with the cores (a minute at 10**6; --cores 10**20 never ended)
MAX_CPU_CORES = 4096


def cpu(cores: int | None = None, split_k_table: tuple[TableRow, ...] | None = None
        ) -> Target:
    """This machine's CPU: all its cores, 64-byte cache lines as sticks, no span limit, split-K
    by ``split_k_table``, by default this host's table (``target/host.py``: measured here on
    first use and cached per host; ``APPORTION_CPU_SPLIT_K=shipped``: ``CPU_SPLIT_K``).

    >>> cpu(cores=2, split_k_table=CPU_SPLIT_K).split_k_table == CPU_SPLIT_K
    True
    """
    n = os.cpu_count() or 1
    top = max(n, MAX_CPU_CORES)
    if is_int(cores) and not 1 <= cores <= top:  # before this host's table may be measured
        raise TargetError(f"target 'cpu': cores must be in 1..{top} (this machine's {n}, or a "
                          f"larger CPU of up to {top}), got {cores}")
    if split_k_table is None:
        measured = host_table()
        split_k_table = CPU_SPLIT_K if measured is None else measured.rows
    return Target(
        # a bad cores is left for Target to name; max() would fail on it first
        name="cpu", cores=n if cores is None else cores,
        max_cores=max(n, cores) if is_int(cores) else n,
        span_limit=1 << 62, stick_bytes=64, scratchpad_bytes=1 * MiB, scratchpad_reserve=0.25,
        # no rows (a host table of no shapes): every split of K is the cost model's
        split_k=ByTable() if split_k_table else ByCost(), split_k_table=split_k_table,
        host=True, **CPU_COST,
    )


# A data-center GPU (AMD MI300X class), each compute unit a "core": 304 CUs, fp16 dense peak
# 1307.4 TFLOPS (2 operations per MAC), vector fp32 81.7 TFLOPS, HBM3 at 5.3 TB/s, 64 KiB of LDS
# per CU as the scratchpad, 128-byte cache lines as sticks. Split-K follows IREE's published
# GPU split-reduction heuristic (``target/split_k.py``).
GPU_COST = {
    "mac_rate": 1307.4e12 / 2 / 304 / 1e6,
    "sfp_rate": 81.7e12 / 304 / 1e6, "reduce_rate": 81.7e12 / 304 / 1e6,
    "mem_bandwidth": 5.3e12, "core_bandwidth": 64e9, "overlap": 0.0,
}


def gpu(cores: int | None = None) -> Target:
    """A GPU: 304 compute units as cores (``cores`` fewer), IREE's split-K heuristic.

    >>> gpu().split_k, gpu(cores=64).cores
    (IreeGpu(), 64)
    """
    return Target(name="gpu", cores=304 if cores is None else cores, max_cores=304,
                  span_limit=1 << 62, stick_bytes=128, scratchpad_bytes=64 * 1024,
                  scratchpad_reserve=0.0, max_loop_count=(1 << 31) - 1, split_k=IreeGpu(),
                  forall_mapping="gpu_blocks", **GPU_COST)


PRESETS = {"spyre": spyre, "cpu": cpu, "gpu": gpu}


# Fields that may be given in MiB as ``<field>_mib``: the byte sizes.
MIB_FIELDS = ("span_limit", "stick_bytes", "scratchpad_bytes", "alignment")


def _table_rows(where: str, value: object) -> tuple[TableRow, ...]:
    """``[[split_k_table]]`` rows (``slices = 8``, ``k = [65536, 1048576]``, ...) as TableRows."""
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        raise TargetError(f"{where}: split_k_table must be an array of tables "
                          f"([[split_k_table]]), got {describe(value)}")
    rows = []
    for i, row in enumerate(value):
        fields_ = dict(row)
        for name in ("k", "m", "n", "batch"):
            if name in fields_:
                bounds = fields_[name]
                if not isinstance(bounds, list) or len(bounds) != 2:
                    raise TargetError(f"{where}: split_k_table row {i}: {name} must be "
                                      f"[low, high], got {describe(bounds)}")
                fields_[name] = tuple(bounds)
        unknown = set(fields_) - {"slices", "k", "m", "n", "batch", "cores"}
        if unknown or "slices" not in fields_:
            raise TargetError(f"{where}: split_k_table row {i} needs slices and may have k, m, "
                              f"n, batch ranges and the cores it was measured on; got "
                              f"{sorted(row)}")
        try:
            rows.append(TableRow(**fields_))
        except TargetError as e:
            raise TargetError(f"{where}: row {i}: {e}") from None
    return tuple(rows)


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
    if not isinstance(path, str | os.PathLike):
        raise TargetError(f"load_toml: path must be a str or a path (a target .toml file), got "
                          f"{describe(path, typed=True)}")
    where = f"target file {str(path)!r}"
    try:
        raw = Path(path).read_bytes()
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise TargetError(f"cannot read {where}: {getattr(e, 'strerror', None) or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TargetError(f"{where} is not UTF-8 text (bad byte at offset {e.start})") from None
    try:
        doc: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TargetError(f"{where} is not valid TOML: {e}") from None
    table = doc.get("target", doc)
    # a [mesh] table beside the target belongs to apportion.sharding.mesh.load_toml
    outside = sorted(k for k in doc if k not in ("target", "mesh")) if "target" in doc else []
    if outside:  # with a [target] table, a key outside it would be silently ignored
        raise TargetError(f"{where}: field {outside[0]!r} is outside the [target] table; put "
                          "every field inside it (or drop the table header)")
    if not isinstance(table, dict):
        raise TargetError(f"{where}: target must be a table ([target]), got "
                          f"{describe(table)}")
    table = dict(table)  # popped below; leave the parsed document alone
    if "target" not in doc:
        table.pop("mesh", None)
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
        elif key == "split_k_table":
            values[key] = _table_rows(where, value)
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
