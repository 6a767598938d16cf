"""The cuda backend: a plan's parallel IR (``emit --forall``, planned for the ``gpu`` target)
lowered by upstream MLIR 22 to CUDA kernels (one per ``scf.forall``, a core of the plan a
block) and a host library, built into a folder (``build.build``) that a machine with an
NVIDIA GPU runs with Python, numpy and the driver alone (``device_main.py``); its outputs are
checked against the reference executor (``build.check_build``). CLI: ``apportion cuda build
| run | check``.
"""
