"""Op kinds: fill constants, convolution and pooling over index sums, top-k, gather, and the
explicit re-layout op the planner inserts where an op reads a tensor transposed.

Each case plans, emits the LoopSpec program and the loop bundle, and runs the plan against the
unplanned program (and the unplanned program against numpy).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import ProgramError
from apportion.frontend.json_format import dumps, loads
from apportion.ir.kinds import Category, kind
from apportion.passes.relayout import relayout
from apportion.plans.serialize import from_json, to_json
from apportion.runtime import compare, random_inputs, run_unplanned
from apportion.target import cpu, spyre
from tests.helpers import program, run_planned


def checked(prog, target=None, inputs=None) -> tuple[ap.PlannedProgram, dict]:
    p = ap.plan(prog, target or spyre(cores=8))
    p.loopspec()
    p.bundle_mlir()
    xs = inputs or random_inputs(p.given)
    unplanned = run_unplanned(p.given, xs)
    checks = compare(unplanned, p.run(xs), p.given)
    assert all(c.ok for c in checks), checks
    back = ap.PlannedProgram.from_json(p.to_json(), p.given, p.target)
    assert back.plan == p.plan and back.program == p.program
    return p, unplanned


def test_fill_is_a_divisible_constant_in_the_builder_and_program_files():
    A, B = ap.dim("A", 64), ap.dim("B", 256)
    with ap.program("const") as b:
        x = b.input("x", [A, B], "float16")
        b.output(x * ap.fill([A, B], 0.25, "float16"))
    p, out = checked(b.program)
    assert kind("fill").category is Category.POINTWISE
    assert p.op("fill0").cores == 8  # divided over cores, unlike the whole-tensor ``full``
    assert loads(dumps(b.program)) == b.program
    np.testing.assert_allclose(out["mul1_out"], np.asarray(out["x"]) * 0.25, rtol=1e-3)


def test_conv_is_a_matmul_over_index_sums_with_builder_sugar():
    L, C, F, K = ap.dim("L", 130), ap.dim("C", 64), ap.dim("F", 128), ap.dim("K", 3)
    with ap.program("conv1d") as b:
        x = b.input("x", [L, C], "float32")
        w = b.input("w", [K, C, F], "float32")
        b.output(ap.conv(x, w))
    (op,) = b.program.ops
    assert str(op) == "conv0: conv0_out[d128, F] = conv(x[d128+K, C], w[K, C, F])"
    assert op.category is Category.MATMUL and op.reduction_dims == ("K", "C")
    p, out = checked(b.program)
    xv, wv = out["x"].astype(np.float64), out["w"].astype(np.float64)
    want = np.stack([np.einsum("kc,kcf->f", xv[o:o + 3], wv) for o in range(128)])
    np.testing.assert_allclose(out["conv0_out"], want, rtol=1e-5)


def test_a_strided_2d_conv():
    H, W, C, F = ap.dim("H", 17), ap.dim("W", 17), ap.dim("C", 32), ap.dim("F", 64)
    with ap.program("conv2d") as b:
        img = b.input("img", [H, W, C], "float32")
        w = b.input("w", [ap.dim("KH", 3), ap.dim("KW", 3), C, F], "float32")
        b.output(ap.conv(img, w, stride=2))
    _, out = checked(b.program)
    x, wv = out["img"].astype(np.float64), out["w"].astype(np.float64)
    want = np.array([[np.einsum("ijc,ijcf->f", x[2 * a:2 * a + 3, 2 * c:2 * c + 3], wv)
                      for c in range(8)] for a in range(8)])
    np.testing.assert_allclose(out["conv0_out"], want, rtol=1e-5)


@pytest.mark.parametrize(("fn", "reduce"), [("max_pool", np.max), ("avg_pool", np.mean)])
def test_pooling_reduces_windows_read_through_index_sums(fn, reduce):
    L, C = ap.dim("L", 64), ap.dim("C", 64)
    with ap.program("pool") as b:
        x = b.input("x", [L, C], "float32")
        b.output(getattr(ap, fn)(x, [L], 4, 2))
    (op,) = b.program.ops
    assert op.category is Category.REDUCTION and str(op.ins[0]) == "x[2*d31+d4, C]"
    _, out = checked(b.program)
    x = out["x"]
    want = np.stack([reduce(x[2 * o:2 * o + 4], axis=0) for o in range(31)])
    np.testing.assert_allclose(out[f"{fn}0_out"], want, rtol=1e-6)


def test_topk_is_a_fallback_on_one_core():
    R, N = ap.dim("R", 16), ap.dim("N", 128)
    with ap.program("top") as b:
        b.output(ap.topk(b.input("x", [R, N], "float32"), 5))
    p, out = checked(b.program)
    assert p.op("topk0").cores == 1 and p.op("topk0").kind == "fallback"
    np.testing.assert_allclose(out["topk0_out"], -np.sort(-out["x"], axis=-1)[:, :5])
    with pytest.raises(ProgramError, match="k must be an int in 1..128"), \
            ap.program("bad") as b2:
        ap.topk(b2.input("x", [R, N], "float32"), 200)


def test_gather_is_the_frontends_kind_with_builder_sugar():
    V, C, T = ap.dim("V", 10), ap.dim("C", 64), ap.dim("T", 5)
    with ap.program("emb") as b:
        table = b.input("table", [V, C], "float32")
        ids = b.input("ids", [T], "int32")
        b.output(ap.gather(table, ids))
    xs = random_inputs(b.program)
    xs["ids"] = np.array([1, 3, 0, 9, 2], dtype=np.int32)
    _, out = checked(b.program, inputs=xs)
    np.testing.assert_array_equal(out["gather0_out"], xs["table"][xs["ids"]])


# --- the explicit re-layout op ----------------------------------------------------------------

def transposed(rows: int = 64, cols: int = 256, readers: int = 1):
    ops = [{"name": f"a{i}", "op": "add", "out": f"z{i}[m,n]", "ins": ["x[m,n]", "y[n,m]"]}
           for i in range(readers)]
    return program({"x": ([rows, cols], "float16"), "y": ([cols, rows], "float16")}, ops,
                   [f"z{i}" for i in range(readers)])


def test_a_transposed_read_gets_a_relayout_op_with_its_cost():
    p, _ = checked(transposed())
    assert [o.name for o in p.program.ops] == ["y.relayout0", "a0"]
    rl = p.op("y.relayout0")
    assert rl.kind == "layout" and rl.op == "relayout" and rl.predicted_time_us > 0
    assert set(rl.stick_dims) == {"r0", "r1"}  # it reads one stick dim and writes another
    assert p.program.tensor("y.relayout0").shape == (64, 256)
    assert str(p.program.op("a0").ins[1]) == "y.relayout0[m, n]"
    assert p.given.ops[0].ins[1].tensor == "y"  # the program as given is unchanged


def test_one_copy_serves_every_reader_and_plans_read_back():
    p, _ = checked(transposed(readers=3))
    assert [o.name for o in p.program.ops] == ["y.relayout0", "a0", "a1", "a2"]
    assert from_json(to_json(p.plan)) == p.plan


def test_no_relayout_where_layouts_agree_or_the_target_is_row_major():
    same = program({"x": ([64, 256], "float16"), "y": ([64, 256], "float16"),
                    "r": ([64, 1], "float16")},
                   [{"name": "a", "op": "add", "out": "z[m,n]", "ins": ["x[m,n]", "y[m,n]"]},
                    {"name": "b", "op": "mul", "out": "w[m,n]", "ins": ["z[m,n]", "r[m,0]"]}],
                   ["w"])
    assert relayout(same, spyre())[1] == ()
    row_major = dataclasses.replace(cpu(), cores=2, max_cores=8, layout="row_major")
    assert relayout(transposed(), row_major)[1] == ()
    # a copy op is itself the explicit transpose: nothing to insert before it
    t = program({"y": ([256, 64], "float16")},
                [{"name": "c", "op": "copy", "out": "z[m,n]", "ins": ["y[n,m]"]}], ["z"])
    assert relayout(t, spyre())[1] == ()


def test_ops_in_loop_groups_keep_reading_their_tensors():
    prog = dataclasses.replace(transposed(), tiling=transposed_tiling())
    assert relayout(prog, spyre())[1] == ()
    checked(prog)


def transposed_tiling():
    from apportion.ir.program import LoopLevel, TilingGroup
    return (TilingGroup(("a0",), (LoopLevel(2, ("m",)),)),)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 12), st.booleans())
def test_relayouts_run_exactly(rows8, sticks, cores, greedy):
    prog = transposed(8 * rows8, 64 * sticks, readers=2)
    p = ap.plan(prog, spyre(cores=cores), strategy="greedy" if greedy else "balanced")
    assert any(o.op == "relayout" for o in p.ops)
    xs = random_inputs(prog)
    assert all(c.ok for c in compare(run_unplanned(prog, xs),
                                     run_planned(p.program, p.plan, xs), prog))
