"""Spans counted from the first stick a core's box touches to the last (issue 28).

A read whose innermost index starts off a stick boundary (``x[a, 18+f]``) touches one stick
more per row than its extent alone; two reads of one tensor (``x[a, f]`` and ``x[a, 64+f]``)
reach from the first's first index to the second's last. Spans are checked against the sticks
actually touched, enumerated element by element on small shapes and from the boxes' corners on
the full-size one.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError
from apportion.passes.geometry import OpContext
from apportion.passes.layouts import layouts
from apportion.plans.plan import LoopInfo
from apportion.plans.views import dim_slices
from apportion.target import device_layout, spyre
from apportion.target.layout import DeviceLayout
from tests.helpers import program
from tests.passes.test_pipeline_properties import programs, targets


def address(layout: DeviceLayout, index: tuple[int, ...]) -> int:
    """The device-memory element address of ``index`` in ``layout`` (padding included)."""
    eps, inner = layout.elems_per_stick, len(index) - 1
    out = 0
    for d in layout.dims:
        v = index[d.tensor_dim]
        if d.part == "sticks":
            v = index[inner] // eps
        elif d.part == "in_stick":
            v = index[inner] % eps
        out += v * d.stride
    return out


def touched_bytes(layout: DeviceLayout, addresses: list[int]) -> int:
    """Bytes from the start of the first stick holding one of ``addresses`` to the end of the
    last; within one stick, from the first element to the last (a span counts elements there,
    as a one-element box of a reduction's output spans one element)."""
    eps = layout.elems_per_stick
    first, last = min(addresses) // eps, max(addresses) // eps
    if first == last:
        return (max(addresses) - min(addresses) + 1) * layout.elem_bytes
    return (last - first + 1) * eps * layout.elem_bytes


def boxes(sizes: dict[str, int], per: dict[str, int], splits: dict[str, int],
          loop: tuple[str, int] | None) -> list[dict[str, range]]:
    """Every core's box of every loop iteration: ``sizes`` per iteration, ``loop`` (dim,
    count) moving the box by one tile of that dim per iteration."""
    dims = list(sizes)
    out = []
    for j in range(loop[1] if loop else 1):
        shift = {d: j * sizes[d] if loop and d == loop[0] else 0 for d in dims}
        for combo in itertools.product(*(dim_slices(sizes[d], per[d], splits[d]) for d in dims)):
            out.append({d: range(shift[d] + lo, shift[d] + hi)
                        for d, (lo, hi) in zip(dims, combo, strict=True) if hi > lo})
    return [b for b in out if len(b) == len(dims)]


def brute_span(op, tensor: str, layout: DeviceLayout, box: dict[str, range]) -> int:
    """Bytes of the sticks one box touches in ``tensor``, every element of every access of it
    enumerated."""
    accs = [a for a in op.operands if a.tensor == tensor]
    dims = list(box)
    addresses = []
    for point in itertools.product(*(box[d] for d in dims)):
        at = dict(zip(dims, point, strict=True))
        for a in accs:
            index = tuple(e.const + sum(c * at[d] for d, c in e.terms) for e in a.index)
            addresses.append(address(layout, index))
    return touched_bytes(layout, addresses)


def context(prog, target, sizes=None, loop=None) -> OpContext:
    lay = layouts(prog, target)
    op = prog.ops[0]
    return OpContext(op, prog, target, lay.ops[op.name], lay.tensors,
                     dict(sizes or op.sizes), loop)


# -- the case ---------------------------------------------------------------------------

#: x[a, 18+f] in float32 (32 per stick): 1024 sticks of f per row, read from 18 into a stick,
#: touch 1025; aligned, 2048 rows of them would span exactly Spyre's 256 MiB
OFFSET_READ = {"x": ([2048, 18 + 32768], "float32")}
OFFSET_OPS = [{"name": "e", "op": "exp", "out": "y[a,f]", "ins": ["x[a,18+f]"],
               "dims": {"f": 32768}}]


def true_plan_span(prog, p: ap.PlannedProgram, op_name: str, tensor: str) -> int:
    """The largest span any core's box of any iteration touches in ``tensor``, from the boxes'
    corners (addresses grow with every index, so a box's first and last elements bound it)."""
    op, o = prog.op(op_name), p.op(op_name)
    layout = device_layout(prog.tensor(tensor).shape, prog.tensor(tensor).dtype, p.target)
    loop = None if o.loop is None else (o.loop.tiled_dims[0][0], o.loop.count[0])
    worst = 0
    for box in boxes(o.sizes, dict(o.unit_elems), o.split_map, loop):
        corners = []
        for a in (a for a in op.operands if a.tensor == tensor):
            for pick in (min, max):
                at = {d: pick(r) for d, r in box.items()}
                corners.append(address(layout, tuple(
                    e.const + sum(c * at[d] for d, c in e.terms) for e in a.index)))
        worst = max(worst, touched_bytes(layout, corners))
    return worst


@pytest.mark.parametrize("strategy", ["balanced", "greedy"])
def test_a_read_off_a_stick_boundary_at_the_span_limit_is_looped_within_its_true_span(strategy):
    prog = program(OFFSET_READ, OFFSET_OPS, ["y"])
    target = spyre(cores=1)
    # the accounting that assumed every box starts on a stick put this read at the limit
    ext = (2048, 32768)
    lay = device_layout(OFFSET_READ["x"][0], "float32", target)
    assert lay.span_bytes(ext) == target.span_limit
    assert lay.span_bytes(ext, offset=18) == target.span_limit + 2048 * 128
    p = ap.plan(prog, target, strategy=strategy)
    spans = dict(p.op("e").span_bytes)
    true = true_plan_span(prog, p, "e", "x")
    assert true <= spans["x"] <= target.span_limit
    assert p.op("e").loop is not None and p.groups[0].added == "span"


def test_the_offset_read_split_over_cores_reports_at_least_its_true_span():
    prog = program(OFFSET_READ, OFFSET_OPS, ["y"])
    p = ap.plan(prog, spyre(cores=4))
    o = p.op("e")
    true = true_plan_span(prog, p, "e", "x")
    assert true <= dict(o.span_bytes)["x"] <= p.target.span_limit
    # counted from a stick boundary, the same boxes fell short of what they touch
    lay = device_layout(OFFSET_READ["x"][0], "float32", p.target)
    largest = {d: max(len(r) for r in rs) for d, rs in zip(
        o.sizes, zip(*[b.values() for b in boxes(o.sizes, dict(o.unit_elems), o.split_map,
                                                 None)], strict=True), strict=True)}
    assert lay.span_bytes((largest["a"], largest["f"])) < true


def test_a_scaled_offset_read_at_the_limit_plans_and_runs_exactly():
    # 8 rows of 4 float32 sticks read from 18 into a stick: 4096 bytes aligned, 5 sticks a row
    prog = program({"x": ([8, 18 + 128], "float32")},
                   [{"name": "e", "op": "exp", "out": "y[a,f]", "ins": ["x[a,18+f]"],
                     "dims": {"f": 128}}], ["y"])
    target = dataclasses.replace(spyre(cores=1), span_limit=4096)
    p = ap.plan(prog, target)
    assert p.op("e").loop is not None
    assert true_plan_span(prog, p, "e", "x") <= target.span_limit
    p.loopspec()
    p.bundle_mlir()
    assert all(c.ok for c in p.check())


def test_an_op_no_loop_brings_within_its_true_span_is_refused():
    # one row of 2 sticks of f read from 18 in: 3 sticks whole, and a loop of 2 over f (the
    # only count of its 2 sticks) leaves tiles of 32 elements from 18 in, 2 sticks each; counted
    # from stick boundaries that loop fitted the 128-byte limit
    prog = program({"x": ([1, 18 + 64], "float32")},
                   [{"name": "e", "op": "exp", "out": "y[a,f]", "ins": ["x[a,18+f]"],
                     "dims": {"f": 64}}], ["y"])
    target = dataclasses.replace(spyre(cores=1), span_limit=128)
    with pytest.raises(PlanningError, match=r"op 'e': tensor 'x' .* spans 384 bytes per core "
                                            r"> limit 128"):
        ap.plan(prog, target)


def test_two_reads_of_one_tensor_span_from_the_first_to_the_last():
    prog = program({"x": ([4, 64 + 64], "float32")},
                   [{"name": "r", "op": "add", "out": "y[a,f]",
                     "ins": ["x[a,f]", "x[a,64+f]"], "dims": {"f": 64}}], ["y"])
    ctx = context(prog, spyre(cores=1))
    # rows x (2 sticks of the first read ... 2 of the second): 4 sticks of 4 rows
    assert ctx.span_check({"a": 1, "f": 1}).spans["x"] == 4 * 4 * 128


def test_a_loop_of_part_stick_tiles_moves_the_read_off_the_stick_boundary():
    # tiles of 24 float32 elements start 0, 24 and 16 into a stick: the second crosses one
    prog = program({"x": ([2, 72], "float32")},
                   [{"name": "s", "op": "sum", "out": "y[a,0]", "ins": ["x[a,f]"]}], ["y"])
    target = spyre(cores=1)
    whole = context(prog, target)
    tiled = context(prog, target, {"a": 2, "f": 24}, LoopInfo((0,), (3,), (("f",),)))
    assert whole.reaches[0].offset == 0 and tiled.reaches[0].offset == 24
    assert tiled.span_check({"a": 1, "f": 1}).spans["x"] == 2 * 2 * 128  # 2 sticks, 2 rows


# -- property: the computed span bounds the sticks touched -------------------------------------

@st.composite
def offset_reads(draw):
    """One op reading ``x`` through ``off + c*f`` innermost (and maybe a second read of it:
    another offset, or ``f`` alone), over small shapes and sticks; splits of any count up to
    the units, and maybe a loop of any count dividing one dim (tiles of part of a stick)."""
    dtype = draw(st.sampled_from(["float16", "float32"]))
    stick = draw(st.sampled_from([8, 16, 32]))
    target = dataclasses.replace(spyre(), stick_bytes=stick, span_limit=1 << 40)
    rank3 = draw(st.booleans())
    a, f = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    c, off = draw(st.integers(1, 3)), draw(st.integers(0, 20))
    reads = [f"{off}+{c}*f" if c > 1 else f"{off}+f"]
    second = draw(st.sampled_from([None, "offset", "plain"]))
    if second == "offset":
        reads.append(f"{draw(st.integers(0, 20))}+{c}*f")
    elif second == "plain":
        reads.append("f")
    width = max(int(r.split("+")[0]) if "+" in r else 0 for r in reads) + c * (f - 1) + 1
    width += draw(st.integers(0, 5))
    lead = "b," if rank3 else ""
    shape = ([2] if rank3 else []) + [a, width]
    ins = [f"x[{lead}a,{r}]" for r in reads]
    fn = "add" if len(ins) == 2 else "exp"
    prog = program({"x": (shape, dtype)},
                   [{"name": "o", "op": fn, "out": f"y[{lead}a,f]", "ins": ins,
                     "dims": {"f": f}}], ["y"])
    op = prog.ops[0]
    sizes = dict(op.sizes)
    loop = None
    if draw(st.booleans()):
        d = draw(st.sampled_from(list(sizes)))
        count = draw(st.sampled_from([k for k in range(1, sizes[d] + 1) if sizes[d] % k == 0]))
        sizes[d] //= count
        loop = (d, count)
    per = dict(layouts(prog, target).ops["o"].unit_elems)
    splits = {d: draw(st.integers(1, -(-n // per[d]))) for d, n in sizes.items()}
    return prog, target, sizes, loop, splits


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offset_reads())
def test_the_computed_span_bounds_the_sticks_every_box_touches(case):
    prog, target, sizes, loop, splits = case
    info = None if loop is None else LoopInfo((0,), (loop[1],), ((loop[0],),))
    ctx = context(prog, target, sizes, info)
    computed = ctx.span_check(splits).spans["x"]
    layout = ctx.tlayouts["x"]
    touched = max(brute_span(ctx.op, "x", layout, b)
                  for b in boxes(sizes, ctx.per, splits, loop))
    assert computed >= touched
    # and not beyond the region the accesses can reach at all
    assert computed <= math.prod(layout.shape) * layout.elem_bytes


# -- property: every plan of random programs (offset reads among them) spans what it touches ----

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), targets(), st.sampled_from(["greedy", "balanced"]))
def test_every_op_of_a_random_plan_reports_at_least_the_sticks_it_touches(prog, target, strategy):
    try:
        p = ap.plan(prog, target, strategy=strategy)
    except PlanningError:
        return
    for o in p.plan.ops:
        assert o.loop is None or len(o.loop.count) == 1  # span tiling adds one level
        spans = dict(o.span_bytes)
        for t in spans:
            assert true_plan_span(p.program, p, o.name, t) <= spans[t] <= target.span_limit
