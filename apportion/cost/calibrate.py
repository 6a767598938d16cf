"""Calibration: the measurement format and the fit of cost coefficients to measured kernel times.

A measurements file is a JSON list of records, one timed kernel each::

    {"matmul": {"M": 512, "K": 4096, "N": 4096, "dtype": "float16"},
     "cores": 32, "splits": {"m": 8, "n": 4, "k": 1}, "time_us": 326.0, "best": true}

``matmul`` is shorthand for a one-op program ``y[m,n] = x[m,k] @ w[k,n]`` (with ``"batch": B``:
``y[b,m,n] = x[b,m,k] @ w[b,k,n]``); ``program`` holds a whole program format v1 document
instead, and ``op`` names the op timed (default: the program's only op). ``splits`` gives the
slices of each dim (a dim left out is not split), ``cores`` the cores the kernel ran on,
``time_us`` its time, ``best`` (optional) that this split was the fastest one measured for its
shape, ``noise`` (optional; ``calibrate --measure`` writes it) how the time was measured: the
rounds timed, the spread of the least time (its interval's width over it, ``cost/noise.py``)
and the 1-minute load average before and after, ``{"rounds": 9, "spread": 0.02, "load": [0.4,
1.9]}``. A record that cannot be read raises ``CalibrationError`` naming its index and field.

``fit`` adjusts the named coefficients of a base ``Target`` so that the model's predictions
match the measured times: a bounded least-squares fit (``scipy.optimize.least_squares``) of the
log of predicted over measured time, each coefficient scaled by its base value. The model's
prediction for a record is a ``predict(target, measurement)`` callable: turning a record into an
op's split and its planning units needs the layouts of the planning passes, which sit above the
cost layer (``apportion/cli/calibrate.py`` builds it). Program documents are read the same way,
by a ``read_program`` callable the caller hands in (program format v1 lives in the frontend).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from apportion.errors import ApportionError, CalibrationError, TargetError
from apportion.ir import jsondoc
from apportion.ir.program import Program
from apportion.target.target import (
    COST_FIELDS,
    FLOAT_FIELDS,
    Target,
    describe,
    finite,
    is_int,
    is_real,
)

#: the fields of one measurement record; any other key is an error
RECORD_FIELDS = ("program", "matmul", "op", "cores", "splits", "time_us", "best", "noise")
#: the fields of a record's ``noise``
NOISE_FIELDS = ("rounds", "spread", "load")
#: the fields of the ``matmul`` shorthand
MATMUL_FIELDS = ("M", "K", "N", "batch", "dtype")
#: coefficients a fit may adjust: the real-valued cost figures (``pt_rows`` is a count)
FITTABLE = tuple(f for f in COST_FIELDS if f != "pt_rows")
_LOWEST = {f: low for f, low, _, _ in FLOAT_FIELDS}
_HIGHEST = {f: high for f, _, _, high in FLOAT_FIELDS}

#: fp16 peak of Spyre: 98.304 TOPS over 32 cores, two operations per MAC, in MACs/us/core
SPYRE_PEAK_MAC_RATE = 98.304e12 / 2 / 32 / 1e6
#: what each preset's fit adjusts by default. Spyre's matrix-unit rate and memory bandwidth are
#: published peaks, and its measured kernels are all memory-bound in the model, so they pin only
#: one combination of compute rate and overlap: the fit holds the peaks and adjusts the overlap
#: (``--fit mac_rate,mem_bandwidth,overlap`` searches the whole, flat valley); the batch drain
#: is a published per-core rate, held too. The CPU's adds the terms that tell its splits apart:
#: each extra core's start and join, how much compute an extra core adds, cutting a contiguous
#: (stick) dim and combining a split reduction
DEFAULT_FIT: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "spyre": ("overlap",),
    "cpu": ("mac_rate", "sfp_rate", "reduce_rate", "mem_bandwidth", "core_bandwidth",
            "overlap", "core_sync_us", "core_scaling", "stick_split_us_per_byte",
            "ring_us_per_element"),
})
#: the range a fit searches for a coefficient whose base value is 0 (a term the base leaves
#: out): from 0 to this. Each is far past what a kernel of a few milliseconds could show
ZERO_BASE_RANGE: Mapping[str, float] = MappingProxyType({
    "core_sync_us": 1e4, "stick_split_us_per_byte": 1e-2, "ring_us_per_element": 1.0,
    "batch_drain_us_per_byte": 1e-2, "pt_exponent": 2.0, "broadcast_exponent": 2.0,
})
#: coefficients whose whole range is a fraction: a fit searches all of it
UNIT_RANGE = ("overlap", "core_scaling")
#: a ceiling of one CPU core, per microsecond: two 4-lane float64 operations (FMAs for a
#: matmul) per cycle at 4 GHz; the executor computes float32 kernels in float64
CPU_PEAK_RATE = 2 * 4 * 4e9 / 1e6
#: physical upper limits per preset (Spyre: the published peaks; the CPU: a ceiling of one
#: core): no fit goes past them
PHYSICAL_CAPS: Mapping[str, Mapping[str, float]] = MappingProxyType({
    "spyre": MappingProxyType({"mac_rate": SPYRE_PEAK_MAC_RATE, "mem_bandwidth": 204.8e9}),
    "cpu": MappingProxyType({"mac_rate": CPU_PEAK_RATE, "sfp_rate": CPU_PEAK_RATE,
                             "reduce_rate": CPU_PEAK_RATE}),
})
#: a fitted coefficient stays within [base / SPREAD, base * SPREAD] unless bounds are given
SPREAD = 10.0


# --- the measurement format ----------------------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    """One timed kernel: ``op`` of ``program`` on ``cores`` cores cut by ``splits`` (every dim
    of the op, 1 where not split) took ``time_us``; ``best``: the fastest split measured for
    its shape. ``spec`` is the record's program as written (``("matmul", {...})`` or
    ``("program", {...})``), kept to write the record back."""

    program: Program
    op: str
    cores: int
    splits: Mapping[str, int]
    time_us: float
    best: bool = False
    spec: tuple[str, Mapping[str, Any]] = field(default=("program", {}), compare=False)
    noise: Mapping[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", MappingProxyType(dict(self.splits)))

    @property
    def shape(self) -> str:
        """The shape timed, for a table: ``512x4096x4096`` (M x K x N) for a matmul record,
        else the program and op name."""
        kind, spec = self.spec
        if kind == "matmul":
            mkn = f"{spec['M']}x{spec['K']}x{spec['N']}"
            return f"{spec['batch']}x{mkn}" if spec.get("batch") is not None else mkn
        return f"{self.program.name}/{self.op}"

    @property
    def split_text(self) -> str:
        return split_text(self.splits)

    @property
    def key(self) -> tuple[str, int]:
        """What makes two records one shape: the shape timed and the cores it ran on."""
        return (self.shape, self.cores)

    def to_record(self) -> dict[str, Any]:
        """The record as the measurements file holds it."""
        kind, spec = self.spec
        out: dict[str, Any] = {kind: dict(spec)}
        if kind == "program":
            out["op"] = self.op
        out |= {"cores": self.cores, "splits": dict(self.splits), "time_us": self.time_us}
        if self.best:
            out["best"] = True
        if self.noise is not None:
            out["noise"] = dict(self.noise)
        return out


def split_text(splits: Mapping[str, int]) -> str:
    """``m8 n4 k1``: every dim's slices."""
    return " ".join(f"{d}{n}" for d, n in splits.items())


def matmul_document(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The program format v1 document of a ``matmul`` shorthand (already checked)."""
    m, k, n, dtype = spec["M"], spec["K"], spec["N"], spec.get("dtype", "float16")
    b = spec.get("batch")
    lead, idx = ([b], "b,") if b is not None else ([], "")
    name = f"matmul_{'' if b is None else f'{b}x'}{m}x{k}x{n}"
    return {"format": "apportion.program/1", "name": name,
            "tensors": {"x": {"shape": [*lead, m, k], "dtype": dtype},
                        "w": {"shape": [*lead, k, n], "dtype": dtype}},
            "inputs": ["x", "w"], "outputs": ["y"],
            "ops": [{"name": "matmul", "op": "matmul", "out": f"y[{idx}m,n]",
                     "ins": [f"x[{idx}m,k]", f"w[{idx}k,n]"]}]}


def read_measurements(path: str | Path, read_program: Callable[[Any], Program]
                      ) -> tuple[Measurement, ...]:
    """The records of a measurements file (UTF-8 JSON); ``read_program`` turns a program format
    v1 document into a Program (``apportion.frontend.json_format.from_dict``)."""
    where = f"measurements file {str(path)!r}"
    try:
        p = Path(path)
        if p.is_dir():
            raise CalibrationError(f"cannot read {where}: it is a directory")
        data = p.read_bytes()
    except OSError as e:
        raise CalibrationError(f"cannot read {where}: {e.strerror or e}") from None
    except ValueError as e:  # an embedded NUL byte in the path
        raise CalibrationError(f"cannot read {where}: {e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CalibrationError(f"{where} is not UTF-8 text (bad byte at offset {e.start})"
                               ) from None
    return loads_measurements(text, read_program, source=where)


def loads_measurements(text: str, read_program: Callable[[Any], Program],
                       source: str = "measurements") -> tuple[Measurement, ...]:
    """The records of a measurements JSON text."""
    try:
        doc = jsondoc.loads(text, CalibrationError, source)
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{source} is not valid JSON: {e.msg} at line {e.lineno} "
                               f"column {e.colno}") from None
    except (ValueError, RecursionError) as e:  # huge integer literals, deep nesting
        raise CalibrationError(f"{source} is not valid JSON: {e}") from None
    return parse_measurements(doc, read_program, source)


def parse_measurements(doc: Any, read_program: Callable[[Any], Program],
                       source: str = "measurements") -> tuple[Measurement, ...]:
    """Measurements from a parsed JSON document: a non-empty list of records."""
    if not isinstance(doc, list):
        raise CalibrationError(f"{source}: expected a JSON list of measurement records, got "
                               f"{describe(doc, typed=True)}")
    if not doc:
        raise CalibrationError(f"{source}: the list of measurement records is empty")
    return tuple(_record(f"{source}: record {i}", rec, read_program)
                 for i, rec in enumerate(doc))


def _record(where: str, rec: Any, read_program: Callable[[Any], Program]) -> Measurement:
    if not isinstance(rec, dict):
        raise CalibrationError(f"{where}: expected an object with fields "
                               f"{', '.join(RECORD_FIELDS)}, got {describe(rec, typed=True)}")
    unknown = [k for k in rec if k not in RECORD_FIELDS]
    if unknown:
        raise CalibrationError(f"{where}: unknown field {unknown[0]!r}; valid: "
                               f"{', '.join(RECORD_FIELDS)}")
    given = [k for k in ("program", "matmul") if k in rec]
    if len(given) != 1:
        why = "both given" if given else "neither given"
        raise CalibrationError(f"{where}: give exactly one of fields 'program' (a program "
                               f"format v1 document) and 'matmul' ({{\"M\", \"K\", \"N\"}}); "
                               f"{why}")
    kind = given[0]
    spec = rec[kind]
    if kind == "matmul":
        _check_matmul(f"{where}: field 'matmul'", spec)
        document = matmul_document(spec)
    else:
        document = spec
    try:
        program = read_program(document)
    except ApportionError as e:
        raise CalibrationError(f"{where}: field {kind!r}: {e}") from None
    if program.tiling:
        raise CalibrationError(f"{where}: field {kind!r}: program {program.name!r} has tiling "
                               "groups; a measurement times one op over its whole iteration "
                               "space")
    op_name = rec.get("op")
    if op_name is None:
        if len(program.ops) != 1:
            raise CalibrationError(f"{where}: field 'op' is missing and program "
                                   f"{program.name!r} has {len(program.ops)} ops; name the "
                                   f"op timed (ops: {', '.join(program.op_map)})")
        op_name = program.ops[0].name
    elif not isinstance(op_name, str) or op_name not in program.op_map:
        shown = repr(op_name) if isinstance(op_name, str) else describe(op_name, typed=True)
        raise CalibrationError(f"{where}: field 'op': {shown} is not an op of "
                               f"program {program.name!r}; ops: {', '.join(program.op_map)}")
    op = program.op(op_name)
    cores = rec.get("cores")
    if not is_int(cores) or cores < 1:
        what = "is missing" if "cores" not in rec else f"must be an int >= 1, got " \
            f"{describe(cores)}"
        raise CalibrationError(f"{where}: field 'cores' {what}")
    splits = rec.get("splits")
    if not isinstance(splits, dict):
        what = "is missing" if "splits" not in rec else \
            f"must be an object of dim: slices, got {describe(splits, typed=True)}"
        raise CalibrationError(f"{where}: field 'splits' {what}")
    for d, n in splits.items():
        if d not in op.sizes:
            raise CalibrationError(f"{where}: field 'splits': {d!r} is not a dim of op "
                                   f"{op.name!r}; dims: {', '.join(op.sizes)}")
        if not is_int(n) or not 1 <= n <= op.sizes[d]:
            raise CalibrationError(f"{where}: field 'splits': dim {d!r} must be split into an "
                                   f"int in 1..{op.sizes[d]} slices, got {describe(n)}")
    full = {d: splits.get(d, 1) for d in op.sizes}
    split = [d for d, n in full.items() if n > 1]
    if split and not op.kind.divisible:  # the planner never divides one: nothing to fit
        raise CalibrationError(f"{where}: field 'splits' {split_text(full)} divides dim "
                               f"{split[0]!r} of op {op.name!r}, a {op.kind.name} fallback, "
                               "which runs whole on one core; give every dim 1 slice")
    if math.prod(full.values()) > cores:
        raise CalibrationError(f"{where}: field 'splits' {split_text(full)} uses "
                               f"{math.prod(full.values())} cores, more than 'cores' {cores}")
    time_us = rec.get("time_us")
    if not is_real(time_us) or not finite(time_us) or time_us <= 0:
        what = "is missing" if "time_us" not in rec else \
            f"must be a finite number > 0, got {describe(time_us)}"
        raise CalibrationError(f"{where}: field 'time_us' {what}")
    best = rec.get("best", False)
    if not isinstance(best, bool):
        raise CalibrationError(f"{where}: field 'best' must be true or false, got "
                               f"{describe(best, typed=True)}")
    noise = rec.get("noise")
    if noise is not None:
        _check_noise(f"{where}: field 'noise'", noise)
    return Measurement(program, op_name, cores, full, float(time_us), best,
                       (kind, MappingProxyType(dict(spec))),
                       None if noise is None else MappingProxyType(dict(noise)))


def _check_noise(where: str, noise: Any) -> None:
    if not isinstance(noise, dict):
        raise CalibrationError(f"{where}: expected an object with {', '.join(NOISE_FIELDS)}, "
                               f"got {describe(noise, typed=True)}")
    unknown = [k for k in noise if k not in NOISE_FIELDS]
    if unknown:
        raise CalibrationError(f"{where}: unknown field {unknown[0]!r}; valid: "
                               f"{', '.join(NOISE_FIELDS)}")
    rounds, spread, load = noise.get("rounds"), noise.get("spread"), noise.get("load")
    if not is_int(rounds) or rounds < 1:
        raise CalibrationError(f"{where}: rounds must be an int >= 1, got {describe(rounds)}")
    if not is_real(spread) or not finite(spread) or spread < 0:
        raise CalibrationError(f"{where}: spread must be a finite number >= 0, got "
                               f"{describe(spread)}")
    if not (isinstance(load, list) and len(load) == 2 and all(
            v is None or (is_real(v) and finite(v) and v >= 0) for v in load)):
        raise CalibrationError(f"{where}: load must be [before, after], each a load average "
                               f">= 0 or null, got {describe(load, typed=True)}")


def _check_matmul(where: str, spec: Any) -> None:
    if not isinstance(spec, dict):
        raise CalibrationError(f"{where}: expected an object with M, K, N (and optional batch, "
                               f"dtype), got {describe(spec, typed=True)}")
    unknown = [k for k in spec if k not in MATMUL_FIELDS]
    if unknown:
        raise CalibrationError(f"{where}: unknown field {unknown[0]!r}; valid: "
                               f"{', '.join(MATMUL_FIELDS)}")
    for k in ("M", "K", "N", "batch"):
        if k not in spec and k != "batch":
            raise CalibrationError(f"{where}: {k} is missing")
        v = spec.get(k, 1)
        if not is_int(v) or v < 1:
            raise CalibrationError(f"{where}: {k} must be an int >= 1, got {describe(v)}")
    if not isinstance(spec.get("dtype", "float16"), str):
        raise CalibrationError(f"{where}: dtype must be a dtype name such as \"float16\", got "
                               f"{describe(spec['dtype'], typed=True)}")


def dumps_measurements(measurements: Sequence[Measurement]) -> str:
    """A measurements file's text: one record per line."""
    lines = [json.dumps(m.to_record()) for m in measurements]
    return "[\n  " + ",\n  ".join(lines) + "\n]\n"


# --- the fit -------------------------------------------------------------------------------------

#: the model's predicted time of a measurement under a target
Predictor = Callable[[Target, Measurement], float]


@dataclass(frozen=True)
class Coefficient:
    """One fitted coefficient: its base value, fitted value and the bounds it was held in.
    ``determined`` is False when no measurement's prediction moves with it at the fitted point:
    the measurements do not pin it down (another term binds wherever it would act). ``tied``
    names the coefficients it moves every prediction in step with (say ``mac_rate`` and
    ``overlap`` when every record is memory-bound): only their combination is fitted, and the
    value of each is the one the fit started from or a bound."""

    name: str
    before: float
    after: float
    low: float
    high: float
    determined: bool = True
    tied: tuple[str, ...] = ()  # coefficients only a combination with which is determined

    @property
    def at_bound(self) -> str | None:
        """``"low"`` or ``"high"`` when the fit stopped at a bound."""
        span = self.high - self.low
        if self.after <= self.low + 1e-6 * span:
            return "low"
        if self.after >= self.high - 1e-6 * span:
            return "high"
        return None


@dataclass(frozen=True)
class RecordFit:
    """One measurement with the fitted model's prediction of it."""

    measurement: Measurement
    predicted_us: float
    before_us: float  # the base target's prediction

    @property
    def measured_us(self) -> float:
        return self.measurement.time_us

    @property
    def rel_error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_us / self.measured_us - 1

    @property
    def log_error(self) -> float:
        return math.log(self.predicted_us / self.measured_us)


@dataclass(frozen=True)
class Calibration:
    """A fit's result: the fitted target, each coefficient, each record, the RMS log error."""

    base: Target
    target: Target
    coefficients: tuple[Coefficient, ...]
    records: tuple[RecordFit, ...]
    rms_log_error: float
    base_rms_log_error: float

    @property
    def values(self) -> dict[str, float]:
        """The fitted value of each coefficient."""
        return {c.name: c.after for c in self.coefficients}

    def coefficient(self, name: str) -> Coefficient:
        return next(c for c in self.coefficients if c.name == name)


def check_fit_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a tuple, each a fittable coefficient named once."""
    if not names:
        raise CalibrationError("nothing to fit: name at least one coefficient")
    for n in names:
        if n == "pt_rows":
            raise CalibrationError("cannot fit 'pt_rows': it is a whole count of rows; set it "
                                   "in a target file instead")
        if n not in FITTABLE:
            raise CalibrationError(f"cannot fit {n!r}: not a cost coefficient; fittable: "
                                   f"{', '.join(FITTABLE)}")
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise CalibrationError(f"coefficient {dup!r} named twice")
    return tuple(names)


def default_fit(target: Target) -> tuple[str, ...]:
    """The coefficients a fit adjusts by default for ``target`` (by its preset name)."""
    return DEFAULT_FIT.get(target.name, DEFAULT_FIT["spyre"])


def default_bounds(base: Target, names: Sequence[str],
                   caps: Mapping[str, float] | None = None,
                   spread: float = SPREAD) -> dict[str, tuple[float, float]]:
    """Bounds of each coefficient: ``[base / spread, base * spread]`` (``overlap`` and
    ``core_scaling``: [0, 1]; a base of 0: ``[0, ZERO_BASE_RANGE]``), within the field's own
    limits, then no higher than ``caps`` (default: the preset's ``PHYSICAL_CAPS``).

    >>> from apportion.target import cpu
    >>> default_bounds(cpu(), ["core_sync_us", "core_scaling"])
    {'core_sync_us': (0.0, 10000.0), 'core_scaling': (0.0, 1.0)}
    """
    caps = PHYSICAL_CAPS.get(base.name, {}) if caps is None else caps
    out: dict[str, tuple[float, float]] = {}
    for n in check_fit_names(names):
        value = float(getattr(base, n))
        if n in UNIT_RANGE:
            low, high = 0.0, 1.0
        elif value == 0 and n in ZERO_BASE_RANGE:
            low, high = 0.0, ZERO_BASE_RANGE[n]
        else:
            if value <= 0:
                raise CalibrationError(f"cannot fit {n!r} from a base value of {value:g}: its "
                                       "bounds are a factor of the base; give bounds")
            low, high = value / spread, value * spread
        low = max(low, _LOWEST[n])
        top = _HIGHEST[n]
        if top is not None:
            high = min(high, top)
        if n in caps:
            high = min(high, float(caps[n]))
            if low >= high:  # a base above the cap: the range ends at the cap
                low = high / spread
        out[n] = (low, high)
    return out


def fit(measurements: Sequence[Measurement], base: Target, predict: Predictor,
        names: Sequence[str] | None = None,
        bounds: Mapping[str, tuple[float, float]] | None = None,
        caps: Mapping[str, float] | None = None) -> Calibration:
    """Fit ``names`` (default: ``default_fit(base)``) of ``base`` to ``measurements``.

    Minimises the sum of squared ``log(predicted / measured)`` over the records, each
    coefficient within ``bounds`` (default: ``default_bounds(base, names, caps)``), starting
    from the base value clipped into its bounds.

    A fit of many coefficients (the cpu preset's ten) is ill-conditioned: the model has kinks
    (compute time against memory time) and coefficients that trade off against each other, so
    the fit stops at a point that moves with the last bits of the arithmetic (a relative change
    of 1e-15 in the residuals moves some predictions by over ten percent), which differ between
    CPUs and BLAS builds; near ties between splits can then rank either way.
    """
    from scipy.optimize import least_squares

    names = check_fit_names(tuple(default_fit(base) if names is None else names))
    if not measurements:
        raise CalibrationError("no measurements to fit")
    given = dict(bounds or {})
    unknown = [n for n in given if n not in names]
    if unknown:
        raise CalibrationError(f"bounds given for {unknown[0]!r}, which is not fitted "
                               f"(fitted: {', '.join(names)})")
    box = default_bounds(base, [n for n in names if n not in given], caps) if \
        len(given) < len(names) else {}
    box |= {n: (float(lo), float(hi)) for n, (lo, hi) in given.items()}
    for n, (lo, hi) in box.items():
        if not (finite(lo) and finite(hi) and lo < hi):
            raise CalibrationError(f"bounds of {n!r} must be finite with low < high, got "
                                   f"[{lo:g}, {hi:g}]")
    # each coefficient in units of its base value (a term the base leaves out: a tenth of the
    # range searched; overlap, whose base may be 0, as it is)
    scale = [float(getattr(base, n)) or (box[n][1] / SPREAD if n in ZERO_BASE_RANGE else 1.0)
             for n in names]
    lo = [box[n][0] / s for n, s in zip(names, scale, strict=True)]
    hi = [box[n][1] / s for n, s in zip(names, scale, strict=True)]
    x0 = [min(max(getattr(base, n) / s, a), b)
          for n, s, a, b in zip(names, scale, lo, hi, strict=True)]
    measured = [m.time_us for m in measurements]

    def target_at(x: Sequence[float]) -> Target:
        return replace(base, **{n: float(v * s) for n, v, s in zip(names, x, scale,
                                                                   strict=True)})

    def predictions(t: Target) -> list[float]:
        return [predict(t, m) for m in measurements]

    def residuals(x: Sequence[float]) -> list[float]:
        try:
            pred = predictions(target_at(x))
        except TargetError as e:  # a bound the caller gave outside the field's own limits
            raise CalibrationError(f"fit left the target's limits: {e}") from None
        return [math.log(p / t) for p, t in zip(pred, measured, strict=True)]

    result = least_squares(residuals, x0, bounds=(lo, hi), method="trf", x_scale=1.0,
                           diff_step=1e-4, xtol=1e-12, ftol=1e-12, gtol=1e-12,
                           max_nfev=200 * (len(names) + 1))
    # trf stays strictly inside the box: a coefficient within a hair of a bound sits on it
    x = [a if v - a <= 1e-6 * (b - a) else b if b - v <= 1e-6 * (b - a) else float(v)
         for v, a, b in zip(result.x, lo, hi, strict=True)]
    fitted = target_at(x)
    pred = predictions(fitted)
    before = predictions(base)
    moves, tied = _identifiable(result.jac, names)
    coefficients = tuple(
        Coefficient(n, float(getattr(base, n)), float(getattr(fitted, n)), box[n][0], box[n][1],
                    determined=moves[n], tied=tied[n])
        for n in names)
    records = tuple(RecordFit(m, p, b) for m, p, b in zip(measurements, pred, before,
                                                          strict=True))
    return Calibration(base, fitted, coefficients, records, _rms([r.log_error for r in records]),
                       _rms([math.log(b / t) for b, t in zip(before, measured, strict=True)]))


def _identifiable(jac: Any, names: Sequence[str]
                  ) -> tuple[dict[str, bool], dict[str, tuple[str, ...]]]:
    """From the Jacobian at the fit: whether each coefficient moves any prediction, and which
    others it is tied to (a direction of the coefficients that moves no prediction)."""
    import numpy as np

    j = np.asarray(jac, dtype=float)
    norms = np.linalg.norm(j, axis=0)
    moves = {n: bool(norms[i] > 1e-9) for i, n in enumerate(names)}
    tied: dict[str, set[str]] = {n: set() for n in names}
    live = [i for i, n in enumerate(names) if moves[n]]
    if len(live) > 1:
        cols = j[:, live] / norms[live]
        _, sv, vt = np.linalg.svd(cols, full_matrices=True)
        sv = np.concatenate([sv, np.zeros(len(live) - len(sv))])
        for s, v in zip(sv, vt, strict=True):
            if s > 1e-6 * sv[0]:
                continue
            group = {names[live[i]] for i, w in enumerate(v) if abs(w) > 0.05}
            for n in group:
                tied[n] |= group - {n}
    return moves, {n: tuple(m for m in names if m in tied[n]) for n in names}


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


# --- leave one shape out ------------------------------------------------------------------------

@dataclass(frozen=True)
class HeldOut:
    """One shape left out of the fit: the calibration of every other shape's records, and this
    shape's records as that calibration predicts them (none of them was fitted)."""

    key: tuple[str, int]  # (shape, cores): Measurement.key
    calibration: Calibration
    records: tuple[RecordFit, ...]

    @property
    def worst_error(self) -> float:
        """The held-out record furthest off: predicted / measured - 1."""
        return max((r.rel_error for r in self.records), key=abs)


def by_shape(measurements: Sequence[Measurement]) -> dict[tuple[str, int], list[Measurement]]:
    """The records of each shape (``Measurement.key``), in first-seen order."""
    out: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        out.setdefault(m.key, []).append(m)
    return out


def leave_one_out(measurements: Sequence[Measurement], base: Target, predict: Predictor,
                  names: Sequence[str] | None = None,
                  bounds: Mapping[str, tuple[float, float]] | None = None,
                  caps: Mapping[str, float] | None = None,
                  progress: Callable[[tuple[str, int]], None] | None = None
                  ) -> tuple[HeldOut, ...]:
    """For each shape: ``fit`` every other shape's records (all records of the shape are left
    out, not one record), then predict the shape's records with that fit, an honest estimate
    of the model on a shape it has not seen. ``progress`` is called with each shape's key
    before its fit. Example: ``leave_one_out(read_measurements(path, from_dict), spyre(),
    predict)`` gives one ``HeldOut`` per shape of the file, in the file's order.
    """
    groups = by_shape(measurements)
    if len(groups) < 2:
        raise CalibrationError(f"leave-one-out needs records of at least 2 shapes, got "
                               f"{len(groups)}")
    out = []
    for key, held in groups.items():
        if progress is not None:
            progress(key)
        rest = [m for k, g in groups.items() if k != key for m in g]
        cal = fit(rest, base, predict, names, bounds, caps)
        records = tuple(RecordFit(m, predict(cal.target, m), predict(base, m)) for m in held)
        out.append(HeldOut(key, cal, records))
    return tuple(out)


# --- the fitted target as a TOML file ------------------------------------------------------------

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return json.dumps(str(value))


def target_toml(calibration: Calibration, preset: str | None,
                comment: Sequence[str] = ()) -> str:
    """The fitted target as TOML: ``preset = "..."`` plus the fitted fields, or, with no
    ``preset``, every field of the target (it then loads without one)."""
    lines = [f"# {c}" for c in comment]
    t = calibration.target
    if preset is not None:
        lines.append(f"preset = {json.dumps(preset)}")
        lines += [f"{c.name} = {_toml_value(getattr(t, c.name))}"
                  for c in calibration.coefficients]
    else:
        if t.cost_terms:  # objects of Python code: a TOML file cannot hold them
            raise CalibrationError(f"target {t.name!r} has cost terms ("
                                   f"{', '.join(c.name for c in t.cost_terms)}), which a "
                                   "target file cannot hold: write it with a preset")
        lines += [f"{f.name} = {_toml_value(getattr(t, f.name))}" for f in fields(Target)
                  if f.name not in ("split_k_table", "cost_terms")]
        for row in t.split_k_table:  # an array of tables, after every plain field
            lines.append("[[split_k_table]]")
            lines.append(f"slices = {row.slices}")
            # TOML has no null: an open bound is written as 1 or 2**62, which bound nothing
            lines += [f"{name} = [{lo or 1}, {hi or 2**62}]"
                      for name in ("k", "m", "n", "batch")
                      for lo, hi in [getattr(row, name)] if (lo, hi) != (None, None)]
    return "\n".join(lines) + "\n"
