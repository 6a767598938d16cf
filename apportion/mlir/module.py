"""One module of parallel IR for a run of a schedule: what the iree, openmp and cuda backends
compile and call, rendered and bound here so that none of them imports another.

A run's schedule is bound at its run-time sizes and symbolic loop counts; the module renders
the schedule it binds (``Schedule.covering``: one function for every size and count), and
``call`` gives the function's arguments for this run (the inputs as the function types them,
then the loop counts and the run-time sizes as ``index`` values) and its results at the run's
sizes. Ops the parallel IR has no construction for (``host_ops``: numpy's random numbers) are
refused by a backend that runs one module (``one_module_ir``); IREE runs them on the host
between its modules (``schedule.parts.segments``). A compiled gather clamps an index outside
its table: a module also returns the indices its gathers compute (``with_gather_indices``) so
that the run refuses them as the reference does (``runtime.reference.check_gathers``).

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> "scf.forall" in one_module_ir(planned.lowered, "openmp")
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apportion.errors import ExecutionError
from apportion.ir.program import Program
from apportion.limits import cite
from apportion.mlir.bodies import supported
from apportion.mlir.builder import symbol_name
from apportion.mlir.forall import forall_mlir, size_symbols
from apportion.mlir.forall.context import symbols
from apportion.mlir.types import mlir_type
from apportion.schedule.parts import with_outputs
from apportion.schedule.values import Schedule

__all__ = ["Call", "call", "gather_indices", "host_ops", "one_module_ir",
           "with_gather_indices"]


def host_ops(program: Program) -> tuple[str, ...]:
    """The ops no module runs: those whose kind the per-kind table lacks (``mlir.bodies``),
    numpy's random generators, which no compiled module reproduces. Every other whole-tensor
    kind (gathers, reshapes, concatenations, constants, ranges, top-k) is parallel IR.

    >>> import apportion as ap
    >>> host_ops(ap.load("examples/mlp.json"))
    ()
    """
    return tuple(op.name for op in program.ops if not supported(op.kind))


def one_module_ir(schedule: Schedule, backend: str) -> str:
    """The parallel IR of ``schedule`` as one module (the schedule it binds, rendered:
    ``forall.forall_mlir``). Refuses, naming ``backend``, the op and the documented limit, an
    op the IR has no construction for (IREE runs those on the host between its modules)."""
    program = schedule.program
    host = host_ops(program)
    if host:
        op = program.op(host[0])
        raise ExecutionError(f"{backend} backend: op {op.name!r} ({op.kind.name}) has no "
                             "parallel IR (IREE runs it on the host between modules; this "
                             f"backend runs one module) {cite('iree-kind-without-mlir')}")
    return forall_mlir(schedule.covering)


def gather_indices(program: Program) -> tuple[str, ...]:
    """The index tensors of the program's gathers that the program makes (not its inputs nor
    its outputs): a module returns them too, to check them after the run."""
    made = {op.out.tensor for op in program.ops}
    return tuple(dict.fromkeys(
        op.ins[1].tensor for op in program.ops
        if op.kind.name == "gather" and op.ins[1].tensor in made
        and op.ins[1].tensor not in program.outputs))


def with_gather_indices(schedule: Schedule) -> Schedule:
    """``schedule`` (and the one it binds) returning the indices its gathers compute too
    (``gather_indices``), after its outputs."""
    return with_outputs(schedule, gather_indices(schedule.program))


@dataclass(frozen=True)
class Call:
    """A call of a module's function: its name, its arguments in order, each (name, value,
    element type: a tensor's, or ``index`` for a loop count or run-time size ``size0``,
    ...), and its results in order, each (name, shape at the run's sizes, element type)."""

    function: str
    arguments: tuple[tuple[str, Any, str], ...]
    results: tuple[tuple[str, tuple[int, ...], str], ...]


def call(schedule: Schedule, env: Mapping[str, Any]) -> Call:
    """The call of ``schedule``'s module (``one_module_ir``) for this run: the inputs of
    ``env`` (bound at the run's sizes), ``schedule``'s symbolic loop counts and run-time
    sizes.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/dynamic_k.json"), ap.targets.spyre(cores=8))
    >>> c = call(planned.schedule({"K": 64}), {"x": None, "w": None})
    >>> [(n, elt) for n, _, elt in c.arguments], c.results
    ([('x', 'f32'), ('w', 'f32')], (('y', (32, 32), 'f32'),))
    """
    module = schedule.covering
    program = module.program
    args = [(n, env[n], mlir_type(program.tensor(n).dtype)) for n in program.inputs]
    counts = dict(schedule.params)
    args += [(s, int(counts[s]), "index") for s in symbols(module)]
    if module.given is not None:
        at = dict(schedule.sizes)
        args += [(f"size{k}", int(at[s]), "index")
                 for k, s in enumerate(size_symbols(module.given))]
    results = tuple((n, tuple(schedule.program.tensor(n).shape),
                     mlir_type(program.tensor(n).dtype)) for n in program.outputs)
    return Call(symbol_name(program.name), tuple(args), results)
