"""The host's split-K table: the factors of K the stock ``cpu`` target splits matmuls into, from
measurements of the machine it runs on.

A split of K pays where it does on the CPU that runs it (its caches, cores and IREE's code for
it), so the ``cpu`` preset reads its ``split_k_table`` from timings taken here: per measured
matmul shape, the seconds each factor of K took (``ShapeTimes``). The table is measured once per
host and kept in a cache folder (default ``~/.cache/apportion/splitk``, beside IREE's compiled
modules), one JSON file per host, keyed as IREE's module cache is: the sha256 of the machine,
its CPU model and feature flags (``host_cpu``), here with the core count (the split competes
with IREE's own threads), IREE's version and a digest of the IR the stock target emits for the
measured shapes (both set the times). A missing or unreadable file means measure again.

This layer only reads and writes tables: the measuring needs the planner and IREE, which live
above it, so ``apportion.targets`` registers the measurer (``set_measurer``); tests inject their
own and a cache folder (``injected``). ``APPORTION_CPU_SPLIT_K=shipped``
(``settings.cpu_split_k``) takes the shipped table instead (``presets.CPU_SPLIT_K``, measured on
the CI's machine): what the test suite runs with, so that no test measures by accident.

The decision, per measured shape (``chosen_factor``): factors within ``TOLERANCE`` of the
fastest are ties the measurement cannot tell apart, and the smallest of them is taken (fewer
partials to combine, and no split at all whenever no split is among the fastest: a split slower
than none is never chosen). Each measured shape makes one table row (``table_rows``) holding the
shapes within ``REACH`` times its M, N and K; a shape no row holds is left to the cost model.

>>> times = ShapeTimes(1, 4096, 4096, ((1, 9.0e-3), (2, 8.0e-3), (4, 3.1e-3), (8, 3.0e-3)))
>>> chosen_factor(dict(times.seconds))   # 4 is within 5% of 8's time: the smaller split
4
>>> table_rows([times])[0]
TableRow(slices=4, k=(2048, 8192), m=(1, 2), n=(2048, 8192), batch=(None, None), cores=None)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.errors import TargetError
from apportion.settings import cpu_split_k
from apportion.target.split_k import TableRow

log = logging.getLogger(__name__)

FORMAT = "apportion.host-splitk/1"
#: factors within this fraction of the fastest factor's time count as ties
TOLERANCE = 0.05
#: a measured shape's row holds shapes within this factor of its M, N and K
REACH = 2
#: a row's least N: a plain reduction's N is 1, and the table is for matmuls
LEAST_N = 8


def host_cpu() -> str:
    """What ``--iree-llvmcpu-target-cpu=host`` compiles for: the machine, and on Linux the CPU
    model and feature flags of the first processor (the same description keys IREE's module
    cache, ``backends.iree.runtime.cache_key``)."""
    parts = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    parts.append(line.strip())
                if line.strip() == "":
                    break  # the first processor is enough
    except OSError:
        pass
    return "\n".join(parts)


def iree_version() -> str:
    """The installed IREE compiler's version ("unknown" without its package metadata)."""
    try:
        from importlib.metadata import version

        return version("iree-base-compiler")
    except Exception:  # noqa: BLE001 - no metadata: the key then ignores the version
        return "unknown"


@dataclass(frozen=True)
class HostKey:
    """What a host's table depends on: the CPU (``host_cpu``), its cores, IREE's version and
    ``code``, a digest of the IR the stock target emits for the measured shapes (the measurer's
    fingerprint: a planner or emitter that emits other code makes other times)."""

    cpu: str
    cores: int
    iree: str
    code: str = ""

    @property
    def digest(self) -> str:
        """The sha256 naming the host's cache file.

        >>> len(HostKey("x86_64", 2, "3.13.0").digest)
        64
        """
        h = hashlib.sha256()
        for part in (FORMAT, self.cpu, str(self.cores), self.iree, self.code):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    @property
    def model(self) -> str:
        """The CPU's model name (its first ``model name`` line), else the machine."""
        for line in self.cpu.splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
        return self.cpu.splitlines()[0] if self.cpu else "unknown"


def host_key() -> HostKey:
    """This machine's key (the code digest from the registered fingerprint, once a process)."""
    fingerprint = _config.fingerprint
    if fingerprint is None:
        code = ""
    else:
        if fingerprint not in _codes:
            _codes[fingerprint] = fingerprint()
        code = _codes[fingerprint]
    return HostKey(host_cpu(), os.cpu_count() or 1, iree_version(), code)


@dataclass(frozen=True)
class ShapeTimes:
    """One matmul shape ``y[m,n] = x[m,k] @ w[k,n]`` timed with K split each way: (factor,
    seconds) pairs, the seconds the least of the timed calls."""

    m: int
    n: int
    k: int
    seconds: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise TargetError(f"split-K measurement: {name} must be an int >= 1, got {v!r}")
        if not self.seconds or not any(f == 1 for f, _ in self.seconds):
            raise TargetError(f"split-K measurement of {self.m}x{self.n}x{self.k}: the factors "
                              "timed must include 1 (no split)")
        for f, s in self.seconds:
            if isinstance(f, bool) or not isinstance(f, int) or f < 1 or not (
                    isinstance(s, int | float) and s > 0):
                raise TargetError(f"split-K measurement of {self.m}x{self.n}x{self.k}: factor "
                                  f"{f!r} took {s!r}; factors are ints >= 1, times seconds > 0")

    @property
    def factor(self) -> int:
        """The factor chosen for this shape (``chosen_factor``)."""
        return chosen_factor(dict(self.seconds))


def chosen_factor(seconds: Mapping[int, float], tolerance: float = TOLERANCE) -> int:
    """The smallest factor whose time is within ``tolerance`` of the fastest (a split slower
    than none is never chosen: no split is then within it).

    >>> chosen_factor({1: 1.0, 2: 0.97, 4: 0.5})
    4
    >>> chosen_factor({1: 1.0, 2: 0.97, 4: 1.2})
    1
    """
    fastest = min(seconds.values())
    return min(f for f, s in seconds.items() if s <= fastest * (1 + tolerance))


def _around(v: int, reach: int, least: int = 1) -> tuple[int, int]:
    return max(least, -(-v // reach)), v * reach


def table_rows(shapes: Sequence[ShapeTimes], reach: int = REACH, cores: int | None = None
               ) -> tuple[TableRow, ...]:
    """One row per measured shape, in order, holding the shapes within ``reach`` times its M,
    N and K (N at least ``LEAST_N``): the factor chosen for it (``chosen_factor``), measured on
    ``cores`` cores (a target of as many takes it as measured, more slices than cores too)."""
    return tuple(TableRow(s.factor, k=_around(s.k, reach), m=_around(s.m, reach),
                          n=_around(s.n, reach, LEAST_N), cores=cores) for s in shapes)


@dataclass(frozen=True)
class HostTable:
    """A host's measurements and the split table they make."""

    key: HostKey
    shapes: tuple[ShapeTimes, ...]

    @property
    def rows(self) -> tuple[TableRow, ...]:
        return table_rows(self.shapes, cores=self.key.cores)

    def to_doc(self) -> dict[str, Any]:
        return {"format": FORMAT,
                "host": {"cpu": self.key.cpu, "cores": self.key.cores, "iree": self.key.iree,
                         "code": self.key.code},
                "shapes": [{"m": s.m, "n": s.n, "k": s.k,
                            "seconds": {str(f): t for f, t in s.seconds}}
                           for s in self.shapes]}

    @staticmethod
    def from_doc(doc: Any) -> HostTable:
        """The table of a document ``to_doc`` wrote; TargetError naming what is wrong."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise TargetError(f"not a host split-K table (format {FORMAT!r})")
        try:
            host = doc["host"]
            key = HostKey(str(host["cpu"]), int(host["cores"]), str(host["iree"]),
                          str(host.get("code", "")))
            shapes = tuple(ShapeTimes(s["m"], s["n"], s["k"],
                                      tuple((int(f), float(t)) for f, t in s["seconds"].items()))
                           for s in doc["shapes"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TargetError(f"host split-K table: bad field ({type(e).__name__}: {e})"
                              ) from None
        return HostTable(key, shapes)


def default_cache_dir() -> Path:
    """``~/.cache/apportion/splitk``: one table per host, beside IREE's compiled modules."""
    return Path.home() / ".cache" / "apportion" / "splitk"


def cache_path(key: HostKey, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where ``key``'s table is kept: ``<cache_dir>/<digest>.json``."""
    folder = Path(cache_dir) if cache_dir is not None else _config.cache_dir or \
        default_cache_dir()
    return folder / f"{key.digest}.json"


def read_table(path: Path, key: HostKey | None = None) -> HostTable | None:
    """The table at ``path``, or None where there is none, it does not parse or it is for
    another host than ``key`` (then it is measured again)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("host split-K table %s is not readable (%s): measuring again", path, e)
        return None
    try:
        table = HostTable.from_doc(json.loads(text))
    except (json.JSONDecodeError, TargetError) as e:
        log.warning("host split-K table %s is not valid (%s): measuring again", path, e)
        return None
    if key is not None and table.key != key:
        log.warning("host split-K table %s is for another host: measuring again", path)
        return None
    return table


def write_table(path: Path, table: HostTable) -> None:
    """Write ``table`` to ``path`` atomically (a temporary file renamed over the name); an
    unwritable folder only costs a measurement next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(table.to_doc(), f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("host split-K table cache %s is not writable: %s", path.parent, e)


#: measures this host: its key in, the timed shapes out
Measure = Callable[[HostKey], Sequence[ShapeTimes]]
#: a digest of the code the measurer times (``HostKey.code``)
Fingerprint = Callable[[], str]


@dataclass
class _Config:
    """What the layers above inject: the measurer, its fingerprint and the cache folder (None:
    the default)."""

    measure: Measure | None = None
    cache_dir: Path | None = None
    fingerprint: Fingerprint | None = None


_config = _Config()
#: tables read or measured in this process, by their file
_memo: dict[Path, HostTable] = {}
#: the files whose table this process measured (``measure_again`` does not measure them twice)
_measured: set[Path] = set()
#: each fingerprint's digest, computed once a process
_codes: dict[Fingerprint, str] = {}


def set_measurer(measure: Measure | None, fingerprint: Fingerprint | None = None
                 ) -> Measure | None:
    """Make ``measure`` the one a missing table calls, and ``fingerprint`` the digest of the
    code it times; returns the measurer it replaces."""
    previous, _config.measure = _config.measure, measure
    _config.fingerprint = fingerprint
    return previous


@contextlib.contextmanager
def injected(measure: Measure | None = None, cache_dir: str | os.PathLike[str] | None = None,
             fingerprint: Fingerprint | None = None) -> Iterator[None]:
    """Within the block, a missing table calls ``measure`` (None: measuring refused), the key's
    code digest is ``fingerprint``'s (None: none) and the tables live in ``cache_dir``; all as
    before after it.

    >>> import tempfile
    >>> fake = lambda key: [ShapeTimes(1, 64, 4096, ((1, 2.0), (4, 1.0)))]
    >>> with tempfile.TemporaryDirectory() as d, injected(fake, d):
    ...     host_table(environ={}).rows[0].slices
    4
    """
    saved = (_config.measure, _config.cache_dir, _config.fingerprint)
    _config.measure, _config.fingerprint = measure, fingerprint
    _config.cache_dir = Path(cache_dir) if cache_dir is not None else None
    try:
        yield
    finally:
        _config.measure, _config.cache_dir, _config.fingerprint = saved


def host_table(environ: Mapping[str, str] | None = None, measure_again: bool = False
               ) -> HostTable | None:
    """This host's table: read from the cache, else measured (and cached) by the registered
    measurer; None where ``APPORTION_CPU_SPLIT_K=shipped`` asks for the shipped table.
    ``measure_again`` measures even where a table is cached (``calibrate --measure``), unless
    this process measured it already."""
    if cpu_split_k(environ) == "shipped":
        return None
    key = host_key()
    path = cache_path(key)
    if not measure_again or path in _measured:
        if path in _memo:
            return _memo[path]
        found = read_table(path, key)
        if found is not None:
            _memo[path] = found
            return found
    if _config.measure is None:
        raise TargetError("target 'cpu': this host's split-K table is not measured and no "
                          "measurer is loaded (import apportion, or set "
                          "APPORTION_CPU_SPLIT_K=shipped for the shipped table)")
    with _locked(path):
        # another process may have measured it while this one waited for the lock
        found = None if measure_again else read_table(path, key)
        table = found or HostTable(key, tuple(_config.measure(key)))
        if found is None:
            write_table(path, table)
            _measured.add(path)
    _memo[path] = table
    return table


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock`` (where the platform has ``fcntl`` and the folder is writable), so
    that processes started together measure a host once, not each on the others' cores."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_suffix(".lock"), "w")  # noqa: SIM115 - held across the yield
    except (ImportError, OSError):
        handle = None
    if handle is None:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
