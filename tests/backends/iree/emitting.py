"""The parallel IR of a program and plan as a run emits it: the plan lowered to its schedule
(``tests.helpers.emitted``), which is all ``forall_mlir`` reads."""

from __future__ import annotations

from apportion.ir.program import Program
from apportion.mlir.forall import forall_mlir
from apportion.plans.plan import Plan
from apportion.target.presets import PRESETS
from apportion.target.target import Target
from tests.helpers import emitted


def emit(program: Program, plan: Plan, target: Target | None = None,
         symbolic: Program | None = None) -> str:
    """``forall_mlir`` of ``plan`` lowered for ``program`` (``symbolic``: the program as given,
    with run-time sizes) on ``target`` (default: the preset the plan names, at its cores)."""
    if target is None:
        target = PRESETS[plan.target](cores=plan.cores)
    return forall_mlir(emitted(program, plan, target, symbolic))
