"""The bundle backend behind the one backend interface (``apportion.backends``): the plan as
LoopSpec/OpSpec values (``loopspec.from_schedule``, of its lowered schedule) and the MLIR loop
bundle of their launches (``mlir.bundle.render_bundle``), checked to parse and verify. It emits; it
does not run.

>>> import apportion as ap
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
>>> BACKEND.supports(planned), BACKEND.emit(planned).startswith("#tile_a")
((), True)
"""

from __future__ import annotations

from apportion.backends import Backend, Planned
from apportion.backends.bundle.loopspec import from_schedule
from apportion.errors import ApportionError
from apportion.limits import LIMITS_BY_ID, Limit, refused
from apportion.mlir.builder import verify_mlir
from apportion.mlir.bundle import render_bundle
from apportion.schedule.mesh import MeshSchedule


def supports(planned: Planned | MeshSchedule) -> tuple[Limit, ...]:
    """The documented limits that stop the bundle: run-time sizes not yet bound, and what the
    LoopSpec builder refuses (it is built to find out; an error citing no limit propagates).
    A program sharded over a mesh (a ``MeshSchedule``) is for a backend that runs meshes."""
    if isinstance(planned, MeshSchedule):
        return (LIMITS_BY_ID["bundle-emits-only"],)
    if planned.symbols:
        return (LIMITS_BY_ID["bundle-static-sizes"],)
    try:
        from_schedule(planned.lowered, planned.target)
    except ApportionError as e:
        return refused(e)
    return ()


def emit(planned: Planned) -> str:
    """The loop bundle of ``planned`` as MLIR text: ``scf.for`` loops of ``apportion.execute``
    launches, checked to parse and verify."""
    text = render_bundle(from_schedule(planned.lowered, planned.target), planned.program.name)
    verify_mlir(text)
    return text


BACKEND = Backend("bundle", "LoopSpec/OpSpec values and the MLIR loop bundle (emit --bundle, "
                  "--loopspec); emits, does not run", supports, emit=emit)
