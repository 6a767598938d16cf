"""Tests of pass coarse_tile: loop nests, per-iteration sizes, and every error path."""

from __future__ import annotations

from pathlib import Path

import pytest

from apportion.errors import PlanningError, ProgramError
from apportion.frontend.json_format import load
from apportion.ir.program import LoopLevel, TilingGroup
from apportion.passes.coarse_tile import coarse_tile
from apportion.passes.layouts import layouts
from apportion.passes.pipeline import plan
from apportion.plans.plan import LoopInfo
from apportion.target import spyre
from tests.helpers import program

ROOT = Path(__file__).parents[2]
A, B = 1024, 4096


def fused(loops: list[dict] | None = None, group: list[str] | None = None, **extra):
    """The two-op example: y = a + b, z = y * c, tiled [(2, [m]), (4, [n])] unless told."""
    t = {n: ([A, B], "float16") for n in "abc"}
    ops = [{"name": "add", "op": "add", "out": "y[m,n]", "ins": ["a[m,n]", "b[m,n]"]},
           {"name": "mul", "op": "mul", "out": "z[m,n]", "ins": ["y[m,n]", "c[m,n]"]}]
    loops = loops or [{"count": 2, "dims": ["m"]}, {"count": 4, "dims": ["n"]}]
    return program(t, ops, ["z"], tiling=[{"ops": group or ["add", "mul"], "loops": loops}],
                   **extra)


def test_example_file_is_the_two_op_example():
    assert load(ROOT / "examples/fused.json") == fused(name="fused")


def test_two_levels_give_counts_path_tiled_dims_and_per_tile_sizes():
    t = coarse_tile(fused())
    for op in ("add", "mul"):
        tile = t.tile(op)
        assert tile.loop == LoopInfo((0, 0), (2, 4), (("m",), ("n",)))
        assert tile.size_map == {"m": 512, "n": 1024}
        assert tile.reduction_level is None
    assert t.groups[0].counts == (2, 4) and t.groups[0].path == (0, 0)


def test_pipeline_divides_work_over_the_per_tile_space():
    p = plan(fused(), spyre(cores=32))
    for op in ("add", "mul"):
        o = p.op(op)
        assert o.sizes == {"m": 512, "n": 1024}
        assert o.split_map == {"m": 32, "n": 1} and o.cores == 32
        assert o.loop == LoopInfo((0, 0), (2, 4), (("m",), ("n",)))


def test_ops_outside_groups_keep_their_whole_space():
    p = plan(fused(loops=[{"count": 2, "dims": ["m"]}], group=["add"]), spyre())
    assert p.op("add").sizes == {"m": 512, "n": B} and p.op("add").loop is not None
    assert p.op("mul").sizes == {"m": A, "n": B} and p.op("mul").loop is None


def test_a_dim_tiled_at_two_levels_is_divided_twice():
    t = coarse_tile(fused(loops=[{"count": 2, "dims": ["n"]}, {"count": 4, "dims": ["n"]}]))
    assert t.tile("add").size_map == {"m": A, "n": B // 8}


def test_ops_without_a_tiled_letter_are_not_tiled_at_that_level():
    p = program({"x": ([64, 256], "float32"), "h": ([128], "float32")},
                [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                 {"name": "g", "op": "neg", "out": "g[p]", "ins": ["h[p]"]}],
                ["y", "g"],
                tiling=[{"ops": ["e", "g"], "loops": [{"count": 2, "dims": ["m"]},
                                                      {"count": 4, "dims": ["n", "p"]}]}])
    t = coarse_tile(p)
    assert t.tile("e").loop.tiled_dims == (("m",), ("n",))
    assert t.tile("g").loop.tiled_dims == ((), ("p",))
    assert t.tile("g").size_map == {"p": 32}


def test_symbolic_count_is_kept_and_planned_at_the_whole_size():
    t = coarse_tile(fused(loops=[{"count": "T", "dims": ["m"]}, {"count": 4, "dims": ["n"]}]))
    assert t.tile("add").loop.count == ("T", 4)
    assert t.tile("add").size_map == {"m": A, "n": 1024}


# --- errors --------------------------------------------------------------------------------

def test_ops_listed_out_of_program_order():
    with pytest.raises(ProgramError, match=r"not a contiguous run.*lists 'add' after 'mul'"):
        coarse_tile(fused(group=["mul", "add"]))


def test_gap_names_the_op_between_and_the_dependence():
    t = {n: ([64, 64], "float32") for n in "ab"}
    ops = [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["a[m,n]"]},
           {"name": "mid", "op": "neg", "out": "w[m,n]", "ins": ["y[m,n]"]},
           {"name": "f", "op": "add", "out": "z[m,n]", "ins": ["w[m,n]", "b[m,n]"]}]
    p = program(t, ops, ["z"], tiling=[{"ops": ["e", "f"], "count": 2, "dims": ["m"]}])
    with pytest.raises(ProgramError, match=r"op 'mid' \(not in the group\) sits between.*reads "
                                           r"'y' made by group op 'e'.*data dependence"):
        coarse_tile(p)


def test_count_not_dividing_names_op_dim_size_and_count():
    with pytest.raises(PlanningError, match=r"count 3 does not divide dim 'm' of op 'add' "
                                            r"\(size 1024\)"):
        coarse_tile(fused(loops=[{"count": 3, "dims": ["m"]}]))
    with pytest.raises(PlanningError, match=r"count 3 does not divide dim 'n'.*after outer"):
        coarse_tile(fused(loops=[{"count": 2, "dims": ["n"]}, {"count": 3, "dims": ["n"]}]))


def test_tiles_must_hold_whole_sticks():
    p = fused(loops=[{"count": 128, "dims": ["n"]}])  # 32 elements: half a float16 stick
    with pytest.raises(PlanningError, match=r"tiles of 32 elements, not whole sticks of 64"):
        coarse_tile(p, layouts(p, spyre()).ops)
    with pytest.raises(PlanningError, match="not whole sticks"):
        plan(p, spyre())


def test_disagreeing_sizes_of_one_letter_in_a_group():
    p = program({"a": ([64, 32], "float32"), "b": ([64, 64], "float32")},
                [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["a[m,n]"]},
                 {"name": "f", "op": "neg", "out": "z[m,n]", "ins": ["b[m,n]"]}],
                ["y", "z"], tiling=[{"ops": ["e", "f"], "count": 2, "dims": ["m"]}])
    with pytest.raises(ProgramError, match=r"dim 'n' has size 32 in op 'e' but 64 in op 'f'"):
        coarse_tile(p)


def test_a_dim_listed_twice_in_one_level():
    with pytest.raises(ProgramError, match="lists a dim twice"):
        coarse_tile(fused(loops=[{"count": 2, "dims": ["m", "m"]}]))


def test_an_op_with_two_dims_of_one_level_runs_an_inner_loop_of_its_own():
    # the level steps m; an inner loop then steps n, so every (m, n) tile is computed (the two
    # ops have the same dims there, so they share it)
    t = coarse_tile(fused(loops=[{"count": 2, "dims": ["m", "n"]}]))
    assert t.tile("add").loop == LoopInfo((0, 0), (2, 2), (("m",), ("n",)))
    assert t.tile("mul").loop == LoopInfo((0, 0), (2, 2), (("m",), ("n",)))
    assert t.tile("add").size_map == {"m": A // 2, "n": B // 2}


def test_op_in_two_groups():
    p = fused()
    p2 = type(p)(p.name, p.tensors, p.inputs, p.outputs, p.ops,
                 (*p.tiling, TilingGroup(("mul",), (LoopLevel(2, ("m",)),))))
    with pytest.raises(ProgramError, match=r"op 'mul' is in tiling group.*in groups 0 and 1"):
        coarse_tile(p2)


def test_no_op_of_the_group_has_the_tiled_dim():
    with pytest.raises(ProgramError, match=r"no op of the group has a dim tiled at loop level 0 "
                                           r"\(\['q'\]\); op dims: add: m, n"):
        coarse_tile(fused(loops=[{"count": 2, "dims": ["q"]}]))
    with pytest.raises(ProgramError, match="no op of the group has dim 'q' tiled"):
        coarse_tile(fused(loops=[{"count": 2, "dims": ["m", "q"]}]))


def test_readers_must_use_the_producers_letter_for_a_tiled_dim():
    p = program({"a": ([64, 64], "float32")},
                [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["a[m,n]"]},
                 {"name": "t", "op": "neg", "out": "z[n,m]", "ins": ["y[m,n]"]},
                 {"name": "u", "op": "neg", "out": "w[p,q]", "ins": ["y[q,p]"]}],
                ["z", "w"], tiling=[{"ops": ["e", "t", "u"], "count": 2, "dims": ["m"]}])
    with pytest.raises(ProgramError, match=r"op 'u' reads tensor 'y' axis 0 as 'q'.*'m', a tiled"):
        coarse_tile(p)


def reduction(fn: str, out: str = "s[m,0]", readers: list[dict] | None = None,
              loops: list[dict] | None = None):
    ops = [{"name": "r", "op": fn, "out": out, "ins": ["x[m,n]"]}, *(readers or [])]
    return program({"x": ([64, 256], "float32")}, ops, [out.split("[")[0]],
                   tiling=[{"ops": [o["name"] for o in ops],
                            "loops": loops or [{"count": 4, "dims": ["n"]}]}])


def test_unsupported_tiled_reductions_are_refused_before_planning():
    with pytest.raises(PlanningError, match=r"op 'r' \(argmax\) is tiled over its reduction dim "
                                            r"'n'.*not supported"):
        coarse_tile(reduction("argmax"))


def test_reading_an_accumulator_inside_its_loop_is_refused():
    readers = [{"name": "u", "op": "exp", "out": "e[m,0]", "ins": ["s[m,0]"]}]
    with pytest.raises(PlanningError, match=r"op 'u' reads 's' inside the loop over 'n'.*"
                                            r"complete only after"):
        coarse_tile(reduction("sum", readers=readers))


def test_tiled_softmax_over_its_reduction_dim_is_refused():
    p = load(ROOT / "examples/softmax_tiled.json")
    p2 = type(p)(p.name, p.tensors, p.inputs, p.outputs, p.ops,
                 (TilingGroup(p.tiling[0].ops, (LoopLevel(2, ("n",)),)),))
    with pytest.raises(PlanningError, match=r"op 'shift' reads 'mx' inside the loop"):
        coarse_tile(p2)


def test_accumulating_op_must_be_tiled_at_every_inner_level():
    # r is given the inner level over p, which it lacks (left to the planner, it would leave it)
    readers = [{"name": "g", "op": "neg", "out": "g[p]", "ins": ["h[p]"]}]
    p = program({"x": ([64, 256], "float32"), "h": ([64], "float32")},
                [{"name": "r", "op": "sum", "out": "s[m,0]", "ins": ["x[m,n]"]}, *readers],
                ["s", "g"], tiling=[{"ops": ["r", "g"], "depths": {"r": 2}, "loops": [
                    {"count": 2, "dims": ["n"]}, {"count": 2, "dims": ["p"]}]}])
    with pytest.raises(PlanningError, match=r"op 'r' accumulates over 'n'.*add each tile 2 times"):
        coarse_tile(p)


def test_fallback_ops_are_tiled_on_all_but_the_dim_they_work_along():
    p = program({"x": ([8, 64], "float32")},
                [{"name": "s", "op": "fallback", "fn": "sort", "out": "y[m,n]", "ins": ["x[m,n]"]}],
                ["y"], tiling=[{"ops": ["s"], "count": 2, "dims": ["m"]}])
    assert coarse_tile(p).tile("s").size_map == {"m": 4, "n": 64}
    p = program({"x": ([8, 64], "float32")},
                [{"name": "s", "op": "fallback", "fn": "sort", "out": "y[m,n]", "ins": ["x[m,n]"]}],
                ["y"], tiling=[{"ops": ["s"], "count": 2, "dims": ["n"]}])
    # sort works along n: it stays whole there, every iteration
    assert coarse_tile(p).tile("s").size_map == {"m": 8, "n": 64}


def test_matmul_k_tiling_records_the_reduction_level():
    p = program({"x": ([64, 256], "float16"), "w": ([256, 128], "float16")},
                [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]}],
                ["h"], tiling=[{"ops": ["mm"], "loops": [{"count": 2, "dims": ["m"]},
                                                         {"count": 4, "dims": ["k"]}]}])
    tile = coarse_tile(p).tile("mm")
    assert tile.reduction_level == 1 and tile.size_map == {"m": 32, "n": 128, "k": 64}
