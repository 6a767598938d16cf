"""A planned program compiled by IREE (or taken from its cache) and run, with what the run
reports: whether the module came from the cache, the compile and run times, and (``check``)
every output compared with the unplanned program on the same random inputs. What ``apportion
run --backend iree`` prints; ``PlannedProgram.run(backend="iree")`` gives the outputs alone.

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.cpu(cores=2))
>>> report = run_in_iree(planned, check=True)                     # doctest: +SKIP
>>> all(c.ok for c in report.checks), report.run_s > 0            # doctest: +SKIP
(True, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apportion.planned import PlannedProgram
    from apportion.runtime.reference import OutputCheck


@dataclass(frozen=True)
class IreeReport:
    """What an IREE run reports: the output checks (None: not checked), whether the module was
    taken from the cache, the seconds it took to compile (0 when cached) and to run, and the
    cache's folder."""

    checks: list[OutputCheck] | None
    cached: bool
    compile_s: float
    run_s: float
    cache_dir: Path


def run_in_iree(planned: PlannedProgram, params: Mapping[str, int] | None = None,
                seed: int = 0, check: bool = False) -> IreeReport:
    """``planned`` run in IREE on random inputs of ``seed`` at the run-time sizes and loop
    counts ``params`` gives (one module for every run-time size); ``check``: every output
    compared with the unplanned program's on the same inputs."""
    from apportion.backends.iree.run import iree_run
    from apportion.backends.iree.runtime import default_cache_dir
    from apportion.runtime.check import expect
    from apportion.runtime.reference import random_inputs

    values = dict(params or {})
    sizes = {k: v for k, v in values.items() if k in planned.symbols}
    schedule = planned.schedule(sizes, {k: v for k, v in values.items() if k not in sizes})
    checks = None
    if check:
        unplanned = planned.given.bind(sizes) if planned.symbols else planned.program
        want = expect(unplanned, seed)
        run = iree_run(schedule, want.inputs)
        checks = want.compare(run)
    else:
        run = iree_run(schedule, random_inputs(schedule.program, seed))
    return IreeReport(checks, run.cached, run.compile_s, run.run_s, default_cache_dir())
