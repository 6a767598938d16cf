"""The bundle backend: a plan as LoopSpec/OpSpec values and the MLIR loop bundle, built from
the plan's schedule (``apportion.schedule``) alone.

The builder is ``apportion.backends.bundle.loopspec.from_schedule`` (of
``PlannedProgram.lowered``).
"""
