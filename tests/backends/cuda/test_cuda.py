"""The cuda backend: the parallel IR lowered by upstream MLIR to CUDA kernels and a host
library, built into a build; run and checked where an NVIDIA GPU is present."""

from __future__ import annotations

import ctypes.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.backends.cuda import device_main
from apportion.backends.cuda.build import build, check_build, run_build
from apportion.backends.cuda.lowering import GpuArch, lower_nvvm
from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.mlir import upstream
from apportion.mlir.forall import forall_mlir
from apportion.runtime.reference import random_inputs, run_unplanned
from tests.backends.iree.trig import (
    FUNCTIONS,
    ROUNDED_ONCE,
    plan_trig,
    rotary_angles,
    whole_range,
    worst_float32_ulps,
)
from tests.helpers import emitted
from tests.runtime_reductions import PROGRAMS as RUNTIME_REDUCTIONS
from tests.runtime_reductions import planned as runtime_planned

pytestmark = pytest.mark.skipif(not upstream.available(),
                                reason="needs the mlir extra (upstream MLIR 22)")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _has_gpu() -> bool:
    return ctypes.util.find_library("cuda") is not None


def _gpu_plan(name: str, cores: int = 8) -> ap.PlannedProgram:
    return ap.plan(ap.load(EXAMPLES / f"{name}.json"), ap.targets.gpu(cores=cores))


@pytest.mark.parametrize("name", ["fused", "mlp", "attention", "rmsnorm_argmax", "halo",
                                  "dynamic_k"])
def test_every_forall_of_a_gpu_plan_becomes_one_kernel_launch(name):
    planned = _gpu_plan(name)
    text = forall_mlir(emitted(planned.program, planned.plan, planned.target))
    lowered = lower_nvvm(text).llvm
    foralls = len(re.findall(r"\bscf\.forall \(", text))
    assert lowered.count("gpu.binary @") == foralls
    assert len(re.findall(r"\bgpu\.launch_func\b", lowered)) == foralls
    assert "memref.alloc" not in lowered and "@malloc" not in lowered.split("gpu.binary")[0]


@pytest.mark.parametrize("name", list(RUNTIME_REDUCTIONS))
def test_a_gpu_reduction_over_several_dims_beside_a_run_time_size_lowers_for_every_size(name):
    # the one function for every size of K: each forall one kernel launch (the op of the
    # run-time dim first is left whole, on one core: no forall)
    text = runtime_planned(name).forall_mlir()
    lowered = lower_nvvm(text).llvm
    foralls = len(re.findall(r"\bscf\.forall \(", text))
    assert (foralls > 0) == (name != "run-time first")
    assert len(re.findall(r"\bgpu\.launch_func\b", lowered)) == foralls


def test_a_plan_whose_foralls_carry_no_gpu_mapping_is_refused_naming_the_target():
    planned = ap.plan(ap.load(EXAMPLES / "fused.json"), ap.targets.spyre(cores=8))
    text = forall_mlir(emitted(planned.program, planned.plan, planned.target))
    with pytest.raises(ExecutionError, match=r"no #gpu\.block mapping.*--target gpu"):
        lower_nvvm(text)


def test_a_build_holds_the_library_its_runtime_and_what_a_run_needs(tmp_path):
    planned = _gpu_plan("megatron")
    b = build(planned.lowered, tmp_path / "m", seed=3)
    manifest = json.loads((b.path / "manifest.json").read_text())
    assert manifest["function"] == "_mlir_ciface_megatron" and manifest["kernels"] == b.kernels
    assert [a["name"] for a in manifest["args"]] == list(planned.program.inputs)
    assert [r["name"] for r in manifest["results"]] == list(planned.program.outputs)
    for f in ("module.so", "libmlir_cuda_runtime.so", "libLLVM.so", "inputs.npz",
              "reference.json", "forall.mlir"):
        assert (b.path / f).exists(), f
    with np.load(b.path / "inputs.npz") as saved:
        want = random_inputs(planned.program, 3)
        for name in planned.program.inputs:
            np.testing.assert_array_equal(saved[name], want[name])


def test_a_run_time_size_and_a_loop_count_travel_as_index_arguments(tmp_path):
    planned = ap.plan(ap.load(EXAMPLES / "softmax_symbolic.json"), ap.targets.gpu(cores=8))
    b = build(planned.schedule(params={"T": 16}), tmp_path / "s")
    indexes = [a for a in json.loads((b.path / "manifest.json").read_text())["args"]
               if a["kind"] == "index"]
    assert {"name": "T", "kind": "index", "value": 16} in indexes


def test_outputs_that_differ_from_the_reference_fail_the_check(tmp_path):
    planned = _gpu_plan("transposed")
    b = build(planned.lowered, tmp_path / "t")
    reference = planned.program
    want = run_unplanned(reference, random_inputs(reference, 0))
    results = tmp_path / "results"
    results.mkdir()
    outputs = {n: want[n] for n in reference.outputs}
    np.savez(results / "outputs.npz", **outputs)
    assert all(c.ok for c in check_build(b.path, results))
    name = reference.outputs[0]
    np.savez(results / "outputs.npz", **{**outputs, name: outputs[name] + 1})
    assert [c.ok for c in check_build(b.path, results) if c.tensor == name] == [False]


@pytest.mark.skipif(_has_gpu(), reason="this machine has an NVIDIA driver")
def test_without_a_driver_the_device_runner_exits_2_with_one_line(tmp_path):
    planned = _gpu_plan("transposed")
    b = build(planned.lowered, tmp_path / "t")
    done = subprocess.run([sys.executable, device_main.__file__, str(b.path),
                           str(tmp_path / "out")], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: no NVIDIA driver (libcuda.so.1) on this machine"]
    with pytest.raises(ExecutionError, match="no NVIDIA driver"):
        run_build(b.path, tmp_path / "out")


def test_the_device_runner_imports_nothing_of_apportion():
    source = Path(device_main.__file__).read_text()
    assert not re.search(r"^\s*(from|import) apportion", source, re.M)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs an NVIDIA GPU and driver")
@pytest.mark.parametrize("threads", [1, 128])
@pytest.mark.parametrize("name", ["fused", "megatron", "rmsnorm_argmax", "splitk", "attention"])
def test_an_example_runs_on_the_gpu_and_matches_the_reference(tmp_path, name, threads):
    planned = _gpu_plan(name, cores=32)
    b = build(planned.lowered, tmp_path / name, threads=threads)
    run_build(b.path, tmp_path / "out")
    checks = check_build(b.path, tmp_path / "out")
    assert all(c.ok for c in checks), checks


@st.composite
def _cases(draw):
    from apportion.frontend.random_programs import random_case
    from tests.conformance.draws import HypothesisDraw

    return random_case(HypothesisDraw(draw)), draw(st.integers(1, 64))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_random_gpu_plans_lower_to_one_kernel_per_forall_or_name_the_refusal(case_cores):
    c, cores = case_cores
    try:
        planned = ap.plan(c.program, ap.targets.gpu(cores=cores), c.strategy)
    except (PlanningError, ProgramError):
        assume(False)
    try:
        text = forall_mlir(emitted(planned.program, planned.plan, planned.target,
                                   planned.given if planned.symbols else None))
    except ap.ApportionError:
        assume(False)  # the emitter's own documented refusals (tested with IREE)
    lowered = lower_nvvm(text).llvm
    assert lowered.count("gpu.binary @") == len(re.findall(r"\bscf\.forall \(", text))


@pytest.mark.parametrize(("arch", "said"), [
    (GpuArch("sm_999"), r"unknown GPU 'sm_999'"),
    (GpuArch("sm_90", "ptx78"), r"unknown PTX feature 'ptx78': expected \+ptxNN"),
    (GpuArch("sm_90", "+ptx999"), r"unknown PTX feature '\+ptx999'"),
])
def test_a_gpu_or_ptx_version_llvm_does_not_know_is_refused_naming_it(arch, said):
    planned = _gpu_plan("fused")
    text = forall_mlir(emitted(planned.program, planned.plan, planned.target))
    with pytest.raises(ExecutionError, match=said):
        lower_nvvm(text, arch)


def test_a_malformed_manifest_or_outputs_file_is_refused_naming_the_file(tmp_path):
    planned = _gpu_plan("transposed")
    b = build(planned.lowered, tmp_path / "t")
    results = tmp_path / "results"
    results.mkdir()
    np.savez(results / "outputs.npz", other=np.zeros(3))
    out = planned.program.outputs[0]
    with pytest.raises(ExecutionError, match=rf"output '{out}' in .*outputs\.npz is missing"):
        check_build(b.path, results)
    (results / "outputs.npz").write_text("not an archive")
    with pytest.raises(ExecutionError, match=r"outputs\.npz is not an npz archive"):
        check_build(b.path, results)
    (b.path / "manifest.json").write_text("{")
    with pytest.raises(ExecutionError, match=r"manifest\.json is not a build manifest"):
        check_build(b.path, results)
    (b.path / "manifest.json").write_text("{}")
    with pytest.raises(ExecutionError, match=r"lacks function, args, results, outputs"):
        check_build(b.path, results)


def _trig_build(out: Path, x: np.ndarray, threads: int = 1):
    planned = plan_trig(ap.targets.gpu(cores=32))
    return build(planned.lowered, out, inputs={"x": x}, threads=threads)


def test_float32_sin_and_cos_build_for_the_gpu_through_f64(tmp_path):
    # the emitter computes them in f64 for every backend (``f64_math.widen_f32_math``): the
    # extended operand, the reduction's i64 arithmetic and the f64 kernels all lower to PTX
    b = _trig_build(tmp_path / "trig", rotary_angles())
    text = (b.path / "forall.mlir").read_text()
    assert "math.sin" not in text and "arith.extf" in text and "arith.truncf" in text
    assert (b.path / "module.so").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs an NVIDIA GPU and driver")
@pytest.mark.parametrize("threads", [1, 128])
def test_float32_sin_and_cos_on_the_gpu_are_correctly_rounded_up_to_the_largest_float32(
        tmp_path, threads):
    for i, x in enumerate((rotary_angles(), whole_range())):
        b = _trig_build(tmp_path / f"trig{i}", x, threads)
        run_build(b.path, tmp_path / f"out{i}")
        checks = check_build(b.path, tmp_path / f"out{i}")
        assert all(c.ok for c in checks), checks
        with np.load(tmp_path / f"out{i}" / "outputs.npz") as got:
            for name, fn in FUNCTIONS.items():
                err, at = worst_float32_ulps(got[name], x, fn)
                assert err <= ROUNDED_ONCE, (name, at, err)
