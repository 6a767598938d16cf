"""Conformance on meshes: random programs sharded over random meshes (1 or 2 axes of 2 to 4
devices, uneven cuts, symbolic axes bound at run; annotations propagated or searched),
lowered, run by the reference against the unplanned program, then by every backend that runs
meshes. A backend either matches or refuses naming a documented limit; wrong numbers, an error
citing no limit, or a crash fail, and ``apportion bench conformance --check`` fails on them."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st
from rich.console import Console

from apportion.backends import BACKENDS, Backend
from apportion.bench import conformance as bench_conformance
from apportion.bench.conformance import (
    MESH_STEPS,
    MeshRecord,
    Outcome,
    mesh_backends,
    mesh_goals,
    plan_mesh_case,
    run_mesh_backend,
    run_mesh_case,
    show_meshes,
    steps_of,
)
from apportion.cli.main import main
from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.frontend.random_meshes import MeshCase, mesh_case, random_mesh_case
from apportion.limits import LIMITS_BY_ID, cite
from apportion.runtime import random_inputs, run_unplanned
from apportion.sharding.mesh import parse
from apportion.sharding.spec import Sharding
from tests.conformance.draws import HypothesisDraw, conformance

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs the torch extra")

#: seeds over which every resharding step and finish occurs (the last first occurs at 16)
SEEDS = 60


@st.composite
def mesh_cases(draw: Any) -> MeshCase:
    return random_mesh_case(HypothesisDraw(draw))


def planned(c: MeshCase) -> Any:
    """``c`` sharded and lowered; a case the planner refuses is skipped."""
    try:
        return plan_mesh_case(c)
    except (PlanningError, ProgramError) as e:
        event(f"not planned: {type(e).__name__}")
        assume(False)


def conform_mesh(c: MeshCase, backend: str) -> Outcome:
    """The reference runs ``c`` exactly, then ``backend`` matches it or names a documented
    limit of its own."""
    schedule = planned(c)
    inputs = random_inputs(c.program, seed=5)
    want = run_unplanned(c.program, inputs)
    ref = run_mesh_backend(BACKENDS["reference"], c.program, schedule, inputs, want)
    assert ref.status == "match", ref  # the reference runs every sharded plan exactly
    out = run_mesh_backend(BACKENDS[backend], c.program, schedule, inputs, want)
    event(f"{backend}: {out.status} {out.detail if out.status == 'refused' else ''}")
    for step in steps_of(schedule):
        event(f"step: {step}")
    assert out.status != "failed", out
    if out.status == "refused":
        assert out.detail in LIMITS_BY_ID and backend in LIMITS_BY_ID[out.detail].backends
    return out


# -- the generator --------------------------------------------------------------------------------

def test_the_mesh_cases_hold_every_resharding_step_both_finishes_and_uneven_shards():
    seen: Counter[str] = Counter()
    for seed in range(SEEDS):
        try:
            schedule = plan_mesh_case(mesh_case(seed))
        except (PlanningError, ProgramError):
            continue
        seen.update(steps_of(schedule))
    assert set(seen) == set(MESH_STEPS), seen
    assert {"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "slice"} <= set(seen)


def test_the_mesh_cases_draw_both_mesh_ranks_symbolic_axes_both_choosers_and_many_families():
    cases = [mesh_case(seed) for seed in range(SEEDS)]
    features = Counter(f for c in cases for f in c.features)
    for wanted in ("1-axis mesh", "2-axis mesh", "symbolic axis", "annotated", "search",
                   "propagate", "tiled"):
        assert features[wanted] > 0, wanted
    assert {"sharded", "chain", "masks", "single", "nested", "symbolic"} <= \
        {c.family for c in cases}


def test_a_mesh_case_is_reproduced_from_its_seed():
    assert mesh_case(11) == mesh_case(11)
    a, b = run_mesh_case(1, ()), run_mesh_case(1, ())
    assert (a.family, a.mesh, a.sizes, a.chooser, a.steps) == \
        (b.family, b.mesh, b.sizes, b.chooser, b.steps)
    assert [o.status for o in a.outcomes] == [o.status for o in b.outcomes] == ["match"]


@conformance(60)
@given(mesh_cases())
def test_a_random_mesh_case_fits_its_mesh_at_planning_and_bound_sizes(c):
    mesh = parse(c.mesh)
    assert 1 <= len(mesh.axes) <= 2 and all(2 <= a.size <= 4 for a in mesh.axes)
    assert not c.program.symbols  # a program with run-time sizes is bound at them
    for axis in mesh.axes:
        if axis.symbol is not None:  # planned at its largest size, bound at one no larger
            assert 2 <= c.sizes[axis.symbol] <= axis.size == axis.max
    bound = mesh.bind(dict(c.sizes)) if c.sizes else mesh
    for name, dims in c.shardings.items():
        shape = c.program.tensor(name).shape
        Sharding(dims).check(mesh, shape, name)  # no empty shard, axes of the mesh
        Sharding(dims).check(bound, shape, name)


# -- the backends on random sharded plans ---------------------------------------------------------

@conformance(12)
@given(mesh_cases())
def test_the_reference_runs_random_sharded_plans_exactly(c):
    schedule = planned(c)
    inputs = random_inputs(c.program, seed=2)
    want = run_unplanned(c.program, inputs)
    got = run_mesh_backend(BACKENDS["reference"], c.program, schedule, inputs, want)
    assert got.status == "match", got


@needs_torch
@conformance(12)
@given(mesh_cases())
def test_torch_runs_random_sharded_plans_as_the_reference_or_names_a_limit(c):
    conform_mesh(c, "torch")


@pytest.mark.slow
@conformance(20)
@given(mesh_cases())
def test_iree_runs_random_sharded_plans_as_the_reference_or_names_a_limit(c):
    conform_mesh(c, "iree")


@pytest.mark.slow
@pytest.mark.distributed
@needs_torch
@conformance(3)
@given(mesh_cases())
def test_dtensor_runs_random_sharded_plans_as_the_reference_or_names_a_limit(c):
    conform_mesh(c, "dtensor")


def test_a_refusal_while_running_names_its_limit_and_an_uncited_error_fails():
    c = mesh_case(1)
    schedule = plan_mesh_case(c)
    inputs = random_inputs(c.program, seed=1)
    want = run_unplanned(c.program, inputs)

    def refuse(*_: Any, **__: Any) -> Any:
        raise ExecutionError(f"cannot run it {cite('iree-accumulate-kind')}")

    def crash(*_: Any, **__: Any) -> Any:
        raise KeyError("t0")

    def fake(run_mesh: Any) -> Backend:
        return Backend("iree", "a backend for tests", lambda _: (), run_mesh=run_mesh)

    refused = run_mesh_backend(fake(refuse), c.program, schedule, inputs, want)
    assert (refused.status, refused.detail, refused.up_front) == \
        ("refused", "iree-accumulate-kind", False)
    failed = run_mesh_backend(fake(crash), c.program, schedule, inputs, want)
    assert (failed.status, failed.detail) == ("failed", "KeyError: 't0'")


# -- the bench ------------------------------------------------------------------------------------

def record(seed: int, *outcomes: Outcome) -> MeshRecord:
    return MeshRecord(seed, "sharded", (), "dp=3", {}, "search", "spyre", 8, "yes",
                      ("all_gather",), outcomes)


def test_the_mesh_table_counts_refusals_by_limit_and_lists_failures_with_their_seed():
    ok = Outcome("reference", "match")
    records = [record(0, ok, Outcome("torch", "match"),
                      Outcome("iree", "refused", "iree-accumulate-kind", up_front=True)),
               record(5, ok, Outcome("torch", "failed", "wrong numbers: t1"),
                      Outcome("iree", "match")),
               record(6, Outcome("reference", "failed", "boom"))]
    console = Console(record=True, width=160)
    show_meshes(records, console, 2, ("torch", "iree"))
    text = console.export_text()
    assert "mesh conformance: 2 sharded plans the reference runs exactly" in text
    assert "iree refused by: iree-accumulate-kind 1" in text
    assert "FAIL torch mesh seed 5 (sharded over dp=3, search): wrong numbers: t1" in text
    assert "plans holding each step: all_gather 3" in text
    met = {g.what.split(" ")[0]: g for g in mesh_goals(records, ("torch", "iree"))}
    assert not met["reference:"].met and "mesh seed 6" in met["reference:"].figure
    assert not met["torch"].met and "mesh seed 5 (wrong numbers: t1)" in met["torch"].figure
    assert met["iree"].met  # a refusal naming a documented limit is no failure


def test_every_backend_that_runs_meshes_is_checked():
    names = mesh_backends()
    assert "reference" not in names and {"iree", "dtensor"} <= set(names)
    assert all(BACKENDS[n].run_mesh is not None for n in names)


def test_openmp_runs_meshes_in_the_table_only_where_the_mlir_extra_is_installed(monkeypatch):
    from apportion.mlir import upstream

    monkeypatch.setattr(upstream, "package_dir", lambda: None)
    assert "openmp" not in mesh_backends() and "iree" in mesh_backends()
    monkeypatch.undo()
    if upstream.available() and upstream.openmp_library() is not None:
        assert mesh_backends()[-1] == "openmp"


def test_a_small_mesh_conformance_run_passes_and_writes_its_records(tmp_path, capsys):
    out = tmp_path / "conf.json"
    assert main(["bench", "conformance", "--n", "3", "--dtensor", "0", "--json", str(out),
                 "--check"]) == 0
    text = capsys.readouterr().out
    assert "mesh conformance:" in text
    assert "goal met: reference: the per-device run matches the unplanned program" in text
    doc = json.loads(out.read_text())
    assert [r["seed"] for r in doc["meshes"]] == [0, 1, 2]
    ran = {o["backend"] for r in doc["meshes"] for o in r["outcomes"]}
    assert "iree" in ran and "dtensor" not in ran  # --dtensor 0
    assert ("openmp" in ran) == ("openmp" in mesh_backends())  # where the mlir extra is


def _spoil(a: np.ndarray) -> np.ndarray:
    """``a`` with its first element wrong whatever its dtype."""
    a = np.array(a, copy=True)
    flat = a.reshape(-1)
    flat[0] = ~flat[0] if a.dtype == np.bool_ else flat[0] + 1000
    return a


def test_check_fails_when_a_mesh_backend_gives_wrong_numbers(monkeypatch, capsys):
    real = BACKENDS["iree"]
    assert real.run_mesh is not None
    real_run = real.run_mesh

    def wrong(schedule: Any, inputs: Any, **options: Any) -> dict[str, np.ndarray]:
        return {k: _spoil(v) for k, v in real_run(schedule, inputs, **options).items()}

    patched = {name: BACKENDS[name] for name in BACKENDS}
    patched["iree"] = dataclasses.replace(real, run_mesh=wrong)
    monkeypatch.setattr(bench_conformance, "BACKENDS", patched)
    assert main(["bench", "conformance", "--n", "2", "--dtensor", "0", "--check"]) == 1
    captured = capsys.readouterr()
    assert "FAIL iree mesh seed 1 (sharded over dp=3, search): wrong numbers:" in captured.out
    assert "goal MISSED: iree matches or names a documented limit on every sharded plan" in \
        captured.err


def test_seed_starts_the_cases_of_both_tables_at_the_given_seed(monkeypatch, tmp_path):
    """``--seed S`` fuzzes cases S .. S+N-1, programs and meshes alike, seeds never run
    before; each record names its own seed."""
    import json

    monkeypatch.setattr(bench_conformance, "run_case",
                        lambda seed, backends=bench_conformance.CHECKED:
                        bench_conformance.Record(seed=seed, family="f", features=(),
                                                 target="t", cores=1, strategy="s",
                                                 planned="refused: stub"))
    monkeypatch.setattr(bench_conformance, "run_mesh_case",
                        lambda seed, backends=None: bench_conformance.MeshRecord(
                            seed=seed, family="f", features=(), mesh="dp=2", sizes={},
                            chooser="search", target="t", cores=1, planned="refused: stub"))
    out = tmp_path / "c.json"
    argv = ["bench", "conformance", "--seed", "7000", "--n", "3", "--json", str(out)]
    assert main(argv) in (0, 1)
    doc = json.loads(out.read_text())
    assert [r["seed"] for r in doc["programs"]] == [7000, 7001, 7002]
    assert [r["seed"] for r in doc["meshes"]] == [7000, 7001, 7002]


def test_seed_is_refused_by_a_suite_that_takes_none():
    assert main(["bench", "workdiv", "--seed", "3"]) == 2
