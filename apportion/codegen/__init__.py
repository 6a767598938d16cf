"""Emitters: the LoopSpec program and the MLIR loop bundle of a plan."""
