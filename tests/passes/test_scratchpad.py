"""Tests of pass scratchpad (placement, reuse, spills, device addresses) and of auto_tile."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from apportion.errors import PlanningError
from apportion.frontend.json_format import from_dict, load
from apportion.passes.auto_tile import candidate_counts
from apportion.passes.layouts import layouts
from apportion.passes.pipeline import plan
from apportion.passes.placement import Request, place
from apportion.target import spyre
from tests.helpers import program
from tests.passes.test_coarse_tile import fused

ROOT = Path(__file__).parents[2]
KiB = 1024


def small_scratchpad(kib: float, cores: int = 32):
    return dataclasses.replace(spyre(cores=cores), scratchpad_bytes=int(kib * KiB),
                               scratchpad_reserve=0.0)


def test_fused_intermediate_sits_at_offset_0_and_the_output_in_device_memory():
    p = plan(fused(), spyre(cores=32))
    y, z = p.buffer("y"), p.buffer("z")
    assert (y.kind, y.space, y.offset, y.shape, y.group) == ("tile", "lx", 0, (512, 1024), (0, 0))
    assert y.per_tile_fixed and y.nbytes == 16 * 1024 * 2  # 16 rows per core, float16
    assert (z.kind, z.space) == ("full", "hbm")
    g = p.groups[0]
    assert g.lx_tensors == ("y",) and g.hbm_tiles == () and g.fits
    assert g.working_set_bytes == 32 * KiB and g.capacity == spyre().scratchpad_capacity
    assert g.saved_bytes == 1024 * 4096 * 2


def test_device_addresses_are_aligned_and_disjoint():
    p = plan(load(ROOT / "examples/mlp.json"), spyre())
    hbm = sorted((b for b in p.buffers if b.space == "hbm"), key=lambda b: b.offset)
    # every tensor has one buffer: in device memory, or (act's output a, read by glu core by
    # core as act wrote it) in the scratchpad
    lx = {b.tensor for b in p.buffers if b.space == "lx"}
    assert lx == {"a"}
    tensors = {t.name for t in load(ROOT / "examples/mlp.json").tensors}
    assert {b.tensor for b in hbm} | lx == tensors
    for a, b in zip(hbm, hbm[1:], strict=False):
        assert a.end <= b.offset and b.offset % 128 == 0


def softmax_plan(target=None):
    return plan(load(ROOT / "examples/softmax_tiled.json"), target or spyre(cores=32))


def test_softmax_reuses_freed_space_best_fit_and_in_place():
    p = softmax_plan()
    off = {t: p.buffer(t).offset for t in ("mx", "d", "e", "s")}
    row_stat = 16 * 64 * 2  # 16 rows per core, one float16 stick each
    # d after mx; e in place over d (exp is pointwise and d dies at it); s in mx's freed gap
    assert off == {"mx": 0, "d": row_stat, "e": row_stat, "s": 0}
    assert all(p.buffer(t).space == "lx" for t in off)
    assert p.groups[0].working_set_bytes == row_stat + 16 * 1024 * 2


def test_offsets_are_aligned_to_128_bytes():
    p = plan(load(ROOT / "examples/softmax_tiled.json"), spyre(cores=24), debug=lambda *a: None)
    assert all(b.offset % 128 == 0 for b in p.buffers)


def test_place_best_fit_takes_the_smallest_gap():
    reqs = [Request("a", 0, 3, 256), Request("b", 1, 1, 512), Request("c", 2, 3, 128),
            Request("d", 3, 3, 384)]
    # b dies before c: gap 256..768 (512); c takes its start; d the rest of the gap (best fit)
    assert place(reqs, None) == {"a": 0, "b": 256, "c": 256, "d": 384}


def test_place_in_place_reuse_only_when_the_input_dies_there():
    reqs = [Request("a", 0, 1, 256), Request("b", 1, 2, 256, inplace=("a",)),
            Request("c", 2, 3, 256, inplace=("a",))]
    assert place(reqs, None) == {"a": 0, "b": 0, "c": 256}


def test_place_leaves_out_what_does_not_fit():
    reqs = [Request("a", 0, 1, 256), Request("b", 1, 1, 256)]
    assert place(reqs, 384) == {"a": 0}


def test_tiles_that_do_not_fit_stay_in_device_memory():
    p = plan(fused(), small_scratchpad(16))  # 32 KiB per core needed
    y = p.buffer("y")
    assert (y.kind, y.space, y.shape) == ("tile", "hbm", (512, 1024))
    g = p.groups[0]
    assert g.hbm_tiles == ("y",) and g.lx_tensors == () and not g.fits
    assert g.working_set_bytes == 32 * KiB
    assert g.saved_bytes == 1024 * 4096 * 2 - 512 * 1024 * 2


def test_a_split_reduction_producer_keeps_its_output_out_of_the_scratchpad():
    doc = json.loads((ROOT / "examples/softmax_tiled.json").read_text())
    doc["work_division"] = {"rowmax": {"m": 8, "n": 4}}
    p = plan(from_dict(doc), spyre())
    assert p.buffer("mx").space == "hbm" and "mx" in p.groups[0].hbm_tiles


def test_a_reader_whose_cores_read_other_cores_tiles_keeps_it_in_device_memory():
    p = plan(fused(work_division={"add": {"m": 32}, "mul": {"m": 16, "n": 2}}), spyre())
    assert p.buffer("y").space == "hbm"


# --- auto_tile -----------------------------------------------------------------------------

def test_candidates_go_by_total_iterations_outer_first():
    p = fused()
    c = candidate_counts(p, p.tiling[0], layouts(p, spyre()).ops, 65535)
    assert c[:6] == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (1, 4)]
    assert all(4096 // n % 64 == 0 for _, n in c)  # whole float16 sticks


def test_auto_tile_picks_the_fewest_iterations_that_fit():
    p = plan(fused(), small_scratchpad(48), auto_tile=True)
    g = p.groups[0]
    assert g.counts == (8, 1) and g.fits and g.lx_tensors == ("y",)
    assert p.op("add").sizes == {"m": 128, "n": 4096}
    assert plan(fused(), spyre(), auto_tile=True).groups[0].counts == (1, 1)


def test_auto_tile_says_when_nothing_fits():
    with pytest.raises(PlanningError, match=r"no loop counts over \[\['m'\], \['n'\]\] make the "
                                            r"per-iteration working set fit.*the least is 128 "
                                            r"bytes"):
        plan(fused(), small_scratchpad(0.1, cores=1), auto_tile=True)


# --- symbolic counts -------------------------------------------------------------------------

def test_symbolic_count_plans_the_upper_bound_and_keeps_the_name():
    p = plan(fused(loops=[{"count": "T", "dims": ["m"]}]), spyre())
    assert p.op("add").loop.count == ("T",) and p.op("add").sizes == {"m": 1024, "n": 4096}
    g = p.groups[0]
    assert g.params == ("T",) and g.iterations is None
    assert p.buffer("y").space == "lx" and p.buffer("y").nbytes == 32 * 4096 * 2


def transposing_reader(count):
    """y = a + b; z[n, m] = y[m, n] * c[n, m]: m is a stick dim of the reader only."""
    return program({"a": ([1024, 256], "float16"), "b": ([1024, 256], "float16"),
                    "c": ([256, 1024], "float16")},
                   [{"name": "add", "op": "add", "out": "y[m,n]", "ins": ["a[m,n]", "b[m,n]"]},
                    {"name": "mul", "op": "mul", "out": "z[n,m]", "ins": ["y[m,n]", "c[n,m]"]}],
                   ["z"], tiling=[{"ops": ["add", "mul"], "count": count, "dims": ["m"]}],
                   work_division={"add": {"m": 2}, "mul": {"m": 2}})


def test_symbolic_count_needs_equal_cuts_for_the_scratchpad():
    # Both halve m: contained at the planned size, but at a one-stick tile the reader's core 0
    # would take the whole stick while the producer's core 0 wrote half of it.
    assert plan(transposing_reader(2), spyre()).buffer("y").space == "lx"
    assert plan(transposing_reader("T"), spyre()).buffer("y").space == "hbm"
