"""Property tests: random programs of the registry's newer kinds (where, comparisons, logic, sin,
cos, erf, clamp, softplus, cumsum), with rank-0 tensors, literal indices and reductions to a
scalar, planned under both strategies (tiled where a group is drawn) and run against the
unplanned program."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import PlanningError, ProgramError
from apportion.runtime import compare, random_inputs, run_unplanned
from apportion.target import spyre
from tests.helpers import program

DTYPES = ["float16", "bfloat16", "float32"]
UNARY = ["sin", "cos", "erf", "softplus", "clamp", "exp", "tanh"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


@st.composite
def kind_programs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    m = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    n = draw(st.sampled_from([1, 5, 64, 128, 192]))
    tensors = {"x": ([m, n], dtype), "s": ([], dtype)}
    ops: list[dict] = []
    cur = "x"
    for i in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(["unary", "mask", "scale", "rowstat"]))
        out = f"t{i}"
        if what == "unary":
            fn = draw(st.sampled_from(UNARY))
            extra = {"min": -0.25, "max": 0.5} if fn == "clamp" else {}
            ops.append({"name": f"u{i}", "op": fn, "out": f"{out}[i,j]", "ins": [f"{cur}[i,j]"],
                        **extra})
        elif what == "mask":  # a comparison, a logical op over it, and a where
            other = f"o{i}"
            tensors[other] = ([m, n], dtype)
            ops.append({"name": f"c{i}", "op": draw(st.sampled_from(COMPARE)),
                        "out": f"k{i}[i,j]", "ins": [f"{cur}[i,j]", f"{other}[i,j]"]})
            logic = draw(st.sampled_from(["logical_not", "logical_and", "logical_or"]))
            ins = [f"k{i}[i,j]"] if logic == "logical_not" else [f"k{i}[i,j]", f"{cur}[i,j]"]
            ops.append({"name": f"l{i}", "op": logic, "out": f"q{i}[i,j]", "ins": ins})
            ops.append({"name": f"w{i}", "op": "where", "out": f"{out}[i,j]",
                        "ins": [f"q{i}[i,j]", f"{cur}[i,j]", f"{other}[i,j]"]})
        elif what == "scale":  # a rank-0 tensor broadcast over everything
            ops.append({"name": f"m{i}", "op": "mul", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", "s[]"]})
        else:  # a row statistic broadcast back
            ops.append({"name": f"r{i}", "op": draw(st.sampled_from(["max", "sum", "mean"])),
                        "out": f"r{i}[i,0]", "ins": [f"{cur}[i,j]"]})
            ops.append({"name": f"a{i}", "op": "add", "out": f"{out}[i,j]",
                        "ins": [f"{cur}[i,j]", f"r{i}[i,0]"]})
        cur = out
    outputs = [cur]
    tiling = []
    if draw(st.booleans()) and m > 1:  # the whole chain in one loop over rows
        tiling = [{"ops": [o["name"] for o in ops],
                   "loops": [{"count": draw(st.sampled_from([1, m])), "dims": ["i"]}]}]
    else:  # fallbacks and reductions to a scalar run outside loops
        ops.append({"name": "cs", "op": "cumsum", "out": "cs[i,j]", "ins": [f"{cur}[i,j]"]})
        ops.append({"name": "tot", "op": draw(st.sampled_from(["max", "min", "sum"])),
                    "out": "tot[]", "ins": [f"{cur}[i,j]"]})
        ops.append({"name": "lit", "op": "copy", "out": "lit[0,0]", "ins": [f"{cur}[0,0]"]})
        outputs += ["cs", "tot", "lit"]
    return program(tensors, ops, outputs, tiling=tiling)


@st.composite
def targets(draw):
    if draw(st.booleans()):
        return spyre(cores=draw(st.integers(1, 32)))
    return dataclasses.replace(spyre(), name="tiny", cores=draw(st.integers(1, 12)),
                               span_limit=draw(st.sampled_from([512, 4096, 1 << 20])))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(kind_programs(), targets(), st.sampled_from(["greedy", "balanced"]))
def test_new_kinds_plan_and_run_like_the_unplanned_program(prog, target, strategy):
    try:
        planned = ap.plan(prog, target, strategy)
    except (PlanningError, ProgramError) as e:
        event(f"refused: {type(e).__name__}")
        assume(False)
    event(f"tiled: {bool(planned.plan.groups)}")
    xs = random_inputs(prog, seed=3)
    checks = compare(run_unplanned(prog, xs), planned.run(xs), prog)
    assert all(c.ok for c in checks), checks
