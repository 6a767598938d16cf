"""Halo reads across several peered mesh axes: a dim split over two (or more) axes that all have
peered memory is read through its window, each device fetching the rows beyond its shard from
whichever devices, along any of the axes, hold them (one ``halo`` step carrying every axis),
priced as the one-axis halo; a plain axis among them keeps the whole read (an all-gather).
Every executor that runs halo steps matches the unplanned program, uneven cuts included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.errors import ExecutionError
from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.mesh import READS, Collective, MeshSchedule
from apportion.sharding.collectives import halo_elements, read_group, read_link, steps
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.plan import ShardingPlan, in_place_read
from apportion.sharding.rules import make_strategy
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding, Window
from tests.conformance.draws import conformance
from tests.sharding.test_peered import conv_program, plan_of, runs_match, shift_program

TWO = "a=2@chiplet:peered,b=2@chiplet:peered"
HALF = "a=2@chiplet:peered,b=2@chiplet"
ROWS_AB = Sharding(((), ("a", "b"), (), ()))
W4 = Sharding.replicated(4)


def conv_plan(spec: str = TWO, h: int = 19, rows: Sharding = ROWS_AB,
              split: tuple[str, ...] = ("a", "b")) -> ShardingPlan:
    return plan_of(conv_program(h), spec, {"conv": {"h": split}}, {"x": rows, "w": W4})


def only(s: MeshSchedule) -> Collective:
    (c,) = s.collectives
    return c


def lacked_elements(c: Collective, d: int) -> int:
    """What device ``d`` receives in read ``c``: the elements of its box other devices hold
    and it does not."""
    return sum(int(np.prod([hi - lo for lo, hi in b])) for p in c.group(d) if p != d
               for b in [c.lacked(p, d)] if b is not None)


# --- planning and pricing --------------------------------------------------------------------

def test_a_convolution_split_over_two_peered_axes_reads_one_halo_across_both():
    plan = conv_plan()
    (t,) = plan.transfers
    (step,) = t.steps
    assert step.kind == "halo" and step.axes == ("a", "b") and step.remote
    assert str(step) == "halo(a,b) dim 1 by remote reads"
    assert t.dst.window(1) == Window(19, 1, 0, 2) and t.dst.dims[1] == ("a", "b")
    s = runs_match(plan)
    c = only(s)
    assert c.kind == "halo" and c.axes == ("a", "b") and c.groups == ((0, 1, 2, 3),)
    # 21 rows of x over 4 devices: 6, 5, 5, 5; 19 rows of h: 5, 5, 5, 4, each reading 2 more
    assert [b[1] for b in c.src_boxes] == [(0, 6), (6, 11), (11, 16), (16, 21)]
    assert [b[1] for b in c.dst_boxes] == [(0, 7), (5, 12), (10, 17), (15, 21)]
    row = 2 * 6 * 4  # the elements of one row of x: b, v, ci
    # only the rows beyond each device's shard cross: 1, 2, 2, 1 rows
    assert [lacked_elements(c, d) for d in range(4)] == [row, 2 * row, 2 * row, row]
    assert t.bytes == step.bytes == 2 * row * 4  # the most any device reads, in float32
    # one latency and those bytes, over the axes' (chiplet) link
    link = plan.mesh.link("a")
    assert step.time_us == pytest.approx(link.latency_us + step.bytes / link.bandwidth * 1e6)


def test_the_halo_across_two_axes_moves_far_less_than_the_gather_when_one_axis_is_plain():
    peered = conv_plan(TWO)
    half = conv_plan(HALF)
    (t,) = half.transfers
    assert "halo" not in {s.kind for s in t.steps}
    assert {s.kind for s in t.steps} == {"all_gather"}
    assert peered.transfers[0].bytes * 5 < t.bytes
    assert peered.comm_us < half.comm_us
    runs_match(half)


def test_the_outer_axis_of_the_split_order_is_outermost_in_the_groups_and_the_cuts():
    plan = conv_plan(h=18, rows=Sharding(((), ("b", "a"), (), ())), split=("b", "a"))
    c = only(runs_match(plan))
    assert c.axes == ("b", "a") and c.groups == ((0, 2, 1, 3),)
    # device 1 (a=0, b=1) holds the third of the rows: 20 over 4 is 5 each
    assert [b[1] for b in c.src_boxes] == [(0, 5), (10, 15), (5, 10), (15, 20)]
    assert [b[1] for b in c.dst_boxes] == [(0, 7), (9, 16), (5, 11), (14, 20)]


def test_a_source_cut_by_the_outer_axis_is_cut_locally_then_haloed_across_both():
    plan = conv_plan(rows=Sharding(((), ("a",), (), ())))
    (t,) = plan.transfers
    assert [str(s) for s in t.steps] == ["slice(b) dim 1", "halo(a,b) dim 1 by remote reads"]
    assert t.steps[0].bytes == 0
    runs_match(plan)


def test_a_window_wider_than_a_shard_reads_from_several_devices_across_the_axes():
    """Seven taps over shards of three or four rows (14 over 2 x 2: 4, 3, 4, 3): the first
    and the last device's windows reach two shards beyond their own, along both axes."""
    p = from_dict({
        "name": "wide", "inputs": ["x"], "outputs": ["y"],
        "tensors": {"x": {"shape": [14, 3], "dtype": "float32"}},
        "ops": [{"name": "s", "op": "sum", "out": "y[i,j]", "ins": ["x[i+k,j]"],
                 "dims": {"i": 8, "k": 7}}]})
    rows = Sharding((("a", "b"), ()))
    plan = plan_of(p, "a=2@chiplet:peered,b=2@chiplet:peered", {"s": {"i": ("a", "b")}},
                   {"x": rows})
    (t,) = plan.transfers
    assert [s.axes for s in t.steps] == [("a", "b")]
    c = only(runs_match(plan))
    assert [b[0] for b in c.dst_boxes] == [(0, 8), (2, 10), (4, 12), (6, 14)]
    assert [b[0] for b in c.src_boxes] == [(0, 4), (4, 7), (7, 11), (11, 14)]
    assert [p_ for p_ in range(4) if c.lacked(p_, 0) is not None] == [1, 2]
    assert [p_ for p_ in range(4) if c.lacked(p_, 3) is not None] == [1, 2]


def test_three_peered_axes_halo_over_the_two_that_split_the_dim():
    """On ``a x b x c``, ``h`` split over ``(a, c)``: a device reads from the devices differing
    along ``a`` or ``c``, never along ``b`` (which holds the same rows)."""
    spec = "a=2@chiplet:peered,b=2@chiplet:peered,c=2@chiplet:peered"
    plan = conv_plan(spec, rows=Sharding(((), ("a", "c"), (), ())), split=("a", "c"))
    c = only(runs_match(plan))
    assert c.axes == ("a", "c")
    assert c.groups == ((0, 1, 4, 5), (2, 3, 6, 7))
    assert read_group(plan.mesh, 2, ("a", "c")) == (2, 3, 6, 7)


def test_a_shifted_slice_across_two_peered_axes_is_read_in_place():
    p = shift_program()
    plan = plan_of(p, TWO, {"e": {"i": ("a", "b")}, "shift": {"i": ("a", "b")}},
                   {"x": Sharding((("a", "b"), ()))})
    (t,) = plan.transfers
    assert t.in_place and [(s.kind, s.axes) for s in t.steps] == [("peer_read", ("a", "b"))]
    c = only(runs_match(plan))
    assert c.kind == "peer_read" and c.axis == "a,b"
    # e's 23 rows over 2 x 2: 6, 6, 6, 5; the 21 rows of i (6, 5, 5, 5) read e from row 2 on:
    # [2, 8), [8, 13), [13, 18), [18, 23), so devices 0 and 1 lack 2 and 1 rows of 5 columns
    assert [b[0] for b in c.src_boxes] == [(0, 6), (6, 12), (12, 18), (18, 23)]
    assert [lacked_elements(c, d) for d in range(4)] == [10, 5, 0, 0]


def test_a_halo_across_axes_of_different_links_is_priced_over_the_slowest():
    mesh = parse("a=2@device:peered,b=2@chiplet:peered")
    p = conv_program(19)
    dst = make_strategy(p.op("conv"), p, mesh, {"h": ("a", "b")}).ins[0]
    (step,) = steps((2, 21, 6, 4), "float32", ROWS_AB, dst, mesh)
    slow = mesh.link("a")
    assert read_link(mesh, ("a", "b")) == slow
    assert step.bytes == halo_elements((2, 21, 6, 4), ROWS_AB, dst, mesh) * 4 == 2 * 48 * 4
    assert step.time_us == pytest.approx(slow.latency_us + step.bytes / slow.bandwidth * 1e6)
    read = in_place_read((2, 21, 6, 4), "float32", ROWS_AB, dst, mesh, 3.0)
    assert read is not None and read.axes == ("a", "b")
    assert read.time_us == pytest.approx(slow.latency_us + 3 * step.bytes / slow.bandwidth * 1e6)


def test_the_search_prefers_the_halo_across_both_peered_axes_to_the_whole_read():
    p = from_dict(_example_doc())
    ann = {"x": Sharding(((), ("a", "b"), ())), "s": Sharding(((), ("a", "b"), ()))}
    peered = search(p, parse(TWO), annotations=ann)
    assert sorted(peered.collectives) == ["halo(remote)", "peer_read(remote)"]
    half = search(p, parse(HALF), annotations=ann)
    assert not {"halo", "peer_read"} & {k.split("(")[0] for k in half.collectives}
    assert peered.predicted_us < half.predicted_us


def _example_doc() -> dict:
    """examples/halo.json's program, smaller."""
    return {"name": "halo", "inputs": ["x", "w"], "outputs": ["s"],
            "tensors": {"x": {"shape": [2, 30, 8], "dtype": "float32"},
                        "w": {"shape": [3, 8, 16], "dtype": "float32"}},
            "ops": [{"name": "conv", "op": "matmul", "out": "y[b,h,co]",
                     "ins": ["x[b,h+kh,ci]", "w[kh,ci,co]"], "dims": {"h": 28}},
                    {"name": "act", "op": "silu", "out": "a[b,h,co]", "ins": ["y[b,h,co]"]},
                    {"name": "shift", "op": "copy", "out": "s[b,i,co]",
                     "ins": ["a[b,i+1,co]"], "dims": {"i": 27}}]}


def test_a_collective_across_several_axes_must_be_a_read():
    with pytest.raises(ExecutionError, match="all_gather runs along one mesh axis"):
        Collective("all_gather", "x", "x", "x@1", "float32", "a,b", ((0, 1),),
                   (((0, 1),), ((1, 2),)), (((0, 2),),) * 2, dim=0)


# --- property: random peered multi-axis cases ------------------------------------------------

@st.composite
def multi_axis_cases(draw: st.DrawFn) -> tuple[Program, str, tuple[str, ...], bool]:
    """A convolution or stencil of random taps and rows (uneven cuts among them) on a mesh of
    two or three axes, the rows split over two or three of them in a random order; every
    axis peered, or one of the splitting ones plain."""
    n_axes = draw(st.integers(2, 3))
    names = ("a", "b", "c")[:n_axes]
    sizes = [draw(st.integers(2, 3)) for _ in names]
    split = tuple(draw(st.permutations(names))[:draw(st.integers(2, n_axes))])
    plain = draw(st.sampled_from((None, *split)))
    spec = ",".join(f"{a}={k}@chiplet" + ("" if a == plain else ":peered")
                    for a, k in zip(names, sizes, strict=True))
    devices = int(np.prod([k for a, k in zip(names, sizes, strict=True) if a in split]))
    taps = draw(st.integers(2, 4))
    rows = draw(st.integers(2 * devices, 4 * devices + 3))
    cols = draw(st.integers(1, 3))
    if draw(st.booleans()):
        doc = {"name": "stencil", "inputs": ["x"], "outputs": ["y"],
               "tensors": {"x": {"shape": [rows + taps - 1, cols], "dtype": "float32"}},
               "ops": [{"name": "s", "op": "sum", "out": "y[i,j]", "ins": ["x[i+k,j]"],
                        "dims": {"i": rows, "k": taps}}]}
    else:
        doc = {"name": "conv", "inputs": ["x", "w"], "outputs": ["y"],
               "tensors": {"x": {"shape": [rows + taps - 1, cols], "dtype": "float32"},
                           "w": {"shape": [taps, cols, 2], "dtype": "float32"}},
               "ops": [{"name": "s", "op": "matmul", "out": "y[i,o]",
                        "ins": ["x[i+k,j]", "w[k,j,o]"], "dims": {"i": rows}}]}
    return from_dict(doc), spec, split, plain is None


@conformance(40)
@given(multi_axis_cases())
def test_random_multi_axis_splits_halo_only_when_every_axis_is_peered_and_match(case):
    from apportion.backends.reference.mesh import run_mesh

    program, spec, split, peered = case
    mesh = parse(spec)
    rows = Sharding((split, ()))
    ins = {"x": rows} | ({"w": Sharding.replicated(3)} if "w" in program.inputs else {})
    plan = plan_of(program, spec, {"s": {"i": split}}, ins)
    (t,) = plan.transfers
    kinds = [s.kind for s in t.steps]
    if peered:
        assert len(kinds) == 1 and kinds[0] in ("halo", "peer_read")
        (step,) = t.steps
        assert step.axes == split and step.remote
        assert step.bytes == halo_elements(program.tensor("x").shape, rows, t.dst, mesh) * 4
    else:
        assert not {"halo", "peer_read"} & set(kinds)
    s = lower_plan(plan)
    for c in s.collectives:
        if c.kind in READS:
            assert all(mesh.axis(a).peered for a in c.axes)
            assert all(c.lacked(d, d) is None for d in range(len(s.devices)))
    xs = random_inputs(program, 0)
    checks = compare(run_unplanned(program, xs), run_mesh(s, xs), program)
    assert all(c.ok for c in checks), [str(c) for c in checks]
