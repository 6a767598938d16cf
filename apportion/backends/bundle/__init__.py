"""The bundle backend: a plan as LoopSpec/OpSpec values and the MLIR loop bundle, built from
the plan's schedule (``apportion.schedule``) alone.

The builder is ``apportion.backends.bundle.loopspec.from_schedule`` (of
``PlannedProgram.lowered``).
"""

from apportion.backends.bundle.loopspec import bundle_mlir as bundle_mlir
from apportion.backends.bundle.spec_text import from_json as from_json
from apportion.backends.bundle.spec_text import from_source as from_source
from apportion.backends.bundle.spec_text import to_json as to_json
from apportion.backends.bundle.spec_text import to_source as to_source
from apportion.mlir.bundle import render_bundle as render_bundle
from apportion.schedule.loopspec_values import LoopSpec as LoopSpec
from apportion.schedule.loopspec_values import OpSpec as OpSpec
from apportion.schedule.loopspec_values import TensorArg as TensorArg
