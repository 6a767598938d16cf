"""Mixture-of-experts models from PyTorch: ``topk`` as planned reductions (against torch.topk
and the documented tie rule), the dense expert dispatch (against the experts' own eager loop),
tiny Mixtral and Qwen2-MoE models planned and run against eager PyTorch on the reference and
torch backends, and the model report's router and expert lines."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import apportion as ap  # noqa: E402
from apportion.cli.main import main  # noqa: E402
from apportion.errors import ProgramError  # noqa: E402
from apportion.frontend import torch_moe  # noqa: E402
from apportion.frontend.torch_export import from_torch  # noqa: E402
from apportion.frontend.torch_lower import Lowering  # noqa: E402
from apportion.ir.program import Program  # noqa: E402
from apportion.runtime import run_unplanned  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

MIXTRAL = "apportion.frontend.torch_moe:tiny_mixtral"
QWEN2_MOE = "apportion.frontend.torch_moe:tiny_qwen2_moe"


# --- topk -----------------------------------------------------------------------------------

def topk_program(shape, dtype, k, dim, largest):
    """A program of one ``torch.topk`` lowered by ``lower_topk``: (program, constants)."""
    lw = Lowering("topk")
    x = lw.input("x", dtype, shape)
    values, indices = torch_moe.lower_topk(lw, "topk", x, k, dim, largest)
    outs = (lw.contiguous(values).tensor, lw.contiguous(indices).tensor)
    program = Program("topk", tuple(lw.types.values()), tuple(lw.inputs), outs, tuple(lw.ops))
    return program, dict(lw.constants)


def run_topk(x, k, dim=-1, largest=True, planned_on=None):
    program, constants = topk_program(x.shape, str(x.dtype), k, dim, largest)
    inputs = {"x": x, **constants}
    if planned_on is None:
        out = run_unplanned(program, inputs)
    else:
        out = ap.plan(program, ap.targets.spyre(cores=planned_on)).run(inputs)
    shape = list(x.shape)
    shape[dim] = k
    return (np.asarray(out[program.outputs[0]]).reshape(shape),
            np.asarray(out[program.outputs[1]]).reshape(shape))


def rule_indices(x, k, dim, largest):
    """The documented rule: values in order, NaN the largest, ties to the lower index."""
    moved = np.moveaxis(x, dim, -1)
    out = np.empty(moved.shape[:-1] + (k,), dtype=np.int64)
    for pos in np.ndindex(moved.shape[:-1]):
        row = moved[pos].tolist()

        def order(i, row=row):
            v = row[i]
            nan = isinstance(v, float) and math.isnan(v)
            if largest:
                return (0 if nan else 1, 0 if nan else -v, i)
            return (1 if nan else 0, 0 if nan else v, i)
        out[pos] = sorted(range(len(row)), key=order)[:k]
    return np.moveaxis(out, -1, dim)


FLOAT_SPECIALS = [math.inf, -math.inf, math.nan]


@st.composite
def topk_cases(draw):
    """Small tensors with many ties (values from a handful), infinities and NaN for floats."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from(["float32", "int32", "int64"]))
    pool = [-2, -1, 0, 1, 2] + (FLOAT_SPECIALS if dtype == "float32" else
                                [np.iinfo(dtype).min, np.iinfo(dtype).max])
    flat = draw(st.lists(st.sampled_from(pool), min_size=math.prod(shape),
                         max_size=math.prod(shape)))
    dim = draw(st.integers(-rank, rank - 1))
    k = draw(st.integers(1, shape[dim]))
    return np.array(flat, dtype=dtype).reshape(shape), k, dim, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(topk_cases())
def test_topk_gives_torchs_values_and_the_lower_index_on_ties(case):
    x, k, dim, largest = case
    values, indices = run_topk(x, k, dim, largest)
    want = torch.topk(torch.from_numpy(x), k, dim=dim, largest=largest)
    np.testing.assert_array_equal(values, want.values.numpy())
    np.testing.assert_array_equal(indices, rule_indices(x, k, dim, largest))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(2, 12), st.data())
def test_topk_of_distinct_values_picks_torchs_indices(rows, n, data):
    k = data.draw(st.integers(1, n))
    largest = data.draw(st.booleans())
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    x = np.stack([rng.permutation(n) for _ in range(rows)]).astype(np.float32) - n / 2
    values, indices = run_topk(x, k, -1, largest)
    want = torch.topk(torch.from_numpy(x), k, largest=largest)
    np.testing.assert_array_equal(values, want.values.numpy())
    np.testing.assert_array_equal(indices, want.indices.numpy())


def test_topk_of_a_row_of_minus_infinities_still_takes_each_element_once():
    x = np.array([[-math.inf] * 4, [1.0, -math.inf, -math.inf, 2.0]], dtype=np.float32)
    _, indices = run_topk(x, 4)
    assert indices.tolist() == [[0, 1, 2, 3], [3, 0, 1, 2]]
    _, smallest = run_topk(np.array([[math.nan, math.inf, 1.0, math.inf]], np.float32), 4,
                           largest=False)
    assert smallest.tolist() == [[2, 1, 3, 0]]  # +inf before NaN, NaN last


def test_topk_is_planned_as_reductions_divided_over_the_rows():
    x = np.random.default_rng(0).standard_normal((512, 16)).astype(np.float32)
    program, _ = topk_program(x.shape, "float32", 2, -1, True)
    assert {op.category for op in program.ops} <= {"pointwise", "reduction", "layout"}
    planned = ap.plan(program, ap.targets.spyre(cores=8))
    argmax = [o for o in planned.ops if o.name.endswith(".argmax")]
    assert argmax and all(o.cores > 1 and "reduction" in o.kind for o in argmax)
    values, indices = run_topk(x, 2, planned_on=8)
    want = torch.topk(torch.from_numpy(x), 2)
    np.testing.assert_array_equal(values, want.values.numpy())
    np.testing.assert_array_equal(indices, want.indices.numpy())


def test_torch_topk_in_a_module_lowers_with_no_fallback():
    class Top(torch.nn.Module):
        def forward(self, x):
            v, i = torch.topk(x.softmax(-1), 3, dim=1, largest=True)
            return v, i

    x = torch.randn(6, 10, 4)
    tp = from_torch(Top(), (x,))
    assert tp.node_counts["fallback"] == 0
    got = tp.torch_outputs(run_unplanned(tp.program, tp.inputs(x)))
    want = Top()(x)
    np.testing.assert_allclose(got[0], want[0].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got[1], want[1].numpy())


def test_topk_with_k_out_of_range_is_refused_naming_the_dim():
    with pytest.raises(ProgramError, match=r"k must be an int in 1\.\.4 \(the size of dim 1\)"):
        topk_program((3, 4), "float32", 5, 1, True)
    with pytest.raises(ProgramError, match="topk of bool is not supported"):
        topk_program((3, 4), "bool", 1, 1, True)


def test_scatter_of_a_value_masks_the_positions_torch_does():
    class GroupMask(torch.nn.Module):  # DeepSeek's group mask, PhiMoE's masked first expert
        def forward(self, scores):
            top = torch.topk(scores, 2, dim=-1)[1]
            ones = torch.zeros_like(scores).scatter(1, top, 1.0)
            return ones, torch.scatter(scores, -1, top[:, :1], float("-inf"))

    x = torch.randn(12, 6)
    tp = from_torch(GroupMask(), (x,))
    assert tp.node_counts["fallback"] == 1  # zeros_like: a constant
    got = tp.torch_outputs(run_unplanned(tp.program, tp.inputs(x)))
    for g, w in zip(got, GroupMask()(x), strict=True):
        np.testing.assert_array_equal(g, w.numpy())


def test_scatter_with_a_narrower_index_is_refused_naming_the_shapes():
    class Narrow(torch.nn.Module):
        def forward(self, x, i):
            return x.scatter(1, i, 0.0)

    with pytest.raises(ProgramError, match=r"scatter along dim 1: an index of shape \[2, 1\]"):
        from_torch(Narrow(), (torch.randn(4, 5), torch.zeros(2, 1, dtype=torch.int64)))


# --- the dense dispatch ------------------------------------------------------------------------

@pytest.mark.parametrize("factory", [torch_moe.tiny_mixtral, torch_moe.tiny_qwen2_moe])
def test_dense_dispatch_computes_the_eager_experts_numbers(factory):
    model, _ = factory()
    experts = next(m for m in model.modules() if torch_moe._is_experts(m))
    torch.manual_seed(1)
    x = torch.randn(24, 32)
    last = experts.num_experts - 1
    with torch.no_grad():  # the last expert overflows to inf, and no token is routed to it:
        experts.down_proj[last] *= 1e38  # weighting it by a product with 0 would give NaN
    w, idx = torch.topk(torch.randn(24, last).softmax(-1), 2)
    with torch.no_grad():
        want = experts(x, idx, w)
        got = torch_moe.dense_experts_forward(experts, x, idx, w)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_static_experts_swaps_the_forward_for_the_export_only():
    model, (ids,) = torch_moe.tiny_mixtral()
    experts = model.model.layers[0].mlp.experts
    with torch_moe.static_experts(model) as swapped:
        assert swapped == 1 and experts.forward.__func__ is torch_moe.dense_experts_forward
    assert "forward" not in vars(experts) and not hasattr(experts, "_apportion_ids")


@pytest.mark.slow
@pytest.mark.parametrize("spec", [MIXTRAL, QWEN2_MOE])
def test_moe_models_lower_their_blocks_with_no_fallback(spec):
    from apportion.workflows.torch_model import load_model

    tm = load_model(spec)
    parts = torch_moe.moe_parts(tm.lowered.origins, torch_moe.moe_blocks(tm.model))
    assert {p for p, _ in parts.values()} >= {"router", "experts"}
    in_blocks = [n for n in tm.lowered.nodes if any(o in parts for o in n.ops)]
    assert [n.target for n in in_blocks if n.status == "fallback"] == []
    assert "aten.topk.default" in {n.target for n in in_blocks}


@pytest.mark.parametrize("spec", [MIXTRAL, QWEN2_MOE])
@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_moe_models_plan_and_run_against_eager_pytorch(spec, backend, capsys):
    assert main(["run", "--torch", spec, "--check", "--backend", backend]) == 0
    assert "matches the model run eagerly in PyTorch" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["greedy", "balanced"])
@pytest.mark.parametrize("cores", [1, 8, 32])
@pytest.mark.parametrize("spec", [MIXTRAL, QWEN2_MOE])
def test_moe_models_match_eager_at_every_core_count_and_strategy(spec, cores, strategy, capsys):
    assert main(["run", "--torch", spec, "--check", "--cores", str(cores),
                 "--strategy", strategy]) == 0


def _tiny(config, model, **kw):
    """A one-layer model of ``transformers`` class ``model`` (config ``config``), width 32."""
    def make():
        torch.manual_seed(0)
        cfg = getattr(transformers, config)(
            vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, use_cache=False, **kw)
        return getattr(transformers, model)(cfg).eval(), (torch.randint(0, 64, (1, 8)),)
    return make


OTHER_MOES = {
    "qwen3_moe": _tiny("Qwen3MoeConfig", "Qwen3MoeForCausalLM", intermediate_size=64,
                       moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                       head_dim=8),
    "olmoe": _tiny("OlmoeConfig", "OlmoeForCausalLM", intermediate_size=32, num_experts=4,
                   num_experts_per_tok=2),
    "gpt_oss": _tiny("GptOssConfig", "GptOssForCausalLM", intermediate_size=32,
                     num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                     layer_types=["full_attention"]),
    "granitemoe": _tiny("GraniteMoeConfig", "GraniteMoeForCausalLM", intermediate_size=32,
                        num_local_experts=4, num_experts_per_tok=2),
    "phimoe": _tiny("PhimoeConfig", "PhimoeForCausalLM", intermediate_size=32,
                    num_local_experts=4, num_experts_per_tok=2),
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", sorted(OTHER_MOES))
def test_other_hugging_face_moe_architectures_match_eager_pytorch(name):
    model, (ids,) = OTHER_MOES[name]()
    tp = from_torch(model, (ids,))
    assert {p for p, _ in torch_moe.moe_parts(tp.origins, torch_moe.moe_blocks(model)).values()
            } >= {"router", "experts"}
    got = tp.torch_outputs(run_unplanned(tp.program, tp.inputs(ids)))[0]
    with torch.no_grad():
        want = model(ids).logits.numpy()
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore")
def test_a_deepseek_v3_moe_block_alone_matches_eager_with_its_parts_told_apart():
    # group-limited routing: topk of groups (sorted=False), a scattered group mask, a shared
    # expert; the block is the root module
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = transformers.DeepseekV3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, moe_intermediate_size=32,
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1)
    torch.manual_seed(0)
    block = DeepseekV3MoE(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=0.2)
    x = torch.randn(1, 8, 32)
    tp = from_torch(block, (x,))
    got = tp.torch_outputs(run_unplanned(tp.program, tp.inputs(x)))[0]
    with torch.no_grad():
        want = block(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    parts = torch_moe.moe_parts(tp.origins, torch_moe.moe_blocks(block))
    assert {p for p, _ in parts.values()} == {"router", "experts", "shared"}
    assert {tp.origins[n].module for n, (p, _) in parts.items() if p == "router"} == {"gate"}


@pytest.mark.slow
def test_the_model_report_shows_router_and_expert_work_and_the_dense_cost(capsys):
    assert main(["plan", "--torch", QWEN2_MOE]) == 0
    out = capsys.readouterr().out
    assert "mixture of experts: 1 block, model.layers.0.mlp (4 experts, top-2); dispatch " \
           "dense: every expert on every token, weighted by the routing mask" in out
    assert "  router: " in out and "  shared experts and the rest: " in out
    line = next(x for x in out.splitlines() if x.startswith("  experts: "))
    planned, routed = (int(n.replace(",", "")) for n in
                       line.split("their matmuls ")[1].split(" multiply-adds for ")[:1]
                       + [line.split(" multiply-adds for ")[1].split(" on ")[0]])
    # every expert on every token: experts / top-k = 2 times the work of the routed tokens
    assert planned == 2 * routed and line.endswith("(experts / top-k = 2.0x)")


def test_a_model_without_experts_has_no_moe_lines(capsys):
    assert main(["plan", "--torch", "apportion.frontend.torch_demo:mlp"]) == 0
    assert "mixture of experts" not in capsys.readouterr().out
