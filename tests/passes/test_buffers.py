"""Tests of pass buffers: tile, full and accumulator roles, copies, inits and combines."""

from __future__ import annotations

import math

import pytest

from apportion.ir.kinds import REDUCERS, Category, kind
from apportion.passes.buffers import buffer_roles, loop_steps
from apportion.passes.coarse_tile import coarse_tile
from apportion.passes.pipeline import plan
from apportion.plans.memory import CombineOp, CopyOp, FinishOp, InitOp
from apportion.target import spyre
from tests.helpers import program
from tests.passes.test_coarse_tile import fused


def roles_of(p):
    return buffer_roles(p, coarse_tile(p))


def test_fused_intermediate_is_a_tile_and_the_output_is_written_into_its_slice():
    r = roles_of(fused())
    assert (r["y"].role, r["y"].copy, r["y"].inside) == ("tile", False, ("mul",))
    assert (r["z"].role, r["z"].outside) == ("full", ("<output>",))
    assert all(r[t].role == "full" and r[t].group is None for t in "abc")


def chain(outputs: list[str], group: list[str]):
    """y = exp(x); z = neg(y); w = y + z: group ``group``, y read where the test wants it."""
    ops = [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
           {"name": "n", "op": "neg", "out": "z[m,n]", "ins": ["y[m,n]"]},
           {"name": "w", "op": "add", "out": "w[m,n]", "ins": ["y[m,n]", "z[m,n]"]}]
    return program({"x": ([64, 128], "float32")}, ops, outputs,
                   tiling=[{"ops": group, "count": 4, "dims": ["m"]}])


def test_read_inside_and_after_gets_a_tile_a_full_buffer_and_a_copy():
    p = chain(["w"], ["e", "n"])
    r = roles_of(p)
    assert (r["y"].role, r["y"].copy, r["y"].inside, r["y"].outside) == \
        ("tile", True, ("n",), ("w",))
    g = coarse_tile(p).groups[0]
    assert loop_steps(p, g, r) == ((), (), (CopyOp((0,), "e", "y"),), ())
    pl = plan(p, spyre())
    assert {b.kind for b in pl.buffers_of("y")} == {"tile", "full"}
    assert pl.groups[0].copies == (CopyOp((0,), "e", "y"),)


def test_program_output_read_inside_is_copied_out():
    r = roles_of(chain(["y", "w"], ["e", "n", "w"]))
    assert r["y"].role == "tile" and r["y"].copy and r["y"].outside == ("<output>",)
    assert r["z"].role == "tile" and not r["z"].copy


def test_read_only_after_the_loop_is_written_straight_into_the_full_buffer():
    r = roles_of(chain(["w"], ["e"]))
    assert (r["y"].role, r["y"].copy) == ("full", False)


def test_a_tensor_nobody_reads_is_a_tile():
    p = program({"x": ([64, 128], "float32")},
                [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                 {"name": "n", "op": "neg", "out": "z[m,n]", "ins": ["x[m,n]"]}],
                ["z"], tiling=[{"ops": ["e", "n"], "count": 2, "dims": ["m"]}])
    assert roles_of(p)["y"].role == "tile"


def matmul_k(loops):
    return program({"x": ([64, 256], "float16"), "w": ([256, 128], "float16")},
                   [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
                    {"name": "act", "op": "relu", "out": "a[m,n]", "ins": ["h[m,n]"]}],
                   ["a"], tiling=[{"ops": ["mm"], "loops": loops}])


def test_tiled_matmul_k_gets_an_accumulator_an_init_and_a_combine():
    p = matmul_k([{"count": 4, "dims": ["k"]}])
    r = roles_of(p)
    assert r["h"].role == "accumulator" and r["h"].outside == ("act",)
    inits, combines, copies, finishes = loop_steps(p, coarse_tile(p).groups[0], r)
    assert inits == (InitOp((0,), "mm", "h", "sum", 0.0, 0),)
    assert combines == (CombineOp((0,), "mm", "h", "sum"),) and copies == ()
    # a float16 result accumulates in float32 and is cast once, after the loop
    assert finishes == (FinishOp((0,), "mm", "h", "sum", 256),)
    pl = plan(p, spyre())
    acc, full = pl.buffer("h", "accumulator"), pl.buffer("h", "full")
    # the float32 accumulator (the whole output here) fits the scratchpad: each core keeps its
    # part there and the finish copies it out
    assert (acc.space, acc.dtype, acc.shape) == ("lx", "float32", (64, 128))
    assert acc.nbytes < 64 * 128 * 4
    assert (full.dtype, full.nbytes) == ("", 64 * 128 * 2)
    assert pl.op("mm").sizes == {"m": 64, "n": 128, "k": 64}


def test_integer_accumulators_on_chip_are_copied_out_else_are_the_result_itself():
    import dataclasses
    p = program({"x": ([64, 256], "int32")},
                [{"name": "r", "op": "sum", "out": "s[m,0]", "ins": ["x[m,n]"]}], ["s"],
                tiling=[{"ops": ["r"], "count": 4, "dims": ["n"]}])
    (fin,) = loop_steps(p, coarse_tile(p).groups[0], roles_of(p))[3]
    assert (fin.tensor, fin.level) == ("s", 0)
    pl = plan(p, spyre())
    assert [(b.kind, b.space) for b in pl.buffers_of("s")] == [("accumulator", "lx"),
                                                              ("full", "hbm")]
    no_room = dataclasses.replace(spyre(), scratchpad_bytes=64, scratchpad_reserve=0.0)
    pl = plan(p, no_room)
    assert [b.kind for b in pl.buffers_of("s")] == ["accumulator"] and not pl.groups[0].finishes


def test_a_tiled_mean_sums_then_divides_after_the_loop():
    p = program({"x": ([64, 256], "float32")},
                [{"name": "r", "op": "mean", "out": "s[m,0]", "ins": ["x[m,n]"]}], ["s"],
                tiling=[{"ops": ["r"], "count": 4, "dims": ["n"]}])
    inits, combines, _, finishes = loop_steps(p, coarse_tile(p).groups[0], roles_of(p))
    assert inits[0].identity == 0.0 and combines[0].fn == "mean"
    assert finishes == (FinishOp((0,), "r", "s", "mean", 256),)


def test_a_reduction_tiled_inside_an_outer_loop_restarts_at_its_level():
    p = matmul_k([{"count": 2, "dims": ["m"]}, {"count": 4, "dims": ["k"]}])
    inits = loop_steps(p, coarse_tile(p).groups[0], roles_of(p))[0]
    assert inits[0].level == 1


@pytest.mark.parametrize("fn", ["sum", "mean", "max", "min", "prod", "any"])
def test_identities_come_from_the_ir(fn):
    p = program({"x": ([64, 256], "float32")},
                [{"name": "r", "op": fn, "out": "s[m,0]", "ins": ["x[m,n]"]}], ["s"],
                tiling=[{"ops": ["r"], "count": 4, "dims": ["n"]}])
    (init,), (comb,), _, _ = loop_steps(p, coarse_tile(p).groups[0], roles_of(p))
    assert init.identity == REDUCERS[fn].identity
    assert comb.fn == fn and init.fn == fn


def test_identity_of_each_reduction():
    def identity(name: str) -> float:
        return kind(name).reducer.identity

    assert identity("sum") == 0.0 and identity("prod") == 1.0 and identity("matmul") == 0.0
    assert kind("max", Category.REDUCTION).reducer.identity == -math.inf
    assert kind("min", Category.REDUCTION).reducer.identity == math.inf
