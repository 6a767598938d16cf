"""The hardware model a plan is made for."""

from __future__ import annotations

from dataclasses import dataclass, replace

from apportion.errors import TargetError
from apportion.ir.dtypes import DTYPE_BYTES, dtype_bytes

LAYOUTS = ("stick", "row_major")


@dataclass(frozen=True)
class Target:
    """Cores, memory limits, stick size and cost figures of one accelerator.

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
    peak_flops_per_core: float  # FLOP/s
    core_bandwidth: float  # bytes/s one core streams to or from device memory
    mem_bandwidth: float  # bytes/s of device memory in all
    combine_latency_us: float  # fixed cost of one cross-core combine of partial sums
    layout: str = "stick"
    alignment: int = 128  # scratchpad offsets are multiples of this

    def __post_init__(self) -> None:
        if self.max_cores < 1:
            raise TargetError(f"target {self.name!r}: max_cores must be >= 1, got {self.max_cores}")
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or not (
                1 <= self.cores <= self.max_cores):
            raise TargetError(f"target {self.name!r}: cores must be in 1..{self.max_cores}, "
                              f"got {self.cores!r}")
        for f in ("span_limit", "stick_bytes", "scratchpad_bytes", "alignment"):
            if getattr(self, f) <= 0:
                raise TargetError(f"target {self.name!r}: {f} must be positive, "
                                  f"got {getattr(self, f)}")
        for f in ("peak_flops_per_core", "core_bandwidth", "mem_bandwidth"):
            if getattr(self, f) <= 0:
                raise TargetError(f"target {self.name!r}: {f} must be positive")
        if self.combine_latency_us < 0:
            raise TargetError(f"target {self.name!r}: combine_latency_us must be >= 0")
        if not 0 <= self.scratchpad_reserve < 1:
            raise TargetError(f"target {self.name!r}: scratchpad_reserve must be in [0, 1), "
                              f"got {self.scratchpad_reserve}")
        if self.layout not in LAYOUTS:
            raise TargetError(f"target {self.name!r}: layout {self.layout!r}; valid: "
                              f"{', '.join(LAYOUTS)}")
        for dt, b in DTYPE_BYTES.items():
            if self.stick_bytes % b:
                raise TargetError(f"target {self.name!r}: stick_bytes {self.stick_bytes} is not a "
                                  f"multiple of {dt} ({b} bytes)")

    def elems_per_stick(self, dtype: str) -> int:
        """Elements of ``dtype`` in one stick."""
        return self.stick_bytes // dtype_bytes(dtype)

    @property
    def scratchpad_capacity(self) -> int:
        """Bytes of scratchpad a plan may use: the scratchpad less its reserve."""
        return int(self.scratchpad_bytes * (1 - self.scratchpad_reserve))

    def with_cores(self, cores: int) -> Target:
        """The same target with another core count (checked against ``max_cores``)."""
        return replace(self, cores=cores)

    def summary(self) -> dict[str, object]:
        return {"name": self.name, "cores": self.cores}
