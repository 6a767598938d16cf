"""What apportion shows of a plan: the report tables and lines (``tables``), the pictures of which
core computes which block (``plot``), and the output paths they are written to, checked before
any work (``files``). The command line prints these; a Python user gets the same tables.

>>> import apportion as ap
>>> from apportion.report.tables import summary_line
>>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
>>> summary_line(planned.plan).split(",")[0]
'5 ops (4 planned'
"""
