"""Planning fast without planning differently: identical ops planned once, the bounded search,
incremental group trials and auto-tiling by predicted time (timings: ``apportion bench
scale``; nothing here asserts a time)."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from apportion.bench.scale import group_program
from apportion.bench.tiling import mlp_block, softmax_block, tiled
from apportion.errors import PlanningError, ProgramError
from apportion.frontend.models import forward_program, load_models
from apportion.passes.auto_tile import Trial, candidate_counts, with_counts
from apportion.passes.buffers import buffer_roles
from apportion.passes.coarse_tile import coarse_tile
from apportion.passes.geometry import OpContext, PlanCache
from apportion.passes.group_distribution import align_group, group_cost
from apportion.passes.layouts import layouts, tensor_layouts
from apportion.passes.pipeline import plan
from apportion.passes.span_reduction import op_minimum
from apportion.passes.strategy import Balanced
from apportion.passes.work_distribution import candidates, ranked, time_lower_bound
from apportion.plans.serialize import to_dict
from apportion.target import spyre
from tests.backends.reference.test_loops_properties import tiled_programs
from tests.frontend.test_models import TINY
from tests.helpers import program
from tests.passes.test_pipeline_properties import programs, targets

DTYPES = ["float16", "float32", "bfloat16"]
SLOW = [HealthCheck.too_slow, HealthCheck.filter_too_much]


@st.composite
def one_op(draw):
    """One op of a random shape: a matmul (plain, batched, or reading heads through index
    sums), a pointwise op with a broadcast, or a reduction."""
    dtype = draw(st.sampled_from(DTYPES))
    size = st.integers(1, 300)
    kind = draw(st.sampled_from(["matmul", "batched", "heads", "pointwise", "reduce"]))
    if kind == "matmul":
        m, n, k = draw(size), draw(size), draw(size)
        return program({"x": ([m, k], dtype), "w": ([k, n], dtype)},
                       [{"name": "op", "op": "matmul", "out": "y[m,n]",
                         "ins": ["x[m,k]", "w[k,n]"]}], ["y"])
    if kind == "batched":
        b, m, n, k = draw(st.integers(1, 8)), draw(size), draw(size), draw(size)
        return program({"x": ([b, m, k], dtype), "w": ([b, k, n], dtype)},
                       [{"name": "op", "op": "matmul", "out": "y[b,m,n]",
                         "ins": ["x[b,m,k]", "w[b,k,n]"]}], ["y"])
    if kind == "heads":
        h, hd, t = draw(st.integers(1, 6)), draw(st.sampled_from([16, 64, 128])), draw(size)
        return program({"q": ([t, h * hd], dtype), "k": ([t, h * hd], dtype)},
                       [{"name": "op", "op": "matmul", "out": "s[h,t,c]",
                         "ins": [f"q[t,{hd}*h+d]", f"k[c,{hd}*h+d]"], "dims": {"h": h, "d": hd}}],
                       ["s"])
    m, n = draw(size), draw(size)
    if kind == "pointwise":
        fn = draw(st.sampled_from(["add", "mul", "sub"]))
        return program({"x": ([m, n], dtype), "r": ([m, 1], dtype)},
                       [{"name": "op", "op": fn, "out": "y[i,j]", "ins": ["x[i,j]", "r[i,0]"]}],
                       ["y"])
    fn = draw(st.sampled_from(["sum", "max", "mean"]))
    out = draw(st.sampled_from(["y[i,0]", "y[0,j]"]))
    return program({"x": ([m, n], dtype)},
                   [{"name": "op", "op": fn, "out": out, "ins": ["x[i,j]"]}], ["y"])


def context(p, target) -> OpContext:
    op = p.ops[0]
    return OpContext(op, p, target, layouts(p, target).ops[op.name], tensor_layouts(p, target),
                     dict(op.dims))


# --- the bounded search ------------------------------------------------------------------------

@settings(max_examples=150, deadline=None, suppress_health_check=SLOW)
@given(one_op(), targets(), st.sampled_from([1, 2, 6]), st.booleans())
def test_the_bounded_search_returns_the_exhaustive_searchs_assignments(p, target, k, span_min):
    ctx = context(p, target)
    minimum = op_minimum(ctx, Balanced())[0] if span_min else {d: 1 for d in ctx.sizes}
    assert ranked(ctx, minimum, k) == ranked(ctx, minimum, k, exhaustive=True)


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
@given(one_op(), targets(), st.data())
def test_the_lower_bound_is_below_every_candidates_time(p, target, data):
    ctx = context(p, target)
    slots = list(ctx.slots)
    resident = frozenset(data.draw(st.lists(st.sampled_from(slots), max_size=len(slots))))
    bound = time_lower_bound(ctx, resident)
    times = [ctx.time_us(s, resident) for s in candidates(ctx, {d: 1 for d in ctx.sizes})]
    assert bound <= min(times)


def test_pruning_speeds_up_the_search_on_the_model_shapes():
    """Prints the speedup over the model shapes of ``bench workdiv`` (a sample); asserts only
    that both searches agree."""
    target = spyre(cores=32)
    cases = [c for c in _bench_cases() if c.phase == "prefill"][::6]
    t_exh = t_pruned = 0.0
    for case in cases:
        ctx = context(case.program, target)
        ones = {d: 1 for d in ctx.sizes}
        t0 = time.perf_counter()
        a = ranked(ctx, ones, 1, exhaustive=True)
        t1 = time.perf_counter()
        b = ranked(ctx, ones, 1)
        t_exh, t_pruned = t_exh + t1 - t0, t_pruned + time.perf_counter() - t1
        assert a == b, case.what
    print(f"\n{len(cases)} op shapes: exhaustive {t_exh:.3f} s, bounded {t_pruned:.3f} s "
          f"({t_exh / t_pruned:.1f}x)")


def _bench_cases():
    from apportion.frontend.models import bench_cases

    return bench_cases(load_models())


# --- identical ops planned once ----------------------------------------------------------------

def same_plans(p, target, strategy="balanced", auto_tile=False):
    """Plan with and without reuse; the plans must be equal, their JSON too (but for the
    counts), and reuse must count every op."""
    try:
        fast = plan(p, target, strategy, auto_tile=auto_tile)
    except (PlanningError, ProgramError) as e:
        with pytest.raises(type(e), match="^" + _escaped(str(e)) + "$"):
            plan(p, target, strategy, auto_tile=auto_tile, reuse=False)
        return None
    slow = plan(p, target, strategy, auto_tile=auto_tile, reuse=False)
    assert fast == slow
    a, b = to_dict(fast), to_dict(slow)
    assert a.pop("reuse") == {"planned": fast.reuse.planned, "reused": fast.reuse.reused}
    assert b.pop("reuse") == {"planned": len(p.ops), "reused": 0}
    assert json.dumps(a) == json.dumps(b)
    assert fast.reuse.planned + fast.reuse.reused == len(p.ops)
    return fast


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_the_forward_program_plans_the_same_with_and_without_reuse():
    p = forward_program("llama2-7b", 3, 64)
    result = same_plans(p, spyre(cores=32))
    assert result is not None
    # every block's ops are the first block's: 21 distinct ops in 3 x 29 + 6
    assert (result.reuse.planned, result.reuse.reused) == (21, 72)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["balanced", "greedy"])
def test_tiny_models_and_a_tiled_group_plan_the_same_with_and_without_reuse(strategy):
    for model in ("tiny-gqa", "tiny-mha"):
        same_plans(forward_program(model, 3, 16, models=TINY), spyre(cores=8), strategy)
    same_plans(group_program(24), spyre(cores=32), strategy)
    same_plans(group_program(24), dataclasses.replace(spyre(), scratchpad_bytes=8192), strategy,
               auto_tile=True)


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW)
@given(programs(), targets(), st.sampled_from(["greedy", "balanced"]))
def test_random_programs_plan_the_same_with_and_without_reuse(p, target, strategy):
    same_plans(p, target, strategy)


@settings(max_examples=30, deadline=None, suppress_health_check=SLOW)
@given(tiled_programs(), st.integers(1, 32), st.sampled_from([None, 2048, 65536]),
       st.booleans())
def test_random_tiled_programs_plan_the_same_with_and_without_reuse(case, cores, scratch, auto):
    p, _ = case
    target = spyre(cores=cores)
    if scratch is not None:
        target = dataclasses.replace(target, scratchpad_bytes=scratch)
    same_plans(p, target, "balanced", auto)


def test_repeated_ops_in_one_program_are_planned_once():
    ops = [{"name": f"e{i}", "op": "exp", "out": f"y{i}[i,j]", "ins": [f"x{i}[i,j]"]}
           for i in range(4)]
    ops.append({"name": "sq", "op": "mul", "out": "z[i,j]", "ins": ["y0[i,j]", "y0[i,j]"]})
    ops.append({"name": "m", "op": "mul", "out": "w[i,j]", "ins": ["y1[i,j]", "y2[i,j]"]})
    p = program({f"x{i}": ([64, 256], "float16") for i in range(4)}, ops, ["y3", "z", "w"])
    result = same_plans(p, spyre())
    # the four exps are one op; x * x and x * y differ (one operand tensor, or two)
    assert (result.reuse.planned, result.reuse.reused) == (3, 3)
    assert [t for t, _ in result.op("e3").span_bytes] == ["x3", "y3"]  # renamed, in order
    assert result.op("e3").splits == result.op("e0").splits


# --- group distribution: incremental trials ----------------------------------------------------

def group_setup(p, target):
    lay = layouts(p, target)
    tiling = coarse_tile(p, lay.ops, target.max_loop_count)
    cache = PlanCache()
    out = []
    from apportion.passes.span_reduction import span_reduction
    from apportion.passes.work_distribution import work_distribution

    for group in tiling.groups:
        ctxs = {n: OpContext(p.op(n), p, target, lay.ops[n], lay.tensors,
                             group.tile(n).size_map, group.tile(n).loop) for n in group.ops}
        spans = span_reduction(ctxs, Balanced())
        splits = work_distribution(ctxs, spans, Balanced(), cache)
        out.append((group, ctxs, buffer_roles(p, tiling), splits, cache))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW)
@given(tiled_programs(), st.integers(1, 32), st.sampled_from([None, 512, 4096]))
def test_incremental_trials_decide_as_whole_evaluation(case, cores, scratch):
    p, _ = case
    target = spyre(cores=cores)
    if scratch is not None:
        target = dataclasses.replace(target, scratchpad_bytes=scratch)
    try:
        setups = group_setup(p, target)
    except (PlanningError, ProgramError):
        assume(False)
        return
    for group, ctxs, roles, splits, cache in setups:
        fast = align_group(group, ctxs, roles, splits, cache)
        whole = align_group(group, ctxs, roles, splits, PlanCache(False), incremental=False)
        assert fast == whole


def test_incremental_trials_decide_as_whole_evaluation_on_a_long_group():
    for scratch in (None, 8192):
        target = spyre() if scratch is None else \
            dataclasses.replace(spyre(), scratchpad_bytes=scratch)
        (group, ctxs, roles, splits, cache), = group_setup(group_program(40), target)
        assert align_group(group, ctxs, roles, splits, cache) == \
            align_group(group, ctxs, roles, splits, PlanCache(), incremental=False)


@settings(max_examples=30, deadline=None, suppress_health_check=SLOW)
@given(tiled_programs(), st.integers(1, 32), st.sampled_from([None, 512, 4096]))
def test_a_trials_cost_is_the_pipelines_iteration_time(case, cores, scratch):
    p, _ = case
    target = spyre(cores=cores)
    if scratch is not None:
        target = dataclasses.replace(target, scratchpad_bytes=scratch)
    try:
        result = plan(p, target)
    except (PlanningError, ProgramError):
        assume(False)
        return
    for (group, ctxs, roles, _, cache), g in zip(group_setup(p, target), result.groups,
                                                 strict=True):
        final = {n: result.op(n).split_map for n in group.ops}
        assert round(group_cost(group, ctxs, roles, final, cache), 4) == g.iteration_time_us


@pytest.mark.slow
@pytest.mark.parametrize("n_ops", [50, 100, 200])
def test_long_groups_are_no_slower_than_op_by_op_and_no_op_slower_than_greedy(n_ops):
    target = spyre(cores=32)
    p = group_program(n_ops)
    t0 = time.perf_counter()
    grouped = plan(p, target)
    seconds = time.perf_counter() - t0
    print(f"\n{n_ops}-op group planned in {seconds:.2f} s")
    # the op-by-op splits, still inside the loop: what group distribution starts from
    (group, ctxs, roles, splits, cache), = group_setup(p, target)
    start = group_cost(group, ctxs, roles, splits.by_op, cache)
    assert grouped.groups[0].iteration_time_us <= round(start, 4)
    greedy = plan(p, target, "greedy")
    for g, b in zip(greedy.ops, grouped.ops, strict=True):
        assert b.predicted_time_us <= g.predicted_time_us + 1e-9, (g, b)


# --- auto-tiling by predicted time -------------------------------------------------------------

def totals(p, target):
    """(counts, fits, predicted time of the whole group) of every candidate of group 0."""
    lay = layouts(p, target)
    out = []
    for counts in candidate_counts(p, p.tiling[0], lay.ops, target.max_loop_count):
        trial = Trial(with_counts(p, 0, counts), target, lay, Balanced(), 0)
        out.append((counts, trial.working_set <= target.scratchpad_capacity,
                    trial.iterations * trial.iteration_time()))
    return out


def test_auto_tile_keeps_a_weight_heavy_group_untiled_when_rereads_cost_more():
    cfg = load_models()["models"]["llama3-8b"]
    p, target = tiled(mlp_block(cfg, 2048, "float16")), spyre(cores=32)
    options = totals(p, target)
    (ones, fits_once, once), *rest = options
    assert ones == (1,) and not fits_once  # untiled, it does not fit the scratchpad
    fitting = [(c, t) for c, ok, t in rest if ok]
    assert fitting and all(once < t for _, t in fitting)  # every fitting count re-reads more
    chosen = plan(p, target, auto_tile=True)
    assert chosen.groups[0].counts == (1,)


def test_auto_tile_takes_the_fastest_count_and_fewer_iterations_on_a_tie():
    cfg = load_models()["models"]["llama2-7b"]
    p, target = tiled(softmax_block(cfg, 2048, "float16")), spyre(cores=32)
    options = totals(p, target)
    chosen = plan(p, target, auto_tile=True).groups[0].counts
    fitting = [(c, t) for c, ok, t in options if ok or c == (1,)]
    best = min(t for _, t in fitting)
    first = next(c for c, t in fitting if t <= best * (1 + 1e-9))
    assert chosen == first
    assert math.isclose(dict((c, t) for c, _, t in options)[chosen], best, rel_tol=1e-9)
