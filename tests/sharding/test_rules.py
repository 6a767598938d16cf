"""Per-op rules: what each category may split, the shardings that follow from the indexing
maps, and the op each device runs."""

from __future__ import annotations

import numpy as np
import pytest

from apportion.errors import ProgramError
from apportion.frontend.json_format import from_dict, load
from apportion.frontend.models import forward_program
from apportion.ir.kinds import REDUCERS, SplitFinish
from apportion.ir.program import Program
from apportion.runtime.reference import evaluate_op, random_inputs, run_unplanned
from apportion.sharding.mesh import parse
from apportion.sharding.rules import (
    local_op,
    local_ops,
    local_ranges,
    make_strategy,
    op_strategies,
)
from apportion.sharding.spec import PARTIAL_REDUCERS, Sharding

S = Sharding


def one_op(op: dict, tensors: dict) -> Program:
    made = op["out"].split("[")[0]
    return from_dict({"name": "p", "tensors": {n: {"shape": s, "dtype": "float32"}
                                               for n, s in tensors.items()},
                      "inputs": [n for n in tensors if n != made], "outputs": [made],
                      "ops": [op]})


def test_a_matmul_splits_rows_columns_or_its_reduction_which_leaves_the_output_partial():
    p = load("examples/mlp.json")
    mesh = parse("tp=4")
    by_label = {s.label: s for s in op_strategies(p.op("down"), p, mesh)}
    assert list(by_label) == ["replicated", "m:tp", "n:tp", "k:tp"]
    assert [str(x) for x in by_label["m:tp"].ins] == ["[tp, -]", "[-, -]"]
    assert [str(x) for x in by_label["n:tp"].ins] == ["[-, -]", "[-, tp]"]
    assert str(by_label["k:tp"].out) == "[-, -] partial sum over tp"


def test_two_axes_may_split_one_dim_in_mesh_order_or_two_dims():
    p = load("examples/mlp.json")
    labels = [s.label for s in op_strategies(p.op("act"), p, parse("dp=2,tp=2"))]
    assert labels == ["replicated", "m:tp", "n:tp", "m:dp", "m:dp*tp", "m:dp n:tp", "n:dp",
                      "m:tp n:dp", "n:dp*tp"]


def reduce_op(fn: str, x: str = "float32", r: str | None = None, k: int = 16) -> Program:
    r = r or ("int64" if fn == "argmax" else x)
    return from_dict({"name": "p", "tensors": {"x": {"shape": [8, k], "dtype": x},
                                               "r": {"shape": [8, 1], "dtype": r}},
                      "inputs": ["x"], "outputs": ["r"],
                      "ops": [{"name": "r", "op": fn, "out": "r[i,0]", "ins": ["x[i,k]"]}]})


def test_every_reduction_splits_its_reduced_dim_and_waits_partial_in_its_own_way():
    mesh = parse("tp=2")
    for fn, reducer in (("sum", "sum"), ("max", "max"), ("min", "min"), ("prod", "prod"),
                        ("mean", "sum"), ("argmax", "argmax")):
        p = reduce_op(fn)
        labels = [s.label for s in op_strategies(p.ops[0], p, mesh)]
        assert labels == ["replicated", "i:tp", "k:tp"], fn
        # a mean waits as a partial sum (each device's sum over the whole count), an argmax as
        # partial argmax keys
        assert make_strategy(p.ops[0], p, mesh, {"k": "tp"}).out == \
            S(((), ()), ("tp",), reducer), fn


def test_each_device_finishes_a_split_mean_or_argmax_so_that_parts_combine():
    mesh = parse("tp=4")
    p = reduce_op("mean", k=10)  # 10 over 4: 3, 3, 2, 2, as cores cut it
    s = make_strategy(p.ops[0], p, mesh, {"k": "tp"})
    ops, types, fin = local_ops(p.ops[0], p, mesh, s, {"tp": 3})
    assert [str(o) for o in ops] == ["r: r~mean[i, 0] = mean(x[i, k])"]
    assert fin.kind == "scale" and fin.factor == pytest.approx(2 / 10)  # its 2 of 10 points
    assert fin.sources == ("r~mean",) and fin.result == "r" and types["r~mean"].shape == (8, 1)
    p = reduce_op("argmax", k=10)
    s = make_strategy(p.ops[0], p, mesh, {"k": "tp"})
    ops, types, fin = local_ops(p.ops[0], p, mesh, s, {"tp": 1})
    assert [str(o) for o in ops] == ["r.value: r~value[i, 0] = max(x[i, k])",
                                     "r: r~index[i, 0] = argmax(x[i, k])"]
    assert (fin.kind, fin.local, fin.starts, fin.sizes) == ("pack", (3,), (3,), (10,))
    assert types["r~value"].dtype == "float32" and types["r~index"].dtype == "int64"
    assert local_ops(p.ops[0], p, mesh, make_strategy(p.ops[0], p, mesh, {"i": "tp"}),
                     {"tp": 1})[2] is None  # a parallel split needs no finish


def test_what_a_split_reduction_waits_as_across_devices_is_the_registry_s():
    assert PARTIAL_REDUCERS == ("sum", "max", "min", "prod", "any", "argmax")
    for name, r in REDUCERS.items():
        across = r.across_devices
        assert across is not None and across.waits_as in PARTIAL_REDUCERS, name
        assert across.collective in ("sum", "prod", "max", "min"), name
        # only a part scaled to its share of the count waits as another reducer's partial
        assert (across.waits_as != name) == (across.finish is SplitFinish.SCALE), name
    assert REDUCERS["argmax"].across_devices.finish is SplitFinish.PACK
    assert REDUCERS["any"].across_devices.collective == "max"  # over 0/1 bytes


@pytest.mark.parametrize(("fn", "x", "r", "why"), [
    ("mean", "int32", "int32", "a mean of int32 splits over devices only with a float result"),
    ("argmax", "int64", "int64", "an argmax of int64 values cannot pack its"),
])
def test_reductions_whose_partials_cannot_cross_devices_keep_the_reduced_dim_whole(fn, x, r,
                                                                                  why):
    p = reduce_op(fn, x, r)
    assert [s.label for s in op_strategies(p.ops[0], p, parse("tp=2"))] == ["replicated",
                                                                           "i:tp"]
    with pytest.raises(ProgramError, match=f"op 'r': dim 'k' cannot split over the mesh: {why}"):
        make_strategy(p.ops[0], p, parse("tp=2"), {"k": "tp"})


def merged(h: int, d: int, t: int = 8) -> Program:
    """Heads merged back into columns: o[t, d*h+e] = exp(x[t, h, e])."""
    return from_dict({"name": "merge", "inputs": ["x"], "outputs": ["o"],
                      "tensors": {"x": {"shape": [t, h, d], "dtype": "float32"},
                                  "o": {"shape": [t, h * d], "dtype": "float32"}},
                      "ops": [{"name": "m", "op": "exp", "out": f"o[t, {d}*h+e]",
                               "ins": ["x[t,h,e]"]}]})


def test_a_merged_output_axis_is_split_like_its_outer_digit_and_never_by_an_inner_one():
    p = merged(4, 64)
    for spec in ("tp=2", "tp=4"):
        by_label = {s.label: s for s in op_strategies(p.ops[0], p, parse(spec))}
        assert list(by_label) == ["replicated", "t:tp", "h:tp"]  # no e:tp: strided columns
        assert str(by_label["h:tp"].out) == "[-, tp]" and str(by_label["h:tp"].ins[0]) == \
            "[-, tp, -]"
    with pytest.raises(ProgramError, match=r"op 'm': cannot split e over the mesh: it writes "
                                           r"'o' axis 1 through 64\*h\+e, and a split of its "
                                           r"inner digit 'e' would leave each device strided"):
        make_strategy(p.ops[0], p, parse("tp=2"), {"e": "tp"})
    lop, types = local_op(p.ops[0], p, parse("tp=4"), make_strategy(
        p.ops[0], p, parse("tp=4"), {"h": "tp"}), {"tp": 2})
    assert str(lop) == "m: o[t, 64*h+e] = exp(x[t, h, e])" and types["o"].shape == (8, 64)
    assert lop.sizes == {"t": 8, "h": 1, "e": 64}


def test_uneven_head_splits_are_offered_only_where_they_are_the_axis_own_cuts():
    # a dim is cut in elements, larger shards first and at most one apart: uneven heads of
    # more than one column never line up with their columns' cuts (7 heads of 2 over 4: heads
    # 2, 2, 2, 1 are columns 4, 4, 4, 2, the cut of 14 columns is 4, 4, 3, 3); heads of one
    # column are their columns, and even heads always line up
    assert "h:tp" not in [s.label for s in op_strategies(merged(7, 2).ops[0], merged(7, 2),
                                                         parse("tp=4"))]
    assert "h:tp" in [s.label for s in op_strategies(merged(7, 1).ops[0], merged(7, 1),
                                                     parse("tp=4"))]
    assert "h:tp" in [s.label for s in op_strategies(merged(8, 2).ops[0], merged(8, 2),
                                                     parse("tp=4"))]
    # 5 heads of 4 over 2: heads 3 + 2 are 12 + 8 columns, the cut of 20 is 10 + 10
    p = merged(5, 4)
    assert [s.label for s in op_strategies(p.ops[0], p, parse("tp=2"))] == ["replicated",
                                                                          "t:tp"]
    with pytest.raises(ProgramError, match=r"'h' \(5\) split over tp=2 gives device "
                                           r"\{'tp': 0\} columns 0..12, not the axis's own cut "
                                           r"\(0, 10\)"):
        make_strategy(p.ops[0], p, parse("tp=2"), {"h": "tp"})


def test_a_fallback_runs_whole_on_replicated_inputs():
    p = one_op({"name": "c", "op": "cumsum", "out": "y[i,j]", "ins": ["x[i,j]"]},
               {"x": [8, 8], "y": [8, 8]})
    assert [s.label for s in op_strategies(p.ops[0], p, parse("a=2,b=2"))] == ["replicated"]
    with pytest.raises(ProgramError, match="a fallback runs whole"):
        make_strategy(p.ops[0], p, parse("a=2"), {"i": "a"})


def test_heads_read_through_a_sum_split_like_the_head_dim_and_inner_splits_need_replicas():
    p = forward_program("llama2-7b", 1, 16)
    mesh = parse("tp=4")
    scores = p.op("l0_scores")  # s[h,t,c] = q[t,128*h+d] . k[c,128*h+d]
    by_heads = make_strategy(scores, p, mesh, {"h": "tp"})
    assert [str(s) for s in by_heads.ins] == ["[-, tp]", "[-, tp]"]
    assert str(by_heads.out) == "[tp, -, -]"
    inner = make_strategy(scores, p, mesh, {"d": "tp"})
    assert [str(s) for s in inner.ins] == ["[-, -]", "[-, -]"]
    assert inner.out.partial == ("tp",)
    o_proj = make_strategy(p.op("l0_o_proj"), p, mesh, {"h": "tp"})  # wo[128*h+d, n]
    assert [str(s) for s in o_proj.ins] == ["[tp, -, -]", "[tp, -]"]
    gqa = forward_program("llama3-8b", 1, 16)  # q[t, 512*a+128*r+d], k[c, 128*a+d]
    s = make_strategy(gqa.op("l0_scores"), gqa, parse("tp=8"), {"a": "tp"})
    assert [str(x) for x in s.ins] == ["[-, tp]", "[-, tp]"]


def test_uneven_heads_whose_shards_do_not_line_up_read_replicas():
    p = one_op({"name": "c", "op": "copy", "out": "y[h,i,d]", "ins": ["x[i,4*h+d]"],
                "dims": {"h": 5, "d": 4}}, {"x": [3, 20], "y": [5, 3, 4]})
    # 5 heads over 2: 3 + 2 heads, 12 + 8 columns; 20 columns are cut 10 + 10
    s = make_strategy(p.ops[0], p, parse("tp=2"), {"h": "tp"})
    assert [str(x) for x in s.ins] == ["[-, -]"]
    lop, types = local_op(p.ops[0], p, parse("tp=2"), s, {"tp": 1})
    assert str(lop.ins[0]) == "x[i, 4*h+d+12]" and types["x"].shape == (3, 20)


@pytest.mark.parametrize(("splits", "match"), [
    ({"q": "tp"}, r"no dim 'q' to split; dims: m, n, k"),
    ({"m": "tp", "n": "tp"}, r"mesh axis 'tp' splits both dim 'm' and dim 'n'"),
    ({"m": "dq"}, r"mesh 'tp=4' has no axis 'dq'"),
])
def test_bad_strategies_name_the_op_dim_and_axis(splits, match):
    p = load("examples/mlp.json")
    with pytest.raises(Exception, match=match):
        make_strategy(p.op("down"), p, parse("tp=4"), splits)


def test_an_empty_shard_is_refused():
    p = one_op({"name": "e", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]},
               {"x": [3, 8], "y": [3, 8]})
    with pytest.raises(ProgramError, match="dim 'i' of size 3 split over tp leaves a device "
                                           "nothing"):
        make_strategy(p.ops[0], p, parse("tp=4"), {"i": "tp"})


def test_each_devices_op_computes_its_box_of_the_global_op():
    p = forward_program("gpt2-small", 1, 6)
    mesh = parse("dp=2,tp=3")
    xs = random_inputs(p)
    env = run_unplanned(p, xs)
    sizes = {a.name: a.size for a in mesh.axes}
    for name, splits in (("l0_scores", {"h": "tp", "t": "dp"}), ("l0_o_proj", {"h": "tp"}),
                         ("l0_up", {"t": "dp", "f": "tp"}), ("l0_mlp_mu", {"t": ("dp", "tp")})):
        op = p.op(name)
        s = make_strategy(op, p, mesh, splits)
        for d in range(mesh.devices):
            c = mesh.coords(d)
            lop, types = local_op(op, p, mesh, s, c)
            local_env = {}
            for acc, need in zip(op.ins, s.ins, strict=True):
                block = need.block(p.tensor(acc.tensor).shape, c, sizes)
                local_env[acc.tensor] = env[acc.tensor][tuple(slice(*b) for b in block)]
            lp = Program("l", tuple(types.values()), tuple(dict.fromkeys(
                a.tensor for a in lop.ins)), (lop.out.tensor,), (lop,))
            got = evaluate_op(lop, lp, local_env)
            want = evaluate_op(op, p, env, local_ranges(op, s, mesh, c))
            np.testing.assert_allclose(np.asarray(got, np.float64),
                                       np.asarray(want, np.float64), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("fn", ["mean", "argmax"])
def test_a_split_mean_or_argmax_is_priced_with_its_finish_and_local_ops(fn):
    from apportion.sharding.plan import CostModel, default_target
    from tests.sharding.programs import reduction

    p = reduction(fn, (64, 4096))
    mesh = parse("tp=2")
    split = make_strategy(p.ops[0], p, mesh, {"k": "tp"})
    cost = CostModel(p, mesh, default_target(mesh, None))
    local_alone = cost._priced(*cost.local(p.ops[0], split))
    assert cost.compute_us(p.ops[0], split) > local_alone
