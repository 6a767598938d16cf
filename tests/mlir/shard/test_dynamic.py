"""The dynamic-list form (``mlir.shard.dynamic``, through ``sharding.forms``): a mesh with a
run-time axis size emitted once, verified upstream, and run by upstream MLIR's execution engine
at 2, 3 and 4 devices from the same text, matching the unplanned program's numbers (uneven
shards among them)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from apportion.cli.main import main
from apportion.errors import EmitError, PlanningError
from apportion.frontend.json_format import load, loads
from apportion.frontend.random_meshes import mesh_case, random_mesh_case
from apportion.frontend.random_programs import Seeded
from apportion.ir.program import Program
from apportion.mlir.shard.body import opaque
from apportion.mlir.shard.dynamic import runnable_mlir
from apportion.mlir.upstream import MISSING, available
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.sharding.forms import dynamic_mlir, grid, run_dynamic
from apportion.sharding.mesh import Mesh, parse
from apportion.sharding.plan import ShardingPlan
from apportion.sharding.propagate import propagate
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding

pytestmark = pytest.mark.skipif(not available(), reason=MISSING)


def _matches_at(plan: ShardingPlan, counts: list[int]) -> str:
    """The form of ``plan`` run at every count of ``counts`` (the mesh's one symbol), each
    compared with the unplanned run; returns the text."""
    prog = plan.program
    text = dynamic_mlir(plan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        xs = random_inputs(prog, 0)
        want = run_unplanned(prog, xs)
        for n in counts:
            got = run_dynamic(text, prog, plan.mesh, xs, {"N": n})
            checks = compare(want, got, prog)
            assert all(c.ok for c in checks), (n, [str(c) for c in checks])
    return text


@pytest.mark.slow
@pytest.mark.parametrize(("example", "spec"), [
    pytest.param("examples/mlp.json", "tp=N~4", marks=pytest.mark.slow),  # ~30 s
    ("examples/megatron.json", "tp=N~4"),
    ("examples/megatron.json", "dp=2,tp=N~2..4"),
    pytest.param("examples/mlp.json", "dp=2,tp=N~2..4", marks=pytest.mark.slow),
])
def test_examples_run_at_two_three_and_four_devices_from_one_text(example, spec):
    plan = search(load(example), parse(spec))
    assert any(o.strategy.axes for o in plan.ops)  # something is split over the list
    _matches_at(plan, [2, 3, 4])


@pytest.mark.slow
def test_a_split_contraction_sums_the_partials_of_the_run_time_list():
    # mlp's down projection split along k over tp: each device's partial float32 sum
    # combined into the whole, cast to float16 once every part is in
    plan = search(load("examples/mlp.json"), parse("tp=N~4"))
    down = plan.strategy("down")
    assert down.out.partial == ("tp",) and down.out.reducer == "sum"
    text = _matches_at(plan, [3])
    assert re.search(r"arith\.addf %y_have, %y_shard : tensor<1024x\?xf32>|"
                     r"arith\.addf %y_have, %y_shard : tensor<\?x1024xf32>|"
                     r"arith\.addf %y_have, %y_shard : tensor<256x1024xf32>", text)


def test_the_wrapper_reads_the_device_count_from_the_grid_and_shards_are_dynamic():
    plan = search(load("examples/megatron.json"), parse("dp=2,tp=N~4"))
    text = dynamic_mlir(plan)
    assert text.startswith("shard.grid @mesh(shape = 2x?)")
    wrapper = text[text.index('func.func @"megatron"('):]
    assert 'apportion.form = "dynamic"' in wrapper
    assert "shard.grid_shape @mesh axes = [1] : index" in wrapper
    assert re.search(r"scf\.for %at_tp = %\w+ to %devices_tp ", text)  # the run-time list
    shard = re.search(r'func\.func private @"megatron\.shard\.up"\((.*?)\) ->', text)
    assert shard is not None and "?" in shard.group(1)
    # the wrapper keeps the caller's signature
    assert re.search(r'@"megatron"\(%arg_x: tensor<64x256xf32>, %arg_w1: tensor<256x1024xf32>, '
                     r"%arg_w2: tensor<1024x256xf32>\) -> \(tensor<64x256xf32>\)", wrapper)


def test_the_runnable_module_takes_the_counts_as_data_not_from_the_grid():
    plan = search(load("examples/megatron.json"), parse("tp=N~4"))
    text = dynamic_mlir(plan)
    run = runnable_mlir(text, plan.program, grid(plan.mesh))
    assert "shard.grid_shape" not in run and "shard.grid_shape" in text
    assert 'func.func @"megatron.run"(%counts: tensor<1xi64>' in run


def test_a_static_mesh_is_refused_naming_the_mesh():
    plan = search(load("examples/mlp.json"), parse("tp=2"))
    with pytest.raises(EmitError, match="tp=2 has no symbolic axis size"):
        dynamic_mlir(plan)


def test_a_run_without_the_symbol_size_is_refused():
    plan = search(load("examples/megatron.json"), parse("tp=N~4"))
    text = dynamic_mlir(plan)
    with pytest.raises(EmitError, match="no size for symbol N"):
        run_dynamic(text, plan.program, plan.mesh, random_inputs(plan.program, 0), {})


_ARGMAX_MEAN = """{"format": "apportion.program/1", "name": "rowstats",
 "tensors": {"x": {"shape": [6, 29], "dtype": "float32"}},
 "inputs": ["x"], "outputs": ["best", "avg"],
 "ops": [{"name": "pick", "op": "argmax", "out": "best[t]", "ins": ["x[t,n]"]},
         {"name": "mean", "op": "mean", "out": "avg[t,0]", "ins": ["x[t,n]"]}]}"""


@pytest.mark.slow
def test_an_argmax_and_a_mean_split_along_their_reduction_finish_across_the_list():
    prog = loads(_ARGMAX_MEAN)
    mesh = parse("tp=N~4")
    plan = propagate(prog, mesh, annotations={"x": Sharding(((), ("tp",)))})
    assert plan.strategy("pick").out.reducer == "argmax"
    assert plan.strategy("mean").out.reducer == "sum"
    _matches_at(plan, [2, 3, 4])  # 29 columns: uneven at 2, 3 and 4


def _random_plan(seed: int, peered: bool = False) -> tuple[Program, Mesh, ShardingPlan]:
    c = random_mesh_case(Seeded(seed), seed, peered=True) if peered else mesh_case(seed)
    mesh = parse(c.mesh)
    ann = {name: Sharding(dims) for name, dims in c.shardings.items()}
    plan = search(c.program, mesh, c.target, annotations=ann, time_limit=10) \
        if c.chooser == "search" else propagate(c.program, mesh, c.target, annotations=ann)
    return c.program, mesh, plan


@pytest.mark.slow
# seeded mesh cases with a symbolic axis: a reduction's partial max (12), an argmax's keys and
# a split mean (16), two axes (20, 47, 143), an inner digit of a merged read split (37)
@pytest.mark.parametrize("seed", [12, 16, 20, 37, 47, 143])
def test_random_mesh_cases_with_a_symbolic_axis_match_at_each_device_count(seed):
    prog, mesh, plan = _random_plan(seed)
    assert mesh.symbolic
    assert not any(opaque(op) for op in prog.ops)
    top = next(a for a in mesh.axes if a.symbolic).size
    _matches_at(plan, list(range(2, top + 1)))


@pytest.mark.slow
# peered meshes: halos (windows read across shards, 14 and 121: split over the run-time axis),
# reads of peers' memory in place and an all-to-all (98); over the whole held tensor each is
# an insert and the reader's cut
@pytest.mark.parametrize(("seed", "kinds"), [(14, {"halo", "peer_read"}), (98, {"all_to_all",
                                                                                "peer_read"}),
                                             (121, set())])
def test_peered_cases_with_halos_and_reads_in_place_match_at_each_device_count(seed, kinds):
    prog, mesh, plan = _random_plan(seed, peered=True)
    assert mesh.symbolic and not any(opaque(op) for op in prog.ops)
    assert kinds <= {s.kind for t in plan.transfers for s in t.steps}
    assert kinds or any(s.windows for o in plan.ops for s in o.strategy.ins)
    top = next(a for a in mesh.axes if a.symbolic).size
    _matches_at(plan, list(range(2, top + 1)))


def test_a_random_case_with_an_opaque_op_still_verifies():
    try:
        prog, _, plan = _random_plan(11)  # a cumsum: an opaque call, run whole
    except PlanningError:
        pytest.skip("case 11 did not plan")
    assert any(opaque(op) for op in prog.ops)
    assert "apportion.fallback" in dynamic_mlir(plan)


def test_cli_emits_the_dynamic_form(capsys):
    status = main(["emit", "examples/megatron.json", "--mesh", "tp=N~2..4", "--shard-form",
                   "dynamic"])
    out, _ = capsys.readouterr()
    assert status == 0 and out.startswith("shard.grid @mesh(shape = ?)")
    assert 'apportion.form = "dynamic"' in out


def test_cli_refuses_the_dynamic_form_on_a_static_mesh(capsys):
    status = main(["emit", "examples/megatron.json", "--mesh", "tp=2", "--shard-form",
                   "dynamic"])
    _, err = capsys.readouterr()
    assert status == 2 and "no symbolic axis size" in err
