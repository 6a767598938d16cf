"""Tests of the cost model's terms, one behaviour each, on the Spyre figures."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cost.model import OpCost, batch_dims, matmul_rows, op_cost, slice_bytes
from apportion.target import spyre
from tests.helpers import one_op

F16 = "float16"
MATMUL = one_op("matmul", "y[m,n]", ["x[m,k]", "w[k,n]"],
                {"x": ([512, 4096], F16), "w": ([4096, 4096], F16)})
MM = MATMUL.ops[0]
SIZES = MM.sizes
UNITS = {"m": 1, "n": 64, "k": 64}


def cost(splits, target=None, program=MATMUL, op=MM, units=UNITS, **kw):
    full = {d: splits.get(d, 1) for d in op.sizes}
    return op_cost(op, program, target or spyre(), op.sizes, full, units, **kw)


def test_row_pipeline_efficiency_falls_as_the_root_of_passes_below_eight():
    full = cost({"m": 8, "n": 4})   # 64 rows per core: 8 passes of 8, the pipeline is full
    short = cost({"m": 32, "n": 1})  # 16 rows: 2 passes, efficiency sqrt(2/8) = 1/2
    per_core_macs = 16 * 4096 * 4096
    assert math.isclose(short.compute_us, per_core_macs / spyre().mac_rate / 0.5)
    assert math.isclose(full.compute_us, 64 * 1024 * 4096 / spyre().mac_rate)


def test_a_shared_slice_is_fetched_once_per_cohort_and_contends_past_eight():
    t = spyre()
    eight = cost({"m": 8, "n": 4})     # w's slices each shared by the 8 cores cutting m
    sixteen = cost({"m": 16, "n": 2})  # by 16: (16/8)**0.75 times the bytes of w
    x, w, y = 512 * 4096 * 2, 4096 * 4096 * 2, 512 * 4096 * 2
    assert math.isclose(eight.memory_us, (x + w + y) / t.mem_bandwidth * 1e6)
    assert math.isclose(sixteen.memory_us, (x + w * 2 ** 0.75 + y) / t.mem_bandwidth * 1e6)


def test_memory_is_never_faster_than_one_cores_port():
    slow_port = replace(spyre(), core_bandwidth=1e9)
    c = cost({"m": 8, "n": 4}, slow_port)
    per_core = 64 * 4096 * 2 + 4096 * 1024 * 2 + 64 * 1024 * 2
    assert math.isclose(c.memory_us, per_core / 1e9 * 1e6)


def test_resident_tensors_move_no_device_memory():
    c = cost({"m": 8, "n": 4}, resident=frozenset({"w"}))
    x, y = 512 * 4096 * 2, 512 * 4096 * 2
    assert math.isclose(c.memory_us, (x + y) / spyre().mem_bandwidth * 1e6)


def test_a_split_reduction_pays_one_ring_hop_per_extra_slice():
    assert cost({"m": 8, "n": 4}).combine_us == 0
    c = cost({"m": 8, "n": 2, "k": 2})
    assert math.isclose(c.combine_us, 1 * 64 * 2048 * spyre().ring_us_per_element)


def test_cutting_a_stick_dim_costs_per_byte_per_halving():
    four, eight = cost({"m": 8, "n": 4}), cost({"m": 4, "n": 8})
    stick_bytes = (4096 * 4096 + 512 * 4096) * 2  # w and y have n innermost
    assert math.isclose(four.stick_us, stick_bytes * 2 * spyre().stick_split_us_per_byte)
    assert math.isclose(eight.stick_us, stick_bytes * 3 * spyre().stick_split_us_per_byte)


def test_splitting_a_batch_dim_slows_the_op_per_doubling():
    bmm = one_op("matmul", "y[b,m,n]", ["x[b,m,k]", "w[b,k,n]"],
                 {"x": ([8, 256, 1024], F16), "w": ([8, 1024, 512], F16)})
    op = bmm.ops[0]
    assert batch_dims(op) == ("b",) and matmul_rows(op) == ("m",)
    units = {"b": 1, "m": 1, "n": 64, "k": 64}
    c = cost({"b": 4, "m": 8}, program=bmm, op=op, units=units)
    assert math.isclose(c.batch_factor, spyre().batch_split_factor ** 2)


def test_overlap_adds_that_share_of_the_shorter_term():
    c = OpCost(compute_us=10.0, memory_us=30.0, overlap=0.5, combine_us=1.0, stick_us=2.0)
    assert c.time_us == 30.0 + 5.0 + 1.0 + 2.0


@pytest.mark.parametrize(("fn", "rate"), [("exp", "sfp_rate"), ("sum", "reduce_rate")])
def test_elementwise_and_reductions_run_at_their_units_rate(fn, rate):
    out = "y[m,n]" if fn == "exp" else "y[m,0]"
    p = one_op(fn, out, ["x[m,n]"], {"x": ([64, 4096], F16)})
    c = cost({"m": 32}, program=p, op=p.ops[0], units={"m": 1, "n": 64})
    assert math.isclose(c.compute_us, 2 * 4096 / getattr(spyre(), rate))


def test_padding_to_sticks_counts_in_traffic():
    p = one_op("exp", "y[m,n]", ["x[m,n]"], {"x": ([4, 65], F16)})
    # 65 fp16 elements take two 64-element sticks per row
    assert slice_bytes(p.ops[0].ins[0], p, spyre(), {"m": 4, "n": 65}) == 4 * 128 * 2


# --- batched matmuls and extra cores --------------------------------------------------------------

def _bmm(b: int, m: int, k: int, n: int):
    from tests.helpers import program

    return program({"x": ([b, m, k], "float16"), "w": ([b, k, n], "float16")},
                   [{"name": "mm", "op": "matmul", "out": "y[b,m,n]",
                     "ins": ["x[b,m,k]", "w[b,k,n]"]}], ["y"])


def test_the_batch_drain_charges_each_iterated_elements_output_slice():
    p = _bmm(8, 512, 64, 512)
    t = spyre()
    op = p.op("mm")
    per = {"b": 1, "m": 1, "n": 64, "k": 64}
    whole = op_cost(op, p, t, op.sizes, {"b": 1, "m": 8, "n": 4, "k": 1}, per)
    split = op_cost(op, p, t, op.sizes, {"b": 8, "m": 4, "n": 1, "k": 1}, per)
    # 8 elements of 64 x 128 float16 outputs per core, against one element of 128 x 512
    assert whole.batch_us == pytest.approx(8 * 64 * 128 * 2 * t.batch_drain_us_per_byte)
    assert split.batch_us == pytest.approx(128 * 512 * 2 * t.batch_drain_us_per_byte)
    # a matmul without batch dims pays none
    assert op_cost(MM, MATMUL, t, SIZES, {"m": 8, "n": 4, "k": 1}, UNITS).batch_us == 0.0


def test_a_batch_element_that_fits_the_scratchpad_once_but_not_twice_overlaps_nothing():
    t = spyre()
    splits = {"b": 1, "m": 8, "n": 4, "k": 1}
    per = {"b": 1, "m": 1, "n": 64, "k": 64}

    def overlap(b: int, m: int, k: int, n: int, target=t) -> float:
        p = _bmm(b, m, k, n)
        op = p.op("mm")
        return op_cost(op, p, target, op.sizes, splits, per).overlap

    # 64 x 4096 + 4096 x 128 + 64 x 128 float16 per element: 1.5 MB, one fits and two do not
    assert overlap(8, 512, 4096, 512) == 1.0
    # small K: two elements fit, the next loads behind the current one
    assert overlap(8, 512, 64, 512) == t.overlap
    # an element larger than the scratchpad streams tile by tile with the fitted overlap
    assert overlap(8, 512, 16384, 512) == t.overlap
    # the same element on a scratchpad that holds two of them overlaps again
    assert overlap(8, 512, 4096, 512, replace(t, scratchpad_bytes=8 << 20)) == t.overlap
    # a matmul without batch dims keeps the fitted overlap whatever its slice
    assert cost({"m": 8, "n": 4, "k": 1}).overlap == t.overlap


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 8]), st.sampled_from([64, 512]), st.sampled_from([64, 1024, 4096]),
       st.sampled_from([128, 512, 2048]), st.sampled_from([(1, 8, 4), (2, 4, 4), (1, 32, 1)]))
def test_element_overflow_only_ever_exposes_more_of_the_shorter_term(b, m, k, n, cut):
    # the term sets overlap to 1 or leaves the target's; it never makes an op faster
    p = _bmm(b, m, k, n)
    op = p.op("mm")
    splits = dict(zip("bmn", cut, strict=True)) | {"k": 1}
    per = {"b": 1, "m": 1, "n": 64, "k": 64}
    t = spyre()
    c = op_cost(op, p, t, op.sizes, splits, per)
    assert c.overlap in (t.overlap, 1.0)
    assert c.time_us >= replace(c, overlap=t.overlap).time_us


def test_batched_terms_move_the_pick_to_the_measured_best_on_a_synthetic_set():
    # the device behaves as the preset says; a model without the drain (and the old, mild batch
    # split factor) picks a 9 x 2 split of the small-K bmm; fitting the drain to the synthetic
    # measurements gives the drain back and the pick m8 n4
    from apportion.cost.calibrate import Measurement, fit
    from apportion.workflows.calibration import predictor, rank_split

    device = spyre()
    shapes = [(8, 512, 64, 512), (8, 512, 4096, 512), (8, 128, 2048, 8192)]
    splits = [{"b": 1, "m": 8, "n": 4, "k": 1}, {"b": 1, "m": 8, "n": 4, "k": 1},
              {"b": 1, "m": 4, "n": 8, "k": 1}]
    predict = predictor()
    records = []
    for (b, m, k, n), s in zip(shapes, splits, strict=True):
        rec = Measurement(_bmm(b, m, k, n), "mm", 32, s, 1.0, True,
                          ("matmul", {"batch": b, "M": m, "K": k, "N": n}))
        records.append(replace(rec, time_us=predict(device, rec)))
    naive = replace(device, batch_drain_us_per_byte=0.0, overlap=0.8, batch_split_factor=1.2)
    assert rank_split(naive, records[0]).pick == {"b": 1, "m": 9, "n": 2, "k": 1}
    cal = fit(records, replace(naive, batch_split_factor=device.batch_split_factor), predict,
              ["overlap", "batch_drain_us_per_byte"],
              bounds={"batch_drain_us_per_byte": (1e-7, 1e-2)})
    assert cal.target.batch_drain_us_per_byte == pytest.approx(device.batch_drain_us_per_byte,
                                                               rel=1e-2)
    assert all(rank_split(cal.target, r).pick == s for r, s in zip(records, splits, strict=True))


def test_core_sync_makes_one_core_fastest_on_a_small_op_and_not_on_a_big_one():
    import apportion as ap
    from apportion.target import cpu
    from tests.helpers import program

    def exp(m: int, n: int):
        return program({"x": ([m, n], "float32")},
                       [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]}], ["y"])

    free = replace(cpu(cores=2), core_sync_us=0.0)
    synced = replace(cpu(cores=2), core_sync_us=200.0)
    small, big = exp(64, 64), exp(4096, 4096)
    assert math.prod(dict(ap.plan(small, free).op("e").splits).values()) == 2
    assert math.prod(dict(ap.plan(small, synced).op("e").splits).values()) == 1
    assert math.prod(dict(ap.plan(big, synced).op("e").splits).values()) == 2
