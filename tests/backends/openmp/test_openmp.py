"""The parallel IR lowered by upstream MLIR 22 to OpenMP and LLVM, JIT-compiled and run on this
machine's cores, against the unplanned program: every runnable example, run-time sizes from
one module, every dtype at the boundary, random programs (hypothesis), the same numbers on one
thread, on many and with the foralls lowered to sequential loops, and the refusals (an op the
IR has no construction for, a bad team size, the ``mlir`` extra missing, a mesh schedule given
to ``run``: it runs by ``run_mesh``, ``test_mesh``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.limits import LIMITS_BY_ID, cited
from apportion.mlir import upstream
from apportion.runtime.reference import random_inputs, run_unplanned
from apportion.schedule.lower import planned_counts
from tests.backends.iree.trig import (
    FUNCTIONS,
    ROUNDED_ONCE,
    plan_trig,
    rotary_angles,
    whole_range,
    worst_float32_ulps,
)
from tests.conformance.draws import HypothesisDraw, conformance
from tests.helpers import checked, program, runnable_examples
from tests.runtime_reductions import PROGRAMS as RUNTIME_REDUCTIONS
from tests.runtime_reductions import SIZES as RUNTIME_SIZES
from tests.runtime_reductions import planned as runtime_planned

pytestmark = pytest.mark.skipif(not upstream.available() or
                                upstream.openmp_library() is None,
                                reason="needs the mlir extra (upstream MLIR 22 and libiomp5)")

from apportion.backends.openmp import engine  # noqa: E402
from apportion.backends.openmp.adapter import BACKEND  # noqa: E402
from apportion.backends.openmp.run import openmp_run, parallel_ir  # noqa: E402

ROOT = Path(__file__).parents[3]
#: matmuls of hundreds of millions of points as scalar loops (mlp, the prime-vocabulary lm_head):
#: seconds each
HEAVY = {"mlp.json", "lm_head_prime_vocab.json"}


def ok(checks: list[Any]) -> bool:
    return all(c.ok for c in checks)


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow)
                                  if p.name in HEAVY else p
                                  for p in runnable_examples(ROOT)], ids=lambda p: p.stem)
def test_every_example_matches_the_reference_on_two_openmp_threads(path):
    planned = ap.plan(ap.load(path), ap.targets.spyre(cores=8))
    checks, run = checked(planned, lambda s, xs: openmp_run(s, xs, 2))
    assert ok(checks), [c for c in checks if not c.ok]
    assert run.threads == 2


def test_a_symbolic_loop_count_is_an_argument_of_the_one_module():
    planned = ap.plan(ap.load(ROOT / "examples/softmax_symbolic.json"),
                      ap.targets.spyre(cores=8))
    counts = planned_counts(planned.plan)
    checks, first = checked(planned, lambda s, xs: openmp_run(s, xs, 2), params=counts)
    assert ok(checks)
    checks, again = checked(planned, lambda s, xs: openmp_run(s, xs, 1), seed=1, params=counts)
    assert ok(checks) and again.cached and again.compile_s == 0.0


def test_run_time_sizes_run_from_one_module_at_each_size():
    planned = ap.plan(ap.load(ROOT / "examples/dynamic_k.json"), ap.targets.spyre(cores=8))
    assert planned.symbols
    runs = []
    for k in (65536, 8192):
        checks, run = checked(planned, lambda s, xs: openmp_run(s, xs, 2), params={"K": k})
        assert ok(checks), (k, [c for c in checks if not c.ok])
        runs.append(run)
    assert runs[1].cached  # the second size needs no new module


@pytest.mark.parametrize("name", list(RUNTIME_REDUCTIONS))
def test_a_gpu_reduction_over_several_dims_beside_a_run_time_size_runs_at_every_size(name):
    planned = runtime_planned(name)
    for i, k in enumerate(RUNTIME_SIZES):
        checks, run = checked(planned, lambda s, xs: openmp_run(s, xs, 2), params={"K": k})
        assert ok(checks), (k, [c for c in checks if not c.ok])
        assert run.cached == (i > 0), k  # one module for every size


@pytest.mark.slow
def test_one_thread_many_threads_and_sequential_loops_give_the_same_bits():
    planned = ap.plan(ap.load(ROOT / "examples/attention.json"), ap.targets.spyre(cores=8))
    inputs = random_inputs(planned.program, 3)
    runs = [openmp_run(planned.lowered, inputs, threads=t)
            for t in (1, 2, 4)]
    runs.append(openmp_run(planned.lowered, inputs,
                           lowering=engine.SEQUENTIAL))
    for run in runs[1:]:
        for name in planned.program.outputs:
            # each thread writes its own slices and partials combine after the loop: the order
            # threads run in changes no bit
            assert np.array_equal(run.tensors[name], runs[0].tensors[name], equal_nan=True)


def test_each_forall_becomes_an_openmp_loop_and_the_sequential_lowering_has_none():
    planned = ap.plan(ap.load(ROOT / "examples/fused.json"), ap.targets.spyre(cores=8))
    text = parallel_ir(planned.lowered)
    foralls = text.count("scf.forall (")
    assert foralls >= 2
    parallel = engine.lower_llvm(text, engine.PARALLEL)
    assert parallel.count("omp.parallel") == foralls and parallel.count("omp.wsloop") == foralls
    assert "scf." not in parallel and "omp." not in engine.lower_llvm(text, engine.SEQUENTIAL)


def dtypes_program() -> ap.Program:
    """Every element type at the boundary: float16, bfloat16, float32, int32, int64, bool."""
    return program(
        {"h": ([64, 96], "float16"), "b": ([64, 96], "bfloat16"), "f": ([64, 96], "float32"),
         "i": ([64, 96], "int32"), "j": ([64, 96], "int64"), "m": ([64, 96], "bool")},
        [{"name": "hb", "op": "add", "out": "hb[r,c]", "ins": ["h[r,c]", "b[r,c]"]},
         {"name": "bb", "op": "mul", "out": "bb[r,c]", "ins": ["b[r,c]", "b[r,c]"]},
         {"name": "ij", "op": "add", "out": "ij[r,c]", "ins": ["i[r,c]", "j[r,c]"]},
         {"name": "gt", "op": "gt", "out": "g[r,c]", "ins": ["f[r,c]", "hb[r,c]"]},
         {"name": "w", "op": "where", "out": "w[r,c]", "ins": ["m[r,c]", "f[r,c]", "bb[r,c]"]},
         {"name": "s", "op": "sum", "out": "s[r]", "ins": ["ij[r,c]"]}],
        ["hb", "bb", "ij", "g", "w", "s"])


def test_every_dtype_crosses_the_boundary_and_matches():
    planned = ap.plan(dtypes_program(), ap.targets.spyre(cores=8))
    checks, _ = checked(planned, lambda s, xs: openmp_run(s, xs, 2))
    assert ok(checks), [c for c in checks if not c.ok]
    assert {c.dtype for c in checks} >= {"float16", "bfloat16", "float32", "int32", "bool"}


def test_the_backend_interface_runs_a_planned_programs_schedule():
    planned = ap.plan(ap.load(ROOT / "examples/splitk.json"), ap.targets.spyre(cores=8))
    assert BACKEND.name == "openmp" and BACKEND.does == "run" and BACKEND.run_mesh is not None
    assert BACKEND.supports(planned) == ()
    inputs = random_inputs(planned.program, 0)
    assert BACKEND.run is not None
    got = BACKEND.run(planned.lowered, inputs, threads=2)
    want = run_unplanned(planned.program, inputs)
    from apportion.runtime.reference import compare

    assert ok(compare(want, got, planned.program))


def noise_program() -> ap.Program:
    return program(
        {"t": ([6, 64], "float32")},
        [{"name": "noise", "op": "uniform", "out": "e[i,d]", "ins": [], "dims": {"i": 6, "d": 64},
          "seed": 3, "dtype": "float32"},
         {"name": "add", "op": "add", "out": "s[i,d]", "ins": ["t[i,d]", "e[i,d]"]}],
        ["s"])


def test_an_op_without_parallel_ir_is_refused_naming_it_and_the_limit():
    planned = ap.plan(noise_program(), ap.targets.spyre(cores=8))
    assert BACKEND.supports(planned) == (LIMITS_BY_ID["iree-kind-without-mlir"],)
    with pytest.raises(ExecutionError, match=r"op 'noise' \(uniform\) has no parallel IR") as e:
        openmp_run(planned.lowered, random_inputs(planned.program, 0))
    assert cited(str(e.value)) is LIMITS_BY_ID["iree-kind-without-mlir"]


def test_a_team_of_no_threads_is_refused():
    planned = ap.plan(ap.load(ROOT / "examples/fused.json"), ap.targets.spyre(cores=8))
    with pytest.raises(ExecutionError, match="threads must be at least 1, got 0"):
        openmp_run(planned.lowered, random_inputs(planned.program, 0), threads=0)


def test_a_mesh_schedule_is_supported_and_run_by_run_mesh_not_run():
    from apportion.sharding.lower import lower_plan
    from apportion.sharding.mesh import parse
    from apportion.sharding.search import search

    schedule = lower_plan(search(ap.load(ROOT / "examples/megatron.json"), parse("tp=2")))
    assert BACKEND.supports(schedule) == ()
    assert BACKEND.run is not None
    with pytest.raises(ExecutionError, match="the mesh schedule of 'megatron' runs by run_mesh"):
        BACKEND.run(schedule, random_inputs(schedule.program, 0))


def test_without_the_mlir_extra_a_run_is_refused_naming_the_extra(monkeypatch):
    planned = ap.plan(ap.load(ROOT / "examples/fused.json"), ap.targets.spyre(cores=8))
    monkeypatch.setattr(upstream, "package_dir", lambda: None)
    monkeypatch.setattr(engine, "ENGINES", engine.EngineCache())
    with pytest.raises(ap.errors.ApportionError, match="install apportion's 'mlir' extra"):
        openmp_run(planned.lowered, random_inputs(planned.program, 0))


def test_the_engine_cache_keeps_the_most_recent_modules():
    cache = engine.EngineCache(size=1)
    a = "func.func @a(%x: tensor<2xf32>) -> tensor<2xf32> {\n  return %x : tensor<2xf32>\n}\n"
    b = a.replace("@a", "@b")
    first, cached = cache.get(a)
    assert not cached and cache.get(a) == (first, True)
    cache.get(b)
    assert cache.get(a)[1] is False  # a was dropped for b


@st.composite
def cases(draw: Any) -> Any:
    from apportion.frontend.random_programs import random_case

    return random_case(HypothesisDraw(draw))


@pytest.mark.slow
@conformance(12)
@given(cases())
def test_random_programs_match_the_reference_or_name_a_documented_limit(c):
    from apportion.bench.conformance import run_backend

    try:
        planned = ap.plan(c.program, c.target, c.strategy)
    except (PlanningError, ProgramError):
        assume(False)
    given_program = c.program.bind(dict(c.sizes)) if c.program.symbols else c.program
    inputs = random_inputs(given_program, seed=5)
    with np.errstate(all="ignore"):
        want = run_unplanned(given_program, inputs)
        out = run_backend(BACKEND, c, planned, inputs, want)
    event(f"openmp: {out.status}")
    assert out.status != "failed", out
    if out.status == "refused":
        assert "openmp" in LIMITS_BY_ID[out.detail].backends


def test_iree_and_the_openmp_backend_run_in_one_process():
    from apportion.mlir.forall import verify_mlir

    planned = ap.plan(ap.load(ROOT / "examples/splitk.json"), ap.targets.spyre(cores=8))
    verify_mlir(parallel_ir(planned.lowered))  # IREE's bindings
    checks, _ = checked(planned, lambda s, xs: openmp_run(s, xs, 2), seed=2)
    assert ok(checks)  # upstream's bindings live in the worker process


@pytest.mark.slow
def test_a_worker_that_ended_is_started_again_and_compiles_the_module_again():
    planned = ap.plan(ap.load(ROOT / "examples/splitk.json"), ap.targets.spyre(cores=8))
    checked(planned, lambda s, xs: openmp_run(s, xs, 1))
    before = engine.WORKER.generation
    proc = engine.WORKER._proc
    assert proc is not None
    proc.kill()
    proc.wait()
    checks, run = checked(planned, lambda s, xs: openmp_run(s, xs, 2))
    assert ok(checks) and run.cached and engine.WORKER.generation == before + 1


def test_float32_sin_and_cos_on_openmp_are_correctly_rounded_up_to_the_largest_float32():
    # the emitter computes them in f64 for every backend (``f64_math.widen_f32_math``): rotary
    # angles up to 1e5 and the whole float32 range, the hardest to reduce among them
    planned = plan_trig(ap.targets.spyre(cores=4))
    x = np.concatenate([rotary_angles(), whole_range()])
    for part in np.split(x, 2):
        got = openmp_run(planned.lowered, {"x": part},
                         threads=2).tensors
        for name, fn in FUNCTIONS.items():
            err, at = worst_float32_ulps(got[name], part, fn)
            assert err <= ROUNDED_ONCE, (name, at, err)
