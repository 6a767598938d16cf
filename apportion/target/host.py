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

The cache is trusted only as far as it could have been measured: a table whose shape names a
factor measuring never tries (``factors_of``: ``FACTORS`` cutting K into slices of at least
``LEAST_SLICE``), or a time that is not a positive number, is reported and measured again; a
cache path that is not a regular file (a FIFO, a device, a folder) is refused naming it, never
opened in a way that blocks. A measurement comes with its trust (``HostMeasurement``: the
measurer times in rounds until each shape's choice is stable, ``cost/noise.py``, and records
the load average before and after); one that could not be trusted (a choice still changing, or
a load over the machine's cores) is never cached: this run plans with the shipped table, says
so in one line on stderr, and the next one measures again. Processes started together measure
once: the first holds ``<digest>.lock`` (and writes its pid there), the others say in one line
that they wait for it, then read what it cached.

This layer only reads and writes tables: the measuring needs the planner and IREE, which live
above it, so ``import apportion`` registers the measurer (``set_measurer``: the one of
``workflows/host_splitk.py``); tests inject their own and a cache folder (``injected``).
``APPORTION_CPU_SPLIT_K=shipped`` (``settings.cpu_split_k``) takes the shipped table instead
(``presets.CPU_SPLIT_K``, measured on the CI's machine): what the test suite runs with, so that
no test measures by accident.

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
import errno
import hashlib
import json
import logging
import math
import os
import platform
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.errors import TargetError
from apportion.settings import cpu_split_k
from apportion.target.split_k import TableRow

log = logging.getLogger(__name__)

FORMAT = "apportion.host-splitk/2"
#: factors within this fraction of the fastest factor's time count as ties
TOLERANCE = 0.05
#: a measured choice is trusted where its time is within this fraction of the fastest factor's
#: in the measurement's whole interval (``bench splitk``'s goal: fastest / pick at least 0.9)
REGRET = 0.10
#: the factors of K measured
FACTORS = (1, 2, 4, 8, 16, 32, 64)
#: a factor is measured where each slice holds at least this much of K
LEAST_SLICE = 16
#: a measured shape's row holds shapes within this factor of its M, N and K
REACH = 2
#: a row's least N: a plain reduction's N is 1, and the table is for matmuls
LEAST_N = 8


def factors_of(k: int, factors: Sequence[int] = FACTORS) -> list[int]:
    """The factors measured for a K: 1, and those cutting it into whole slices of at least
    ``LEAST_SLICE``; a cached table naming another is not trusted.

    >>> factors_of(1024)
    [1, 2, 4, 8, 16, 32, 64]
    >>> factors_of(96)
    [1, 2, 4]
    """
    return [f for f in factors if f == 1 or (k % f == 0 and k // f >= LEAST_SLICE)]


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
    seconds) pairs, the seconds the least of the timed calls; ``rounds`` timed (0: not
    recorded) and ``spread``, the width of the chosen factor's least time's interval over the
    resampled rounds, relative to it (``cost/noise.py``)."""

    m: int
    n: int
    k: int
    seconds: tuple[tuple[int, float], ...]
    rounds: int = 0
    spread: float = 0.0

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
                    isinstance(s, int | float) and not isinstance(s, bool) and
                    math.isfinite(s) and s > 0):
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
    """A host's measurements and the split table they make, with the 1-minute load average
    before and after measuring (None: not recorded)."""

    key: HostKey
    shapes: tuple[ShapeTimes, ...]
    load: tuple[float | None, float | None] = (None, None)

    @property
    def rows(self) -> tuple[TableRow, ...]:
        return table_rows(self.shapes, cores=self.key.cores)

    def to_doc(self) -> dict[str, Any]:
        return {"format": FORMAT,
                "host": {"cpu": self.key.cpu, "cores": self.key.cores, "iree": self.key.iree,
                         "code": self.key.code},
                "load": {"before": self.load[0], "after": self.load[1]},
                "shapes": [{"m": s.m, "n": s.n, "k": s.k,
                            "seconds": {str(f): t for f, t in s.seconds},
                            "rounds": s.rounds, "spread": s.spread}
                           for s in self.shapes]}

    @staticmethod
    def from_doc(doc: Any) -> HostTable:
        """The table of a document ``to_doc`` wrote; TargetError naming what is wrong, a
        factor measuring never tries for its shape included (``factors_of``).

        >>> doc = HostTable(HostKey("cpu", 2, "3.13.0"), (ShapeTimes(32, 32, 40960,
        ...     ((1, 1.0), (40960, 0.5))),)).to_doc()
        >>> try:
        ...     HostTable.from_doc(doc)
        ... except TargetError as e:
        ...     print(e)  # doctest: +NORMALIZE_WHITESPACE
        host split-K table: shape 32x32x40960 names factor 40960, which measuring never
        tries (it tries 1, 2, 4, 8, 16, 32, 64)
        """
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise TargetError(f"not a host split-K table (format {FORMAT!r})")
        try:
            host = doc["host"]
            key = HostKey(str(host["cpu"]), int(host["cores"]), str(host["iree"]),
                          str(host.get("code", "")))
            load = doc.get("load") or {}
            shapes = tuple(ShapeTimes(s["m"], s["n"], s["k"],
                                      tuple((int(f), float(t)) for f, t in s["seconds"].items()),
                                      int(s.get("rounds", 0)), float(s.get("spread", 0.0)))
                           for s in doc["shapes"])
            before, after = (None if load.get(w) is None else float(load[w])
                             for w in ("before", "after"))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TargetError(f"host split-K table: bad field ({type(e).__name__}: {e})"
                              ) from None
        for s in shapes:
            allowed = factors_of(s.k)
            for f, _ in s.seconds:
                if f not in allowed:
                    raise TargetError(
                        f"host split-K table: shape {s.m}x{s.n}x{s.k} names factor {f}, which "
                        f"measuring never tries (it tries {', '.join(map(str, allowed))})")
        return HostTable(key, shapes, (before, after))


@dataclass(frozen=True)
class HostMeasurement:
    """What a measurer returns: the timed shapes, whether they can be trusted (each shape's
    choice stable, the load under the machine's cores) and why not, and the load average
    before and after. An untrusted measurement is never cached."""

    shapes: tuple[ShapeTimes, ...]
    trusted: bool = True
    why: str = ""
    load: tuple[float | None, float | None] = (None, None)


def default_cache_dir() -> Path:
    """``~/.cache/apportion/splitk``: one table per host, beside IREE's compiled modules."""
    return Path.home() / ".cache" / "apportion" / "splitk"


def cache_path(key: HostKey, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where ``key``'s table is kept: ``<cache_dir>/<digest>.json``."""
    folder = Path(cache_dir) if cache_dir is not None else _config.cache_dir or \
        default_cache_dir()
    return folder / f"{key.digest}.json"


def _open_regular(path: Path, flags: int) -> int:
    """A descriptor of ``path`` opened without blocking (a FIFO or a device in the cache's
    place would hang a plain open), once it is known to be a regular file; TargetError naming
    the path where it is not. FileNotFoundError where there is nothing."""
    fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else
                    "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
                    "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
            raise TargetError(f"host split-K table cache {str(path)!r} is {kind}, not a regular "
                              "file: remove it (or set APPORTION_CPU_SPLIT_K=shipped)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_table(path: Path, key: HostKey | None = None, quiet: bool = False
               ) -> HostTable | None:
    """The table at ``path``, or None where there is none, it does not parse, it names a
    factor measuring never tries or it is for another host than ``key`` (then it is measured
    again, which a warning says unless ``quiet``: a second look at a file already reported);
    TargetError naming the path where it is not a regular file."""
    warn = (lambda *a: None) if quiet else log.warning
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO or socket no one holds open (as os.open says)
            raise TargetError(f"host split-K table cache {str(path)!r} is not a regular "
                              "file: remove it (or set APPORTION_CPU_SPLIT_K=shipped)") from None
        warn("host split-K table %s is not readable (%s): measuring again", path, e)
        return None
    try:
        with os.fdopen(fd, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as e:
        warn("host split-K table %s is not readable (%s): measuring again", path, e)
        return None
    try:
        table = HostTable.from_doc(json.loads(text))
    except (json.JSONDecodeError, TargetError) as e:
        warn("host split-K table %s is not valid (%s): measuring again", path, e)
        return None
    if key is not None and table.key != key:
        warn("host split-K table %s is for another host: measuring again", path)
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


#: measures this host: its key in, the timed shapes out (a plain sequence: trusted as given)
Measure = Callable[[HostKey], "Sequence[ShapeTimes] | HostMeasurement"]
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
#: the files whose measurement in this process could not be trusted, and why
_untrusted: dict[Path, str] = {}
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
    """This host's table: read from the cache, else measured (and cached, where the
    measurement can be trusted) by the registered measurer; None where
    ``APPORTION_CPU_SPLIT_K=shipped`` asks for the shipped table, or where this process's
    measurement could not be trusted (``untrusted_why`` says why; the shipped table applies).
    ``measure_again`` measures even where a table is cached (``calibrate --measure``), unless
    this process measured it already."""
    if cpu_split_k(environ) == "shipped":
        return None
    key = host_key()
    path = cache_path(key)
    if path in _untrusted and (not measure_again or path in _measured):
        return None
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
        found = None if measure_again else read_table(path, key, quiet=True)
        if found is None:
            got = _config.measure(key)
            measured = got if isinstance(got, HostMeasurement) else HostMeasurement(tuple(got))
            _measured.add(path)
            if not measured.trusted:
                _untrusted[path] = measured.why
                _memo.pop(path, None)
                log.warning("this host's split-K table is not cached: %s; this run plans with "
                            "the shipped table and the next one measures again "
                            "(APPORTION_CPU_SPLIT_K=shipped: never measure)", measured.why)
                return None
            _untrusted.pop(path, None)
            found = HostTable(key, measured.shapes, measured.load)
            write_table(path, found)
    _memo[path] = found
    return found


def untrusted_why(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this process's measurement of this host's table was not trusted (None: it was, or
    none was made)."""
    if cpu_split_k(environ) == "shipped":
        return None
    return _untrusted.get(cache_path(host_key()))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock`` (where the platform has ``fcntl`` and the folder is writable), so
    that processes started together measure a host once, not each on the others' cores. The
    holder writes its pid into the lock; a process that has to wait says so in one line on
    stderr, naming the lock and that pid. A lock that is not a regular file is refused naming
    it (a FIFO would block the open)."""
    lock = path.with_suffix(".lock")
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _open_regular(lock, os.O_RDWR | os.O_CREAT)
    except TargetError:
        raise
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise TargetError(f"host split-K table lock {str(lock)!r} is not a regular file: "
                              "remove it (or set APPORTION_CPU_SPLIT_K=shipped)") from None
        fd = None
    except ImportError:
        fd = None
    if fd is None:
        yield
        return
    with os.fdopen(fd, "r+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = handle.read().strip()
            by = f"process {holder}" if _alive(holder) else "another process"
            log.warning("waiting for %s measuring this host's split-K table (it holds %s)", by,
                        lock)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(pid: str) -> bool:
    """Whether ``pid`` (as a lock holds it) names a running process: the holder may not have
    written its own over its predecessor's yet."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's: it runs
    return True
