"""Foralls carry a ``mapping`` where the target gives one: the ``gpu`` target's worker grids as
GPU blocks, verified by upstream MLIR 22 and by IREE's bindings, none for ``cpu`` and ``spyre``;
a mapped forall still runs on OpenMP threads (the mapping is for a GPU lowering, the loop is
parallel either way)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import apportion as ap
from apportion.mlir import upstream
from apportion.mlir.forall import forall_mlir, verify_mlir
from apportion.mlir.forall.context import forall_mapping
from apportion.schedule.lower import lower

ROOT = Path(__file__).parents[3]
needs_mlir = pytest.mark.skipif(not upstream.available() or
                                upstream.openmp_library() is None,
                                reason="needs the mlir extra (upstream MLIR 22 and libiomp5)")
#: a forall's induction variables and what follows its region
FORALL = re.compile(r"scf\.forall \(([^)]*)\) in")
MAPPED = re.compile(r"^\s*\} \{mapping = \[([^\]]*)\]\}$", re.M)


def emitted(example: str, target: ap.Target) -> str:
    planned = ap.plan(ap.load(ROOT / f"examples/{example}.json"), target)
    return forall_mlir(lower(planned.program, planned.plan, planned.target))


@given(st.integers(1, 6))
def test_a_gpu_forall_maps_each_id_to_one_block_dim_the_last_to_x(ids):
    text = forall_mapping("gpu_blocks", ids)
    dims = re.findall(r"#gpu\.block<(\w+)>", text)
    assert len(dims) == ids == len(set(dims))
    assert dims[-1] in ("x", "linear_dim_0")
    assert forall_mapping("cores", ids) == ""


@pytest.mark.parametrize("example", ["attention", "softmax_tiled", "splitk"])
def test_every_gpu_forall_carries_a_block_mapping_and_verifies(example):
    text = emitted(example, ap.targets.gpu(cores=16))
    foralls = FORALL.findall(text)
    mappings = MAPPED.findall(text)
    assert foralls and len(mappings) == len(foralls)
    for ids, mapping in zip(foralls, mappings, strict=True):
        assert mapping.count("#gpu.block<") == ids.count(",") + 1
    verify_mlir(text)  # IREE's bindings
    if upstream.available():
        upstream.verify_upstream(text)


def test_a_toml_target_from_the_gpu_preset_with_its_own_name_maps_foralls_to_blocks(tmp_path):
    # the mapping is the target's declared capability, not its name
    path = tmp_path / "h100.toml"
    path.write_text('preset = "gpu"\nname = "h100"\ncores = 16\n')
    target = ap.targets.resolve(str(path))
    assert target.name == "h100" and target.forall_mapping == "gpu_blocks"
    assert emitted("attention", target) == emitted("attention", ap.targets.gpu(cores=16))
    named_gpu = dataclasses.replace(ap.targets.spyre(cores=8), name="gpu")
    assert "mapping" not in emitted("attention", named_gpu)


def test_cpu_and_spyre_foralls_carry_no_mapping():
    for target in (ap.targets.cpu(cores=8), ap.targets.spyre(cores=8)):
        text = emitted("attention", target)
        assert "scf.forall (" in text and "mapping" not in text


@pytest.mark.slow
@needs_mlir
def test_a_plan_for_the_gpu_target_runs_on_openmp_threads_as_the_reference():
    from apportion.backends.openmp.run import openmp_run
    from tests.helpers import checked

    planned = ap.plan(ap.load(ROOT / "examples/attention.json"), ap.targets.gpu(cores=16))
    checks, _ = checked(planned, lambda s, xs: openmp_run(s, xs, 2))
    assert all(c.ok for c in checks)
