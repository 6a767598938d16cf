"""Sharded programs as MLIR.

MLIR's ``shard`` dialect (formerly ``mesh``: ``shard.grid``, ``shard.sharding``,
``shard.shard``) would carry a sharded program as one module. The MLIR Python bindings that
iree-base-compiler 3.13.0 ships do not register it (nor ``mesh``): parsing ``shard.grid``
fails with "Dialect `shard' not found" (``shard_dialect_available`` probes this), and
apportion verifies every MLIR text it emits with those bindings. So no shard-dialect form is
emitted; ``sharded_mlir`` says why, and ``per_device_mlir`` emits the per-device programs with
IREE's own collective ops, which the bindings do register: the plan lowered to a
``MeshSchedule`` (``sharding.lower``), then one module per device (``backends.iree.mesh``):
each compute segment as ``ap.plan`` plans it for the device's cores, in the parallel IR of
``PlannedProgram.forall_mlir``, and the device's function calling them with every collective
between as a ``flow.collective.*`` op on a ``!flow.channel`` split into the groups of devices
along its mesh axis (slices as ``tensor.extract_slice``, finishes of a mean or argmax split
over devices as ``linalg.generic``). Each module is parsed and verified. Modules are separated
by ``// -----`` lines (``iree-opt --split-input-file`` reads them so).

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> from apportion.sharding.unroll import unroll
>>> text = per_device_mlir(unroll(search(load("examples/mlp.json"), parse("tp=2"))))
>>> [line.strip()[:44] for line in text.splitlines() if "flow.collective" in line][0]
'%exchanged = flow.collective.reduce_scatter '
"""

from __future__ import annotations

from apportion.backends.iree.mesh import mesh_mlir
from apportion.errors import EmitError
from apportion.sharding.lower import lower_mesh
from apportion.sharding.unroll import Unrolled
from apportion.target.target import Target

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


def per_device_mlir(unrolled: Unrolled, target: Target | None = None) -> str:
    """Every device's module as verified MLIR: its segments' parallel IR and its function
    calling them with IREE's collective ops between (see the module docstring)."""
    return mesh_mlir(lower_mesh(unrolled, target))
