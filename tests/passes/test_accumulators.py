"""Tile-sized accumulators: each at the loop level that needs it, in the scratchpad when it fits,
copied out at the end of that level.

Each case plans, emits the LoopSpec program and the loop bundle, and runs the plan in simulated
memory against the unplanned program.
"""

from __future__ import annotations

import dataclasses
import json

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.bench.tiling import accumulator_traffic
from apportion.errors import PlanningError
from apportion.plans.memory import FinishOp
from apportion.plans.serialize import from_json, to_json
from apportion.target import spyre
from tests.helpers import program

MM = [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
      {"name": "act", "op": "relu", "out": "a[m,n]", "ins": ["h[m,n]"]}]
T = {"x": ([256, 1024], "float16"), "w": ([1024, 512], "float16")}
MK = [{"count": 2, "dims": ["m"]}, {"count": 4, "dims": ["k"]}]


def matmul(loops=MK, ops=("mm",), depths=None, dtype="float16"):
    tensors = {n: (s, dtype) for n, (s, _) in T.items()}
    group = {"ops": list(ops), "loops": loops, **({"depths": depths} if depths else {})}
    out = "a" if "act" in ops else "h"
    return program(tensors, [o for o in MM if o["name"] in ops or o["name"] == "act"], [out],
                   tiling=[group])


def checked(prog, target=None) -> ap.PlannedProgram:
    p = ap.plan(prog, target or spyre(cores=32))
    p.loopspec()
    p.bundle_mlir()
    checks = p.check()
    assert all(c.ok for c in checks), checks
    assert from_json(to_json(p.plan)) == p.plan
    return p


def test_matmul_over_m_and_k_keeps_a_tile_sized_accumulator_on_chip():
    p = checked(matmul())
    acc = p.plan.buffer("h", "accumulator")
    assert (acc.space, acc.shape, acc.dtype) == ("lx", (128, 512), "float32")
    assert acc.nbytes == 128 * 512 * 4 // 32  # each core's part: m 8 x n 4 ways
    (group,) = p.groups
    assert group.finishes == (FinishOp(group.path, "mm", "h", "sum", 1024, 1),)
    assert "h" in group.lx_tensors
    outer = p.loopspec()[0]
    assert [getattr(s, "name", "loop") for s in outer.body] == ["mm.init", "loop", "mm.finish"]


def test_the_device_memory_traffic_saved_against_a_whole_float32_accumulator():
    p = ap.plan(matmul(), spyre(cores=32))
    traffic = accumulator_traffic(p.program, p.plan, p.target)["mm"]
    whole, result = 256 * 512 * 4, 256 * 512 * 2
    # before: the whole float32 accumulator set once, each K step reading and writing its
    # 128-row half, then read once more to be cast into the float16 result:
    # 1 + 4 x 2 x 2 x 1/2 + 1 = 10 times 512 KiB, and the result's 256 KiB
    assert traffic.full_size == whole * 10 + result
    # now: the accumulator never leaves the scratchpad; only the copy-out writes the result
    assert traffic.tiled == result and traffic.saved == whole * 10


def test_a_reader_after_the_k_loop_reads_the_copied_out_tile():
    p = checked(matmul(ops=("mm", "act"), depths={"act": 1}))
    tile = p.plan.buffer("h", "tile")
    assert (tile.space, tile.group, tile.shape) == ("hbm", (0,), (128, 512))
    (outer,) = p.loopspec()
    assert [getattr(s, "name", "loop") for s in outer.body] == [
        "mm.init", "loop", "mm.finish", "act"]


def test_an_output_dim_tiled_inside_the_reduction_loop_keeps_a_whole_accumulator():
    p = checked(matmul(loops=[{"count": 4, "dims": ["k"]}, {"count": 2, "dims": ["m"]}]))
    acc = p.plan.buffer("h", "accumulator")
    assert (acc.space, acc.shape) == ("hbm", (256, 512))  # each core's rows move with m


def test_an_accumulator_that_does_not_fit_stays_tile_sized_in_device_memory():
    small = dataclasses.replace(spyre(cores=32), scratchpad_bytes=2048, scratchpad_reserve=0.0)
    p = checked(matmul(), small)
    acc = p.plan.buffer("h", "accumulator")
    assert (acc.space, acc.shape, acc.nbytes) == ("hbm", (128, 512), 128 * 512 * 4)
    # it moves the bytes a whole one would, in half the device memory
    traffic = accumulator_traffic(p.program, p.plan, p.target)["mm"]
    assert traffic.tiled == traffic.full_size
    assert p.groups[0].saved_bytes >= 256 * 512 * 4 - acc.nbytes


def test_a_float32_accumulator_left_in_device_memory_is_the_result_itself():
    small = dataclasses.replace(spyre(cores=32), scratchpad_bytes=2048, scratchpad_reserve=0.0)
    p = checked(matmul(dtype="float32"), small)
    assert [b.kind for b in p.plan.buffers_of("h")] == ["accumulator"]
    assert p.plan.buffer("h").shape == (256, 512) and not p.groups[0].finishes


def test_a_reduction_split_over_cores_keeps_its_accumulator_in_device_memory():
    prog = dataclasses.replace(matmul(), work_division=(("mm", (("m", 2), ("k", 4))),))
    p = checked(prog)
    assert p.plan.buffer("h", "accumulator").space == "hbm"


def test_means_maxima_and_integer_sums_at_an_inner_level():
    for fn, dtype in (("mean", "float16"), ("max", "float32"), ("sum", "int32")):
        prog = program({"x": ([64, 256], dtype)},
                       [{"name": "r", "op": fn, "out": "s[m,0]", "ins": ["x[m,n]"]}], ["s"],
                       tiling=[{"ops": ["r"], "loops": [{"count": 2, "dims": ["m"]},
                                                        {"count": 4, "dims": ["n"]}]}])
        p = checked(prog)
        assert p.plan.buffer("s", "accumulator").shape == (32, 1)
        assert p.groups[0].finishes[0].level == 1


def test_finish_levels_are_in_the_plan_json():
    doc = json.loads(ap.plan(matmul(), spyre(cores=32)).to_json())
    assert doc["groups"][0]["finishes"] == [{"op": "mm", "tensor": "h", "fn": "sum",
                                             "count": 1024, "level": 1}]


@st.composite
def reductions(draw):
    """A matmul or row sum with its reduction tiled at a random level, an output dim tiled
    outside or inside it, maybe a reader after the reduction's loop."""
    m = draw(st.sampled_from([8, 16, 32]))
    k = 64 * draw(st.sampled_from([2, 4]))
    kind = draw(st.sampled_from(["matmul", "sum", "max"]))
    if kind == "matmul":
        tensors = {"x": ([m, k], "float32"), "w": ([k, 64], "float32")}
        ops = [{"name": "r", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
               {"name": "u", "op": "relu", "out": "a[m,n]", "ins": ["h[m,n]"]}]
    else:
        tensors = {"x": ([m, k], "float32")}
        ops = [{"name": "r", "op": kind, "out": "h[m,0]", "ins": ["x[m,k]"]},
               {"name": "u", "op": "neg", "out": "a[m,0]", "ins": ["h[m,0]"]}]
    red = {"count": draw(st.sampled_from([2, 4])), "dims": ["k"]}
    out = {"count": draw(st.sampled_from([1, 2, 4])), "dims": ["m"]}
    outer_first = draw(st.booleans())
    loops = [out, red] if outer_first else [red, out]
    group = {"ops": ["r", "u"], "loops": loops}
    reader = outer_first and draw(st.booleans())
    if reader:
        group["depths"] = {"u": 1}
    else:
        group["ops"] = ["r"]
    prog = program(tensors, ops, ["a"], tiling=[group])
    capacity = draw(st.sampled_from([256, 4096, 2 << 20]))
    target = dataclasses.replace(spyre(cores=draw(st.integers(1, 8))),
                                 scratchpad_bytes=capacity, scratchpad_reserve=0.0)
    return prog, target


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40, deadline=None)
@given(reductions())
def test_every_accumulator_placement_runs_exactly(case):
    prog, target = case
    try:
        p = ap.plan(prog, target)
    except PlanningError as e:
        event(f"refused: {str(e)[:50]}")
        return
    acc = p.plan.buffer("h", "accumulator")
    event(f"accumulator in {acc.space}, level {p.groups[0].inits[0].level}")
    if acc.space == "lx":
        assert acc.nbytes <= target.scratchpad_capacity
    p.loopspec()
    p.bundle_mlir()
    checks = p.check()
    assert all(c.ok for c in checks), checks
