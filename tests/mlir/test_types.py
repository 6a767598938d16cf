"""Scalar types of every MLIR emitter (``mlir.types``): one dtype-to-element-type map and one
compute-type rule, which the parallel IR and the shard forms both follow."""

from __future__ import annotations

import re

import pytest

import apportion as ap
from apportion.errors import EmitError
from apportion.ir.kinds import kind
from apportion.mlir.shard.body import Block, render_op
from apportion.mlir.types import compute_type, mlir_type
from tests.sharding.programs import reduction


def test_a_dtype_without_an_element_type_is_refused_naming_it():
    with pytest.raises(EmitError, match="dtype 'float64' has no MLIR element type"):
        mlir_type("float64")


@pytest.mark.parametrize(("fn", "ins", "ty"), [
    ("exp", [], "f64"),                        # a constant: the reference's Python float
    ("logical_not", ["bool"], "i1"),
    ("add", ["float16", "bfloat16"], "f32"),
    ("add", ["int8", "int64"], "i64"),
    ("div", ["int32", "int32"], "f64"),        # integers through f64, as the reference
    ("add", ["int32", "float32"], "f64"),      # integers meeting floats
    ("sum", ["float32"], "f64"), ("prod", ["float32"], "f64"),
    ("max", ["float32"], "f32"), ("matmul", ["float32", "float32"], "f32"),
])
def test_the_compute_type_follows_the_inputs_dtypes_and_the_kind(fn, ins, ty):
    assert compute_type(kind(fn), ins) == ty


#: the combine of a reduction's accumulator, with the type it computes in
_COMBINE = re.compile(r"= arith\.(?:addf|addi|maximumf|maxsi) \S+, \S+ : (\w+)")


@pytest.mark.parametrize(("fn", "dtype"), [("sum", "float32"), ("sum", "float16"),
                                           ("max", "float32"), ("sum", "int8")])
def test_the_parallel_ir_and_the_shard_forms_accumulate_in_the_same_compute_type(fn, dtype):
    p = reduction(fn, dtype=dtype)
    want = compute_type(p.op("r").kind, [dtype])
    forall = ap.plan(p, ap.targets.spyre(cores=2)).forall_mlir()
    blk = Block()
    render_op(blk, p.op("r"), p.tensor_map, {"x": "%x"})
    for text in (forall, blk.text()):
        assert set(_COMBINE.findall(text)) == {want}
