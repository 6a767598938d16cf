"""Group distribution: splits agreeing across a loop group so its tiles stay on chip."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from apportion.errors import PlanningError, ProgramError
from apportion.passes.geometry import OpContext
from apportion.passes.layouts import layouts, tensor_layouts
from apportion.passes.pipeline import plan
from apportion.runtime import compare, random_inputs, run_unplanned
from apportion.target import spyre
from tests.backends.reference.test_loops_properties import tiled_programs
from tests.helpers import program, run_tiled

F16 = "float16"
# a plain MLP (up, gelu, down) over 128 tokens, one loop of count 1 around all three
MLP_TENSORS = {"x": ([1024, 768], F16), "wu": ([768, 3072], F16), "wd": ([3072, 768], F16)}
MLP_OPS = [{"name": "up", "op": "matmul", "out": "u[t,f]", "ins": ["x[t,n]", "wu[n,f]"]},
           {"name": "act", "op": "gelu", "out": "m[t,f]", "ins": ["u[t,f]"]},
           {"name": "down", "op": "matmul", "out": "y[t,n]", "ins": ["m[t,f]", "wd[f,n]"]}]


def mlp(tiled: bool = True, **extra):
    tiling = [{"ops": ["up", "act", "down"], "loops": [{"count": 1, "dims": ["t"]}]}]
    return program(MLP_TENSORS, MLP_OPS, ["y"], **({"tiling": tiling} if tiled else {}),
                   **extra)


def group_cost(p, pl, target) -> float:
    """Sum of the group's op times with its scratchpad tensors costing no traffic."""
    lx = frozenset(pl.groups[0].lx_tensors)
    total = 0.0
    for op_plan in pl.ops:
        op = p.op(op_plan.name)
        ctx = OpContext(op, p, target, layouts(p, target).ops[op.name], tensor_layouts(p, target),
                        op_plan.sizes)
        total += ctx.time_us(op_plan.split_map, lx)
    return total


def test_reader_follows_its_producer_so_the_intermediate_stays_on_chip():
    target = spyre()
    alone = plan(mlp(tiled=False), target)
    grouped = plan(mlp(), target)
    # op by op, up cuts rows and columns and act only rows: u would go through device memory
    assert alone.op("up").split_map != alone.op("act").split_map
    assert grouped.op("act").split_map == {"t": grouped.op("up").split_map["t"],
                                           "f": grouped.op("up").split_map["f"]}
    assert "u" in grouped.groups[0].lx_tensors
    xs = random_inputs(mlp(), 0)
    assert all(c.ok for c in compare(run_unplanned(mlp(), xs), run_tiled(mlp(), grouped, xs),
                                     mlp()))


def test_group_is_never_predicted_slower_than_its_ops_planned_alone():
    target = spyre()
    grouped = plan(mlp(), target)
    # the same splits as planning alone, but still inside the loop: what the group started from
    pins = {o.name: dict(o.split_map) for o in plan(mlp(tiled=False), target).ops}
    start = plan(mlp(work_division=pins), target)
    assert group_cost(mlp(), grouped, target) < group_cost(mlp(), start, target)


def test_greedy_and_pinned_ops_keep_their_own_splits():
    target = spyre()
    greedy_alone = plan(mlp(tiled=False), target, "greedy")
    greedy_grouped = plan(mlp(), target, "greedy")
    assert [o.splits for o in greedy_alone.ops] == [o.splits for o in greedy_grouped.ops]
    pinned = plan(mlp(work_division={"act": {"t": 32}}), target)
    assert pinned.op("act").split_map == {"t": 32, "f": 1}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tiled_programs(), st.integers(1, 32))
def test_aligned_groups_stay_no_slower_than_greedy_op_by_op(case, cores):
    p, _ = case
    target = spyre(cores=cores)
    try:
        greedy = plan(p, target, "greedy")
        balanced = plan(p, target, "balanced")
    except (PlanningError, ProgramError):
        assume(False)
        return
    for g, b in zip(greedy.ops, balanced.ops, strict=True):
        assert b.predicted_time_us <= g.predicted_time_us + 1e-9, (g, b)
