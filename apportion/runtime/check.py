"""The one check of a planned run: the program run unplanned and planned on the same random
inputs, every output compared (``reference.compare``).

Every backend's run is checked this way (``PlannedProgram.check``, ``apportion run --check``,
the benches, a mesh schedule's run), as two calls the caller makes around its own planned run:
``expect`` runs the program unplanned first (an input the program refuses is refused as the
reference refuses it) and gives the inputs to run on; ``Expected.compare`` compares what the
planned run returned: the tensors by name, or a run record holding them (``tensors`` or
``outputs``: a backend's timing record). The caller runs, so control never climbs back up
from here into a backend.

>>> import apportion as ap
>>> from apportion.backends import get
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> want = expect(planned.program, seed=3)
>>> got = get("reference").run(planned.lowered, want.inputs)
>>> all(c.ok for c in want.compare(got))
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.ir.program import Program
from apportion.runtime.reference import OutputCheck, compare, random_inputs, run_unplanned

__all__ = ["Expected", "expect", "tensors_of"]


@dataclass(frozen=True)
class Expected:
    """What a planned run of ``program`` on ``inputs`` must give: ``outputs``, the program's
    unplanned run on them."""

    program: Program
    inputs: dict[str, np.ndarray]
    outputs: Mapping[str, np.ndarray]

    def compare(self, got: Any) -> list[OutputCheck]:
        """Every output of the planned run ``got`` (tensors by name, or a run record holding
        them: ``tensors_of``) compared with the unplanned one."""
        return compare(self.outputs, tensors_of(got), self.program)


def expect(program: Program, seed: int = 0, inputs: Mapping[str, np.ndarray] | None = None,
           expected: Mapping[str, np.ndarray] | None = None) -> Expected:
    """``program`` (static shapes: a program with run-time sizes bound) run unplanned on
    ``inputs`` (None: random ones, ``seed``), before any planned run. ``expected``: the
    unplanned run of ``inputs`` where the caller has it already (several runs checked
    against one).

    >>> from apportion.frontend.json_format import load
    >>> want = expect(load("examples/fused.json"), seed=1)
    >>> all(c.ok for c in want.compare(want.outputs))
    True
    """
    xs = random_inputs(program, seed) if inputs is None else dict(inputs)
    want = run_unplanned(program, xs) if expected is None else expected
    return Expected(program, xs, want)


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
