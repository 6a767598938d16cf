"""Sharded programs run by the openmp backend: every device's segments as parallel IR lowered
by upstream MLIR to OpenMP and JIT-compiled (once per distinct segment), the collectives and
finishes between them on the host by the schedule's own data movement, compared with the
reference's ``run_mesh`` and the unplanned program, through the module's ``run_mesh``, the
registry's and ``apportion run --mesh --backend openmp``. Meshes of 2 and 4 devices, 2x2,
uneven splits, both finishes, a symbolic loop count, random sharded plans (hypothesis)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given

from apportion.backends import get, require
from apportion.backends.reference.mesh import run_mesh as reference_run_mesh
from apportion.cli.main import main
from apportion.errors import ExecutionError
from apportion.frontend.json_format import load
from apportion.limits import LIMITS_BY_ID, Unsupported
from apportion.mlir import upstream
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.mesh import MeshSchedule, box_shape
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from tests.conformance.draws import conformance
from tests.conformance.test_meshes import conform_mesh, mesh_cases
from tests.sharding.programs import as_float32, hard_inputs, reduction

pytestmark = pytest.mark.skipif(not upstream.available() or
                                upstream.openmp_library() is None,
                                reason="needs the mlir extra (upstream MLIR 22 and libiomp5)")

from apportion.backends.openmp import engine  # noqa: E402
from apportion.backends.openmp.adapter import BACKEND  # noqa: E402
from apportion.backends.openmp.mesh import mesh_parallel_ir, run_mesh  # noqa: E402
from apportion.runtime.check import expect  # noqa: E402

ROWS, COLS, REP = Sharding((("tp",), ())), Sharding(((), ("tp",))), Sharding(((), ()))


def _matches_reference(s: MeshSchedule, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The openmp run of ``s`` on ``inputs`` (2 threads): every output within tolerance of the
    unplanned program and of the reference's per-device run."""
    got = run_mesh(s, inputs, threads=2)
    assert got.threads == 2 and got.modules == s.distinct()
    for want in (run_unplanned(s.program, inputs), reference_run_mesh(s, inputs)):
        checks = compare(want, got.outputs, s.program)
        assert checks and all(c.ok for c in checks), checks
    return got.outputs


def _exp(rows: int, cols: int) -> Any:
    from apportion.frontend.json_format import from_dict

    return from_dict({"name": "e", "inputs": ["x"], "outputs": ["y"],
                      "tensors": {"x": {"shape": [rows, cols], "dtype": "float32"},
                                  "y": {"shape": [rows, cols], "dtype": "float32"}},
                      "ops": [{"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}]})


def test_megatron_over_a_2x2_mesh_matches_the_reference_run_mesh_and_the_unplanned_program():
    s = lower_plan(search(load("examples/megatron.json"), parse("dp=2,tp=2")))
    assert len(s.devices) == 4 and s.collectives
    _matches_reference(s, random_inputs(s.program, 1))


@pytest.mark.slow
def test_mlp_in_float32_over_2x2_gathers_and_reduce_scatters_along_each_axis():
    s = lower_plan(search(as_float32(load("examples/mlp.json")), parse("dp=2,tp=2")))
    assert [(c.kind, c.axis) for c in s.collectives] == [("reduce_scatter", "dp"),
                                                         ("reduce_scatter", "tp")]
    _matches_reference(s, random_inputs(s.program, 0))


def test_uneven_shards_compile_one_module_per_distinct_segment_and_move_exactly():
    p = _exp(10, 6)  # 10 rows over 4 devices: shards of 3 and of 2 rows
    gather = lower_plan(propagate(p, parse("tp=4"), annotations={"x": ROWS, "y": REP}))
    assert sorted({box_shape(b)[0] for b in gather.collectives[0].src_boxes}) == [2, 3]
    assert len(gather.distinct_launches()) == gather.distinct() == 2
    _matches_reference(gather, random_inputs(p, 2))
    to_all = lower_plan(propagate(p, parse("tp=4"), annotations={"x": ROWS, "y": COLS}))
    assert [c.kind for c in to_all.collectives] == ["all_to_all"]
    _matches_reference(to_all, random_inputs(p, 3))


@pytest.mark.parametrize(("fn", "dtype"), [("argmax", "float16"), ("argmax", "int8"),
                                           ("mean", "bfloat16")])
def test_an_argmax_and_a_mean_split_over_a_2x2_mesh_finish_on_the_host(fn, dtype):
    p = reduction(fn, dtype=dtype)
    s = lower_plan(propagate(p, parse("a=2,b=2"), annotations={"x": Sharding(((), ("a", "b")))}))
    assert any(type(stage).__name__ == "MeshFinish" for stage in s.stages)
    # ties across devices, NaNs, signed zeros and all -inf for the float argmax
    _matches_reference(s, hard_inputs(p) if dtype == "float16" else random_inputs(p, 4))


def test_a_symbolic_loop_count_the_devices_keep_is_the_modules_argument():
    s = lower_plan(search(load("examples/softmax_symbolic.json"), parse("tp=2")),
                   params={"T": 16})
    _matches_reference(s, random_inputs(s.program, 0))


def test_sequential_loops_and_one_thread_give_the_same_numbers():
    s = lower_plan(search(load("examples/megatron.json"), parse("tp=2")))
    xs = random_inputs(s.program, 5)
    many = run_mesh(s, xs, threads=2).outputs
    one = run_mesh(s, xs, threads=1, lowering=engine.SEQUENTIAL).outputs
    assert one.keys() == many.keys()
    assert all(np.array_equal(one[k], many[k]) for k in one)


def test_the_one_check_compares_every_output_of_a_mesh_run_with_the_unplanned_program():
    s = lower_plan(search(load("examples/megatron.json"), parse("tp=2")))
    want = expect(s.program, seed=3)
    run = run_mesh(s, want.inputs, threads=2)
    checks = want.compare(run)
    assert [c.tensor for c in checks] == list(s.program.outputs) and all(c.ok for c in checks)
    assert run.modules == 1 and run.run_s > 0


def test_the_registry_runs_a_mesh_and_refuses_what_it_cannot_honour():
    s = lower_plan(search(load("examples/megatron.json"), parse("tp=2")))
    assert BACKEND is get("openmp") and BACKEND.run_mesh is not None
    assert BACKEND.supports(s) == ()
    xs = random_inputs(s.program, 6)
    got = BACKEND.run_mesh(s, xs, seed=9, threads=2)
    assert all(c.ok for c in compare(run_unplanned(s.program, xs), got, s.program))
    with pytest.raises(ExecutionError, match="timeout_s and device apply to the dtensor"):
        BACKEND.run_mesh(s, xs, device="cuda")
    with pytest.raises(ExecutionError, match="timeout_s and device apply to the dtensor"):
        BACKEND.run_mesh(s, xs, timeout_s=5.0)
    with pytest.raises(ExecutionError, match="runs by run_mesh"):
        assert BACKEND.run is not None
        BACKEND.run(s, xs)


def test_a_segment_without_parallel_ir_is_refused_up_front_naming_the_op_and_limit():
    from tests.backends.openmp.test_openmp import noise_program

    p = noise_program()
    s = lower_plan(propagate(p, parse("tp=2"), annotations={"t": ROWS}))
    assert BACKEND.supports(s) == (LIMITS_BY_ID["iree-kind-without-mlir"],)
    with pytest.raises(ExecutionError, match=r"op 'noise' \(uniform\) has no parallel IR"):
        mesh_parallel_ir(s)
    with pytest.raises(Unsupported, match="limit iree-kind-without-mlir"):
        require(BACKEND, s)


def test_run_mesh_backend_openmp_check_matches_and_exits_0(capsys):
    assert main(["run", "examples/megatron.json", "--mesh", "dp=2,tp=2", "--backend", "openmp",
                 "--threads", "2", "--check"]) == 0
    assert "per-device parallel IR of megatron over dp=2,tp=2 (dp=2,tp=2, 4 devices) (search, " \
           "openmp) run with OpenMP, collectives between them on the host, matches the " \
           "unplanned program" in capsys.readouterr().out
    assert main(["run", "examples/megatron.json", "--mesh", "tp=2", "--backend", "openmp"]) == 0
    assert "ran megatron over tp=2 (tp=2, 2 devices) (search, openmp): 2 devices" in \
        capsys.readouterr().out


@pytest.mark.slow
@conformance(6)
@given(mesh_cases())
def test_random_sharded_plans_match_the_reference_or_name_a_documented_limit(c):
    conform_mesh(c, "openmp")
