"""The per-kind MLIR table (``mlir.bodies``): each reducer's MLIR in one entry (``REDUCER_OPS``:
its combine, the arith ops its partials combine by on tensors, IREE's collective reduction and
the shard dialect's), the one table every form that combines or reduces partials reads."""

from __future__ import annotations

import dataclasses

import pytest

from apportion.errors import EmitError
from apportion.ir.kinds import REDUCERS
from apportion.mlir.bodies import REDUCER_OPS
from apportion.mlir.mesh import mesh_mlir
from apportion.sharding.forms import unrolled_mlir
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.spec import Sharding
from tests.sharding.programs import reduction

COLS = Sharding(((), ("tp",)))


def test_a_reducer_s_elementwise_op_on_tensors_is_the_op_its_element_combine_uses():
    for name, ops in REDUCER_OPS.items():
        if name == "argmax":  # its partials are int64 keys, combined by the largest
            assert (ops.float_op, ops.int_op) == (None, "arith.maxsi")
            continue
        for op, template in ((ops.float_op, ops.combine.float), (ops.int_op, ops.combine.int)):
            assert op is None or f"= {op} {{a}}, {{b}} : " in template, name


def test_every_name_partials_wait_as_across_devices_has_its_shard_and_tensor_combine():
    for r in REDUCERS.values():
        if r.across_devices is None:
            continue
        ops = REDUCER_OPS[r.across_devices.waits_as]
        assert ops.shard is not None and ops.int_op is not None, r.name


def _split_sum(fn: str = "sum"):
    p = reduction(fn)
    return lower_plan(propagate(p, parse("tp=2"), annotations={"x": COLS}))


def test_the_mesh_modules_take_their_collective_reduction_from_the_table(monkeypatch):
    assert "flow.collective.all_reduce sum, f32" in mesh_mlir(_split_sum())
    monkeypatch.setitem(REDUCER_OPS, "sum", dataclasses.replace(REDUCER_OPS["sum"],
                                                                collective=None))
    with pytest.raises(EmitError, match=r"all_reduce of tensor 'r' along axis 'tp': IREE's "
                                        r"collectives have no 'sum' reduction \(they have max, "
                                        r"min, prod, argmax\)"):
        mesh_mlir(_split_sum())


def test_the_unrolled_shard_form_combines_partials_by_the_table_s_tensor_op(monkeypatch):
    monkeypatch.setitem(REDUCER_OPS, "max", dataclasses.replace(REDUCER_OPS["max"],
                                                                float_op=None))
    with pytest.raises(EmitError, match="reducer 'max' over float32 has no elementwise combine "
                                        "in the unrolled form"):
        unrolled_mlir(_split_sum("max"), parse("tp=2"))

