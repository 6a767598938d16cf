"""Sharded programs as MLIR.

MLIR's ``shard`` dialect (formerly ``mesh``: ``shard.grid``, ``shard.sharding``,
``shard.shard``) would carry a sharded program as one module. The MLIR Python bindings that
iree-base-compiler 3.13.0 ships do not register it (nor ``mesh``): parsing ``shard.grid``
fails with "Dialect `shard' not found" (``shard_dialect_available`` probes this), and
apportion verifies every MLIR text it emits with those bindings. So no shard-dialect form is
emitted; ``sharded_mlir`` says why, and ``per_device_mlir`` emits the per-device programs: for
each device, each compute segment as ``ap.plan`` plans it for the device's cores, in the
parallel IR of ``PlannedProgram.forall_mlir`` (each module parsed and verified), with the
collective steps between them as comments naming the step, the tensors and the devices (and
the finish of a mean or argmax split over devices, ``rules.Finish``, as a comment too).
Modules are separated by ``// -----`` lines (``mlir-opt --split-input-file`` reads them so).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apportion.errors import EmitError
from apportion.sharding.rules import Finish
from apportion.sharding.unroll import Collective, Unrolled
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
    """Every device's programs as verified parallel IR, collectives as comments between."""
    planned = unrolled.planned(target)
    mesh = unrolled.plan.mesh
    parts = []
    for dev, plans in zip(unrolled.devices, planned, strict=True):
        coords = ", ".join(f"{a}={c}" for a, c in dev.coords)
        pending = [f"// device {dev.device} ({coords}) of mesh {mesh.spec()}"]
        seg = 0
        for stage in dev.stages:
            if isinstance(stage, Collective):
                group = mesh.group(dev.device, stage.step.axis)
                pending.append(f"// collective: {stage} over devices {list(group)}")
                continue
            if isinstance(stage, Finish):  # elementwise on the device, by its host runner
                pending.append(f"// finish of op {stage.op} (elementwise, on the device): "
                               f"{stage}")
                continue
            text = _named(plans[seg], stage.name).forall_mlir()
            seg += 1
            parts.append("\n".join([*pending, f"// segment {stage.name}", text.rstrip("\n")]))
            pending = []
        if pending:
            if seg == 0:
                parts.append("\n".join(pending))
            else:
                parts[-1] += "\n" + "\n".join(pending)
    return "\n// -----\n".join(parts) + "\n"


def _named(planned: Any, name: str) -> Any:
    """A planned segment under ``name`` (devices with equal shards share one plan)."""
    if planned.program.name == name:
        return planned
    source = planned.source
    return replace(planned, program=replace(planned.program, name=name),
                   plan=replace(planned.plan, program=name),
                   source=None if source is None else replace(source, name=name))
