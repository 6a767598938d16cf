"""Backends: what consumes a plan to emit or run it, one package each.

``reference`` (numpy, core by core, simulated memory), ``torch`` (PyTorch kernels on a thread
pool), ``iree`` (parallel IR compiled and run by IREE) and ``bundle`` (LoopSpec/OpSpec values and
the MLIR loop bundle). ``mlir`` holds the MLIR text helpers the emitters share.
"""
