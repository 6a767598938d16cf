"""Running a schedule's parallel IR on this machine's cores: the module of the schedule
(``mlir.module``: ``scf.forall`` IR, the same function IREE compiles), lowered by upstream MLIR
to OpenMP and LLVM and JIT-compiled (``engine``), called with the inputs.

What the emitter refuses, this backend refuses, by the same documented limits. Ops the
parallel IR has no construction for (numpy's random numbers, which IREE runs on the host
between its modules) are refused too, naming the op and the limit: this backend runs one
module, no host steps.

>>> import apportion as ap
>>> from apportion.mlir import upstream
>>> from apportion.runtime.check import expect
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> if upstream.available():
...     want = expect(planned.program)
...     run = openmp_run(planned.lowered, want.inputs, 2)
...     assert all(c.ok for c in want.compare(run)) and run.threads == 2
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.backends.openmp import engine as omp
from apportion.errors import ExecutionError
from apportion.mlir.module import call, one_module_ir, with_gather_indices
from apportion.runtime.reference import bind_inputs, check_gathers
from apportion.schedule.values import Schedule


@dataclass(frozen=True)
class OpenmpRun:
    """One run: the inputs and outputs by name (storage arrays, as the reference executor
    gives them), seconds lowering and JIT-compiling (0.0 when the module was compiled
    before in this process), whether it was, seconds the call took, and the OpenMP team size
    it ran with."""

    tensors: dict[str, np.ndarray]
    compile_s: float
    cached: bool
    run_s: float
    threads: int


def parallel_ir(schedule: Schedule) -> str:
    """The ``scf.forall`` IR this backend runs for ``schedule`` (one function; for a program
    with run-time sizes, one function for every size). Refuses, naming the op and the
    documented limit, an op the IR has no construction for.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    >>> "scf.forall" in parallel_ir(planned.lowered)
    True
    """
    return one_module_ir(schedule, "openmp")


def openmp_run(schedule: Schedule, inputs: Mapping[str, np.ndarray],
               threads: int | None = None, lowering: omp.Lowering = omp.PARALLEL) -> OpenmpRun:
    """Emit the module of ``schedule`` (bound at the run's sizes and loop counts) as parallel
    IR, lower it with upstream MLIR (``lowering``: each forall an OpenMP loop, or
    ``engine.SEQUENTIAL``), JIT-compile it (or take it from this process's cache) and run it
    on ``inputs`` with ``threads`` OpenMP threads (None: the runtime's default). One module
    serves every run-time size. A gather index outside its table is refused after the run, as
    the reference executor refuses it.
    """
    s = with_gather_indices(schedule)
    text = one_module_ir(s, "openmp")
    program = schedule.program
    env = bind_inputs(program, inputs)
    check_gathers(program, env)  # the indices the program takes, before compiling
    engine, cached = omp.ENGINES.get(text, lowering)
    c = call(s, env)
    team = threads if threads is not None else omp.max_threads()
    done = engine.call(c.function, [(v, elt) for _, v, elt in c.arguments],
                       [(shape, elt) for _, shape, elt in c.results], team)
    tensors = dict(env)
    tensors.update(zip((n for n, _, _ in c.results), done.outputs, strict=True))
    check_gathers(program, tensors)
    tensors = {n: a for n, a in tensors.items() if n in env or n in program.outputs}
    return OpenmpRun(tensors, 0.0 if cached else engine.compile_s, cached, done.run_s, team)


@dataclass(frozen=True)
class Prepared:
    """A program without run-time sizes ready to call many times (a benchmark's loop): its
    module compiled, the function's name, its arguments and its results' shapes and types."""

    engine: omp.Engine
    function: str
    args: tuple[tuple[Any, str], ...]
    results: tuple[tuple[tuple[int, ...], str], ...]
    outputs: tuple[str, ...]

    def call(self, threads: int | None = None) -> omp.Call:
        """One call with ``threads`` OpenMP threads (None: the runtime's default)."""
        return self.engine.call(self.function, self.args, self.results, threads)


def prepare(schedule: Schedule, inputs: Mapping[str, np.ndarray],
            lowering: omp.Lowering = omp.PARALLEL) -> Prepared:
    """The module of ``schedule`` emitted, lowered by ``lowering`` and compiled (or taken from
    the cache), its arguments bound to ``inputs`` once: ``Prepared.call`` then times the
    module alone.

    >>> import apportion as ap
    >>> from apportion.mlir import upstream
    >>> from apportion.runtime import random_inputs
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    >>> if upstream.available():
    ...     ready = prepare(planned.lowered, random_inputs(planned.program, 0))
    ...     assert ready.call(threads=1).outputs[0].shape == (1024, 4096)
    """
    if schedule.given is not None:
        raise ExecutionError(f"program {schedule.program.name!r} has run-time sizes: run it "
                             "with openmp_run, which takes them from its inputs")
    env = bind_inputs(schedule.program, inputs)
    engine, _ = omp.ENGINES.get(one_module_ir(schedule, "openmp"), lowering)
    c = call(schedule, env)
    return Prepared(engine, c.function, tuple((v, elt) for _, v, elt in c.arguments),
                    tuple((shape, elt) for _, shape, elt in c.results),
                    schedule.program.outputs)
