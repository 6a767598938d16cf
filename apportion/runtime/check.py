"""The one check of a planned run: the program run unplanned and planned on the same random
inputs, every output compared (``reference.compare``).

Every backend's run is checked this way (``PlannedProgram.check``, ``apportion run --check``,
the benches, a mesh schedule's run): ``run`` is the planned run, inputs in; it returns the
tensors by name, or a run record holding them (``tensors`` or ``outputs``: a backend's timing
record), which ``check`` hands back with the comparison.

>>> import apportion as ap
>>> from apportion.backends import get
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> run = get("reference").run
>>> checks, _ = check(planned.program, lambda xs: run(planned.lowered, xs), seed=3)
>>> all(c.ok for c in checks)
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from apportion.ir.program import Program
from apportion.runtime.reference import OutputCheck, compare, random_inputs, run_unplanned

R = TypeVar("R")

__all__ = ["check", "tensors_of"]


def check(program: Program, run: Callable[[dict[str, np.ndarray]], R], seed: int = 0,
          inputs: Mapping[str, np.ndarray] | None = None,
          expected: Mapping[str, np.ndarray] | None = None) -> tuple[list[OutputCheck], R]:
    """``program`` (static shapes: a program with run-time sizes bound) run unplanned and by
    ``run`` on ``inputs`` (None: random ones, ``seed``); every output compared. Returns the
    comparisons and what ``run`` returned. The unplanned run goes first: an input the
    program refuses (a gather index out of its table) is refused as the reference refuses
    it. ``expected``: the unplanned run of ``inputs`` where the caller has it already
    (several runs checked against one)."""
    xs = random_inputs(program, seed) if inputs is None else dict(inputs)
    want = run_unplanned(program, xs) if expected is None else expected
    got = run(xs)
    return compare(want, tensors_of(got), program), got


def tensors_of(got: Any) -> Mapping[str, np.ndarray]:
    """The tensors by name a run returned: itself (a mapping), or a run record's ``tensors``
    (a program's run: its inputs and outputs) or ``outputs`` (a mesh schedule's run).

    >>> tensors_of({"y": 1})
    {'y': 1}
    """
    if isinstance(got, Mapping):
        return got
    found = getattr(got, "tensors", None)
    return found if found is not None else got.outputs
