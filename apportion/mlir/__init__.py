"""The only package that builds MLIR text: it renders a lowered ``Schedule`` (and a mesh
schedule's device modules) as the parallel IR the iree, openmp and cuda backends run.

It sits between ``schedule`` and ``backends``: it imports no planning pass, no sharding and
no backend (the ``mlir-renders-schedules`` contract), and the backends import it, never each
other.
"""
