"""``ap.plan``: a program planned for a target, with its emitters and executors at hand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apportion.ir.program import Program
from apportion.passes.pipeline import plan as run_pipeline
from apportion.plans.plan import OpPlan, Plan
from apportion.target.presets import spyre
from apportion.target.target import Target

if TYPE_CHECKING:
    from apportion.codegen.specs import SpecProgram


@dataclass(frozen=True)
class PlannedProgram:
    """A program, its target and its plan.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/mlp.json"), target=ap.targets.spyre(cores=8))
    >>> planned.op("act").cores
    8
    """

    program: Program
    target: Target
    plan: Plan

    def op(self, name: str) -> OpPlan:
        return self.plan.op(name)

    def to_json(self) -> str:
        from apportion.plans.serialize import to_json

        return to_json(self.plan)

    def loopspec(self) -> SpecProgram:
        """The plan as nested LoopSpec / OpSpec values, ops outside loops bare, in program order.

        >>> import apportion as ap
        >>> planned = ap.plan(ap.load("examples/fused.json"), target=ap.targets.spyre(cores=32))
        >>> [s.count for s in planned.loopspec()]
        [2]
        """
        from apportion.codegen.loopspec import loopspec

        return loopspec(self.program, self.plan, self.target)

    def bundle_mlir(self, unrolled: bool = False) -> str:
        """The loop bundle as MLIR text: ``scf.for`` loops of ``"apportion.execute"`` launches.

        ``unrolled`` lists every iteration's launches with their addresses as constants.
        """
        from apportion.codegen.bundle import bundle_mlir

        return bundle_mlir(self.program, self.plan, self.target, unrolled=unrolled)

    def run(self, inputs: dict[str, Any] | None = None, threads: int | None = None
            ) -> dict[str, Any]:
        """Execute the plan core by core (random inputs unless given); returns every tensor."""
        from apportion.runtime import random_inputs, run_planned

        xs = inputs or random_inputs(self.program)
        if self.plan.groups:  # loop nests run tile by tile (runtime.loops)
            from apportion.runtime.loops import run_tiled

            return run_tiled(self.program, self.plan, xs, threads=threads)
        return run_planned(self.program, self.plan, xs, threads=threads)

    def check(self, seed: int = 0) -> list[Any]:
        """Run planned and unplanned on the same random inputs and compare every output."""
        from apportion.runtime import compare, random_inputs, run_unplanned

        inputs = random_inputs(self.program, seed)
        return compare(run_unplanned(self.program, inputs), self.run(inputs), self.program)


def plan(program: Any, target: Target | None = None, strategy: str = "balanced"
         ) -> PlannedProgram:
    """Plan a Program (or a builder's program) for ``target`` (default: spyre)."""
    prog = program if isinstance(program, Program) else program.program
    tgt = target or spyre()
    return PlannedProgram(prog, tgt, run_pipeline(prog, tgt, strategy))
