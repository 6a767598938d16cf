"""Tiles narrower than a stick along a dim an op writes (pass ``coarse_tile``): allowed where
the output lives only inside the op's loop, one tile buffer per iteration padded to whole
sticks; refused, naming op, dim and stick, where two iterations would write one stick of a
tensor written whole. Each plan runs in simulated memory against the unplanned program.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError
from apportion.plans.serialize import from_json, to_json
from apportion.target import spyre
from tests.helpers import program

#: float16: 64 elements per stick; n = 64 is one stick per row
T = {"x": ([16, 64], "float16"), "b": ([16, 64], "float16")}
CHAIN = [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
         {"name": "mul", "op": "mul", "out": "z[m,n]", "ins": ["y[m,n]", "b[m,n]"]},
         {"name": "r", "op": "sum", "out": "s[m,0]", "ins": ["z[m,n]"]}]


def chain(loops, outputs=("s",), ops=CHAIN, group=None):
    return program(T, list(ops), list(outputs),
                   tiling=[{"ops": group or [o["name"] for o in ops], "loops": loops}])


def checked(prog, cores=8) -> ap.PlannedProgram:
    p = ap.plan(prog, spyre(cores=cores))
    p.loopspec()
    p.bundle_mlir()
    checks = p.check()
    assert all(c.ok for c in checks), checks
    assert from_json(to_json(p.plan)) == p.plan
    return p


def test_half_stick_tiles_of_intermediates_only_the_loop_reads_run_on_chip():
    for cores in (1, 4, 32):
        p = checked(chain([{"count": 2, "dims": ["n"]}]), cores)
        assert p.op("e").sizes == {"m": 16, "n": 32} and p.op("mul").sizes == {"m": 16, "n": 32}
        assert {"y", "z"} <= set(p.groups[0].lx_tensors)


def test_a_sub_stick_tile_buffer_is_sized_in_whole_sticks():
    p = ap.plan(chain([{"count": 4, "dims": ["n"]}]), spyre(cores=1))
    y = p.plan.buffer("y", "tile")
    assert y.shape == (16, 16)  # a quarter of a stick per row
    assert y.nbytes == 16 * 128  # ... held in one whole 128-byte stick per row


def test_sub_stick_tiles_at_an_inner_level_with_their_readers_in_that_loop():
    loops = [{"count": 2, "dims": ["m"]}, {"count": 2, "dims": ["n"]}]
    p = checked(chain(loops))
    assert p.plan.op("mul").loop.count == (2, 2) and p.op("mul").sizes == {"m": 8, "n": 32}


def test_a_program_output_cut_inside_a_stick_is_refused_naming_op_dim_and_stick():
    with pytest.raises(PlanningError, match=r"count 2 cuts dim 'n' of op 'mul' \(size 64\) into "
                                            r"tiles of 32 elements, not whole sticks of 64; the "
                                            r"op writes its output 'z'.*not a program output"):
        ap.plan(chain([{"count": 2, "dims": ["n"]}], outputs=("s", "z")), spyre(cores=8))


def test_an_intermediate_read_outside_the_group_is_refused():
    ops = [*CHAIN, {"name": "g", "op": "neg", "out": "w[m,n]", "ins": ["y[m,n]"]}]
    with pytest.raises(PlanningError, match=r"cuts dim 'n' of op 'e'.*not read outside the loop"):
        ap.plan(chain([{"count": 2, "dims": ["n"]}], outputs=("s", "w"), ops=ops,
                      group=["e", "mul", "r"]), spyre(cores=8))


def test_an_intermediate_read_after_its_inner_loop_is_refused():
    # y is made in the inner loop over n and read by an op of the outer loop only: its buffer
    # holds the outer tile, which two inner iterations would write a stick of
    ops = [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
           {"name": "c", "op": "neg", "out": "z[m,n]", "ins": ["y[m,n]"]}]
    prog = program(T, ops, ["z"], tiling=[{"ops": ["e", "c"], "depths": {"c": 1}, "loops": [
        {"count": 2, "dims": ["m"]}, {"count": 2, "dims": ["n"]}]}])
    with pytest.raises(PlanningError, match=r"cuts dim 'n' of op 'e'"):
        ap.plan(prog, spyre(cores=8))


@st.composite
def sub_stick_groups(draw):
    """A chain over [m, 64] float16 tiled by 2 or 4 over n (tiles of half or a quarter of a
    stick), maybe an outer level over m, and its intermediates maybe program outputs."""
    ops = [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
           {"name": "mul", "op": "mul", "out": "z[m,n]", "ins": ["y[m,n]", "b[m,n]"]}]
    last = draw(st.sampled_from(["sum", "max", "sum", "max", "neg"]))
    ops.append({"name": "r", "op": last, "out": "s[m,0]" if last != "neg" else "s[m,n]",
                "ins": ["z[m,n]"]})
    inner = {"count": draw(st.sampled_from([2, 4])), "dims": ["n"]}
    loops = [{"count": 2, "dims": ["m"]}, inner] if draw(st.booleans()) else [inner]
    outs = ["s", *draw(st.sampled_from([(), (), (), ("y",), ("z",)]))]
    # outputs written whole along n, which a tile of part of a stick may not cut
    whole = [t for t in outs if t != "s" or last == "neg"]
    return program(T, ops, outs, tiling=[{"ops": ["e", "mul", "r"], "loops": loops}]), \
        draw(st.integers(1, 8)), whole


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=30, deadline=None)
@given(sub_stick_groups())
def test_every_sub_stick_tiling_that_plans_runs_exactly(case):
    prog, cores, whole = case
    try:
        p = ap.plan(prog, spyre(cores=cores))
    except PlanningError as e:
        assert "not whole sticks" in str(e) and whole  # refused only for a tensor written whole
        event("refused: written whole")
        return
    assert not whole
    event(f"planned, outputs {sorted(prog.outputs)}")
    checks = p.check()
    assert all(c.ok for c in checks), checks
