"""The shard-dialect forms (``apportion.sharding.forms``, rendered by ``apportion.mlir.shard``):
every example program and a Llama-shaped block emitted in each form and verified by upstream
MLIR 22; the unrolled form compiled and run by upstream MLIR against the unplanned reference
run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apportion.errors import EmitError
from apportion.frontend.models import forward_program
from apportion.ir.program import Program
from apportion.mlir.shard.dialect import grid_op, sharding_op
from apportion.mlir.upstream import MISSING, available, mlir_opt
from apportion.sharding.forms import (
    annotated_mlir,
    grid,
    partitioned_mlir,
    propagated_mlir,
    tensor_sharding,
    unrolled_mlir,
)
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import Mesh, parse
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding, load
from tests.helpers import assert_runs_as_unplanned

pytestmark = pytest.mark.skipif(not available(), reason=MISSING)

EXAMPLES = sorted(Path("examples").glob("*.json"))
#: upstream's names of apportion's collective kinds
UPSTREAM = {"all_gather": "all_gather", "all_reduce": "all_reduce", "slice": "all_slice",
            "reduce_scatter": "reduce_scatter", "all_to_all": "all_to_all"}


def _case(path: Path) -> tuple[Program, dict[str, Sharding], Mesh]:
    """The example with its annotations, run-time sizes bound, on a mesh of 2 devices per
    axis its annotations name (``tp=2`` when it has none)."""
    prog, ann = load(path)
    if prog.symbols:
        prog = prog.bind({s.name: 256 for s in prog.symbols})
    axes = sorted({a for s in ann.values() for a in s.axes}) or ["tp"]
    return prog, ann, parse(",".join(f"{a}=2" for a in axes))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_is_emitted_in_every_form_and_verified_upstream(path):
    prog, ann, mesh = _case(path)
    plan = search(prog, mesh, annotations=ann)
    form1 = annotated_mlir(prog, mesh, ann)
    assert form1.count("shard.shard ") == len(ann)
    assert form1.count("linalg.generic") + form1.count("func.call") >= len(prog.ops)
    form2 = propagated_mlir(plan)
    # every input, operand and result annotated
    assert form2.count("shard.shard ") >= len(prog.inputs) + len(prog.ops) + \
        sum(len(o.ins) for o in prog.ops)
    form4 = unrolled_mlir(lower_plan(plan), mesh)
    assert f'func.func @"{prog.name}"(' in form4 or f"func.func @{prog.name}(" in form4
    try:
        form3 = partitioned_mlir(plan)
    except EmitError as e:  # a read of peers' memory in place: no shard op says it
        assert "reads it in place from its peers' memory" in str(e)
        return
    kinds = {UPSTREAM[c] for c in plan.collectives}  # communicating steps: no local slice
    found = set(re.findall(r"shard\.(all_gather|all_reduce|all_slice|reduce_scatter|"
                           r"all_to_all) ", form3))
    assert kinds <= found and found - kinds <= {"all_slice"}


def test_a_llama_block_is_emitted_in_every_form_and_verified_upstream():
    prog = forward_program("llama3-8b", layers=1, tokens=64)
    mesh = parse("tp=2")
    plan = search(prog, mesh)
    assert "shard.grid @mesh(shape = 2)" in annotated_mlir(prog, mesh, {})
    assert propagated_mlir(plan).count("linalg.generic") >= len(prog.ops)
    form3 = partitioned_mlir(plan)
    for c in plan.collectives:
        assert f"shard.{UPSTREAM[c]} " in form3
    assert "func.call" in unrolled_mlir(lower_plan(plan), mesh)


@pytest.mark.slow
def test_a_llama_block_on_a_2d_mesh_is_emitted_in_every_form():
    prog = forward_program("llama3-8b", layers=1, tokens=64)
    mesh = parse("dp=2,tp=2")
    plan = search(prog, mesh)
    for text in (propagated_mlir(plan), partitioned_mlir(plan),
                 unrolled_mlir(lower_plan(plan), mesh)):
        assert text.startswith("shard.grid @mesh(shape = 2x2)")


def test_the_grid_carries_static_dynamic_and_peered_axes():
    text = grid_op(grid(parse("dp=2@node,tp=N~4~2..8@chiplet:peered")))
    assert text.startswith("shard.grid @mesh(shape = 2x?)")
    for part in ('apportion.axes = ["dp", "tp"]', 'apportion.peered = ["tp"]',
                 'apportion.symbols = {tp = "N"}', 'apportion.levels = ["node", "chiplet"]'):
        assert part in text
    assert mlir_opt(text).strip().startswith("module")


def test_an_uneven_cut_lists_its_offsets_and_a_partial_value_its_axes():
    mesh = parse("dp=2,tp=3")
    s = sharding_op("%s", tensor_sharding(Sharding((("tp",), ()), partial=("dp",), reducer="sum"),
                                          mesh, (10, 4)))
    assert "sharded_dims_offsets = [0, 4, 7, 10]" in s
    assert 'apportion.partial_axes = array<i64: 0>, apportion.reducer = "sum"' in s


def test_a_symbolic_mesh_is_annotated_but_partitioned_only_once_bound():
    prog, ann = load("examples/megatron.json")
    mesh = parse("tp=N~2..4")
    plan = search(prog, mesh, annotations=ann)
    assert "shape = ?" in annotated_mlir(prog, mesh, ann)
    assert "shape = ?" in propagated_mlir(plan)
    with pytest.raises(EmitError, match="symbolic"):
        partitioned_mlir(plan)
    assert "shape = 2" in partitioned_mlir(plan.bind({"N": 2}))


@pytest.mark.parametrize("spec", ["tp=3", "dp=2,tp=3"])
@pytest.mark.parametrize("name", ["megatron", "mlp", "splitk", "rmsnorm_argmax", "fused"])
def test_uneven_shards_move_in_equal_slots_through_upstream_collectives(name, spec):
    prog, ann = load(f"examples/{name}.json")
    plan = search(prog, parse(spec), annotations=ann)
    text = partitioned_mlir(plan)
    moved = [c for c in plan.collectives if c != "all_reduce"]
    if moved:  # each device's pieces padded into slots of the largest piece, then moved
        assert ".slots" in text and ".moved" in text
    assert "scf.index_switch" in text or "tensor<" in text


#: examples the execution engine runs quickly (no fallback op, which is an opaque call)
RUNS = ["megatron", "attention", "merge_heads", "splitk", "fused", "transposed", "matmul_mk",
        "softmax_tiled", "dynamic_k", "halo"]


def _run_unrolled(prog: Program, ann: dict[str, Sharding], mesh: Mesh) -> None:
    plan = search(prog, mesh, annotations=ann)
    assert_runs_as_unplanned(unrolled_mlir(lower_plan(plan), mesh), prog)


@pytest.mark.parametrize("name", RUNS)
def test_the_unrolled_form_runs_upstream_and_matches_the_unplanned_program(name):
    prog, ann, mesh = _case(Path(f"examples/{name}.json"))
    _run_unrolled(prog, ann, mesh)


@pytest.mark.parametrize("spec", ["tp=3", "dp=2,tp=2"])
def test_the_unrolled_form_runs_uneven_and_two_axis_meshes_exactly(spec):
    prog, ann = load("examples/megatron.json")
    _run_unrolled(prog, ann, parse(spec))


def test_a_split_mean_and_argmax_finish_and_unpack_in_the_unrolled_form():
    prog, _ = load("examples/rmsnorm_argmax.json")
    # without the sort (a fallback: an opaque call the engine has no body for)
    prog = Program(prog.name, tuple(t for t in prog.tensors if t.name != "ranked"),
                   prog.inputs, ("y", "best"), prog.ops[:-1])
    ann = {"x": Sharding(((), ("tp",)))}
    plan = search(prog, parse("tp=2"), annotations=ann)
    assert plan.strategy("ms").split_map.get("n") == ("tp",)
    _run_unrolled(prog, ann, parse("tp=2"))


@pytest.mark.parametrize("name", ["megatron", "mlp", "splitk", "softmax_tiled", "matmul_mk"])
def test_upstream_propagates_the_annotated_form_and_partitions_the_propagated_form(name):
    prog, ann, mesh = _case(Path(f"examples/{name}.json"))
    plan = search(prog, mesh, annotations=ann)
    seeds = {**dict(plan.inputs), **ann}  # the inputs as apportion placed them: a partial
    propagated = mlir_opt(annotated_mlir(prog, mesh, seeds),  # annotation upstream completes
                          ["--pass-pipeline=builtin.module(func.func(sharding-propagation))"])
    assert propagated.count("shard.shard ") > len(seeds)
    partitioned = mlir_opt(propagated_mlir(plan),
                           ["--pass-pipeline=builtin.module(func.func(shard-partition))"])
    assert "shard.shard " not in partitioned  # every annotation turned into per-shard code


#: a Llama-shaped configuration small enough to run loop by loop: grouped-query attention
#: (4 heads over 2 K/V heads), RMS norms, a gated SiLU MLP
TINY = {"hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "head_dim": 16, "vocab": 96,
        "layers": 1, "norm": "rms", "act": "silu", "gated_mlp": True}


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["tp=2", pytest.param("dp=2,tp=2", marks=pytest.mark.slow)])
def test_a_sharded_llama_block_runs_upstream_in_the_unrolled_form_and_matches(spec):
    prog = forward_program("tiny", layers=1, tokens=16, dtype="float32",
                           models={"models": {"tiny": TINY}})
    _run_unrolled(prog, {}, parse(spec))
