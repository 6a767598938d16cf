"""Running a plan's parallel IR on this machine's cores: the schedule emitted as ``scf.forall``
IR (``mlir.forall``, the same function IREE compiles), lowered by upstream MLIR to
OpenMP and LLVM and JIT-compiled (``engine``), called with the inputs, checked against the
reference executor.

The emitter is the iree backend's: this backend reads its ``forall_mlir`` (and the helpers
that bind a run, ``backends.iree.run``: the schedule emitted, the gather indices checked)
and nothing of IREE itself (the one import between backends the contracts allow). What the
emitter refuses, this backend refuses, by the same documented limits. Ops the parallel IR has
no construction for (numpy's random numbers, which IREE runs on the host between its modules)
are refused too, naming the op and the limit: this backend runs one module, no host steps.

>>> import apportion as ap
>>> from apportion.runtime import upstream_mlir
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> if upstream_mlir.available():
...     checks, run = openmp_check(planned.program, planned.plan, planned.target, threads=2)
...     assert all(c.ok for c in checks) and run.threads == 2
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.backends.iree.run import (
    bind_run,
    check_gathers,
    one_module_ir,
    reference_at,
)
from apportion.backends.openmp import engine as omp
from apportion.errors import ExecutionError
from apportion.ir.program import Program
from apportion.mlir.forall import (
    mlir_type,
    symbol_name,
    symbols,
)
from apportion.plans.plan import Plan
from apportion.runtime.reference import (
    OutputCheck,
    bind_inputs,
    compare,
    random_inputs,
    run_unplanned,
)
from apportion.schedule.lower import lower
from apportion.target.target import Target


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


def parallel_ir(program: Program, plan: Plan, target: Target, symbolic: Program | None = None
                ) -> str:
    """The ``scf.forall`` IR this backend runs for ``plan`` (one function; for a program with
    run-time sizes, ``symbolic`` as given, one function for every size). Refuses, naming the
    op and the documented limit, an op the IR has no construction for.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    >>> "scf.forall" in parallel_ir(planned.program, planned.plan, planned.target)
    True
    """
    return one_module_ir(program, plan, target, "openmp", symbolic)[1]


def openmp_run(program: Program, plan: Plan, target: Target, inputs: Mapping[str, np.ndarray],
               params: Mapping[str, int] | None = None, symbolic: Program | None = None,
               sizes: Mapping[str, int] | None = None, threads: int | None = None,
               lowering: omp.Lowering = omp.PARALLEL) -> OpenmpRun:
    """Emit ``plan`` as parallel IR, lower it with upstream MLIR (``lowering``: each forall an
    OpenMP loop, or ``engine.SEQUENTIAL``), JIT-compile it (or take it from this process's
    cache) and run it on ``inputs`` with ``threads`` OpenMP threads (None: the runtime's
    default); ``params`` gives the symbolic loop counts.

    ``symbolic`` is the program as given where it has run-time sizes (``program`` and
    ``plan`` at its planning sizes): one module serves every size; a run takes its sizes from
    the inputs' shapes (and ``sizes``, or sizes named in ``params``), checked as the reference
    executor checks them. A gather index outside its table is refused after the run, as the
    reference executor refuses it.
    """
    b = bind_run(program, plan, target, inputs, params, symbolic, sizes)
    program, bound_program = b.program, b.bound.program
    schedule, text = one_module_ir(program, plan, target, "openmp", b.symbolic)
    env = bind_inputs(bound_program, inputs)
    check_gathers(bound_program, env)  # the indices the program takes, before compiling
    engine, cached = omp.ENGINES.get(text, lowering)
    args = [(v, elt) for _, v, elt in b.arguments(env, schedule)]
    results = [(shape, elt) for _, shape, elt in b.results()]
    team = threads if threads is not None else omp.max_threads()
    call = engine.call(symbol_name(program.name), args, results, team)
    tensors = dict(env)
    tensors.update(zip(program.outputs, call.outputs, strict=True))
    check_gathers(bound_program, tensors)
    tensors = {n: a for n, a in tensors.items() if n in env or n in b.given_outputs}
    return OpenmpRun(tensors, 0.0 if cached else engine.compile_s, cached, call.run_s, team)


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


def prepare(program: Program, plan: Plan, target: Target, inputs: Mapping[str, np.ndarray],
            params: Mapping[str, int] | None = None,
            lowering: omp.Lowering = omp.PARALLEL) -> Prepared:
    """``plan`` emitted, lowered by ``lowering`` and compiled (or taken from the cache), its
    arguments bound to ``inputs`` once: ``Prepared.call`` then times the module alone.

    >>> import apportion as ap
    >>> from apportion.runtime import upstream_mlir
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    >>> if upstream_mlir.available():
    ...     ready = prepare(planned.program, planned.plan, planned.target,
    ...                     random_inputs(planned.program, 0))
    ...     assert ready.call(threads=1).outputs[0].shape == (1024, 4096)
    """
    if program.symbols:
        raise ExecutionError(f"program {program.name!r} has run-time sizes: run it with "
                             "openmp_run, which binds them")
    bound = lower(program, plan, target, params=params or None)
    env = bind_inputs(bound.program, inputs)
    schedule, text = one_module_ir(program, plan, target, "openmp")
    engine, _ = omp.ENGINES.get(text, lowering)
    args = [(env[n], mlir_type(program.tensor(n).dtype)) for n in program.inputs]
    args += [(int((params or {})[s]), "index") for s in symbols(schedule)]
    results = tuple((bound.program.tensor(n).shape, mlir_type(program.tensor(n).dtype))
                    for n in program.outputs)
    return Prepared(engine, symbol_name(program.name), tuple(args), results, program.outputs)


def openmp_check(program: Program, plan: Plan, target: Target, seed: int = 0,
                 params: Mapping[str, int] | None = None, symbolic: Program | None = None,
                 threads: int | None = None) -> tuple[list[OutputCheck], OpenmpRun]:
    """Run with OpenMP and unplanned on the same random inputs; compare every output. A
    program with run-time sizes (``symbolic``) runs at the sizes ``params`` names (the others
    at their planning sizes), and ``symbolic`` bound at those sizes is the reference."""
    reference = reference_at(program, symbolic, params)
    inputs = random_inputs(reference, seed)
    run = openmp_run(program, plan, target, inputs, params, symbolic, threads=threads)
    return compare(run_unplanned(reference, inputs), run.tensors, reference), run
