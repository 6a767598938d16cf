"""The parallel IR (scf.forall on tensors): golden text, every example verified, the threads'
slice geometry against plans.views, structure, writes through a merge of dims (split views and
the tiles it refuses), kinds it refuses, and sequential schedules of a forall (any order of
cores gives the same numbers)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.cli.main import main
from apportion.errors import EmitError, ExecutionError, PlanningError, ProgramError
from apportion.frontend.json_format import from_dict, to_dict
from apportion.ir.kinds import KINDS
from apportion.mlir.bodies import supported
from apportion.mlir.builder import Block, Builder
from apportion.mlir.forall import thread_slices, verify_mlir
from apportion.mlir.forall.merge import merged_tile, reassociation, split_view, written
from apportion.mlir.forall.tensors import TensorVal, iree_safe_map
from apportion.mlir.index import Ix
from apportion.planned import PlannedProgram
from apportion.plans.views import core_slices, dim_slices
from apportion.runtime.reference import (
    bind_inputs,
    evaluate_op,
    random_inputs,
    run_op_boxes,
)
from tests.backends.iree.emitting import emit
from tests.backends.merged import (
    EXAMPLE,
    looped_program,
    merged_program,
    plan_in_loops,
    split_k_program,
)
from tests.backends.sums import DYNAMIC, SUM3, sums_program, tiled_sums_program
from tests.helpers import program, run_sliced

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted(ROOT.joinpath("examples").glob("*.json"))

GOLDEN = """\
func.func @golden(%x: tensor<10x128xf16>) -> tensor<10x1xf16> {
  %e_init = tensor.empty() : tensor<10x128xf16>
  %e = scf.forall (%e_i) in (3) shared_outs(%e_shared = %e_init) -> (tensor<10x128xf16>) {
    %e_i_lo = affine.min affine_map<(d0) -> (d0 * 4, d0 * 3 + 1)>(%e_i)
    %e_i_len = affine.min affine_map<(d0, d1) -> (-((d0 + 2) floordiv 3) + 4, -d1 + 10)>(%e_i, \
%e_i_lo)
    %x_s = tensor.extract_slice %x[%e_i_lo, 0][%e_i_len, 128][1, 1] : tensor<10x128xf16> to \
tensor<?x128xf16>
    %e_o = tensor.extract_slice %e_shared[%e_i_lo, 0][%e_i_len, 128][1, 1] : \
tensor<10x128xf16> to tensor<?x128xf16>
    %e_1 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, \
d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%x_s : tensor<?x128xf16>) \
outs(%e_o : tensor<?x128xf16>) {
    ^bb0(%in: f16, %out: f16):
      %v = arith.extf %in : f16 to f32
      %r = math.exp %v : f32
      %v_1 = arith.truncf %r : f32 to f16
      linalg.yield %v_1 : f16
    } -> tensor<?x128xf16>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %e_1 into %e_shared[%e_i_lo, 0][%e_i_len, 128][1, 1] : \
tensor<?x128xf16> into tensor<10x128xf16>
    }
  }
  %s_init = tensor.empty() : tensor<10x1xf16>
  %s_parts_init = tensor.empty() : tensor<2x10xf32>
  %s_parts = scf.forall (%s_j) in (2) shared_outs(%s_part = %s_parts_init) -> \
(tensor<2x10xf32>) {
    %e_off = affine.apply affine_map<(d0) -> (d0 * 64)>(%s_j)
    %e_s = tensor.extract_slice %e[0, %e_off][10, 64][1, 1] : tensor<10x128xf16> to \
tensor<10x64xf16>
    %s_init_1 = tensor.empty() : tensor<10xf32>
    %cst = arith.constant 0.0 : f32
    %s_fill = linalg.fill ins(%cst : f32) outs(%s_init_1 : tensor<10xf32>) -> tensor<10xf32>
    %s_acc = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, \
affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%e_s : \
tensor<10x64xf16>) outs(%s_fill : tensor<10xf32>) {
    ^bb0(%in_1: f16, %out_1: f32):
      %v_2 = arith.extf %in_1 : f16 to f32
      %r_1 = arith.addf %out_1, %v_2 : f32
      linalg.yield %r_1 : f32
    } -> tensor<10xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %s_acc into %s_part[%s_j, 0][1, 10][1, 1] : tensor<10xf32> \
into tensor<2x10xf32>
    }
  }
  %s_comb_init = tensor.empty() : tensor<10xf32>
  %cst_1 = arith.constant 0.0 : f32
  %s_comb_fill = linalg.fill ins(%cst_1 : f32) outs(%s_comb_init : tensor<10xf32>) -> \
tensor<10xf32>
  %s_red = linalg.reduce ins(%s_parts : tensor<2x10xf32>) outs(%s_comb_fill : tensor<10xf32>) \
dimensions = [0]
    (%in_2: f32, %acc: f32) {
      %r_2 = arith.addf %acc, %in_2 : f32
      linalg.yield %r_2 : f32
    }
  %s_o = tensor.extract_slice %s_init[0, 0][10, 1][1, 1] : tensor<10x1xf16> to tensor<10xf16>
  %s_fin = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> \
(d0)>], iterator_types = ["parallel"]} ins(%s_red : tensor<10xf32>) outs(%s_o : \
tensor<10xf16>) {
  ^bb0(%in_3: f32, %out_2: f16):
    %v_3 = arith.truncf %in_3 : f32 to f16
    linalg.yield %v_3 : f16
  } -> tensor<10xf16>
  %s = tensor.insert_slice %s_fin into %s_init[0, 0][10, 1][1, 1] : tensor<10xf16> into \
tensor<10x1xf16>
  return %s : tensor<10x1xf16>
}
"""


def resplit(planned: PlannedProgram, splits: dict[str, dict[str, int]]) -> PlannedProgram:
    """``planned`` with the splits of some ops replaced (``{op: {dim: slices}}``, others 1):
    uneven splits and split reductions that pins (which must divide) cannot ask for."""
    ops = tuple(dataclasses.replace(o, splits=tuple((d, splits[o.name].get(d, 1))
                                                    for d, _ in o.splits))
                if o.name in splits else o for o in planned.plan.ops)
    return PlannedProgram(planned.program, planned.target,
                          dataclasses.replace(planned.plan, ops=ops))


def golden() -> PlannedProgram:
    """exp split unevenly over rows (4, 3, 3), then a row sum split over its reduction dim."""
    p = program({"x": ([10, 128], "float16")},
                [{"name": "e", "op": "exp", "out": "e[i,j]", "ins": ["x[i,j]"]},
                 {"name": "s", "op": "sum", "out": "s[i,0]", "ins": ["e[i,j]"]}], ["s"],
                name="golden")
    return resplit(ap.plan(p, ap.targets.spyre(cores=4)), {"e": {"i": 3}, "s": {"j": 2}})


def fused(count: int | str = 2) -> ap.Program:
    p = ap.load(ROOT / "examples/fused.json")
    d = to_dict(p)
    d["tiling"] = [{"ops": ["add", "mul"], "loops": [{"count": count, "dims": ["m"]}]}]
    return from_dict(d)


ELEMS = {"float16": 64, "bfloat16": 64, "float32": 32, "int8": 128, "int32": 32, "int64": 16,
         "bool": 128}  # elements per 128-byte stick


@st.composite
def small_programs(draw, merge: bool | None = None):
    """One matmul, reduction or broadcasting pointwise op over small random shapes and dtypes,
    with the reduction dim's split pinned (a split reduction) half the time. Half the time
    (always with ``merge``, never with ``merge=False``) the op writes its output through a
    merge of dims: a matmul or pointwise op ``y[i, n*h+j]`` (or ``y[m*h+i, j]``) over operands
    with one more axis h, a reduction ``y[g*i+h]``; h (of size 1 to 3) split over cores
    sometimes."""
    kind = draw(st.sampled_from(["matmul", "reduction", "pointwise"]))
    dtypes = {"matmul": ["float16", "bfloat16", "float32", "int32", "int64"],
              "reduction": ["float16", "bfloat16", "float32", "int8", "int32", "bool"],
              "pointwise": sorted(ELEMS)}[kind]
    dt = draw(st.sampled_from(dtypes))
    m = draw(st.integers(1, 9))
    split = draw(st.sampled_from([1, 2, 3, 4]))
    pad = draw(st.sampled_from([0, 1, ELEMS[dt] - 1]))  # a padded last stick
    length = max(1, ELEMS[dt] * split * draw(st.integers(1, 2)) - pad)
    merged = draw(st.booleans()) if merge is None else merge
    g = draw(st.integers(1, 3)) if merged else 1
    h, gh = (["h"], [g]) if merged else ([], [])  # the merged digit's index and size
    if kind == "matmul":
        n = draw(st.integers(1, 3 * ELEMS[dt]))
        out = f"y[i,{n}*h+j]" if merged else "y[i,j]"
        p = program({"x": ([m, *gh, length], dt), "w": ([*gh, length, n], dt)},
                    [{"name": "op", "op": "matmul", "out": out,
                      "ins": [f"x[{','.join(['i', *h, 'r'])}]",
                              f"w[{','.join([*h, 'r', 'j'])}]"]}], ["y"])
        red: str | None = "r"
    elif kind == "reduction":
        floats = dt in ("float16", "bfloat16", "float32")  # integer products overflow
        fn = draw(st.sampled_from(["sum", "mean", "max", "min", "any", "argmax"]
                                  + (["prod"] if floats else [])))
        row = f"{g}*i+h" if merged else "i"
        out = f"y[{row}]" if fn == "argmax" else f"y[{row},0]"
        p = program({"x": ([m, *gh, length], dt)},
                    [{"name": "op", "op": fn, "out": out,
                      "ins": [f"x[{','.join(['i', *h, 'j'])}]"]}], ["y"])
        red = "j"
    else:
        fn = draw(st.sampled_from(["add", "mul", "max", "sub", "eq", "lt", "where"]))
        n = draw(st.integers(1, 3 * ELEMS[dt]))
        at = ",".join(["i", *h, "j"])
        tensors = {"x": ([m, *gh, n], dt), "z": ([1, *gh, n], dt)}
        ins = [f"x[{at}]", f"z[{','.join(['0', *h, 'j'])}]"]
        if fn == "where":
            tensors["c"] = ([m, *gh, n], "bool")
            ins = [f"c[{at}]", *ins]
        out = "y[i,j]"
        if merged:
            out = f"y[{m}*h+i,j]" if draw(st.booleans()) else f"y[i,{n}*h+j]"
        p = program(tensors, [{"name": "op", "op": fn, "out": out, "ins": ins}], ["y"])
        red = None
    pins = {red: split} if red is not None and split > 1 else {}
    if draw(st.booleans()):
        pins["i"] = draw(st.integers(1, 3))
    if merged and draw(st.booleans()):
        pins["h"] = draw(st.sampled_from([k for k in range(1, g + 1) if g % k == 0]))
    if pins:
        d = to_dict(p)
        d["work_division"] = {"op": pins}
        p = from_dict(d)
    return p


def plan_small(p: ap.Program, cores: int) -> PlannedProgram:
    """Plan for Spyre, letting padded reduction dims split; refused plans are skipped."""
    target = dataclasses.replace(ap.targets.spyre(cores=cores), split_padded_reduction=True)
    try:
        return ap.plan(p, target)
    except (PlanningError, ProgramError):
        assume(False)
        raise AssertionError("unreachable") from None


@st.composite
def resplit_programs(draw) -> PlannedProgram:
    """A small program's plan with every op's splits redrawn within its units: uneven splits
    and several split reduction dims, which the planner never picks."""
    planned = plan_small(draw(small_programs()), draw(st.integers(1, 8)))
    return resplit(planned, {o.name: {d: draw(st.integers(1, min(u, 4)))
                                      for d, u in o.unit_map.items()}
                             for o in planned.ops})


# --- text ------------------------------------------------------------------------------------

def test_golden_text_verifies():
    text = emit(golden().program, golden().plan, golden().target)
    assert text == GOLDEN
    verify_mlir(text)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_emits_and_verifies(path):
    planned = ap.plan(ap.load(path), ap.targets.spyre(cores=32))
    text = planned.forall_mlir()  # verifies
    assert text.startswith(f"func.func @{planned.program.name}(")
    assert text.count("scf.forall (") >= sum(o.cores > 1 for o in planned.ops)


def test_one_induction_variable_per_split_dim():
    text = golden().forall_mlir()
    foralls = re.findall(r"scf\.forall \(([^)]*)\) in \(([^)]*)\)", text)
    assert foralls == [("%e_i", "3"), ("%s_j", "2")]  # dims split 1 get none
    assert "tensor.parallel_insert_slice %s_acc into %s_part[%s_j, 0][1, 10]" in text
    assert "linalg.reduce ins(%s_parts : tensor<2x10xf32>)" in text
    # uneven: the start and the size are affine.min of the thread id
    assert "%e_i_lo = affine.min affine_map<(d0) -> (d0 * 4, d0 * 3 + 1)>(%e_i)" in text


def test_an_op_on_one_core_has_no_forall():
    planned = resplit(golden(), {"e": {}, "s": {}})
    text = planned.forall_mlir()
    assert "scf.forall" not in text and "linalg.reduce" not in text
    assert planned.check()[0].ok


def test_sums_of_dims_read_a_wider_slice_through_the_access_map():
    text = ap.plan(ap.load(ROOT / "examples/attention.json"),
                   ap.targets.spyre(cores=32)).forall_mlir()
    # q[t, 128*h+d]: the map keeps the sum; d, named alone nowhere, gets a shape operand
    assert "affine_map<(d0, d1, d2, d3) -> (d1, d0 * 128 + d3)>" in text
    assert "affine_map<(d0, d1, d2, d3) -> (d3)>" in text and "tensor<128xi8>" in text


def test_maps_iree_cannot_analyse_are_told_apart():
    # IREE 3.13 crashes where a sum's outermost + has a dim (times a constant) on one side only
    assert iree_safe_map(["d1", "d0 * 128 + d3"]) and iree_safe_map(["d0 + d1", "d2 * 2 + d3"])
    assert iree_safe_map(["d0 * 2", "d1"]) and iree_safe_map([])
    assert not iree_safe_map(["d1", "d0 * 64 + d2 * 32 + d3"])  # three terms
    assert not iree_safe_map(["d0", "d0 + d1"])  # a dim of the sum used again
    assert not iree_safe_map(["d0 + d1", "d1 + d2"])
    assert not iree_safe_map(["d0 floordiv 2"])  # a form reads never write: assumed unsafe


def input_maps(text: str) -> list[list[str]]:
    """The results of every indexing map of every linalg.generic in ``text``."""
    out = []
    for maps in re.findall(r"indexing_maps = \[(.*?)\], iterator_types", text):
        for results in re.findall(r"-> \(([^)]*)\)>", maps):
            out.append([r for r in results.split(", ") if r])
    return out


def test_reads_through_sums_of_three_dims_are_gathers_with_plain_maps():
    """x[b, 64*a+32*c+d] is copied by a tensor.extract into a tensor of one axis per dim and read
    back through a projection, in every op category, loop nest and beside run-time sizes."""
    planned = [ap.plan(from_dict(SUM3), ap.targets.spyre(cores=c)) for c in (1, 8, 32)]
    planned += [ap.plan(sums_program(split=c > 1), ap.targets.spyre(cores=c)) for c in (1, 8)]
    planned += [ap.plan(tiled_sums_program(), ap.targets.spyre(cores=4)),
                ap.plan(from_dict(DYNAMIC), ap.targets.resolve("gpu", None))]
    for p in planned:
        text = p.forall_mlir()  # verifies
        maps = input_maps(text)
        assert maps and all(iree_safe_map(m) for m in maps), p.program.name
        assert "affine_map<(d0, d1, d2, d3) -> (d0 * 64 + d2 * 32 + d3)>" in text
    text = planned[0].forall_mlir()
    assert "%x_1 = tensor.extract %x[%i1, %at] : tensor<16x128xf32>" in text
    assert ["d0", "d1", "d2", "d3"] in input_maps(text)
    # a sum of two dims stays in the map (IREE analyses it)
    text = ap.plan(ap.load(ROOT / "examples/attention.json"), ap.targets.spyre(cores=32)
                   ).forall_mlir()
    assert "tensor.extract " not in text and ["d1", "d0 * 128 + d3"] in input_maps(text)


def test_symbolic_counts_are_trailing_index_arguments():
    text = ap.plan(fused("T"), ap.targets.spyre(cores=8)).forall_mlir()
    assert text.startswith("func.func @fused(%a: tensor<1024x4096xf16>, "
                           "%b: tensor<1024x4096xf16>, %c: tensor<1024x4096xf16>, %T: index)")
    assert re.search(r"scf\.for %i0 = %c0 to %T step %c1 iter_args\(%z_it = %z_fill\)", text)
    assert "arith.divui %c1024, %T : index" in text
    # y is one iteration's tile: a fresh tensor each iteration, bounded by the whole dim
    assert "%y_tile_init = tensor.empty() : tensor<1024x4096xf16>" in text


def test_a_tiled_reduction_accumulates_in_iter_args():
    p = program({"x": ([64, 256], "float16")},
                [{"name": "r", "op": "sum", "out": "s[m,0]", "ins": ["x[m,n]"]}], ["s"],
                tiling=[{"ops": ["r"], "loops": [{"count": 2, "dims": ["m"]},
                                                 {"count": 2, "dims": ["n"]}]}])
    planned = ap.plan(p, ap.targets.spyre(cores=4))
    assert planned.groups[0].inits[0].level == 1
    text = planned.forall_mlir()
    assert "iter_args(%s_acc_1 = %s_acc_fill)" not in text  # reset inside the outer loop
    assert re.search(r"%s_reset\w* = linalg\.fill", text)
    assert "tensor<64x1xf32>" in text  # the float32 accumulator
    assert re.search(r"arith\.truncf %\w+ : f32 to f16", text)  # finished after the nest


@settings(deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                HealthCheck.too_slow])
@given(resplit_programs())
def test_any_split_of_any_small_program_emits_verified_ir(planned):
    text = planned.forall_mlir()  # verifies
    op = planned.ops[0]
    foralls = re.findall(r"scf\.forall \(([^)]*)\) in \(([^)]*)\)", text)
    split = [n for _, n in op.splits if n > 1]
    assert foralls == ([(", ".join(f"%op_{d}" for d, n in op.splits if n > 1),
                         ", ".join(map(str, split)))] if split else [])


def test_every_registry_kind_has_a_body():
    # but numpy's random generators, which the emitter refuses by name (refusals:
    # test_forall_ops.py)
    assert [k.name for k in KINDS if not supported(k)] == ["uniform", "normal"]


def test_a_plan_for_another_target_is_refused():
    planned = golden()
    with pytest.raises(ExecutionError, match="not 'spyre' with 8"):  # lowering refuses it
        emit(planned.program, planned.plan, ap.targets.spyre(cores=8))


def test_cli_emit_forall(capsys):
    assert main(["emit", str(ROOT / "examples/softmax_tiled.json"), "--cores", "8",
                 "--forall"]) == 0
    text = capsys.readouterr().out
    verify_mlir(text)
    assert "scf.for %i0" in text and "scf.forall" in text


# --- outputs written through a merge of dims ---------------------------------------------------

def test_a_merged_write_expands_its_destination_and_collapses_it_back():
    planned = ap.plan(from_dict(EXAMPLE), ap.targets.spyre(cores=8))
    text = planned.forall_mlir()  # verifies
    assert ("%y_split = tensor.expand_shape %y_init [[0], [1, 2]] output_shape [8, 4, 64] : "
            "tensor<8x256xf32> into tensor<8x4x64xf32>") in text
    # the forall writes the split view with the split index, one thread per t
    assert re.search(r"scf\.forall \(%m_t\) in \(8\) shared_outs\(%y_shared = %y_split\) -> "
                     r"\(tensor<8x4x64xf32>\)", text)
    assert "tensor.parallel_insert_slice %y_1 into %y_shared[%m_t, 0, 0][1, 4, 64]" in text
    assert "tensor.collapse_shape %y [[0], [1, 2]] : tensor<8x4x64xf32> into tensor<8x256xf32>" \
        in text
    # the consumer reads y as a plain [8, 256] tensor
    assert re.search(r"tensor\.extract_slice %y_\d+\[%\w+, 0\]\[1, 256\]", text)


@pytest.mark.parametrize("cores", [1, 8, 32])
def test_every_merged_write_emits_verified_ir(cores):
    planned = ap.plan(merged_program(), ap.targets.spyre(cores=cores))
    text = planned.forall_mlir()  # verifies
    merging = [op for op in planned.program.ops if op.merges_output]
    assert text.count("tensor.expand_shape") == text.count("tensor.collapse_shape") == \
        len(merging)
    # several merged axes in one output; size-1 digits stay axes of the split view
    assert "tensor<6x256xbf16> into tensor<2x3x4x64xbf16>" in text
    assert "[[0], [1, 2, 3]] output_shape [8, 4, 64, 1]" in text
    assert "[[0], [1, 2]] output_shape [8, 32, 1]" in text


def test_split_k_partials_written_through_a_merge_emit_verified_ir():
    planned = ap.plan(split_k_program(), ap.targets.spyre(cores=32))
    assert planned.op("mm.partial").split_k is not None
    text = planned.forall_mlir()
    assert "tensor<4x4x128xf32> into tensor<4x4x2x64xf32>" in text  # the partials, split
    assert "tensor<4x128xf16> into tensor<4x2x64xf16>" in text  # the combine's output


def test_a_size_one_dim_with_a_coefficient_is_written_as_its_dim():
    # y[t, 3*u] with u of size 1 writes through no merge but needs the split view's index
    p = program({"x": ([8, 1], "float32")},
                [{"name": "m", "op": "exp", "out": "y[t,3*u]", "ins": ["x[t,u]"]}], ["y"])
    planned = ap.plan(p, ap.targets.spyre(cores=2))
    op = written(p.ops[0])
    assert str(op.out) == "y[t, u]" and reassociation(p.ops[0]) == [[0], [1]]
    text = planned.forall_mlir()  # verifies
    assert "expand_shape" not in text and "affine_map<(d0, d1) -> (d0, d1)>" in text


def test_merged_writes_in_loop_nests_emit_verified_ir():
    planned = plan_in_loops(looped_program(), ap.targets.spyre(cores=8))
    assert len(planned.groups) == 4
    text = planned.forall_mlir()
    # one iteration's tile of t: made split, collapsed to a [32, 256] tile of y
    assert "tensor.collapse_shape %y [[0], [1, 2]] : tensor<32x4x64xf16> into " \
        "tensor<32x256xf16>" in text
    # the accumulator's reset inside the outer loop fills the split view's tile (a float32
    # sum accumulates in f64)
    assert re.search(r"%s_reset\w* = linalg\.fill .* -> tensor<8x4x64xf64>", text)


def test_a_loop_tile_that_cuts_an_inner_digit_of_a_merge_is_refused():
    planned = ap.plan(from_dict(EXAMPLE), ap.targets.spyre(cores=8))
    blk = Block(Builder(), 1)
    op = planned.program.op("m")
    # a tile of 2 values of h but half of d: no contiguous part of y's axis 1
    view = TensorVal("%v", (Ix(8), Ix(2), Ix(32)), "f32", (Ix(0), Ix(2), Ix(32)))
    with pytest.raises(EmitError, match=r"op 'm' writes tensor 'y' through a merge of dims on "
                                        r"axis 1 \(64\*h\+d\), but its loop tile takes 2 values "
                                        r"of dim 'h' and only part of dim 'd'"):
        merged_tile(blk, op, view)
    # a tile of one h and part of d is contiguous: origin 64*2 + 32
    one = merged_tile(blk, op, TensorVal("%v", (Ix(8), Ix(1), Ix(32)), "f32",
                                         (Ix(0), Ix(2), Ix(32))))
    assert one.shape == (Ix(8), Ix(32)) and one.origin == (Ix(0), Ix(160))
    part = TensorVal("%p", (Ix(8), Ix(128)), "f32", (Ix(0), Ix(128)))
    with pytest.raises(EmitError, match=r"op 'm' writes tensor 'y' through a merge of dims on "
                                        r"axis 1 \(64\*h\+d\), but its destination holds only a "
                                        r"part of that axis"):
        split_view(blk, op, part)


# --- index geometry --------------------------------------------------------------------------

def test_index_expressions_render_as_affine_maps():
    i, j = Ix.atom("%i"), Ix.atom("%j")
    names = {"%i": "d0", "%j": "d1"}
    assert (i * 4 - j + 3).render(names) == "d0 * 4 - d1 + 3"
    assert (10 - (i + 2).floordiv(3) * 4).render(names) == "-((d0 + 2) floordiv 3) * 4 + 10"
    assert (i * 6 + 3).floordiv(3) == i * 2 + 1  # exact divisions fold
    assert (i * 4 + j).evaluate({"%i": 2, "%j": 1}) == 9


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "run-time"])
def test_thread_slices_are_the_plans_slices(dynamic):
    for n in range(1, 70):
        for per in (1, 3, 8, 64):
            units = -(-n // per)
            for split in range(1, 7):
                if split > units and not dynamic:  # a plan never splits past its units
                    continue
                expected = [(lo, hi - lo) for lo, hi in dim_slices(n, per, split)]
                assert thread_slices(n, per, split, dynamic) == expected, (n, per, split)


# --- sequential schedules ----------------------------------------------------------------------

def run_in_order(planned: PlannedProgram, inputs, rng: np.random.Generator) -> dict:
    """The plan run op by op with each op's cores in a random order (a sequential schedule of
    its forall)."""
    p = planned.program
    env = bind_inputs(p, inputs)
    for op in p.ops:
        if not op.kind.divisible:
            env[op.out.tensor] = evaluate_op(op, p, env)
            continue
        boxes = core_slices(planned.op(op.name))
        order = [int(i) for i in rng.permutation(len(boxes))]
        env[op.out.tensor] = run_op_boxes(op, p, env, boxes, order=order)
    return env


@settings(deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                HealthCheck.too_slow])
@given(resplit_programs(), st.integers(0, 2**32 - 1))
def test_cores_run_in_any_order_give_identical_results(planned, seed):
    p = planned.program
    inputs = random_inputs(p, seed % 4)
    expected = run_sliced(p, planned.plan, inputs)
    got = run_in_order(planned, inputs, np.random.default_rng(seed))
    for name in p.outputs:  # bit for bit: partials still combine in core order
        np.testing.assert_array_equal(got[name], expected[name])


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in EXAMPLES if "lm_head" not in p.name],
                         ids=lambda p: p.stem)
def test_examples_run_in_any_order_give_identical_results(path):
    planned = ap.plan(ap.load(path), ap.targets.spyre(cores=32))
    if planned.groups:
        pytest.skip("loop groups run in simulated memory, tile by tile")
    inputs = random_inputs(planned.program)
    expected = run_sliced(planned.program, planned.plan, inputs)
    got = run_in_order(planned, inputs, np.random.default_rng(7))
    for name in planned.program.outputs:
        np.testing.assert_array_equal(got[name], expected[name])


def test_an_order_must_be_a_permutation():
    planned = golden()
    p = planned.program
    env = bind_inputs(p, random_inputs(p))
    with pytest.raises(ExecutionError, match="is not a permutation"):
        run_op_boxes(p.ops[0], p, env, core_slices(planned.op("e")), order=[0, 0, 1])
