"""Upstream MLIR 22 (the ``mlir`` extra): its tools, runner libraries and OpenMP runtime.

IREE 3.13's bindings lack the ``shard`` dialect and the upstream passes that check a sharded
program (``--sharding-propagation``, ``--shard-partition``) or run ``scf.forall`` in parallel
(``--scf-forall-to-parallel``, ``--convert-scf-to-openmp``). The packages of the ``mlir`` extra
(``pip install 'apportion[mlir]'``; ``make test`` installs it) bring ``mlir-opt``,
``mlir-runner``, the Python bindings and an OpenMP runtime. Their places are found from the
installed packages, never from a fixed path.

>>> ok = available()          # False without the extra
>>> isinstance(ok, bool)
True
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from apportion.errors import EmitError

#: the optional-dependency group that installs upstream MLIR
EXTRA = "mlir"
MISSING = (f"upstream MLIR is not installed: install apportion's '{EXTRA}' extra "
           f"(pip install -e '.[{EXTRA}]'; make test installs it)")


@cache
def package_dir() -> Path | None:
    """The installed ``mlir`` package's folder (a namespace package), or None."""
    spec = importlib.util.find_spec("mlir")
    if spec is None or not spec.submodule_search_locations:
        return None
    for place in spec.submodule_search_locations:
        if (Path(place) / "bin" / "mlir-opt").exists():
            return Path(place)
    return None


def available() -> bool:
    """True when ``mlir-opt`` and the Python bindings of the ``mlir`` extra are installed."""
    return package_dir() is not None


def require() -> Path:
    """The ``mlir`` package folder, or an EmitError naming the missing extra."""
    found = package_dir()
    if found is None:
        raise EmitError(MISSING)
    return found


def tool(name: str) -> Path:
    """An upstream tool (``mlir-opt``, ``mlir-runner``, ``mlir-translate`` ...) by name."""
    path = require() / "bin" / name
    if not path.exists():
        raise EmitError(f"upstream MLIR has no tool {name!r} in {path.parent.name}/")
    return path


def runner_library(name: str) -> Path:
    """A runner library shipped with upstream MLIR (``mlir_c_runner_utils`` ...)."""
    path = require() / "lib" / f"lib{name}.so"
    if not path.exists():
        raise EmitError(f"upstream MLIR ships no runner library lib{name}.so")
    return path


@cache
def openmp_library() -> Path | None:
    """The OpenMP runtime with the ``__kmpc_*`` entry points MLIR's OpenMP lowering calls
    (``libiomp5.so`` from the intel-openmp package), or None when it is not installed."""
    try:
        files = importlib.metadata.files("intel-openmp") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libiomp5.so":
            return Path(str(f.locate())).resolve()
    return None


def mlir_opt(text: str, args: Sequence[str] = (), *, timeout_s: float = 120.0) -> str:
    """Run upstream ``mlir-opt`` with ``args`` on ``text``; its output, or an EmitError
    carrying its diagnostics. With no ``args`` it parses and verifies only.

    >>> if available():
    ...     out = mlir_opt("shard.grid @g(shape = 2x4)")
    ...     assert "shard.grid @g(shape = 2x4)" in out
    """
    exe = tool("mlir-opt")
    try:
        done = subprocess.run([str(exe), *args, "-"], input=text, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise EmitError(f"upstream mlir-opt {' '.join(args)} ran past {timeout_s:g} s") from None
    if done.returncode != 0:
        notes = " ".join(line.strip() for line in done.stderr.splitlines() if line.strip())
        raise EmitError(f"upstream mlir-opt {' '.join(args)} refused the IR: {notes[:2000]}")
    return done.stdout


def verify_upstream(text: str) -> None:
    """Parse and verify ``text`` with upstream MLIR 22 (every dialect it registers, ``shard``
    included); raise EmitError with its diagnostics when it fails."""
    mlir_opt(text)
