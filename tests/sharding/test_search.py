"""The strategy search: Megatron on transformer shapes, batch sharding on data-parallel
shapes, annotations as constraints, device memory, identical layers solved once."""

from __future__ import annotations

import pytest

from apportion.errors import PlanningError
from apportion.frontend.json_format import from_dict
from apportion.frontend.models import forward_program
from apportion.sharding import oracle
from apportion.sharding.mesh import Mesh, cards, parse
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from apportion.sharding.unroll import unroll

S = Sharding
REP = S(((), ()))


def mlp(tokens: int, hidden: int, ffn: int, dtype: str = "float16"):
    return from_dict({
        "name": "mlp", "inputs": ["x", "w1", "w2"], "outputs": ["y"],
        "tensors": {"x": {"shape": [tokens, hidden], "dtype": dtype},
                    "w1": {"shape": [hidden, ffn], "dtype": dtype},
                    "w2": {"shape": [ffn, hidden], "dtype": dtype}},
        "ops": [{"name": "up", "op": "matmul", "out": "h[t,f]", "ins": ["x[t,n]", "w1[n,f]"]},
                {"name": "act", "op": "gelu", "out": "a[t,f]", "ins": ["h[t,f]"]},
                {"name": "down", "op": "matmul", "out": "y[t,n]", "ins": ["a[t,f]",
                                                                          "w2[f,n]"]}]})


def kinds(plan) -> list[str]:
    return sorted(s.kind for t in plan.transfers for s in t.collectives)


@pytest.mark.parametrize("how", ["annotated", "outputs"])
def test_a_megatron_mlp_on_a_1d_mesh_is_column_then_row_with_one_all_reduce(how):
    p = mlp(128, 4096, 16384)
    mesh = parse("tp=4")
    plan = search(p, mesh, annotations={"x": REP, "y": REP}) if how == "annotated" else \
        search(p, mesh, outputs="replicated")
    assert [plan.strategy(o).label for o in ("up", "act", "down")] == ["f:tp", "f:tp", "f:tp"]
    assert plan.sharding("w1") == S(((), ("tp",))) and plan.sharding("w2") == S((("tp",), ()))
    assert plan.strategy("down").out.partial == ("tp",)
    assert kinds(plan) == ["all_reduce"]
    assert plan.objective_us == pytest.approx(plan.predicted_us)


def test_left_free_the_megatron_output_is_reduce_scattered_instead():
    plan = search(mlp(128, 4096, 16384), parse("tp=4"))
    assert [plan.strategy(o).label for o in ("up", "down")] == ["f:tp", "f:tp"]
    assert kinds(plan) == ["reduce_scatter"]


def test_data_parallel_shapes_are_batch_sharded_with_weights_replicated():
    plan = search(mlp(65536, 256, 512), parse("tp=4"))
    assert [o.strategy.label for o in plan.ops] == ["t:tp"] * 3
    assert plan.sharding("x") == S((("tp",), ())) and plan.sharding("w1") == REP
    assert not plan.transfers
    plan = search(mlp(65536, 256, 512), parse("tp=4"), outputs="replicated")
    assert [o.strategy.label for o in plan.ops] == ["t:tp"] * 3 and kinds(plan) == ["all_gather"]


def test_annotations_are_constraints():
    ann = {"x": S(((), ("tp",))), "h": S((("tp",), ()))}
    plan = search(mlp(128, 256, 512, "float32"), parse("tp=2"), annotations=ann)
    assert plan.sharding("x") == ann["x"] and plan.sharding("h") == ann["h"]
    assert all(c.ok for c in oracle.check(unroll(plan)))


def test_device_memory_bounds_the_search_and_a_mesh_too_small_is_refused():
    p = mlp(4096, 1024, 4096)
    free = search(p, Mesh(parse("tp=2").axes))
    cap = free.peak_bytes - 1
    tight = search(p, Mesh(parse("tp=2").axes, memory_bytes=cap))
    assert tight.peak_bytes <= cap and tight.predicted_us > free.predicted_us
    # here: the weights kept sharded and gathered for their op alone (as FSDP does)
    assert ([o.strategy for o in tight.ops], tight.inputs) != \
        ([o.strategy for o in free.ops], free.inputs)
    with pytest.raises(PlanningError, match=r"program 'mlp' does not fit mesh 'mesh': its "
                                            r"inputs need at least 12.0 MiB per device .* each "
                                            r"device has 1.0 MiB \(tensor 'x' 4.0 MiB per device "
                                            r"at best, as \[tp, -\]"):
        search(p, Mesh(parse("tp=2").axes, memory_bytes=1 << 20))
    with pytest.raises(PlanningError, match="no strategy of program 'mlp' fits mesh"):
        search(p, Mesh(parse("tp=2").axes, memory_bytes=13 << 20))


def test_identical_layers_share_one_solution_on_a_32_layer_llama_on_8():
    # how fast it solves is a goal of `apportion bench sharding`, never a unit test's assertion
    p = forward_program("llama3-8b", 32, 2048)
    plan = search(p, cards(8))
    stats = dict(plan.stats)
    assert stats["classes"] < stats["nodes"] / 10
    for i in range(2, 30):  # layers away from the ends take the same strategies
        assert [plan.strategy(o.name.replace("l1_", f"l{i}_", 1)).label
                for o in p.ops if o.name.startswith("l1_")] == \
            [plan.strategy(o.name).label for o in p.ops if o.name.startswith("l1_")]
    assert plan.peak_bytes <= cards(8).memory_bytes


def test_outputs_must_be_any_or_replicated():
    with pytest.raises(PlanningError, match="outputs must be one of any, replicated"):
        search(mlp(8, 8, 8), parse("tp=2"), outputs="sharded")


def test_a_symbolic_mesh_is_searched_at_its_planning_size_and_shows_its_symbol():
    p = mlp(128, 4096, 16384)
    plan = search(p, parse("tp=N~2..8"), annotations={"x": REP, "y": REP})
    static = search(p, parse("tp=8"), annotations={"x": REP, "y": REP})
    assert [o.strategy for o in plan.ops] == [o.strategy for o in static.ops]
    assert plan.predicted_us == pytest.approx(static.predicted_us)
    assert plan.summary().startswith("mlp on tp=N~2..8 (tp=N~8~2..8, 8 devices at N=8)")
    doc = plan.to_dict()["mesh"]["axes"][0]
    assert (doc["symbol"], doc["size"], doc["min"], doc["max"]) == ("N", 8, 2, 8)
    bound = plan.bind({"N": 2})  # the same strategies at 2 devices: shards twice as large
    assert [o.strategy.label for o in bound.ops] == [o.strategy.label for o in plan.ops]
    assert bound.peak_bytes > plan.peak_bytes and not bound.mesh.symbolic
