"""Peered memory used, not only priced: a read across shard boundaries on a peered mesh axis
fetches only the rows beyond the device's shard (a ``halo``), and a resharding on a peered axis
is replaced by the reader reading the source in place (a ``peer_read``) where the cost model
says so; every executor's numbers against the unplanned run, uneven cuts included."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from apportion.backends.reference.mesh import run_mesh
from apportion.errors import PlanningError, ProgramError
from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.mesh import Collective, MeshSchedule
from apportion.sharding import oracle
from apportion.sharding.collectives import halo_elements, steps
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.plan import (
    ShardingPlan,
    build_plan,
    default_target,
    in_place_read,
    lifetimes,
    read_us,
    reuse,
)
from apportion.sharding.rules import make_strategy, read_window
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding, Window
from apportion.sharding.unroll import unroll

PEERED = "tp=3@chiplet:peered"
PLAIN = "tp=3@chiplet"


def conv_program(h: int = 19, co: int = 32) -> Program:
    """A 2-D convolution, ``y[b, h, v, co] = sum x[b, h + kh, v + kw, ci] w[kh, kw, ci, co]``:
    ``h`` rows out of ``h + 2`` in, so the row cuts of ``x`` and of the op differ (19 over 3 is
    7, 6, 6; 21 over 3 is 7, 7, 7). Each input row is read once per output channel ``co``."""
    return from_dict({
        "name": "conv", "inputs": ["x", "w"], "outputs": ["y"],
        "tensors": {"x": {"shape": [2, h + 2, 6, 4], "dtype": "float32"},
                    "w": {"shape": [3, 3, 4, co], "dtype": "float32"}},
        "ops": [{"name": "conv", "op": "matmul", "out": "y[b,h,v,co]",
                 "ins": ["x[b,h+kh,v+kw,ci]", "w[kh,kw,ci,co]"], "dims": {"h": h, "v": 4}}]})


def shift_program(n: int = 23, by: int = 2) -> Program:
    """``e = exp(x)``, then ``y[i, j] = e[i + by, j]``: a shifted slice (``n - by`` rows of
    ``n``; 23 over 3 is 8, 8, 7 and 21 over 3 is 7, 7, 7)."""
    return from_dict({
        "name": "shift", "inputs": ["x"], "outputs": ["y"],
        "tensors": {"x": {"shape": [n, 5], "dtype": "float32"}},
        "ops": [{"name": "e", "op": "exp", "out": "e[i,j]", "ins": ["x[i,j]"]},
                {"name": "shift", "op": "copy", "out": "y[i,j]", "ins": [f"e[i+{by},j]"],
                 "dims": {"i": n - by}}]})


def plan_of(program: Program, spec: str, splits: dict[str, dict[str, Any]],
            inputs: dict[str, Sharding], outputs: dict[str, Sharding] | None = None
            ) -> ShardingPlan:
    mesh = parse(spec)
    strategies = {op.name: make_strategy(op, program, mesh, splits.get(op.name, {}))
                  for op in program.ops}
    return build_plan(program, mesh, default_target(mesh, None), strategies, inputs,
                      outputs or {}, {})


def runs_match(plan: ShardingPlan, seed: int = 0) -> MeshSchedule:
    """The plan's numbers as the reference mesh runner, the torch mesh runner and ``unroll``'s
    numpy collectives give them, each against the unplanned program."""
    p = plan.program
    xs = random_inputs(p, seed)
    want = run_unplanned(p, xs)
    s = lower_plan(plan)
    assert all(c.ok for c in compare(want, run_mesh(s, xs), p))
    assert all(c.ok for c in compare(want, oracle.run(unroll(plan), xs), p))
    pytest.importorskip("torch")
    from apportion.backends.torch.mesh import run_mesh as torch_run_mesh

    assert all(c.ok for c in compare(want, torch_run_mesh(s, xs), p))
    return s


def only(s: MeshSchedule) -> Collective:
    (c,) = s.collectives
    return c


ROWS4 = Sharding(((), ("tp",), (), ()))


# --- halo reads --------------------------------------------------------------------------------

def test_a_convolution_split_over_a_peered_axis_reads_its_window_and_the_halo_beyond_it():
    p = conv_program()
    plan = plan_of(p, PEERED, {"conv": {"h": "tp"}}, {"x": ROWS4, "w": Sharding.replicated(4)})
    (t,) = plan.transfers
    assert [s.kind for s in t.steps] == ["halo"] and not t.in_place  # co re-reads x: a copy
    # 2*7*4 outputs x 32 channels x 3*3*4 taps over the 2*9*6*4 elements of the window
    assert reuse(p.op("conv"), 0, plan.strategy("conv"), plan.mesh) == 2 * 7 * 4 * 32 * 36 / 432
    assert t.dst.window(1) == Window(19, 1, 0, 2)
    s = runs_match(plan)
    c = only(s)
    # each device's box is the rows its part of h reads: [lo, hi - 1 + 2 + 1), uneven
    assert [b[1] for b in c.src_boxes] == [(0, 7), (7, 14), (14, 21)]
    assert [b[1] for b in c.dst_boxes] == [(0, 9), (7, 15), (13, 21)]
    # only the rows beyond a device's shard cross the link: 2, 1 and 1 rows
    row = 2 * 6 * 4
    assert [sum(np.prod([hi - lo for lo, hi in b]) for p_ in range(3) if p_ != d
                for b in [c.lacked(p_, d)] if b is not None) for d in range(3)] == \
        [2 * row, row, row]
    assert t.bytes == 2 * row * 4  # the most any device reads, in float32


def test_a_halo_moves_far_less_than_the_all_gather_a_plain_axis_needs():
    p = conv_program()
    mesh = parse(PEERED)
    halo = steps((2, 21, 6, 4), "float32", ROWS4, make_strategy(
        p.op("conv"), p, mesh, {"h": "tp"}).ins[0], mesh)
    plain = plan_of(p, PLAIN, {"conv": {"h": "tp"}}, {"x": ROWS4, "w": Sharding.replicated(4)})
    (t,) = plain.transfers
    assert [s.kind for s in t.steps] == ["all_gather"]
    assert halo[0].bytes * 5 < t.bytes
    runs_match(plain)


def test_the_same_read_on_an_axis_without_peered_memory_still_all_gathers():
    p = conv_program()
    s = make_strategy(p.op("conv"), p, parse(PLAIN), {"h": "tp"})
    assert s.ins[0] == Sharding.replicated(4)
    assert read_window(p.op("conv"), p.op("conv").ins[0].index[1], 21, "h", ("tp",),
                       parse(PLAIN)) is None


def test_a_window_read_from_a_replicated_tensor_is_cut_locally():
    p = conv_program()
    plan = plan_of(p, PEERED, {"conv": {"h": "tp"}},
                   {"x": Sharding.replicated(4), "w": Sharding.replicated(4)})
    (t,) = plan.transfers
    assert [s.kind for s in t.steps] == ["slice"] and t.bytes == 0
    runs_match(plan)


def test_a_convolution_with_one_output_channel_reads_its_halo_in_place():
    """Each element read under five times from the peer costs less than a copy written
    locally."""
    p = conv_program(co=1)
    plan = plan_of(p, PEERED, {"conv": {"h": "tp"}}, {"x": ROWS4, "w": Sharding.replicated(4)})
    (t,) = plan.transfers
    assert t.in_place and [s.kind for s in t.steps] == ["peer_read"]
    assert only(runs_match(plan)).dst_boxes[2][1] == (13, 21)


def test_the_search_prefers_the_halo_on_a_peered_axis():
    p = conv_program(h=46)
    plan = search(p, parse(PEERED), annotations={"x": ROWS4})
    assert plan.strategy("conv").label == "h:tp"
    assert [s.kind for t in plan.transfers for s in t.steps] == ["halo"]
    runs_match(plan)


def test_a_strided_convolution_reads_every_other_row_of_its_window():
    """``y[i, n] = sum x[2 i + k, c] w[k, c, n]``: 11 outputs of 23 rows, cut 4, 4, 3 and
    8, 8, 7 rows; device 1 computes i in 4..8 and reads rows 8..17, one beyond its shard."""
    p = from_dict({
        "name": "strided", "inputs": ["x", "w"], "outputs": ["y"],
        "tensors": {"x": {"shape": [23, 4], "dtype": "float32"},
                    "w": {"shape": [3, 4, 40], "dtype": "float32"}},
        "ops": [{"name": "c", "op": "matmul", "out": "y[i,n]", "ins": ["x[2*i+k,c]", "w[k,c,n]"],
                 "dims": {"i": 11}}]})
    plan = plan_of(p, PEERED, {"c": {"i": "tp"}},
                   {"x": Sharding((("tp",), ())), "w": Sharding.replicated(3)})
    (t,) = plan.transfers
    assert [s.kind for s in t.steps] == ["halo"] and t.dst.window(0) == Window(11, 2, 0, 2)
    c = only(runs_match(plan))
    assert [b[0] for b in c.dst_boxes] == [(0, 9), (8, 17), (16, 23)]


def test_a_leading_slice_reads_its_rows_from_the_device_that_holds_them():
    """``y[t, c] = exp(x[t, c])`` over the first 10 of 16 rows: the rows of a device's part of
    ``t`` lie partly in its neighbour's shard (10 over 3 is 4, 3, 3; 16 over 3 is 6, 5, 5)."""
    p = from_dict({
        "name": "lead", "inputs": ["x"], "outputs": ["y"],
        "tensors": {"x": {"shape": [16, 4], "dtype": "float32"}},
        "ops": [{"name": "e", "op": "exp", "out": "y[t,c]", "ins": ["x[t,c]"],
                 "dims": {"t": 10}}]})
    plan = plan_of(p, PEERED, {"e": {"t": "tp"}}, {"x": Sharding((("tp",), ()))})
    (t,) = plan.transfers
    assert t.in_place and [s.kind for s in t.steps] == ["peer_read"]
    c = only(runs_match(plan))
    assert [b[0] for b in c.dst_boxes] == [(0, 4), (4, 7), (7, 10)]
    assert c.lacked(0, 1) == ((4, 6), (0, 4)) and c.lacked(1, 2) == ((7, 10), (0, 4))


def test_a_stencil_reads_each_element_about_three_times_and_its_halo_matches():
    """``y[i, j] = sum over k < 3 of x[i + k, j]``: 17 rows out of 19, cut 6, 6, 5 and 7, 6,
    6; each device's window overlaps its neighbours' by two rows."""
    p = from_dict({
        "name": "stencil", "inputs": ["x"], "outputs": ["y"],
        "tensors": {"x": {"shape": [19, 5], "dtype": "float32"}},
        "ops": [{"name": "s", "op": "sum", "out": "y[i,j]", "ins": ["x[i+k,j]"],
                 "dims": {"i": 17, "k": 3}}]})
    rows = Sharding((("tp",), ()))
    plan = plan_of(p, PEERED, {"s": {"i": "tp"}}, {"x": rows})
    assert reuse(p.op("s"), 0, plan.strategy("s"), plan.mesh) == 6 * 3 * 5 / (8 * 5)
    (t,) = plan.transfers
    # 2.25 reads of 40 bytes over the link cost less than writing the 180-byte window
    assert t.in_place and [s.kind for s in t.steps] == ["peer_read"] and t.bytes == 40
    c = only(runs_match(plan))
    assert [b[0] for b in c.dst_boxes] == [(0, 8), (6, 14), (12, 19)]


def test_a_dim_split_over_two_axes_is_read_through_a_window_only_when_both_are_peered():
    """Both axes peered: the dim stays split over both and each device reads its window; one
    plain axis among them: the dim is read replicated, as before."""
    p = conv_program(h=40)
    s = make_strategy(p.op("conv"), p, parse("a=2@chiplet:peered,b=2@chiplet:peered"),
                      {"h": ("a", "b")})
    assert s.ins[0] == Sharding(((), ("a", "b"), (), ()), windows=(None, Window(40, 1, 0, 2),
                                                                   None, None))
    for spec in ("a=2@chiplet:peered,b=2@chiplet", "a=2@chiplet,b=2@chiplet:peered"):
        s = make_strategy(p.op("conv"), p, parse(spec), {"h": ("a", "b")})
        assert s.ins[0] == Sharding.replicated(4)


# --- a shifted slice, and reads in place ----------------------------------------------------

def test_a_shifted_slice_over_a_peered_axis_is_read_in_place_from_the_neighbour():
    p = shift_program()
    rows = Sharding((("tp",), ()))
    plan = plan_of(p, PEERED, {"e": {"i": "tp"}, "shift": {"i": "tp"}}, {"x": rows})
    (t,) = plan.transfers
    assert t.in_place and [s.kind for s in t.steps] == ["peer_read"]
    assert t.dst.window(0) == Window(21, 1, 2, 0)
    s = runs_match(plan)
    c = only(s)
    assert c.kind == "peer_read"
    assert [b[0] for b in c.src_boxes] == [(0, 8), (8, 16), (16, 23)]
    assert [b[0] for b in c.dst_boxes] == [(2, 9), (9, 16), (16, 23)]
    # device 0 lacks one row (8), device 1 none, device 2 none: one row of 5 float32
    assert t.bytes == 5 * 4
    assert c.lacked(1, 0) == ((8, 9), (0, 5)) and c.lacked(0, 1) is None
    # read in place: the device holds no copy
    assert t.name not in {local for *_, local, _, _ in lifetimes(plan)}


def test_a_reshard_on_a_peered_axis_is_replaced_by_a_read_in_place():
    """Rows to columns: on a peered axis the next op reads the rows where they are, and no
    copy is held; on a plain axis the all-to-all is made and its copy held."""
    p = from_dict({
        "name": "turn", "inputs": ["x"], "outputs": ["y"],
        "tensors": {"x": {"shape": [10, 11], "dtype": "float32"}},
        "ops": [{"name": "e", "op": "exp", "out": "e[i,j]", "ins": ["x[i,j]"]},
                {"name": "n", "op": "neg", "out": "y[i,j]", "ins": ["e[i,j]"]}]})
    rows, cols = Sharding((("tp",), ())), Sharding(((), ("tp",)))
    splits = {"e": {"i": "tp"}, "n": {"j": "tp"}}
    peered = plan_of(p, PEERED, splits, {"x": rows}, {"y": cols})
    plain = plan_of(p, PLAIN, splits, {"x": rows}, {"y": cols})
    (t,) = peered.transfers
    assert t.in_place and [s.kind for s in t.steps] == ["peer_read"]
    (u,) = plain.transfers
    assert not u.in_place and [s.kind for s in u.steps] == ["all_to_all"]
    assert peered.peak_bytes < plain.peak_bytes
    assert peered.comm_us < plain.comm_us
    runs_match(peered)
    runs_match(plain)


def test_a_matmul_that_rereads_its_operand_keeps_a_resharded_copy():
    """A matmul reads ``a[m, k]`` once per output column: reading it from a peer that often
    costs more than one gather and a local copy, so the copy is made."""
    p = from_dict({
        "name": "mm", "inputs": ["x", "w"], "outputs": ["y"],
        "tensors": {"x": {"shape": [12, 16], "dtype": "float32"},
                    "w": {"shape": [16, 64], "dtype": "float32"}},
        "ops": [{"name": "e", "op": "exp", "out": "a[m,k]", "ins": ["x[m,k]"]},
                {"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["a[m,k]", "w[k,n]"]}]})
    mesh = parse(PEERED)
    st = make_strategy(p.op("mm"), p, mesh, {"n": "tp"})
    assert reuse(p.op("mm"), 0, st, mesh) == 22  # 64 columns over 3: 22, 21, 21
    rows = Sharding((("tp",), ()))
    time, peer = read_us(p, p.op("mm"), 0, st, rows, mesh, default_target(mesh, None))
    assert peer is None and time > 0
    plan = plan_of(p, PEERED, {"e": {"m": "tp"}, "mm": {"n": "tp"}},
                   {"x": rows, "w": Sharding(((), ("tp",)))})
    (t,) = plan.transfers
    assert not t.in_place and [s.kind for s in t.steps] == ["all_gather"]
    runs_match(plan)


def test_a_read_in_place_needs_a_peered_axis_and_one_moving_step():
    mesh = parse("dp=2,tp=2@chiplet:peered")
    src = Sharding((("dp",), ("tp",)))
    # along the plain axis: no read in place
    assert in_place_read((8, 8), "float32", src, Sharding(((), ("tp",))), mesh, 1) is None
    # along the peered one: one read, of the half the device lacks
    st = in_place_read((8, 8), "float32", src, Sharding((("dp",), ())), mesh, 1)
    assert st is not None and st.kind == "peer_read" and st.bytes == 4 * 4 * 4
    # two axes at once: not one step
    assert in_place_read((8, 8), "float32", src, Sharding.replicated(2), mesh, 1) is None
    # a partial value is reduced, not read
    part = Sharding(((), ()), ("tp",), "sum")
    assert in_place_read((8, 8), "float32", part, Sharding.replicated(2), mesh, 1) is None


# --- the sharding's windows -----------------------------------------------------------------

def test_a_windowed_sharding_round_trips_through_json_and_refuses_bad_windows():
    s = Sharding(((), ("tp",)), windows=(None, Window(7, 2, 1, 3)))
    assert Sharding.from_json(s.to_json()) == s
    assert str(s) == "[-, tp window 2*i+1..+3]"
    with pytest.raises(ProgramError, match="windows must be"):
        Sharding.from_json({"dims": [[], ["tp"]], "windows": [None, [7, 2, -1, 3]]})
    two = Sharding(((), ("a", "b")), windows=(None, Window(7, 1, 0, 1)))
    assert Sharding.from_json(two.to_json()) == two
    with pytest.raises(ProgramError, match="dim 1: a window reads a dim split by mesh axes"):
        Sharding(((), ()), windows=(None, Window(7, 1, 0, 1)))
    with pytest.raises(PlanningError, match="a window is only ever read"):
        steps((8, 8), "float32", s, Sharding.replicated(2), parse("tp=2@chiplet:peered"))


def test_a_window_is_never_wider_than_the_largest_device_reads():
    s = Sharding((("tp",),), windows=(Window(19, 1, 0, 2),))
    sizes = {"tp": 3}
    widest = max(hi - lo for c in range(3) for lo, hi in s.block((21,), {"tp": c}, sizes))
    assert s.largest_shape((21,), sizes) == (widest,) == (9,)
    assert halo_elements((21,), Sharding((("tp",),)), s, parse(PEERED)) == 2


def test_a_window_is_never_how_a_tensor_is_annotated_placed_or_handed_back():
    from apportion.sharding.spec import check_annotations

    p = shift_program()
    w = Sharding((("tp",), ()), windows=(Window(21, 1, 2, 0), None))
    mesh = parse(PEERED)
    with pytest.raises(ProgramError, match="tensor 'x': an annotation cannot have windows"):
        check_annotations(p, {"x": w}, mesh)
    with pytest.raises(PlanningError, match="input 'x' cannot be placed as a window"):
        plan_of(p, PEERED, {}, {"x": w})
    with pytest.raises(PlanningError, match="output 'y' cannot be handed back as a window"):
        plan_of(p, PEERED, {}, {"x": Sharding.replicated(2)}, {"y": w})
