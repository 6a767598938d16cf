"""The scratchpad of the whole program: outputs of ops outside loop groups kept on chip where
they fit, by lifetimes across ops tiled or not, each tensor once for all its readers.

Each case plans, emits the LoopSpec program and the loop bundle, and runs the plan in simulated
memory against the unplanned program.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError
from apportion.plans.serialize import from_json, to_json
from apportion.report.tables import scratchpad_lines
from apportion.target import spyre
from tests.helpers import program

SOFTMAX = [{"name": "rowmax", "op": "max", "out": "mx[m,0]", "ins": ["x[m,n]"]},
           {"name": "shift", "op": "sub", "out": "d[m,n]", "ins": ["x[m,n]", "mx[m,0]"]},
           {"name": "exp", "op": "exp", "out": "e[m,n]", "ins": ["d[m,n]"]},
           {"name": "rowsum", "op": "sum", "out": "s[m,0]", "ins": ["e[m,n]"]},
           {"name": "norm", "op": "div", "out": "y[m,n]", "ins": ["e[m,n]", "s[m,0]"]}]


def softmax(rows: int = 256, cols: int = 1024, **extra):
    return program({"x": ([rows, cols], "float16")}, SOFTMAX, ["y"], **extra)


def checked(prog, target=None) -> ap.PlannedProgram:
    p = ap.plan(prog, target or spyre(cores=32))
    p.loopspec()
    p.bundle_mlir()
    checks = p.check()
    assert all(c.ok for c in checks), checks
    assert from_json(to_json(p.plan)) == p.plan
    return p


def on_chip(p: ap.PlannedProgram) -> dict[str, tuple[int, int]]:
    return {b.tensor: (b.offset, b.nbytes) for b in p.buffers if b.space == "lx"}


def test_an_untiled_softmax_keeps_its_row_statistics_and_intermediates_on_chip():
    p = checked(softmax())
    kept = on_chip(p)
    assert set(kept) == {"mx", "d", "e", "s"}  # the output y goes to device memory
    assert p.plan.buffer("mx").kind == "full" and not p.groups
    # 8 rows per core, one float16 stick each
    assert kept["mx"][1] == 8 * 64 * 2
    specs = {s.name: s for s in p.loopspec()}
    assert [a.memory for a in specs["shift"].args] == ["hbm", "lx", "lx"]
    assert "in scratchpad outside loop groups" in scratchpad_lines(p.plan)[0]


def test_a_tensor_read_by_several_ops_is_kept_once_until_its_last_reader():
    p = checked(softmax())
    kept = on_chip(p)
    # e is read by rowsum and norm: one buffer, live until norm; s (live at the same time)
    # does not overlap it, mx (dead after shift) may share space with later tensors
    assert len([b for b in p.buffers if b.tensor == "e"]) == 1
    e, s = kept["e"], kept["s"]
    assert e[0] + e[1] <= s[0] or s[0] + s[1] <= e[0]


def test_lifetimes_let_later_tensors_reuse_freed_space():
    p = checked(softmax())
    kept = on_chip(p)
    # mx dies at shift, d at exp: e and s go where they were
    assert kept["e"][0] in (kept["mx"][0], kept["d"][0]) or kept["s"][0] == kept["mx"][0]


def test_outputs_and_tensors_other_cores_read_stay_in_device_memory():
    p = checked(ap.load("examples/mlp.json"))
    # gate and up split rows and columns; act reads them by rows only: another core's part
    assert on_chip(p).keys() == {"a"} and p.plan.buffer("y").space == "hbm"
    assert p.plan.buffer("g").space == "hbm"


def test_a_tensor_made_before_a_loop_group_and_read_in_it_stays_on_chip_around_its_tiles():
    # the row max is computed untiled; shift and exp run in a loop over column blocks, each
    # core reading the rows of mx it wrote every iteration
    prog = softmax(tiling=[{"ops": ["shift", "exp"], "count": 4, "dims": ["n"]}])
    p = checked(prog)
    kept = on_chip(p)
    assert "mx" in kept and p.plan.buffer("mx").kind == "full"
    mx = kept["mx"]
    for t in p.groups[0].lx_tensors:  # the group's tiles live while mx does: no overlap
        b = p.plan.buffer(t, "tile")
        assert b.end <= mx[0] or mx[0] + mx[1] <= b.offset


def test_a_reader_in_a_loop_reading_other_cores_rows_keeps_it_in_device_memory():
    # a loop over row blocks cuts each block over every core: core c reads rows another core
    # wrote, so the untiled row max goes through device memory
    prog = softmax(tiling=[{"ops": ["shift", "exp", "rowsum", "norm"], "count": 4,
                            "dims": ["m"]}])
    p = checked(prog)
    assert p.plan.buffer("mx").space == "hbm"


def test_a_small_scratchpad_keeps_what_fits():
    small = dataclasses.replace(spyre(cores=32), scratchpad_bytes=2048, scratchpad_reserve=0.0)
    p = checked(softmax(), small)
    kept = on_chip(p)
    assert set(kept) <= {"mx", "s"} and all(off + n <= 2048 for off, n in kept.values())


def test_threads_give_the_same_numbers():
    p = ap.plan(softmax(), spyre(cores=8))
    xs = ap.runtime.random_inputs(p.program)
    a, b = p.run(xs), p.run(xs, threads=4)
    assert (a["y"] == b["y"]).all()


@st.composite
def chains(draw):
    """A chain of untiled row ops and row statistics over [m, n]."""
    m = draw(st.integers(1, 24))
    n = 32 * draw(st.integers(1, 4))
    tensors = {"x": ([m, n], "float32")}
    ops, cur = [], "x"
    for i in range(draw(st.integers(2, 5))):
        kind = draw(st.sampled_from(["exp", "neg", "rowstat", "add"]))
        if kind == "rowstat":
            ops.append({"name": f"r{i}", "op": draw(st.sampled_from(["sum", "max", "mean"])),
                        "out": f"s{i}[m,0]", "ins": [f"{cur}[m,n]"]})
            ops.append({"name": f"b{i}", "op": "sub", "out": f"t{i}[m,n]",
                        "ins": [f"{cur}[m,n]", f"s{i}[m,0]"]})
        elif kind == "add":  # reads two earlier tensors: lifetimes overlap
            ops.append({"name": f"a{i}", "op": "add", "out": f"t{i}[m,n]",
                        "ins": [f"{cur}[m,n]", "x[m,n]"]})
        else:
            ops.append({"name": f"u{i}", "op": kind, "out": f"t{i}[m,n]",
                        "ins": [f"{cur}[m,n]"]})
        cur = f"t{i}"
    prog = program(tensors, ops, [cur])
    capacity = draw(st.sampled_from([512, 4096, 2 << 20]))
    return prog, dataclasses.replace(spyre(cores=draw(st.integers(1, 12))),
                                     scratchpad_bytes=capacity, scratchpad_reserve=0.0)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40, deadline=None)
@given(chains())
def test_tensors_on_chip_never_overlap_while_both_live_and_runs_are_exact(case):
    prog, target = case
    try:
        p = ap.plan(prog, target)
    except PlanningError:
        return
    pos = {o.name: i for i, o in enumerate(prog.ops)}
    life = {}
    for b in p.buffers:
        if b.space != "lx":
            continue
        producer = prog.producer(b.tensor)
        last = max(pos[r.name] for r in prog.consumers(b.tensor))
        life[b.tensor] = (pos[producer.name], last, b.offset, b.end)
        assert b.end <= target.scratchpad_capacity
    event(f"on chip: {len(life)}")
    items = list(life.values())
    for i, (s1, e1, o1, x1) in enumerate(items):
        for s2, e2, o2, x2 in items[i + 1:]:
            if not (e1 < s2 or e2 < s1):  # both live at once: disjoint bytes
                assert x1 <= o2 or x2 <= o1
    checks = p.check()
    assert all(c.ok for c in checks), checks
