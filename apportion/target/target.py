"""The hardware model a plan is made for."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

from apportion.errors import TargetError
from apportion.ir.dtypes import DTYPE_BYTES, dtype_bytes
from apportion.target.split_k import ByCost, TableRow, TargetResolver, parse_split_k
from apportion.target.terms import CostTerm

LAYOUTS = ("stick", "row_major")
#: how a forall's worker grid maps onto the device (``Target.forall_mapping``): ``cores`` (its
#: threads are the cores, no mapping attribute) or ``gpu_blocks`` (each worker a GPU block)
FORALL_MAPPINGS = ("cores", "gpu_blocks")

# Whole-number fields: counts and byte sizes, all > 0.
INT_FIELDS = ("max_cores", "cores", "span_limit", "stick_bytes", "scratchpad_bytes", "alignment",
              "max_loop_count", "pt_rows")
# Real-valued figures: (field, lowest allowed, whether the lowest is allowed, upper bound or None);
# the upper bound is excluded but for the fields in HIGH_INCLUSIVE.
FLOAT_FIELDS: tuple[tuple[str, float, bool, float | None], ...] = (
    ("scratchpad_reserve", 0.0, True, 1.0),
    ("mac_rate", 0.0, False, None),
    ("sfp_rate", 0.0, False, None),
    ("reduce_rate", 0.0, False, None),
    ("pt_full_passes", 0.0, False, None),
    ("pt_exponent", 0.0, True, None),
    ("core_bandwidth", 0.0, False, None),
    ("mem_bandwidth", 0.0, False, None),
    ("broadcast_cohort", 1.0, True, None),
    ("broadcast_exponent", 0.0, True, None),
    ("overlap", 0.0, True, 1.0),
    ("ring_us_per_element", 0.0, True, None),
    ("batch_split_factor", 1.0, True, None),
    ("batch_drain_us_per_byte", 0.0, True, None),
    ("core_sync_us", 0.0, True, None),
    ("core_scaling", 0.0, True, 1.0),
    ("stick_split_us_per_byte", 0.0, True, None),
)
#: fields whose upper bound is allowed: overlap 1 is no overlap at all (the cpu preset's)
HIGH_INCLUSIVE = frozenset({"overlap", "core_scaling"})
#: the cost model's coefficients (``apportion/cost/model.py`` names the term each one sets)
COST_FIELDS = tuple(f for f, *_ in FLOAT_FIELDS if f != "scratchpad_reserve") + ("pt_rows",)


def is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass, but True cores or a True span limit is always a mistake
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite(value: int | float) -> bool:
    # math.isfinite raises on ints too big for a float; those would overflow the cost model
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def describe(value: object, typed: bool = False) -> str:
    """``value`` for a one-line error message: its repr, cut short, then its type unless it is a
    number (a number's fault is its value) or ``typed`` asks for it anyway."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return text if is_real(value) and not typed else f"{text} ({type(value).__name__})"


@dataclass(frozen=True)
class Target:
    """Cores, memory limits, stick size and cost figures of one accelerator.

    Every field is checked on construction; a bad one raises ``TargetError`` naming it.
    ``max_loop_count`` is the hardware's limit on the trip count of one counted loop (Spyre's
    loop counters are 16-bit, so 65535).

    >>> from apportion.target import spyre
    >>> t = spyre(cores=8)
    >>> t.cores, t.elems_per_stick("float16"), t.scratchpad_capacity
    (8, 64, 1677721)
    """

    name: str
    cores: int
    max_cores: int
    span_limit: int  # bytes one core may address contiguously
    stick_bytes: int
    scratchpad_bytes: int
    scratchpad_reserve: float  # fraction of the scratchpad kept back
    # cost model coefficients (see apportion/cost/model.py for the term each one sets)
    mac_rate: float  # matrix unit: MACs per microsecond per core
    sfp_rate: float  # elementwise unit: elements per microsecond per core
    reduce_rate: float  # reductions: elements per microsecond per core
    core_bandwidth: float  # bytes/s one core's port moves to or from device memory
    mem_bandwidth: float  # bytes/s of device memory in all
    pt_rows: int = 1  # rows the matrix unit streams per pass
    pt_full_passes: float = 1.0  # passes per core that hide the matrix unit's start-up
    pt_exponent: float = 0.0  # how fast its efficiency falls below that (0: it does not)
    broadcast_cohort: float = 1e9  # cores one broadcast reaches before contention
    broadcast_exponent: float = 0.0  # contention growth beyond that cohort
    overlap: float = 0.0  # share of the shorter of compute and memory not hidden
    ring_us_per_element: float = 0.0  # partial-sum hop per output element per extra slice
    batch_split_factor: float = 1.0  # slowdown per doubling of a matmul batch split
    batch_drain_us_per_byte: float = 0.0  # a batch element's output slice written back, unhidden
    core_sync_us: float = 0.0  # start and join of each core beyond the first
    core_scaling: float = 1.0  # compute each core beyond the first adds, in cores (1: all)
    stick_split_us_per_byte: float = 0.0  # gather cost per byte per halving of a stick dim
    split_padded_reduction: bool = True  # may a reduction dim with a padded last stick split?
    # the split-K resolver (target/split_k.py); its name (cost, gpu, table, none) is taken too
    split_k: TargetResolver = ByCost()
    split_k_table: tuple[TableRow, ...] = ()  # the rows of the ``table`` resolver
    layout: str = "stick"
    alignment: int = 128  # scratchpad offsets are multiples of this
    max_loop_count: int = 65535  # most iterations one counted loop may run
    # capabilities: what the device can do, read where it matters (never its name)
    forall_mapping: str = "cores"  # a forall's workers: the cores or GPU blocks (FORALL_MAPPINGS)
    # the machine apportion runs on (the cpu preset): its plans can be timed here, and its
    # max_cores is this machine's count, not a limit of the device
    host: bool = False
    # further cost terms, beyond the model's own (target/terms.py): a new device's extension
    cost_terms: tuple[CostTerm, ...] = ()

    def __post_init__(self) -> None:
        where = f"target {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise TargetError(f"{where}: name must be a non-empty str, got {describe(self.name)}")
        for f in INT_FIELDS:
            v = getattr(self, f)
            if not is_int(v):
                raise TargetError(f"{where}: {f} must be an int, got {describe(v)}")
            if v < 1 and f != "cores":
                raise TargetError(f"{where}: {f} must be an int >= 1, got {v}")
        if not 1 <= self.cores <= self.max_cores:
            raise TargetError(f"{where}: cores must be in 1..{self.max_cores}, got {self.cores}")
        for f, low, low_ok, high in FLOAT_FIELDS:
            v = getattr(self, f)
            shut = f in HIGH_INCLUSIVE
            rng = (f">= {low:g}" if low_ok else f"> {low:g}") if high is None \
                else f"in [{low:g}, {high:g}{']' if shut else ')'}"
            if not is_real(v) or not finite(v) or v < low or (v == low and not low_ok) \
                    or (high is not None and (v > high if shut else v >= high)):
                raise TargetError(f"{where}: {f} must be a finite number {rng}, got {describe(v)}")
        for flag in ("split_padded_reduction", "host"):
            if not isinstance(getattr(self, flag), bool):
                raise TargetError(f"{where}: {flag} must be true or false, got "
                                  f"{describe(getattr(self, flag))}")
        object.__setattr__(self, "split_k", parse_split_k(self.split_k, where))
        if not isinstance(self.split_k_table, tuple) or not all(
                isinstance(r, TableRow) for r in self.split_k_table):
            raise TargetError(f"{where}: split_k_table must be a tuple of rows, got "
                              f"{describe(self.split_k_table)}")
        if self.split_k.needs_table and not self.split_k_table:
            raise TargetError(f"{where}: split_k = \"{self.split_k}\" needs split_k_table rows")
        if not isinstance(self.layout, str) or self.layout not in LAYOUTS:
            raise TargetError(f"{where}: layout must be one of {', '.join(LAYOUTS)}, "
                              f"got {describe(self.layout)}")
        if not isinstance(self.forall_mapping, str) or self.forall_mapping not in FORALL_MAPPINGS:
            raise TargetError(f"{where}: forall_mapping must be one of "
                              f"{', '.join(FORALL_MAPPINGS)}, got {describe(self.forall_mapping)}")
        if not isinstance(self.cost_terms, tuple) or not all(
                isinstance(t, CostTerm) for t in self.cost_terms):
            raise TargetError(f"{where}: cost_terms must be a tuple of CostTerm objects (a "
                              f"target made in Python), got {describe(self.cost_terms)}")
        for dt, b in DTYPE_BYTES.items():
            if self.stick_bytes % b:
                raise TargetError(f"{where}: stick_bytes {self.stick_bytes} is not a "
                                  f"multiple of {dt} ({b} bytes)")

    def elems_per_stick(self, dtype: str) -> int:
        """Elements of ``dtype`` in one stick."""
        return self.stick_bytes // dtype_bytes(dtype)

    @property
    def scratchpad_capacity(self) -> int:
        """Bytes of scratchpad a plan may use: the scratchpad less its reserve."""
        return int(self.scratchpad_bytes * (1 - self.scratchpad_reserve))
