"""The whole-model forward program: its ops, its attention indexing, and that it runs exactly."""

from __future__ import annotations

import pytest

import apportion as ap
from apportion.errors import ProgramError
from apportion.frontend.models import forward_program, load_models

TINY = {
    "models": {
        # grouped-query attention: 4 query heads over 2 K/V heads; RMS norm, gated MLP
        "tiny-gqa": {"hidden": 64, "ffn": 96, "heads": 4, "kv_heads": 2, "head_dim": 16,
                     "vocab": 80, "norm": "rms", "act": "silu", "gated_mlp": True},
        # plain attention, layer norm, plain MLP
        "tiny-mha": {"hidden": 64, "ffn": 128, "heads": 2, "kv_heads": 2, "head_dim": 32,
                     "vocab": 48, "norm": "layer", "act": "gelu", "gated_mlp": False},
        "odd": {"hidden": 64, "ffn": 64, "heads": 3, "kv_heads": 2, "head_dim": 16,
                "vocab": 8},
    },
}


def test_llama2_7b_with_32_layers_has_934_ops():
    p = forward_program("llama2-7b", 32, 128)
    # 29 per block: norm 5, q k v 3, scores, scale, softmax 5, pv, o_proj, add, norm 5,
    # gate up act glu down 5, add; then the final norm 5 and lm_head
    assert len(p.ops) == 32 * 29 + 6 == 934
    assert len({o.name for o in p.ops}) == 934
    assert p.ops[-1].name == "lm_head" and p.outputs == ("logits",)
    assert p.tensor("logits").shape == (128, 32000)
    cfg = load_models()["models"]["llama2-7b"]
    weights = [t for t in p.inputs if t.startswith("l0_w")]
    assert sorted(weights) == ["l0_wd", "l0_wg", "l0_wk", "l0_wo", "l0_wq", "l0_wu", "l0_wv"]
    assert p.tensor("l0_wd").shape == (cfg["ffn"], cfg["hidden"])


def test_multi_head_attention_reads_each_heads_columns_through_index_sums():
    p = forward_program("llama2-7b", 1, 16)
    scores, pv, o_proj = p.op("l0_scores"), p.op("l0_pv"), p.op("l0_o_proj")
    assert str(scores) == "l0_scores: l0_s[h, t, c] = matmul(l0_q[t, 128*h+d], l0_k[c, 128*h+d])"
    assert scores.sizes == {"h": 32, "t": 16, "c": 16, "d": 128}
    assert str(pv.ins[1]) == "l0_v[c, 128*h+d]"
    assert o_proj.reduction_dims == ("h", "d") and str(o_proj.ins[1]) == "l0_wo[128*h+d, n]"


def test_grouped_query_attention_splits_the_head_into_kv_head_and_group_member():
    # llama3-8b: 32 query heads over 8 K/V heads, 4 per group; no copy of K or V is needed
    p = forward_program("llama3-8b", 1, 16)
    scores = p.op("l0_scores")
    assert str(scores.ins[0]) == "l0_q[t, 512*a+128*r+d]"
    assert str(scores.ins[1]) == "l0_k[c, 128*a+d]"
    assert scores.sizes == {"a": 8, "r": 4, "t": 16, "c": 16, "d": 128}
    assert p.tensor("l0_k").shape == (16, 8 * 128)
    assert not any(o.fn == "copy" for o in p.ops)


@pytest.mark.parametrize("model", ["tiny-gqa", "tiny-mha"])
@pytest.mark.parametrize("strategy", ["balanced", "greedy"])
def test_tiny_forward_programs_plan_and_run_like_the_unplanned_program(model, strategy):
    p = forward_program(model, 2, 8, "float32", models=TINY)
    checks = ap.plan(p, ap.targets.spyre(cores=8), strategy).check()
    assert checks and all(c.ok for c in checks), checks


def test_the_norm_and_mlp_follow_the_configuration():
    mha = forward_program("tiny-mha", 1, 8, models=TINY)
    assert [o.fn for o in mha.ops[:7]] == ["mean", "sub", "square", "mean", "rsqrt", "mul", "mul"]
    assert [o.name for o in mha.ops if o.fn == "gelu"] == ["l0_act"]
    assert "l0_gate" not in mha.op_map
    gqa = forward_program("tiny-gqa", 1, 8, models=TINY)
    assert [o.fn for o in gqa.ops[:5]] == ["mul", "mean", "rsqrt", "mul", "mul"]
    assert str(gqa.ops[0]) == "l0_attn_sq: l0_attn_sq[t, n] = mul(x[t, n], x[t, n])"


@pytest.mark.parametrize(("args", "message"), [
    (("nope", 1, 8), "unknown model 'nope'"),
    (("tiny-gqa", 0, 8), "layers must be a positive int"),
    (("tiny-gqa", 1, True), "tokens must be a positive int"),
    (("odd", 1, 8), "3 heads are not a multiple of its 2 K/V heads"),
])
def test_bad_arguments_are_refused_by_name(args, message):
    with pytest.raises(ProgramError, match=message):
        forward_program(*args, models=TINY)
