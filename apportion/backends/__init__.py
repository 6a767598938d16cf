"""Backends: what consumes a plan to emit or run it, one package each, behind one interface.

``reference`` (numpy, core by core, simulated memory), ``torch`` (PyTorch kernels on a thread
pool), ``iree`` (parallel IR compiled and run by IREE), ``bundle`` (LoopSpec/OpSpec values and
the MLIR loop bundle; it emits, it does not run), ``dtensor`` (a sharding plan over a mesh of
devices on torch.distributed), ``openmp`` (the parallel IR lowered by upstream MLIR, each
``scf.forall`` an OpenMP loop, run on this machine's cores; the ``mlir`` extra) and ``cuda``
(the parallel IR for the gpu target built into CUDA kernels, run on this machine's NVIDIA GPU;
``cuda-needs-gpu`` where there is none). ``apportion.mlir`` renders the parallel IR the
compiled backends share; ``apportion.limits`` holds the documented limits every refusal cites.

Each is a ``Backend``: its name, ``supports(planned)`` (the documented limits that stop it, empty
when it takes the plan), and ``run`` or ``emit``. ``run(schedule, inputs, *, threads=None)``
takes the schedule of the run (``PlannedProgram.schedule``: the plan lowered once, bound at the
run's sizes and symbolic loop counts; a compiled backend renders the schedule it binds,
``Schedule.covering``); no backend lowers a plan. A backend that runs a program sharded over a
mesh of devices, lowered (``schedule.mesh.MeshSchedule``), has ``run_mesh`` too, and its
``supports`` answers for a ``MeshSchedule`` as for a planned program: ``reference``, ``torch``
and ``iree`` run every device's core schedule their own way, driving the schedule's steps
(``schedule.mesh.MeshSteps``: each device's launch handed to the backend, the data moving
between devices on the host). Every run is checked the same way (``runtime.check.expect``
runs the program unplanned, ``Expected.compare`` compares the backend's run with it).

``BACKENDS`` maps each name to its backend, imported on first use from its module path, so
importing apportion imports no torch and no IREE, and no backend imports another (the
``backends-independent`` import contract). ``PlannedProgram.run(backend=)``,
``check(backend=)`` and ``apportion run --backend`` take exactly these names. Another
installed distribution adds a backend by naming it in the ``apportion.backends`` entry-point
group (``ENTRY_POINTS``), its module holding ``BACKEND``: nothing of apportion is edited (a
backend built on ``apportion.mlir`` renders a schedule with ``mlir.module.one_module_ir``).

>>> from apportion.backends import BACKENDS, get
>>> list(BACKENDS)
['reference', 'torch', 'iree', 'bundle', 'dtensor', 'openmp', 'cuda']
>>> get("reference").does
'run'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

from apportion.errors import ExecutionError
from apportion.limits import Limit, Unsupported

if TYPE_CHECKING:
    import numpy as np

    from apportion.ir.program import Program
    from apportion.schedule.mesh import MeshSchedule
    from apportion.schedule.values import Schedule
    from apportion.target.target import Target

__all__ = ["BACKENDS", "Backend", "Planned", "get", "require"]


class Planned(Protocol):
    """What ``supports`` and ``emit`` read of a planned program (``PlannedProgram`` is one):
    the program as planned (split-K rewritten, at its planning sizes), its target, the names
    of its run-time sizes, and its schedule lowered once (``lowered``)."""

    @property
    def program(self) -> Program: ...

    @property
    def target(self) -> Target: ...

    @property
    def symbols(self) -> tuple[str, ...]: ...

    @property
    def lowered(self) -> Schedule: ...


class Runner(Protocol):
    """``run(schedule, inputs, *, threads=None)``: the schedule of a run (bound at its sizes
    and symbolic loop counts) on ``inputs`` (by the program's input names, at those sizes);
    returns the inputs and outputs (the reference: every tensor held whole) as numpy storage
    arrays. ``threads``: how many threads run an op's cores concurrently (the cuda backend:
    per block); a runner refuses (an ``ExecutionError`` naming it) what it cannot honour."""

    def __call__(self, schedule: Schedule, inputs: Mapping[str, Any], *,
                 threads: int | None = None) -> dict[str, np.ndarray]: ...


class MeshRunner(Protocol):
    """``run_mesh(schedule, inputs, *, seed=0, timeout_s=None, device=None, threads=None)``:
    a ``MeshSchedule`` run on the host ``inputs`` (by the program's input names); returns the
    program's outputs by name as storage arrays. ``seed`` seeds whatever the run draws,
    ``timeout_s`` and ``device`` are for runners that start processes or use accelerators,
    ``threads`` for those that run an op's cores concurrently; a runner refuses (an
    ``ExecutionError`` naming it) an option it cannot honour rather than ignoring it."""

    def __call__(self, schedule: MeshSchedule, inputs: Mapping[str, Any], *, seed: int = 0,
                 timeout_s: float | None = None, device: str | None = None,
                 threads: int | None = None) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class Backend:
    """One backend: ``supports(planned)`` gives the documented limits that stop it (empty: it
    takes the plan; asked of a ``MeshSchedule``, the limits that stop it running that), at
    most one of ``run`` (inputs in, tensors out) and ``emit`` (text out, checked to parse and
    verify), and ``run_mesh`` (a ``MeshSchedule`` run, ``MeshRunner``; None: the backend runs
    no mesh), at least one of the three.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    >>> get("bundle").supports(planned), get("bundle").does
    ((), 'emit')
    """

    name: str
    summary: str
    supports: Callable[[Any], tuple[Limit, ...]]
    run: Runner | None = None
    emit: Callable[[Any], str] | None = None
    run_mesh: MeshRunner | None = None

    def __post_init__(self) -> None:
        if self.run is not None and self.emit is not None:
            raise ValueError(f"backend {self.name!r}: give run or emit, not both")
        if self.run is None and self.emit is None and self.run_mesh is None:
            raise ValueError(f"backend {self.name!r}: give run, emit or run_mesh")

    @property
    def does(self) -> str:
        """``emit`` for an emitter, else ``run`` (a program, a mesh schedule or both)."""
        return "emit" if self.emit is not None else "run"


#: name -> module whose ``BACKEND`` is that backend (imported on first use)
_MODULES: dict[str, str] = {
    "reference": "apportion.backends.reference.adapter",
    "torch": "apportion.backends.torch.adapter",
    "iree": "apportion.backends.iree.adapter",
    "bundle": "apportion.backends.bundle.adapter",
    "dtensor": "apportion.backends.dtensor.adapter",
    "openmp": "apportion.backends.openmp.adapter",
    "cuda": "apportion.backends.cuda.adapter",
}

#: the entry-point group where another distribution names its backends: ``name = "module"``
#: (the module's ``BACKEND``) or ``name = "module:attribute"``. A name apportion's own
#: backends hold stays theirs.
ENTRY_POINTS = "apportion.backends"


def _modules() -> dict[str, str]:
    """apportion's backends, then those other installed distributions name (read on each
    look-up, so a backend installed while the process runs is found)."""
    found = {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINTS)}
    return {**_MODULES, **{n: v for n, v in sorted(found.items()) if n not in _MODULES}}


class _Registry(Mapping[str, Backend]):
    """The backends by name; a backend's module is imported when it is first looked up."""

    def __getitem__(self, name: str) -> Backend:
        where = _modules()[name]
        module, _, attribute = where.partition(":")
        try:
            backend = getattr(importlib.import_module(module), attribute or "BACKEND")
        except (ImportError, AttributeError) as e:
            if module in _MODULES.values():
                raise
            raise ExecutionError(f"backend {name!r} (entry point {where!r} of group "
                                 f"{ENTRY_POINTS!r}) cannot be loaded: {e}") from e
        if not isinstance(backend, Backend) or backend.name != name:
            raise TypeError(f"{where} is not the Backend {name!r}")
        return backend

    def __iter__(self) -> Iterator[str]:
        return iter(_modules())

    def __len__(self) -> int:
        return len(_modules())


BACKENDS: Mapping[str, Backend] = _Registry()


def get(name: object) -> Backend:
    """The backend called ``name``, or an ExecutionError listing the valid names.

    >>> get("numpy")
    Traceback (most recent call last):
    ...
    apportion.errors.ExecutionError: unknown backend 'numpy'; valid: reference, torch, iree, \
bundle, dtensor, openmp, cuda
    """
    known = _modules()
    if not isinstance(name, str) or name not in known:
        raise ExecutionError(f"unknown backend {name!r}; valid: {', '.join(known)}")
    return BACKENDS[name]


def require(backend: Backend, planned: Any) -> None:
    """Raise ``Unsupported`` naming the backend, the program and each documented limit when
    ``backend`` does not take ``planned``: the one place a backend's refusal up front is made.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    >>> require(get("dtensor"), planned)
    Traceback (most recent call last):
    ...
    apportion.limits.Unsupported: backend 'dtensor' cannot run program 'fused': the \
dtensor backend runs sharding plans over a mesh of devices (--mesh, ap.sharding); a plan for \
one device's cores is not one [limit dtensor-needs-mesh, docs/limits.md]
    """
    limits = backend.supports(planned)
    if limits:
        raise Unsupported(backend.name, planned.program.name, limits)
