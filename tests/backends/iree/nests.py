"""Random loop nests for the parallel-IR tests: chains over ``[m, n]`` in one tiling group with
ops at several depths, levels over two dims, fallbacks, tiled reductions and matmuls (their
accumulators), split reductions on many cores, several program outputs and symbolic counts."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

import apportion as ap
from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.passes.geometry import divisors
from apportion.planned import PlannedProgram
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.target import spyre
from tests.helpers import program

DTYPES = {"float16": 64, "bfloat16": 64, "float32": 32}  # elements per 128-byte stick
UNARY = ["exp", "neg", "relu", "sigmoid", "tanh"]
BINARY = ["add", "mul", "sub", "max"]
REDUCE = ["sum", "max", "min", "mean"]
FALLBACK = ["cumsum", "flip", "sort"]


@st.composite
def nest_programs(draw):
    """(program, params, cores, scratchpad bytes or None): a chain of 1 to 5 steps (unary,
    binary with a fresh input, a row statistic read back over the row, a matmul, a fallback
    along the last axis) with one or two contiguous runs of them in groups of 1 to 3 levels (a
    level over one dim or two), ops of a group at random depths, some intermediates program
    outputs too, one outer count sometimes symbolic."""
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    eps = DTYPES[dtype]
    m = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    n = eps * draw(st.sampled_from([1, 2, 4]))
    tensors = {"x": ([m, n], dtype)}
    ops: list[dict] = []
    cur = "x"
    matmuls = 0
    made: list[str] = []
    for i in range(draw(st.integers(1, 5))):
        kinds = ["unary", "binary", "rowstat", "fallback"] + (["matmul"] if matmuls < 2 else [])
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
        elif kind == "rowstat":
            ops.append({"name": f"r{i}", "op": draw(st.sampled_from(REDUCE)),
                        "out": f"s{i}[i,0]", "ins": [f"{cur}[i,j]"]})
            made.append(f"s{i}")
            ops.append({"name": f"c{i}", "op": draw(st.sampled_from(["add", "mul"])),
                        "out": f"{out}[i,j]", "ins": [f"{cur}[i,j]", f"s{i}[i,0]"]})
        elif kind == "fallback":
            ops.append({"name": f"f{i}", "op": draw(st.sampled_from(FALLBACK)),
                        "out": f"{out}[i,j]", "ins": [f"{cur}[i,j]"]})
        else:
            tensors[f"w{i}"] = ([n, n], dtype)
            ops.append({"name": f"mm{i}", "op": "matmul", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,k]", f"w{i}[k,j]"]})
        made.append(out)
        cur = out
    lo = draw(st.integers(0, len(ops) - 1))
    hi = len(ops) if draw(st.booleans()) else draw(st.integers(lo + 1, len(ops)))
    ranges = [(lo, hi)]
    if hi < len(ops) and draw(st.booleans()):  # a second group after the first
        lo2 = draw(st.integers(hi, len(ops) - 1))
        ranges.append((lo2, draw(st.integers(lo2 + 1, len(ops)))))
    tiling = []
    params: dict[str, int] | None = None
    for lo, hi in ranges:
        group, loops = ops[lo:hi], []
        letters = sorted({d for o in group for d in ("i", "j", "k")
                          if any(f"{d}]" in a or f"{d}," in a for a in [o["out"], *o["ins"]])})
        units = {"i": m, "j": n // eps, "k": n // eps}
        for _ in range(draw(st.integers(1, 3))):
            ds = draw(st.sampled_from([[d] for d in letters] + (
                [["i", "j"]] if {"i", "j"} <= set(letters) else [])))
            count = draw(st.sampled_from(sorted(set.intersection(
                *(set(divisors(units[d], units[d])) for d in ds)))))
            for d in ds:
                units[d] //= count
            loops.append({"count": count, "dims": ds})
        if params is None and draw(st.booleans()):
            params = {"T": loops[0]["count"]}
            loops[0] = {**loops[0], "count": "T"}
        g: dict = {"ops": [o["name"] for o in group], "loops": loops}
        if len(loops) > 1:
            depths = {o["name"]: draw(st.integers(1, len(loops) - 1)) for o in group
                      if draw(st.booleans())}
            if depths:
                g["depths"] = depths
        tiling.append(g)
    outputs = [cur] + [t for t in made[:-1] if draw(st.integers(0, 3)) == 0]
    prog = program(tensors, ops, outputs, tiling=tiling)
    cores = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32]))
    scratch = draw(st.sampled_from([None, None, 4096, 512]))
    return prog, params, cores, scratch


def plan_nest(prog: ap.Program, cores: int, scratch: int | None) -> PlannedProgram:
    """``prog`` planned for Spyre with ``cores`` (``scratch``: a scratchpad that small)."""
    target = spyre(cores=cores)
    if scratch is not None:
        target = dataclasses.replace(target, scratchpad_bytes=scratch)
    return ap.plan(prog, target)


def reference_exact(planned: PlannedProgram, params: dict[str, int] | None, seed: int) -> bool:
    """Whether the reference executor runs the plan and matches the unplanned program (and the
    values stay finite and moderate: long exp chains are beyond any tolerance)."""
    import numpy as np

    p = planned.program
    xs = random_inputs(p, seed)
    want = run_unplanned(p, xs)
    if not all(np.all(np.abs(want[o].astype(np.float64)) < 1e4) for o in p.outputs):
        return False
    try:
        got = planned.run(xs, params=params)
    except (ExecutionError, PlanningError, ProgramError):
        return False
    return all(c.ok for c in compare(want, got, p))
