"""Per-device MLIR with the collectives as IREE's own ops: every kind of resharding step (all
gathers even and uneven, all-reduces by sum, max and argmax keys, reduce-scatters, all-to-alls,
slices) and the finishes of a split mean or argmax parse and verify with the compiler's
bindings, with exact shapes and element types; and the layout each device's module gives an
exchange, run with IREE's semantics, moves exactly what the host collective moves."""

from __future__ import annotations

import functools
import re
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from apportion.errors import EmitError
from apportion.frontend.json_format import from_dict, load
from apportion.ir.kinds import REDUCERS
from apportion.mlir.builder import verify_mlir
from apportion.mlir.mesh import device_mlir, exchange, mesh_mlir
from apportion.runtime import kernels
from apportion.schedule.mesh import Collective, MeshFinish, argmax_index, box_shape, within
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from tests.sharding.programs import annotated, reduction

ROWS, COLS, REP = Sharding((("tp",), ())), Sharding(((), ("tp",))), Sharding(((), ()))


def _exp(rows: int = 10, cols: int = 6) -> object:
    return from_dict({"name": "e", "inputs": ["x"], "outputs": ["y"],
                      "tensors": {"x": {"shape": [rows, cols], "dtype": "float32"},
                                  "y": {"shape": [rows, cols], "dtype": "float32"}},
                      "ops": [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}]})


def _device_function(text: str, device: int) -> str:
    return text.split(f"// device {device}: its segments in order")[1]


def _ops(text: str, kind: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if f"flow.collective.{kind} " in line]


def test_an_uneven_all_gather_pads_each_shard_and_assembles_the_rows_the_plan_cut():
    s = lower_plan(propagate(_exp(), parse("tp=4"), annotations={"x": ROWS, "y": REP}))
    (c,) = s.collectives
    assert c.kind == "all_gather"
    rows = [box_shape(b)[0] for b in c.src_boxes]
    assert sum(rows) == 10 and max(rows) > min(rows)  # uneven, as the plan cuts it
    text = mesh_mlir(s)  # verified
    last = _device_function(text.split("// -----\n")[3], 3)
    (op,) = _ops(last, "all_gather")
    assert op.endswith(f"%world : (tensor<4x{max(rows)}x6xf32>, tensor<1x{max(rows)}x6xf32>, "
                       f"!flow.channel) -> %recv as tensor<4x{max(rows)}x6xf32>")
    assert f"func.func @e.d3(%x: tensor<{rows[3]}x6xf32>) -> (tensor<10x6xf32>)" in last
    assert "linalg.fill" in last  # the short shard is padded with zeros, not left undefined
    for k, lo in enumerate(np.cumsum([0, *rows[:-1]])):
        assert re.search(rf"tensor.insert_slice %part\w* into %\w+\[{lo}, 0\]\[{rows[k]}, 6\]",
                         last)


def test_an_all_to_all_sends_one_part_per_peer_and_receives_one_from_each():
    s = lower_plan(propagate(_exp(8, 8), parse("tp=2"), annotations={"x": ROWS, "y": COLS}))
    (c,) = s.collectives
    assert (c.kind, c.dim, c.to_dim) == ("all_to_all", 0, 1)
    text = mesh_mlir(s)
    (op,) = _ops(text.split("// -----\n")[0], "all_to_all")
    assert "f32" in op and "(tensor<2x4x4xf32>, tensor<2x4x4xf32>, !flow.channel)" in op
    assert "func.func @e.d0(%x: tensor<4x8xf32>) -> (tensor<8x4xf32>)" in text


def test_a_reduce_scatter_of_float16_sums_moves_float32_and_truncates_its_shard():
    s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
    (c,) = s.collectives
    assert (c.kind, c.reducer, c.dtype, c.out_dtype) == ("reduce_scatter", "sum", "float32",
                                                         "float16")
    text = mesh_mlir(s)
    device = text.split("// -----\n")[1]
    (op,) = _ops(device, "reduce_scatter")
    assert op.startswith("%exchanged = flow.collective.reduce_scatter sum, f32, %recv, ")
    assert "(tensor<1x256x512xf32>, tensor<2x256x512xf32>, !flow.channel)" in op
    assert "arith.truncf" in device.split("flow.collective.reduce_scatter")[1]
    assert "-> (tensor<256x512xf16>)" in text


@pytest.mark.parametrize(("fn", "reduction_op", "elt"), [("sum", "sum", "f32"),
                                                          ("max", "maximum", "f32"),
                                                          ("min", "minimum", "f32")])
def test_an_all_reduce_of_a_split_reduction_uses_its_reducer(fn, reduction_op, elt):
    p = reduction(fn)
    s = lower_plan(propagate(p, parse("tp=2"), annotations={"x": Sharding(((), ("tp",)))}))
    (c,) = s.collectives
    assert (c.kind, c.reducer) == ("all_reduce", fn)
    (op,) = _ops(mesh_mlir(s).split("// -----\n")[0], "all_reduce")
    assert op.startswith(f"%r_1 = flow.collective.all_reduce {reduction_op}, {elt}, ")
    assert "(tensor<6xf32>, tensor<6xf32>, !flow.channel)" in op


def test_an_argmax_over_a_2x2_mesh_packs_keys_reduces_them_by_max_and_unpacks_the_index():
    p = reduction("argmax", dtype="float16")
    m = parse("a=2,b=2")
    s = lower_plan(propagate(p, m, annotations={"x": Sharding(((), ("a", "b")))}))
    kinds = [type(st).__name__ if not isinstance(st, Collective) else st.kind
             for st in s.stages]
    assert kinds == ["Compute", "MeshFinish", "all_reduce", "all_reduce"]
    assert [c.unpack for c in s.collectives] == [False, True]
    text = mesh_mlir(s)
    dev3 = _device_function(text.split("// -----\n")[3], 3)
    # two channels, one per mesh axis: device 3 is rank 1 of its group along each
    assert re.search(r"%channel_a = flow.channel.split %world, %c1_index, %c1_index", dev3)
    assert re.search(r"%channel_b = flow.channel.split %world, %c1_index, %c1_index", dev3)
    ops = _ops(dev3, "all_reduce")
    assert [o.split(", ")[0].split()[-1] for o in ops] == ["maximum", "maximum"]
    assert all(", si64, " in o and "tensor<6xi64>" in o for o in ops)
    assert "arith.bitcast" in dev3 and "arith.shli" in dev3  # the keys packed
    assert dev3.count("arith.andi") == 1  # and the index unpacked once, after the last


def test_a_mean_split_over_devices_is_scaled_by_each_devices_exact_share():
    p = reduction("mean")  # 10 columns over 4 devices: shares 3/10, 3/10, 2/10, 2/10
    s = lower_plan(propagate(p, parse("tp=4"), annotations={"x": Sharding(((), ("tp",)))}))
    (fin,) = [st for st in s.stages if isinstance(st, MeshFinish)]
    text = mesh_mlir(s)
    for d, part in enumerate(fin.parts):
        lit = re.findall(r"arith.constant (0x[0-9A-F]{16}) : f64",
                         _device_function(text.split("// -----\n")[d], d))
        assert struct.unpack(">d", bytes.fromhex(lit[0][2:]))[0] == part.factor


def test_a_slice_is_a_stage_of_its_own_and_an_extract_slice():
    p = load("examples/mlp.json")
    plan = propagate(p, parse("tp=3"), annotations={"x": REP, "h": ROWS})
    s = lower_plan(plan)
    slices = [c for c in s.collectives if c.kind == "slice"]
    assert [c.tensor for c in slices] == ["a", "u"]
    text = mesh_mlir(s)
    dev2 = _device_function(text.split("// -----\n")[2], 2)
    lo, hi = slices[0].dst_boxes[2][0]
    assert re.search(rf"tensor.extract_slice %a\[{lo}, 0\]\[{hi - lo}, 2816\]\[1, 1\] : "
                     rf"tensor<256x2816xf16> to tensor<{hi - lo}x2816xf16>", dev2)
    assert "flow.collective" not in dev2  # a slice communicates nothing


def test_the_emit_command_prints_the_verified_modules_with_the_collective_ops(capsys):
    from apportion.cli.main import main

    assert main(["emit", "examples/megatron.json", "--mesh", "tp=2", "--forall"]) == 0
    text = capsys.readouterr().out
    verify_mlir(text.split("// -----\n")[1])
    assert "flow.collective.reduce_scatter sum, f32" in text
    assert "func.func @megatron.d1(" in text


def test_bool_tensors_have_no_collective_element_type_and_are_refused_naming_the_tensor():
    p = from_dict({"name": "b", "inputs": ["x"], "outputs": ["y"],
                   "tensors": {"x": {"shape": [4, 4], "dtype": "bool"},
                               "y": {"shape": [4, 4], "dtype": "bool"}},
                   "ops": [{"name": "n", "op": "copy", "out": "y[i,j]", "ins": ["x[i,j]"]}]})
    s = lower_plan(propagate(p, parse("tp=2"), annotations={"x": ROWS, "y": REP}))
    with pytest.raises(EmitError, match="all_gather of tensor 'y' along axis 'tp'.*no bool"):
        device_mlir(s, 0)


# --- the exchange layout, run with IREE's semantics -------------------------------------------

def _iree(c: Collective, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """What the modules compute: each device's send buffer as ``exchange`` lays it out, IREE's
    collective on equal parts along dim 0, the result assembled from the received slots."""
    n = len(c.src_boxes)
    sends = []
    for d in range(n):
        lay = exchange(c, d)
        buf = np.zeros((len(lay.sends), *lay.pad), arrays[d].dtype)
        for k, b in enumerate(lay.sends):
            if b is not None:
                part = arrays[d][tuple(slice(lo, hi) for lo, hi in within(b, c.src_boxes[d]))]
                buf[(k, *(slice(0, s) for s in part.shape))] = part
        sends.append(buf)
    out = []
    for d in range(n):
        lay, group, me = exchange(c, d), c.group(d), c.rank(d)
        if c.kind == "all_gather":
            recv = np.concatenate([sends[p] for p in group])
        elif c.kind == "all_to_all":
            recv = np.stack([sends[p][me] for p in group])
        else:
            parts = [sends[p][me] for p in group]
            if c.reducer == "argmax":
                total = functools.reduce(np.maximum, parts)
            else:
                r = REDUCERS[c.reducer]
                total = kernels.to_storage(functools.reduce(
                    lambda a, b: r.combine(kernels.XP, a, b), parts), c.dtype)
            recv = np.asarray(total)[None]
        dst = c.dst_boxes[d]
        res = np.empty(box_shape(dst), arrays[d].dtype)
        for k, b in lay.recvs:
            res[tuple(slice(lo, hi) for lo, hi in within(b, dst))] = \
                recv[(k, *(slice(0, s) for s in box_shape(b)))]
        out.append(argmax_index(res) if c.unpack else res)
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(annotated())
def test_every_exchange_laid_out_for_iree_moves_what_the_host_collective_moves(case):
    program, mesh, ann = case
    s = lower_plan(propagate(program, mesh, annotations=ann))
    rng = np.random.default_rng(0)
    for c in s.collectives:
        if c.kind in ("slice", "all_reduce"):
            continue
        dtype = kernels.storage_dtype(c.dtype)
        arrays = [(rng.integers(-50, 50, box_shape(b)) if c.dtype.startswith("int") else
                   rng.standard_normal(box_shape(b))).astype(dtype) for b in c.src_boxes]
        for got, want in zip(_iree(c, arrays), c.move(arrays), strict=True):
            assert got.shape == want.shape and np.array_equal(got, want), c


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(annotated())
def test_random_sharded_programs_emit_modules_that_verify(case):
    program, mesh, ann = case
    s = lower_plan(propagate(program, mesh, annotations=ann))
    text = mesh_mlir(s)  # every module parsed and verified
    assert text.count("// -----\n") == len(s.devices) - 1
    for c in s.collectives:
        if c.kind != "slice":
            assert f"flow.collective.{c.kind} " in text


@pytest.mark.parametrize(("fn", "dtype"), [
    (fn, dt) for fn in ("argmax", "mean", "sum", "max")
    for dt in ("float16", "bfloat16", "float32", "int8", "int32")
    if not (fn == "mean" and dt.startswith("int"))])  # an integer mean is not split
def test_split_reductions_of_every_dtype_emit_modules_that_verify(fn, dtype):
    p = reduction(fn, dtype=dtype)
    s = lower_plan(propagate(p, parse("tp=3"), annotations={"x": Sharding(((), ("tp",)))}))
    text = mesh_mlir(s)
    (c,) = s.collectives
    elt = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "int8": "si8",
           "int32": "si32"}[dtype]
    elt = "si64" if fn == "argmax" else elt  # argmax keys travel as int64
    if fn in ("mean", "sum") and dtype in ("float16", "bfloat16"):
        elt = "f32"  # their partials travel in the accumulator dtype, truncated once whole
        assert "arith.truncf" in text.split("flow.collective.all_reduce")[1]
    assert f"flow.collective.all_reduce {'sum' if fn in ('mean', 'sum') else 'maximum'}, " \
           f"{elt}, " in text
