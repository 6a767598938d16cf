"""PyTorch models sharded over a mesh: the lowered program (weights as inputs the search may
split) planned by the strategy search, unrolled into per-device programs run core slice by
core slice, and run on torch.distributed; every result compared with the model itself run
eagerly in PyTorch on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest

from apportion.sharding import oracle
from apportion.sharding.mesh import parse
from apportion.sharding.search import search
from apportion.sharding.unroll import unroll
from apportion.workflows.torch_model import compare_eager, load_model

pytest.importorskip("torch")
pytest.importorskip("transformers")

MLP = "apportion.frontend.torch_demo:mlp"
LLAMA = "apportion.frontend.torch_demo:tiny_llama"
GPT2 = "apportion.frontend.torch_demo:tiny_gpt2"


@pytest.fixture(scope="module")
def mlp():
    return load_model(MLP)


@pytest.fixture(scope="module")
def llama():
    return load_model(LLAMA)


def _inputs(tm):
    return tm.lowered.inputs(*tm.example_inputs)


def _matches_eager(tm, outputs):
    checks = compare_eager(tm, outputs)
    assert checks and all(c.ok for c in checks), checks


def test_the_search_splits_the_weights_of_a_torch_mlp_column_then_row(mlp):
    tm = mlp
    plan = search(tm.lowered.program, parse("tp=2"))
    placed = {n: str(s) for n, s in plan.inputs}
    # nn.Linear keeps its weight [out, in]: gate and up split their rows, down its columns
    assert placed == {"p_gate_weight": "[tp, -]", "p_up_weight": "[tp, -]",
                      "p_down_weight": "[-, tp]", "x": "[-, -]"}
    assert plan.collectives_text() == "1 reduce_scatter"
    # each device holds half of every weight, not all of them
    weights = sum(plan.program.tensor(n).nbytes for n in tm.lowered.constants)
    assert plan.peak_bytes < weights


@pytest.mark.parametrize("mesh", ["tp=2", "tp=4", "dp=2", "dp=2,tp=2", "tp=3"])
def test_the_per_device_programs_of_a_sharded_torch_mlp_match_the_model_run_eagerly(mlp, mesh):
    u = unroll(search(mlp.lowered.program, parse(mesh)))
    _matches_eager(mlp, oracle.run(u, _inputs(mlp), planned=True))


def test_a_sharded_torch_model_on_a_symbolic_mesh_matches_eager_once_bound(mlp):
    plan = search(mlp.lowered.program, parse("tp=N~4"))
    for n in (2, 4):
        _matches_eager(mlp, oracle.run(unroll(plan, {"N": n}), _inputs(mlp)))


def test_the_per_device_programs_of_a_sharded_llama_match_the_model_run_eagerly(llama):
    plan = search(llama.lowered.program, parse("tp=2"))
    # the embedding table, the gathers and the other fallbacks run whole, on replicated inputs
    fallbacks = [o for o in llama.lowered.program.ops if not o.kind.divisible]
    assert fallbacks and all(plan.strategy(o.name).label == "replicated" for o in fallbacks)
    u = unroll(plan)
    _matches_eager(llama, oracle.run(u, _inputs(llama)))
    _matches_eager(llama, oracle.run(u, _inputs(llama), planned=True))


def test_a_llama_with_a_mismatched_output_is_reported_not_hidden(llama):
    out = oracle.run(unroll(search(llama.lowered.program, parse("tp=2"))), _inputs(llama))
    (name,) = llama.lowered.outputs
    bad = {name: np.asarray(out[name]) + 1.0}
    (check,) = compare_eager(llama, bad)
    assert not check.ok and check.max_abs_err == pytest.approx(1.0, rel=1e-3)


@pytest.mark.distributed
def test_a_sharded_torch_mlp_on_two_gloo_processes_matches_the_model_run_eagerly(mlp):
    from apportion.backends.dtensor.runner import run_mesh
    from apportion.sharding.lower import lower_plan

    plan = search(mlp.lowered.program, parse("tp=2"))
    run = run_mesh(lower_plan(plan), _inputs(mlp), timeout_s=180, device="cpu")
    assert run.placement_checks >= len(plan.ops) + len(plan.program.inputs)
    _matches_eager(mlp, run.outputs)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("spec", [LLAMA, GPT2])
def test_a_sharded_transformer_on_two_gloo_processes_matches_the_model_run_eagerly(spec):
    from apportion.backends.dtensor.runner import run_mesh
    from apportion.sharding.lower import lower_plan

    tm = load_model(spec)  # scalar constants (rank 0) are placed as DTensors too
    plan = search(tm.lowered.program, parse("tp=2"))
    _matches_eager(tm, run_mesh(lower_plan(plan), _inputs(tm), timeout_s=300,
                                device="cpu").outputs)
