"""Sharded programs as MLIR: the ``shard`` dialect, which the bindings lack.

MLIR's ``shard`` dialect (formerly ``mesh``: ``shard.grid``, ``shard.sharding``,
``shard.shard``) would carry a sharded program as one module. The MLIR Python bindings that
iree-base-compiler 3.13.0 ships do not register it (nor ``mesh``): parsing ``shard.grid``
fails with "Dialect `shard' not found" (``shard_dialect_available`` probes this), and
apportion verifies every MLIR text it emits with those bindings. So no shard-dialect form is
emitted; ``sharded_mlir`` says why. The per-device programs are emitted by the IREE backend
from the plan lowered to a ``MeshSchedule`` (``sharding.lower.lower_plan``, then
``backends.iree.mesh.mesh_mlir``): one module per device, each compute segment's parallel IR
and the device's function calling them with every collective between as IREE's own
``flow.collective.*`` ops. This package imports no backend.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> from apportion.sharding.unroll import unroll
>>> sharded_mlir(unroll(search(load("examples/mlp.json"), parse("tp=2"))))
Traceback (most recent call last):
...
apportion.errors.EmitError: the MLIR Python bindings of iree-base-compiler 3.13.0 do not \
register the shard dialect (shard.grid, shard.sharding, shard.shard) nor its older name mesh, \
so a sharded module could not be verified; emit the per-device programs instead (apportion \
emit PROG --mesh SPEC --forall)
"""

from __future__ import annotations

from apportion.errors import EmitError
from apportion.sharding.unroll import Unrolled

PROBE = "shard.grid @probe(shape = 2)"


def shard_dialect_available() -> bool:
    """True when the MLIR bindings parse a ``shard.grid`` (or the older ``mesh.mesh``)."""
    try:
        from iree.compiler import ir
    except ImportError:
        return False
    for text in (PROBE, "mesh.mesh @probe(shape = 2)"):
        try:
            with ir.Context() as ctx:
                ir.Module.parse(text, ctx)
            return True
        except Exception:  # noqa: BLE001 - an MLIRError: the dialect is not registered
            continue
    return False


def sharded_mlir(unrolled: Unrolled) -> str:
    """The sharded program in the ``shard`` dialect: refused, the bindings lack the dialect."""
    if shard_dialect_available():
        raise EmitError("the MLIR bindings know the shard dialect, but apportion has no "
                        "shard-dialect emitter yet; emit the per-device programs")
    raise EmitError("the MLIR Python bindings of iree-base-compiler 3.13.0 do not register the "
                    "shard dialect (shard.grid, shard.sharding, shard.shard) nor its older name "
                    "mesh, so a sharded module could not be verified; emit the per-device "
                    "programs instead (apportion emit PROG --mesh SPEC --forall)")

