"""``ap.plan``: a program planned for a target, with its emitters and executors at hand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apportion.ir.program import Program
from apportion.passes.pipeline import plan as run_pipeline
from apportion.plan.plan import OpPlan, Plan
from apportion.target.presets import spyre
from apportion.target.target import Target


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
        from apportion.plan.serialize import to_json

        return to_json(self.plan)

    def run(self, inputs: dict[str, Any] | None = None, threads: int | None = None
            ) -> dict[str, Any]:
        """Execute the plan core by core (random inputs unless given); returns every tensor."""
        from apportion.runtime import random_inputs, run_planned

        return run_planned(self.program, self.plan, inputs or random_inputs(self.program),
                           threads=threads)

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
