"""Tests of runtime.loops: loop nests run tile by tile in simulated memory match unplanned runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from apportion.backends.reference.loops import decode, encode
from apportion.errors import ExecutionError
from apportion.frontend.json_format import from_dict, load
from apportion.passes.pipeline import plan
from apportion.plans.serialize import from_json, to_json
from apportion.runtime import compare, random_inputs, run_unplanned
from apportion.target import spyre
from tests.helpers import program, run_tiled
from tests.passes.test_coarse_tile import fused

ROOT = Path(__file__).parents[3]


def check(p, pl, threads=None, params=None, seed=0):
    xs = random_inputs(p, seed)
    got = run_tiled(p, pl, xs, threads=threads, params=params)
    checks = compare(run_unplanned(p, xs), got, p)
    assert all(c.ok for c in checks), checks
    return got


@pytest.mark.parametrize("threads", [None, 4])
def test_fused_example_matches_unplanned(threads):
    p = load(ROOT / "examples/fused.json")
    pl = plan(p, spyre(cores=32))
    assert pl.buffer("y").space == "lx" and pl.buffer("z").space == "hbm"
    got = check(p, pl, threads)
    assert "y" not in got  # y only ever exists one tile at a time


@pytest.mark.parametrize("cores", [32, 7])
def test_softmax_tiled_by_rows_matches(cores):
    p = load(ROOT / "examples/softmax_tiled.json")
    check(p, plan(p, spyre(cores=cores)))


def test_softmax_with_split_reductions_combines_across_cores():
    p = load(ROOT / "examples/softmax_tiled.json")
    p = dataclasses.replace(p, work_division=(("rowmax", (("m", 4), ("n", 8))),
                                              ("rowsum", (("m", 8), ("n", 4)))))
    pl = plan(p, spyre())
    assert pl.buffer("mx").space == "hbm" and pl.buffer("d").space == "lx"
    check(p, pl)


def matmul_k(loops, dtype="float16"):
    return program({"x": ([64, 256], dtype), "w": ([256, 128], dtype)},
                   [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
                    {"name": "act", "op": "relu", "out": "a[m,n]", "ins": ["h[m,n]"]}],
                   ["a"], tiling=[{"ops": ["mm"], "loops": loops}])


@pytest.mark.parametrize("loops", [
    [{"count": 4, "dims": ["k"]}],
    [{"count": 2, "dims": ["m"]}, {"count": 4, "dims": ["k"]}],
    [{"count": 2, "dims": ["k"]}, {"count": 2, "dims": ["m"]}, {"count": 2, "dims": ["k"]}],
], ids=["k", "m-then-k", "k-m-k"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "int32"])
def test_tiled_k_reduction_accumulates_to_the_unplanned_result(loops, dtype):
    p = matmul_k(loops, dtype)
    pl = plan(p, spyre(cores=12))
    assert pl.buffer("h", "accumulator").dtype == ("float32" if dtype == "float16" else "")
    check(p, pl)


@pytest.mark.parametrize("fn", ["sum", "mean", "max", "min", "prod", "any"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "bool"])
def test_tiled_reductions_start_from_their_identity(fn, dtype):
    p = program({"x": ([16, 1024], dtype)},
                [{"name": "r", "op": fn, "out": "s[m,0]", "ins": ["x[m,n]"]}], ["s"],
                tiling=[{"ops": ["r"], "loops": [{"count": 2, "dims": ["m"]},
                                                 {"count": 8, "dims": ["n"]}]}])
    check(p, plan(p, spyre(cores=6)))


def test_tensor_read_inside_and_after_is_copied_to_its_full_buffer():
    p = program({"x": ([64, 128], "float32")},
                [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                 {"name": "n", "op": "neg", "out": "z[m,n]", "ins": ["y[m,n]"]},
                 {"name": "w", "op": "add", "out": "w[m,n]", "ins": ["y[m,n]", "z[m,n]"]}],
                ["w", "y"], tiling=[{"ops": ["e", "n"], "count": 4, "dims": ["m"]}])
    pl = plan(p, spyre(cores=8))
    assert pl.buffer("y", "tile").space == "lx" and pl.groups[0].copies
    got = check(p, pl)
    np.testing.assert_array_equal(got["y"], run_unplanned(p, random_inputs(p))["y"])


def test_tiles_left_in_device_memory_run_too():
    pl = plan(fused(), dataclasses.replace(spyre(), scratchpad_bytes=1024))
    assert pl.buffer("y").space == "hbm"
    check(fused(), pl)


def test_groups_whose_ops_tile_different_dims():
    # e and r tile (m, n); g tiles only p; r accumulates over n inside the m loop
    p = program({"x": ([64, 256], "float32"), "q": ([64, 128], "float32"),
                 "h": ([128], "float32")},
                [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
                 {"name": "r", "op": "sum", "out": "s[m,0]", "ins": ["y[m,n]"]},
                 {"name": "d", "op": "relu", "out": "w[m,p]", "ins": ["q[m,p]"]},
                 {"name": "g", "op": "neg", "out": "g[p]", "ins": ["h[p]"]},
                 {"name": "after", "op": "mul", "out": "o[m,n]", "ins": ["x[m,n]", "s[m,0]"]}],
                ["o", "w", "g"],
                tiling=[{"ops": ["e", "r", "d", "g"],
                         "loops": [{"count": 2, "dims": ["m"]},
                                   {"count": 4, "dims": ["n", "p"]}]}])
    pl = plan(p, spyre(cores=16))
    assert pl.op("g").loop.tiled_dims == ((), ("p",))
    assert pl.groups[0].inits[0].level == 1
    check(p, pl, threads=3)


@pytest.mark.slow
def test_symbolic_count_takes_its_value_at_run_time():
    p = fused(loops=[{"count": "T", "dims": ["m"]}, {"count": 2, "dims": ["n"]}])
    pl = plan(p, spyre())
    for t in (1, 4, 64):
        check(p, pl, params={"T": t})
    with pytest.raises(ExecutionError, match=r"count 3 \(symbolic 'T'\) does not divide dim 'm'"):
        run_tiled(p, pl, random_inputs(p), params={"T": 3})
    with pytest.raises(ExecutionError, match="'T' needs a value"):
        run_tiled(p, pl, random_inputs(p))


def test_plans_from_json_run():
    p = load(ROOT / "examples/softmax_tiled.json")
    check(p, from_json(to_json(plan(p, spyre(cores=24)))))


def test_untiled_plans_run_in_simulated_memory_too():
    p = load(ROOT / "examples/mlp.json")
    check(p, plan(p, spyre(cores=24)))


def three_op_chain():
    """y = a + b; w = y * c; z = w + y: y is live while w is written."""
    t = {n: ([256, 512], "float16") for n in "abc"}
    ops = [{"name": "add", "op": "add", "out": "y[m,n]", "ins": ["a[m,n]", "b[m,n]"]},
           {"name": "mul", "op": "mul", "out": "w[m,n]", "ins": ["y[m,n]", "c[m,n]"]},
           {"name": "add2", "op": "add", "out": "z[m,n]", "ins": ["w[m,n]", "y[m,n]"]}]
    return program(t, ops, ["z"], tiling=[{"ops": ["add", "mul", "add2"], "count": 4,
                                          "dims": ["m"]}])


def test_an_overlapping_scratchpad_allocation_corrupts_the_result():
    p = three_op_chain()
    pl = plan(p, spyre(cores=32))
    y, w = pl.buffer("y"), pl.buffer("w")
    assert y.space == w.space == "lx" and w.offset >= y.end
    check(p, pl)
    bad = dataclasses.replace(pl, buffers=tuple(
        dataclasses.replace(b, offset=y.offset) if b.tensor == "w" else b for b in pl.buffers))
    xs = random_inputs(p)
    checks = compare(run_unplanned(p, xs), run_tiled(p, bad, xs), p)
    assert not all(c.ok for c in checks)


def test_an_overlapping_device_allocation_corrupts_the_result():
    p = load(ROOT / "examples/fused.json")
    pl = plan(p, spyre())
    a = pl.buffer("a")
    half = a.offset + a.nbytes // 2  # z's first rows land on a's rows still to be read
    bad = dataclasses.replace(pl, buffers=tuple(
        dataclasses.replace(b, offset=half) if b.tensor == "z" else b for b in pl.buffers))
    xs = random_inputs(p)
    assert not all(c.ok for c in compare(run_unplanned(p, xs), run_tiled(p, bad, xs), p))


def test_reading_another_cores_scratchpad_is_refused():
    p = three_op_chain()
    pl = plan(p, spyre(cores=32))
    mul = pl.op("mul")
    wrong = dataclasses.replace(mul, splits=(("m", 16), ("n", 2)))
    bad = dataclasses.replace(pl, ops=tuple(wrong if o.name == "mul" else o for o in pl.ops))
    with pytest.raises(ExecutionError, match=r"op 'mul' core 0 reads 'y'.*only what a core "
                                             "wrote"):
        run_tiled(p, bad, random_inputs(p))


def test_a_buffer_too_small_for_its_tile_is_refused():
    p = load(ROOT / "examples/fused.json")
    pl = plan(p, spyre())
    bad = dataclasses.replace(pl, buffers=tuple(
        dataclasses.replace(b, nbytes=128) if b.tensor == "y" else b for b in pl.buffers))
    with pytest.raises(ExecutionError, match=r"tensor 'y': \[16, 1024\] float16 takes 32768 "
                                             "bytes, its tile buffer has 128"):
        run_tiled(p, bad, random_inputs(p))


def test_missing_buffers_and_inputs_are_execution_errors():
    p = load(ROOT / "examples/fused.json")
    pl = plan(p, spyre())
    with pytest.raises(ExecutionError, match="input 'c' of program 'fused' is missing"):
        run_tiled(p, pl, {k: v for k, v in random_inputs(p).items() if k != "c"})
    with pytest.raises(ExecutionError, match="has no full buffer"):
        run_tiled(p, dataclasses.replace(pl, buffers=()), random_inputs(p))


def test_bfloat16_is_stored_in_16_bits_exactly():
    from apportion.runtime import round_bf16
    x = round_bf16(np.array([1.0, -3.5, 1e-3, np.inf], dtype=np.float32))
    raw = encode(x, "bfloat16")
    assert raw.dtype == np.uint16 and np.array_equal(decode(raw, "bfloat16"), x)


def test_bfloat16_rank0_intermediate_kept_on_chip_matches_unplanned():
    """A bfloat16 scalar between two ops outside loops lives in the scratchpad; its 16-bit
    encoding keeps rank 0 (numpy's ascontiguousarray would make it rank 1)."""
    p = program({"x": ([64, 64], "bfloat16")},
                [{"name": "s", "op": "sum", "out": "s[]", "ins": ["x[i,j]"]},
                 {"name": "e", "op": "exp", "out": "e[]", "ins": ["s[]"]},
                 {"name": "y", "op": "add", "out": "y[]", "ins": ["e[]", "e[]"]}], ["y"])
    pl = plan(p, spyre(cores=32))
    assert pl.buffer("e").space == "lx"
    check(p, pl)
    assert encode(np.float32(1.5), "bfloat16").shape == ()
    assert decode(np.zeros((), np.uint16), "bfloat16").shape == ()


# --- outputs written through a merge of dims ---------------------------------------------------

def declared(tensors, inputs, ops, outputs, **extra):
    """A program with every tensor declared, a merged write's output too."""
    return from_dict({"format": "apportion.program/1", "name": "merged",
                      "tensors": {n: {"shape": s, "dtype": d} for n, (s, d) in tensors.items()},
                      "inputs": inputs, "outputs": outputs, "ops": ops, **extra})


def merged_after_a_nest(**extra):
    """Two ops tiled by rows, then ``g[256*i+j]`` (the rows flattened) and a reader of ``g``
    through the same merge (so ``g`` may stay on chip)."""
    return declared({"x": ([8, 256], "float16"), "g": ([2048], "float16")}, ["x"],
                    [{"name": "u0", "op": "exp", "out": "t0[i,j]", "ins": ["x[i,j]"]},
                     {"name": "u1", "op": "neg", "out": "t1[i,j]", "ins": ["t0[i,j]"]},
                     {"name": "mg", "op": "exp", "out": "g[256*i+j]", "ins": ["t1[i,j]"]},
                     {"name": "z", "op": "neg", "out": "z[i,j]", "ins": ["g[256*i+j]"],
                      "dims": {"i": 8, "j": 256}}],
                    ["t1", "z"], tiling=[{"ops": ["u0", "u1"], "loops": [{"count": 2,
                                                                            "dims": ["i"]}]}],
                    **extra)


@pytest.mark.parametrize(("cores", "splits"), [
    (1, None), (8, None), (32, None), (8, {"i": 2, "j": 2}), (32, {"i": 1, "j": 4})],
    ids=["1", "8", "32", "8-both-digits", "32-inner-digit"])
def test_merged_writes_outside_a_nest_run_in_device_memory_and_scratchpads(cores, splits):
    """The merged write and its reader run outside the nest through ``run_tiled``: into the
    full buffer, or each core's part in its scratchpad, also where the cores split the merge's
    inner digit and a part is no box of ``g`` (it has gaps that other cores fill)."""
    pins = {} if splits is None else {"work_division": {"mg": splits, "z": splits}}
    p = merged_after_a_nest(**pins)
    assert p.op("mg").merges_output and p.op("z").ins[0] == p.op("mg").out
    spaces = set()
    for scratch in (None, 128):  # 128 bytes: g in device memory
        target = spyre(cores=cores)
        if scratch is not None:
            target = dataclasses.replace(target, scratchpad_bytes=scratch)
        pl = plan(p, target)
        assert pl.op("mg").loop is None and pl.groups[0].ops == ("u0", "u1")
        spaces.add(pl.buffer("g").space)
        for threads in (None, 4):
            check(p, pl, threads)
    assert spaces == {"lx", "hbm"}, spaces


def test_a_merged_write_in_a_loop_nest_is_refused():
    """The planner keeps merged writes out of loop nests; a plan that has one anyway (here: of
    the same program with ``y`` written one axis per dim) is refused, naming the op."""
    tensors = {"x": ([8, 4, 64], "float16")}
    ops = [{"name": "m", "op": "exp", "out": "y[t,h,d]", "ins": ["x[t,h,d]"]},
           {"name": "e", "op": "neg", "out": "z[t,h,d]", "ins": ["y[t,h,d]"]}]
    tiling = [{"ops": ["m", "e"], "loops": [{"count": 2, "dims": ["t"]}]}]
    pl = plan(program(tensors, ops, ["z"], tiling=tiling), spyre(cores=8))
    merged = declared({**tensors, "y": ([8, 256], "float16"), "z": ([8, 4, 64], "float16")},
                      ["x"], [{**ops[0], "out": "y[t,64*h+d]"}, {**ops[1], "ins": ["y[t,64*h+d]"]}],
                      ["z"])
    assert merged.op("m").merges_output
    with pytest.raises(ExecutionError, match=r"op 'm' writes y\[t, 64\*h\+d\] through a merge "
                                             r"of dims, but the plan runs it in loop group"):
        run_tiled(merged, pl, random_inputs(merged))


def test_a_merged_output_read_by_other_cores_than_wrote_it_stays_in_device_memory():
    """The producer splits the merge's inner digit, the reader its outer one: a reader core's
    box lies inside the bounding box of a producer core's part but holds the other's elements."""
    p = merged_after_a_nest(work_division={"mg": {"i": 1, "j": 2}, "z": {"i": 2, "j": 1}})
    pl = plan(p, spyre(cores=2))
    assert pl.buffer("g").space == "hbm"
    check(p, pl, None)
