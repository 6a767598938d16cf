"""Propagation: annotations completed along the indexing maps, forward and backward, with a
resharding where a reader needs another sharding."""

from __future__ import annotations

import pytest

import apportion as ap
from apportion.errors import ProgramError
from apportion.frontend.json_format import load
from apportion.sharding import oracle
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.spec import Sharding, shard
from apportion.sharding.unroll import unroll

S = Sharding
MLP = ("gate", "up", "act", "glu", "down")


def labels(plan, ops=MLP):
    return [plan.strategy(o).label for o in ops]


def test_weights_annotated_megatron_style_give_column_then_row_and_one_all_reduce():
    plan = propagate(load("examples/mlp.json"), parse("tp=4"), annotations={
        "wg": S(((), ("tp",))), "wu": S(((), ("tp",))), "wd": S((("tp",), ()))})
    assert labels(plan) == ["n:tp", "n:tp", "n:tp", "n:tp", "k:tp"]
    assert plan.sharding("y") == S(((), ()), ("tp",), "sum")
    assert plan.collectives_text() == "1 all_reduce"
    assert dict((n, s) for n, s, _ in plan.outputs)["y"] == S(((), ()))
    assert all(c.ok for c in oracle.check(unroll(plan)))


def test_a_batch_split_input_runs_forward_through_every_op_without_communication():
    plan = propagate(load("examples/mlp.json"), parse("dp=2"),
                     annotations={"x": S((("dp",), ()))})
    assert labels(plan) == ["m:dp"] * 5 and not plan.transfers
    assert plan.sharding("wg") == S(((), ()))  # placed as their readers need: replicated


def test_an_annotated_output_runs_backward_to_its_producers_and_places_the_inputs():
    plan = propagate(load("examples/mlp.json"), parse("tp=2"),
                     annotations={"y": S(((), ("tp",)))})
    assert plan.strategy("down").label == "n:tp"
    assert plan.sharding("wd") == S(((), ("tp",)))
    assert not plan.transfers


def test_nothing_annotated_is_replicated_and_an_annotated_intermediate_is_resharded():
    p = load("examples/mlp.json")
    plain = propagate(p, parse("tp=2"))
    assert labels(plain) == ["replicated"] * 5 and not plain.transfers
    plan = propagate(p, parse("tp=2"), annotations={"x": S((("tp",), ())),
                                                    "a": S(((), ("tp",)))})
    moved = [t for t in plan.transfers if t.why == "annotation"]
    assert [(t.tensor, str(t.dst)) for t in moved] == [("a", "[-, tp]")]
    assert all(c.ok for c in oracle.check(unroll(plan)))


def test_builder_annotations_reach_propagation():
    mesh = parse("dp=2")
    with ap.program("b") as p:
        x = shard(p.input("x", [8, 16], "float32"), mesh, ("dp", None))
        w = p.input("w", [16, 4], "float32")
        p.output(ap.relu(x @ w))
    plan = propagate(p, mesh)
    assert [o.strategy.label for o in plan.ops] == ["d8:dp", "d8:dp"]  # anonymous dim of 8


def test_an_annotation_naming_a_missing_axis_is_refused_naming_tensor_dim_and_axis():
    with pytest.raises(ProgramError, match=r"tensor 'x' dim 0: mesh axis 'dq' is not an axis"):
        propagate(load("examples/mlp.json"), parse("dp=2"), annotations={"x": S((("dq",), ()))})
