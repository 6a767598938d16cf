"""Loop nests the reference design accepts: ops at different depths of one nest, one level
tiling two dims of an op, fallback ops inside a group, and tiles smaller than one stick.

Each case plans, emits the LoopSpec program and the loop bundle, and runs the plan in simulated
memory against the unplanned program.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError, ProgramError
from apportion.frontend.json_format import dumps, loads
from apportion.ir.program import LoopLevel, TilingGroup
from apportion.passes.coarse_tile import coarse_tile
from apportion.plans.plan import LoopInfo
from apportion.plans.serialize import from_json, to_json
from apportion.schedule.loopspec_values import LoopSpec, OpSpec
from apportion.target import spyre
from tests.helpers import program

M, N = 256, 1024
TWO = [{"count": 2, "dims": ["m"]}, {"count": 4, "dims": ["n"]}]


def chain(depths: dict[str, int] | None = None, loops=None):
    """y = a + b, z = y * c, w = exp(z) over [256, 1024] float16 in one group."""
    t = {n: ([M, N], "float16") for n in "abc"}
    ops = [{"name": "add", "op": "add", "out": "y[m,n]", "ins": ["a[m,n]", "b[m,n]"]},
           {"name": "mul", "op": "mul", "out": "z[m,n]", "ins": ["y[m,n]", "c[m,n]"]},
           {"name": "e", "op": "exp", "out": "w[m,n]", "ins": ["z[m,n]"]}]
    group = {"ops": ["add", "mul", "e"], "loops": loops or TWO}
    if depths:
        group["depths"] = depths
    return program(t, ops, ["w"], tiling=[group])


def checked(prog, cores: int = 8) -> ap.PlannedProgram:
    p = ap.plan(prog, spyre(cores=cores))
    p.loopspec()
    p.bundle_mlir()
    checks = p.check()
    assert all(c.ok for c in checks), checks
    assert from_json(to_json(p.plan)) == p.plan
    return p


def shape(specs) -> list:
    """The nest as names: an op's name, or [count, body] for a loop."""
    return [s.name.split(".")[0] if isinstance(s, OpSpec) else [s.count, shape(s.body)]
            for s in specs]


# --- ops at different depths of one nest ------------------------------------------------------

def test_an_outer_op_next_to_the_inner_loop_keeps_its_tile_on_chip():
    p = checked(chain({"add": 1}))
    assert p.op("add").loop == LoopInfo((0,), (2,), (("m",),))
    assert p.op("mul").loop == LoopInfo((0, 0), (2, 4), (("m",), ("n",)))
    assert shape(p.loopspec()) == [[2, ["add", [4, ["mul", "e"]]]]]
    y = p.plan.buffer("y")
    assert (y.space, y.group, y.shape) == ("lx", (0,), (M // 2, N))  # the outer tile, on chip
    # mul reads a quarter of it per inner iteration: its address moves within the scratchpad
    mul = p.loopspec()[0].body[1].body[0]
    arg = next(a for a in mul.args if a.tensor == "y")
    assert arg.memory == "lx" and arg.tile_strides[0] == 0 and arg.tile_strides[1] > 0


def test_an_inner_op_read_after_its_loop_writes_into_the_outer_tile():
    p = checked(chain({"e": 1}))
    assert shape(p.loopspec()) == [[2, [[4, ["add", "mul"]], "e"]]]
    z = p.plan.buffer("z")
    assert (z.kind, z.space, z.group, z.shape) == ("tile", "hbm", (0,), (M // 2, N))


def test_a_shallower_op_between_deeper_ones_makes_two_inner_loops():
    p = checked(chain({"mul": 1}))
    assert [p.op(n).loop.group for n in ("add", "mul", "e")] == [(0, 0), (0,), (0, 1)]
    assert shape(p.loopspec()) == [[2, [[4, ["add"]], "mul", [4, ["e"]]]]]


def test_builder_nested_hints_make_one_nest_with_depths():
    A, B = ap.dim("A", 256), ap.dim("B", 512)
    with ap.program("nest") as b:
        x = b.input("x", [A, B], "float16")
        c = b.input("c", [A, B], "float16")
        with ap.hint(slices={A: 2}):
            y = ap.exp(x)
            with ap.hint(slices={B: 4}):
                z = y * c
        b.output(z)
    (group,) = b.program.tiling
    assert group.depths == ((b.program.ops[0].name, 1),)
    assert group.loops == (LoopLevel(2, ("A",)), LoopLevel(4, ("B",)))
    p = checked(b)
    assert shape(p.loopspec()) == [[2, ["exp0", [4, ["mul1"]]]]]


def test_depths_round_trip_and_are_checked():
    prog = chain({"add": 1})
    assert loads(dumps(prog)) == prog
    assert json.loads(dumps(prog))["tiling"][0]["depths"] == {"add": 1}
    with pytest.raises(ProgramError, match=r"op 'add' depth 3 must be an int in 1\.\.2"):
        TilingGroup(("add",), (LoopLevel(2, ("m",)), LoopLevel(2, ("n",))), (("add", 3),))
    with pytest.raises(ProgramError, match="depths name op 'x', which is not in the group"):
        TilingGroup(("add",), (LoopLevel(2, ("m",)),), (("x", 1),))


def test_reading_a_whole_tensor_that_a_shared_loop_tiles_is_an_error():
    # add tiles m in the loop it shares with sort, which works along m (its last axis):
    # sort would need all of y while each iteration holds one tile of it
    prog = program({"a": ([64, 8], "float32")},
                   [{"name": "add", "op": "exp", "out": "y[n,m]", "ins": ["a[n,m]"]},
                    {"name": "s", "op": "sort", "out": "z[n,m]", "ins": ["y[n,m]"]}],
                   ["z"], tiling=[{"ops": ["add", "s"], "loops": [{"count": 2, "dims": ["m"]}]}])
    with pytest.raises(PlanningError, match=r"op 's' reads tensor 'y', which its producer 'add' "
                                            r"tiles over 'm'"):
        coarse_tile(prog)


# --- one level tiling two dims of an op -------------------------------------------------------

def test_one_level_over_two_dims_of_an_op_computes_every_pair_of_tiles():
    p = checked(chain(loops=[{"count": 2, "dims": ["m", "n"]}]))
    for name in ("add", "mul", "e"):
        assert p.op(name).loop == LoopInfo((0, 0), (2, 2), (("m",), ("n",)))
        assert p.op(name).sizes == {"m": M // 2, "n": N // 2}
    assert shape(p.loopspec()) == [[2, [[2, ["add", "mul", "e"]]]]]


def test_a_level_with_the_letters_of_different_ops_still_steps_them_together():
    # add uses m, neg uses p: one loop variable steps both; nothing runs an inner loop
    prog = program({"a": ([64, 128], "float32"), "h": ([64], "float32")},
                   [{"name": "add", "op": "exp", "out": "y[m,n]", "ins": ["a[m,n]"]},
                    {"name": "g", "op": "neg", "out": "g[p]", "ins": ["h[p]"]}],
                   ["y", "g"], tiling=[{"ops": ["add", "g"],
                                        "loops": [{"count": 2, "dims": ["m", "p"]}]}])
    p = checked(prog)
    assert p.op("add").loop.count == (2,) and p.op("g").loop.count == (2,)


# --- fallback ops inside a group --------------------------------------------------------------

def test_a_fallback_in_a_group_runs_on_one_core_over_its_tile_each_iteration():
    prog = program({"x": ([16, 64], "float32")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                    {"name": "c", "op": "cumsum", "out": "z[m,n]", "ins": ["y[m,n]"]},
                    {"name": "r", "op": "relu", "out": "w[m,n]", "ins": ["z[m,n]"]}],
                   ["w"], tiling=[{"ops": ["e", "c", "r"], "count": 4, "dims": ["m"]}])
    p = checked(prog)
    assert p.op("c").cores == 1 and p.op("c").sizes == {"m": 4, "n": 64}
    assert shape(p.loopspec()) == [[4, ["e", "c", "r"]]]


def test_a_fallback_tiled_along_the_axis_it_works_on_stays_whole_there():
    prog = program({"x": ([8, 64], "float32")},
                   [{"name": "c", "op": "cumsum", "out": "z[m,n]", "ins": ["x[m,n]"]},
                    {"name": "r", "op": "relu", "out": "w[m,n]", "ins": ["z[m,n]"]}],
                   ["w"], tiling=[{"ops": ["c", "r"], "count": 2, "dims": ["n"]}])
    p = checked(prog)
    assert p.op("c").sizes == {"m": 8, "n": 64} and p.op("r").sizes == {"m": 8, "n": 32}


def test_a_whole_tensor_fallback_runs_whole_each_iteration():
    from apportion.ir.op import Access, Op
    from apportion.ir.program import Program, TensorType

    full = Op.build("f", "full", Access.parse("f[m,n]"), (), {"m": 8, "n": 64},
                    {"value": "2.0", "dtype": "float32"})
    mul = Op.build("a", "mul", Access.parse("y[m,n]"),
                   (Access.parse("x[m,n]"), Access.parse("f[m,n]")), {"m": 8, "n": 64})
    prog = Program("whole", tuple(TensorType(n, (8, 64), "float32") for n in "xfy"), ("x",),
                   ("y",), (full, mul), (TilingGroup(("f", "a"), (LoopLevel(4, ("m",)),)),))
    p = checked(prog)
    assert p.op("f").sizes == {"m": 8, "n": 64} and p.op("a").sizes == {"m": 2, "n": 64}
    assert p.op("f").cores == 1


# --- tiles smaller than one stick --------------------------------------------------------------

def test_a_sub_stick_tile_of_a_dim_the_op_only_reads_is_allowed():
    # k is the stick dim of x, which the row sum only reads: tiles of half a stick are loads
    prog = program({"x": ([16, 64], "float16")},
                   [{"name": "s", "op": "sum", "out": "y[m,0]", "ins": ["x[m,k]"]}], ["y"],
                   tiling=[{"ops": ["s"], "loops": [{"count": 2, "dims": ["k"]}]}])
    p = checked(prog)
    assert p.op("s").sizes == {"m": 16, "k": 32}


def test_a_sub_stick_tile_of_a_dim_the_op_writes_names_op_dim_and_stick():
    prog = program({"x": ([16, 64], "float16")},
                   [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]}], ["y"],
                   tiling=[{"ops": ["e"], "loops": [{"count": 2, "dims": ["n"]}]}])
    with pytest.raises(PlanningError, match=r"cuts dim 'n' of op 'e' \(size 64\) into tiles of "
                                            r"32 elements, not whole sticks of 64; the op writes "
                                            r"its output 'y'"):
        ap.plan(prog, spyre())


# --- properties --------------------------------------------------------------------------------

@st.composite
def nests(draw):
    """A chain of 2 to 4 ops over [m, n] in one two-level group with random depths, a level
    over both dims or a fallback among them."""
    m, n = draw(st.sampled_from([4, 8, 16])), 64 * draw(st.sampled_from([1, 2, 4]))
    tensors = {"x": ([m, n], "float32")}
    ops, cur = [], "x"
    for i in range(draw(st.integers(2, 4))):
        kind = draw(st.sampled_from(["exp", "neg", "add", "cumsum", "rowsum"]))
        if kind == "add":
            tensors[f"in{i}"] = ([m, n], "float32")
            ops.append({"name": f"o{i}", "op": "add", "out": f"t{i}[m,n]",
                        "ins": [f"{cur}[m,n]", f"in{i}[m,n]"]})
        elif kind == "rowsum":  # a row sum read back over the row
            ops.append({"name": f"s{i}", "op": "sum", "out": f"r{i}[m,0]",
                        "ins": [f"{cur}[m,n]"]})
            ops.append({"name": f"o{i}", "op": "mul", "out": f"t{i}[m,n]",
                        "ins": [f"{cur}[m,n]", f"r{i}[m,0]"]})
        else:
            ops.append({"name": f"o{i}", "op": kind, "out": f"t{i}[m,n]",
                        "ins": [f"{cur}[m,n]"]})
        cur = f"t{i}"
    names = [o["name"] for o in ops]
    if draw(st.booleans()):
        loops = [{"count": draw(st.sampled_from([1, 2])), "dims": ["m"]},
                 {"count": draw(st.sampled_from([1, 2, 4])), "dims": ["m"]}]
    else:
        loops = [{"count": 2, "dims": ["m", "n"]}]
    group = {"ops": names, "loops": loops}
    if len(loops) == 2:
        depths = {o: 1 for o in names if draw(st.booleans())}
        if depths:
            group["depths"] = depths
    prog = program(tensors, ops, [cur], tiling=[group])
    return prog, draw(st.integers(1, 8))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40, deadline=None)
@given(nests())
def test_every_nest_that_plans_runs_exactly(case):
    prog, cores = case
    try:
        p = ap.plan(prog, spyre(cores=cores))
    except (PlanningError, ProgramError) as e:
        event(f"refused: {str(e).split(':')[1][:40]}")
        return
    depths = {len(o.loop.count) for o in p.ops}
    event(f"depths {sorted(depths)}; on chip {bool(p.groups[0].lx_tensors)}")
    specs = p.loopspec()
    assert all(isinstance(s, LoopSpec | OpSpec) for s in specs)
    p.bundle_mlir()
    checks = p.check()
    assert all(c.ok for c in checks), checks
