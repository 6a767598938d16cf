"""Property tests: random tiled programs, counts, core counts and scratchpads run exactly."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.frontend.json_format import from_dict
from apportion.passes.geometry import divisors
from apportion.passes.pipeline import plan
from apportion.runtime import compare, random_inputs, run_unplanned
from apportion.target import spyre
from tests.helpers import program, run_tiled

DTYPES = {"float16": 64, "bfloat16": 64, "float32": 32}  # elements per 128-byte stick
UNARY = ["exp", "neg", "relu", "sigmoid", "tanh"]
BINARY = ["add", "mul", "sub", "max"]
REDUCE = ["sum", "max", "min", "mean"]


@st.composite
def tiled_programs(draw):
    """A chain over [m, n] with a random contiguous group and 1-2 loop levels; sometimes
    followed, outside the nest, by a write through a merge of dims and a read of it."""
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    eps = DTYPES[dtype]
    m = draw(st.sampled_from([1, 2, 4, 6, 8, 16, 32]))
    n = eps * draw(st.sampled_from([1, 2, 4]))
    tensors = {"x": ([m, n], dtype)}
    ops: list[dict] = []
    cur = "x"
    matmuls = 0
    for i in range(draw(st.integers(1, 5))):
        # random_inputs has mean 1, so each matmul grows values ~16x: four reach fp16's overflow
        kinds = ["unary", "binary", "rowstat"] + (["matmul"] if matmuls < 2 else [])
        kind = draw(st.sampled_from(kinds))
        matmuls += kind == "matmul"
        out = f"t{i}"
        if kind == "unary":
            ops.append({"name": f"u{i}", "op": draw(st.sampled_from(UNARY)),
                        "out": f"{out}[i,j]", "ins": [f"{cur}[i,j]"]})
        elif kind == "binary":
            tensors[f"in{i}"] = ([m, n], dtype)
            ops.append({"name": f"b{i}", "op": draw(st.sampled_from(BINARY)),
                        "out": f"{out}[i,j]", "ins": [f"{cur}[i,j]", f"in{i}[i,j]"]})
        elif kind == "rowstat":  # a row reduction then a broadcast over the row
            ops.append({"name": f"r{i}", "op": draw(st.sampled_from(REDUCE)),
                        "out": f"s{i}[i,0]", "ins": [f"{cur}[i,j]"]})
            # not sub: x - max(x) after a split-K matmul cancels to where one rounding of the
            # matmul (as run_planned has too) exceeds the tolerance; softmax tests cover sub
            ops.append({"name": f"c{i}", "op": draw(st.sampled_from(["add", "mul"])),
                        "out": f"{out}[i,j]", "ins": [f"{cur}[i,j]", f"s{i}[i,0]"]})
        else:
            tensors[f"w{i}"] = ([n, n], dtype)
            ops.append({"name": f"mm{i}", "op": "matmul", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,k]", f"w{i}[k,j]"]})
        cur = out
    lo = draw(st.integers(0, len(ops) - 1))
    hi = len(ops) if draw(st.booleans()) else draw(st.integers(lo + 1, len(ops)))
    group = ops[lo:hi]
    letters = sorted({d for o in group for d in ("i", "j", "k")
                      if any(f"{d}]" in a or f"{d}," in a for a in [o["out"], *o["ins"]])})
    units = {"i": m, "j": n // eps, "k": n // eps}
    loops = []
    for _ in range(draw(st.integers(1, 2))):
        d = draw(st.sampled_from(letters))  # one letter per level: every op has it or not
        count = draw(st.sampled_from(divisors(units[d], units[d])))
        units[d] //= count
        loops.append({"count": count, "dims": [d]})
    symbolic = draw(st.booleans())
    params = {"T": loops[0]["count"]} if symbolic else None
    if symbolic:
        loops[0] = {**loops[0], "count": "T"}
    tiling = [{"ops": [o["name"] for o in group], "loops": loops}]
    merge = draw(st.sampled_from([None, "rows", "columns"]))
    if merge is None:
        return program(tensors, ops, [cur], tiling=tiling), params
    # after the nest (merged writes stay outside loop nests): the result flattened through a
    # merge of dims, rows or columns outermost, and read back through the same merge (so g
    # may stay in the cores' scratchpads)
    flat = f"{n}*i+j" if merge == "rows" else f"{m}*j+i"
    ops += [{"name": "mg", "op": draw(st.sampled_from(UNARY)), "out": f"g[{flat}]",
             "ins": [f"{cur}[i,j]"]},
            {"name": "rd", "op": "neg", "out": "r[i,j]", "ins": [f"g[{flat}]"],
             "dims": {"i": m, "j": n}}]
    declared = {name: {"shape": s, "dtype": d} for name, (s, d) in tensors.items()}
    return from_dict({"format": "apportion.program/1", "name": "t",
                      "tensors": {**declared, "g": {"shape": [m * n], "dtype": dtype}},
                      "inputs": list(tensors), "outputs": [cur, "r"], "ops": ops,
                      "tiling": tiling}), params


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tiled_programs(), st.integers(1, 32), st.sampled_from([None, 4096, 512]),
       st.integers(0, 3))
def test_random_tiled_programs_execute_to_the_unplanned_result(case, cores, scratch, seed):
    p, params = case
    target = spyre(cores=cores)
    if scratch is not None:  # small scratchpads make tiles spill to device memory
        target = dataclasses.replace(target, scratchpad_bytes=scratch)
    try:
        pl = plan(p, target)
    except (PlanningError, ProgramError) as e:
        event(f"refused: {type(e).__name__}")
        assume(False)
        return
    g = pl.groups[0]
    event(f"lx: {bool(g.lx_tensors)}, device tiles: {bool(g.hbm_tiles)}, "
          f"accumulates: {bool(g.inits)}, copies: {bool(g.copies)}")
    xs = random_inputs(p, seed)
    checks = compare(run_unplanned(p, xs), run_tiled(p, pl, xs, params=params), p)
    assert all(c.ok for c in checks), (checks, pl.groups)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tiled_programs(), st.integers(1, 32), st.sampled_from([2048, 8192, 65536]))
def test_auto_tile_fits_the_scratchpad_or_keeps_one_iteration_or_says_so(case, cores, scratch):
    p, params = case
    target = dataclasses.replace(spyre(cores=cores), scratchpad_bytes=scratch)
    try:
        pl = plan(p, target, auto_tile=True)
    except PlanningError as e:
        event("refused")
        assert "tiling group" in str(e) or "op " in str(e)
        return
    except ProgramError:
        assume(False)
        return
    # a group either fits, or keeps a single iteration because re-reading its weights every
    # iteration is predicted slower than leaving tiles in device memory
    for g in pl.groups:
        assert g.fits or all(c == 1 or isinstance(c, str) for c in g.counts), g
    xs = random_inputs(p)
    try:
        got = run_tiled(p, pl, xs, params=params)
    except ExecutionError as e:
        # auto counts are chosen with a symbolic count at 1; a run-time value that leaves no
        # room for them is refused by name, never run wrong
        assert params and "does not divide" in str(e)
        event("symbolic value refused at run time")
        return
    assert all(c.ok for c in compare(run_unplanned(p, xs), got, p))
