"""The PyTorch frontend: models exported with torch.export, lowered, planned for Spyre under both
strategies and run by the reference executor, against eager PyTorch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import apportion as ap  # noqa: E402
from apportion.frontend.torch_export import from_torch  # noqa: E402
from apportion.frontend.torch_program import TorchProgram  # noqa: E402
from apportion.runtime import run_unplanned  # noqa: E402

# torch.export deep-copies pytree specs, which warns inside torch
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

#: targets of the nodes that may lower to fallbacks: gathers, cumsum, constants, random numbers
FALLBACK_TARGETS = {
    "aten.embedding.default", "aten.index.Tensor", "aten.index_select.default",
    "aten.cumsum.default", "aten.arange.start_step", "aten.arange.start", "aten.arange.default",
    "aten.full.default", "aten.full_like.default", "aten.scalar_tensor.default",
    "aten.zeros.default", "aten.ones.default", "aten.zeros_like.default",
    "aten.ones_like.default", "aten.rand.default", "aten.randn.default",
}
CASES = [(s, c) for s in ("greedy", "balanced") for c in (1, 8, 32)]


def eager(model, *xs):
    with torch.no_grad():
        out = model(*xs)
    out = getattr(out, "logits", out)
    return [o.numpy() for o in (out if isinstance(out, tuple | list) else (out,))]


def check_everywhere(tp: TorchProgram, xs, want, rtol=1e-4, atol=1e-5):
    """Planned for Spyre under both strategies on 1, 8 and 32 cores, run core by core."""
    inputs = tp.inputs(*xs)
    for strategy, cores in CASES:
        planned = ap.plan(tp.program, ap.targets.spyre(cores=cores), strategy=strategy)
        got = tp.torch_outputs(planned.run(inputs))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol,
                                       err_msg=f"{strategy}, {cores} cores")


def assert_lowered_but_fallback_kinds(tp: TorchProgram, more: frozenset[str] = frozenset()):
    """Every node but gathers, cumsum, constants and random numbers (and the targets ``more``)
    lowers to non-fallback ops (or index maps alone)."""
    bad = [(n.node, n.target) for n in tp.nodes
           if n.status == "fallback" and n.target not in FALLBACK_TARGETS | more]
    assert bad == []
    for n in tp.nodes:
        for op in n.ops:
            fallback = tp.program.op(op).category == "fallback"
            assert not fallback or n.status == "fallback", (n, op)


# --- Hugging Face models ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128, use_cache=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 1000, (1, 12))
    return model, ids, from_torch(model, (ids,))


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512,
                                  n_positions=64, bos_token_id=0, eos_token_id=0,
                                  use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 512, (1, 16))
    return model, ids, from_torch(model, (ids,))


@pytest.mark.slow
def test_llama_matches_eager_pytorch_on_every_plan(llama):
    model, ids, tp = llama
    check_everywhere(tp, (ids,), eager(model, ids))


@pytest.mark.slow
def test_gpt2_matches_eager_pytorch_on_every_plan(gpt2):
    model, ids, tp = gpt2
    check_everywhere(tp, (ids,), eager(model, ids))


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_only_gathers_cumsum_constants_and_random_ops_are_fallbacks(which, request):
    _, _, tp = request.getfixturevalue(which)
    assert_lowered_but_fallback_kinds(tp)
    counts = tp.node_counts
    assert set(counts) == {"lowered", "fallback", "dropped", "unsupported"}
    assert counts["unsupported"] == 0
    assert sum(counts.values()) == len(tp.nodes) and counts["lowered"] > 150
    assert tp.lowered_share == counts["lowered"] / (counts["lowered"] + counts["fallback"])
    assert tp.lowered_share > 0.85
    fallbacks = {n.target for n in tp.nodes if n.status == "fallback"}
    assert "aten.embedding.default" in fallbacks and "aten.mm.default" not in fallbacks


def test_attention_reads_heads_through_index_maps_without_copies(llama):
    _, _, tp = llama
    kinds = {o.fn for o in tp.program.ops}
    assert "reshape" not in kinds  # no view needed a data movement
    # o_proj reads the attention output [b, h, t, d] as its reduction dim h*d: no merge copy
    o_proj = tp.program.op("mm_3")
    assert o_proj.fn == "matmul" and len(o_proj.reduction_dims) > 1
    w = next(a for a in o_proj.ins if "o_proj" in a.tensor)
    assert len(w.index[1].terms) == len(o_proj.reduction_dims)


def test_ops_keep_their_torch_node_and_source_line(llama):
    _, _, tp = llama
    origin = tp.origins["mm_1"]
    assert origin.node == "mm_1" and origin.target == "aten.mm.default"
    assert origin.module == "model.layers.0.self_attn.k_proj"
    assert "modeling_llama.py:" in origin.source and "torch/" not in origin.source
    softmax_parts = [op for op, o in tp.origins.items() if o.node == "_softmax"]
    assert set(softmax_parts) == {"_softmax", "_softmax.max", "_softmax.sub", "_softmax.exp",
                                  "_softmax.sum"}
    assert set(tp.origins) == {op.name for op in tp.program.ops}


def test_inputs_hold_user_inputs_then_weights_as_constants(gpt2):
    model, ids, tp = gpt2
    inputs = tp.inputs(ids)
    assert tp.user_inputs == ("input_ids",)
    assert set(inputs) == set(tp.program.inputs)
    np.testing.assert_array_equal(inputs["input_ids"], ids.numpy())
    weight = model.transformer.wpe.weight.detach().numpy()
    np.testing.assert_array_equal(tp.constants["p_transformer_wpe_weight"], weight)
    with pytest.raises(ap.ProgramError, match="takes 1 tensor inputs"):
        tp.inputs(ids, ids)


# --- plain torch.nn blocks -------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, d=64, f=256):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, f)
        self.down = nn.Linear(f, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.down(self.drop(F.gelu(self.up(self.norm(x)))))


class SelfAttention(nn.Module):
    """Fused qkv projection split by chunk (a leading slice read), causal SDPA."""

    def __init__(self, d=128, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q * 0.5
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, t, d)).softmax(-1)


@pytest.mark.parametrize(("make", "shape"), [(MLP, (4, 16, 64)), (SelfAttention, (2, 16, 128))],
                         ids=["mlp", "self_attention"])
def test_torch_nn_blocks_match_eager_pytorch_on_every_plan(make, shape):
    torch.manual_seed(2)
    model = make().eval()
    x = torch.randn(*shape)
    tp = ap.from_torch(model, (x,))
    assert isinstance(tp, ap.TorchProgram)
    assert_lowered_but_fallback_kinds(tp)
    check_everywhere(tp, (x,), eager(model, x))


def test_a_chunk_is_read_as_a_leading_slice():
    torch.manual_seed(3)
    tp = from_torch(SelfAttention().eval(), (torch.randn(2, 16, 128),))
    q = tp.program.op("mul")  # q * 0.5 right after the chunk: reads qkv's first 128 columns
    src = tp.program.tensor(q.ins[0].tensor)
    assert src.shape[-1] == 384 and q.ins[0].index[-1].single_dim is not None
    assert q.sizes[q.ins[0].index[-1].single_dim] == 128


# --- many ATen ops at once -----------------------------------------------------------------

class Sink(nn.Module):
    """Layout ops, reductions, casts, comparisons, gathers and constants; many outputs."""

    def forward(self, x, ids):
        a, b = x.split([3, 5], dim=1)
        c = torch.cat([b, a, a], dim=1)                       # unequal pieces: 11 chunks
        d = torch.cat([x, x.flip(-1)], dim=-1)                # equal pieces
        e = x.narrow(2, 4, 8).transpose(0, 2).contiguous()
        f = x.select(1, 2) * x[:, -1]
        g = x.repeat_interleave(2, dim=0) + x.repeat(2, 1, 1)
        h = x.cumsum(1) + torch.arange(16.0)
        i = x.index_select(1, ids)
        j = x.argmax(-1) + x.max(dim=1).indices.sum(-1, keepdim=True) + x.argmin()
        k = x.var(-1, keepdim=True) + x.std(1).mean() + x.log_softmax(-1)
        m = torch.where(x > 0, x.clamp(-0.5, 0.5), 2.0).sum((0, 2))
        n = (x * 3).to(torch.int32) // 2 + (x > 0.3).sum(-1, dtype=torch.int32, keepdim=True)
        o = x.unbind(0)[1] @ x[0].t() + torch.ones(8, 8) * x.amax() - x.amin(dim=(1, 2)).mean()
        p = torch.logical_or(x > 0, x < -1).any(-1) & ~(x.abs() > 2).all(-1)
        q = x.reshape(4, 2, 4, 16).permute(0, 2, 1, 3).reshape(16, 2, 16)
        r = torch.matmul(x, x.transpose(-1, -2)) + torch.baddbmm(
            x[:, :, :8], x, x.transpose(1, 2)[:, :, :8], beta=0.5)
        s = x[:, ids, :2] + x[ids[:2], 1:3].sum()
        t = (F.silu(x) + F.relu(x) + torch.sigmoid(x) * torch.tanh(x) + x.exp().log1p()
             - torch.expm1(x).abs().sqrt() + torch.rsqrt(x.abs() + 1) + x.sin() * x.cos()
             + torch.erf(x) + x.sign() + F.softplus(x) + x.reciprocal().clamp_max(2)
             + F.gelu(x, approximate="tanh") + x.pow(3) + torch.pow(2.0, x) + (x - 1) / 3
             + torch.maximum(x, -x) + torch.minimum(x, x * 2) + F.hardtanh(x, -0.5, 0.25)
             + F.leaky_relu(x, 0.2))
        u = x.view(4, 2, 64).view(4, 2, 4, 16).sum(2)  # a view back and forth
        return c, d, e, f, g, h, i, j, k, m, n, o, p, q, r, s, t, u


def test_many_aten_ops_match_eager_pytorch():
    torch.manual_seed(4)
    model = Sink()
    x, ids = torch.randn(4, 8, 16), torch.tensor([1, 0, 3, 2])
    tp = from_torch(model, (x, ids))
    assert_lowered_but_fallback_kinds(tp, frozenset({"aten.flip.default"}))
    want = eager(model, x, ids)
    got = tp.torch_outputs(run_unplanned(tp.program, tp.inputs(x, ids)))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype, i
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"output {i}")
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8), strategy="balanced")
    for g, w in zip(tp.torch_outputs(planned.run(tp.inputs(x, ids))), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


class Regroup(nn.Module):
    """A view no affine map names ([3, 4] -> [2, 6]) and a cat of many unequal pieces."""

    def forward(self, x):
        y = (x + 1).view(2, 6).exp()
        z = torch.cat([x.view(-1)] + [x[0, :1] * k for k in range(1, 30)])
        return y, z


def test_views_and_cats_without_an_index_map_fall_back_to_whole_tensor_ops():
    x = torch.randn(3, 4)
    tp = from_torch(Regroup(), (x,))
    kinds = [op.fn for op in tp.program.ops]
    assert "reshape" in kinds and "concat" in kinds
    want = eager(Regroup(), x)
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8))
    for g, w in zip(tp.torch_outputs(planned.run(tp.inputs(x))), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5)
    assert {n.target for n in tp.nodes if n.status == "fallback"} == {
        "aten.view.default", "aten.cat.default"}


def test_bfloat16_and_half_models_run_in_their_dtype():
    torch.manual_seed(5)
    model = MLP(d=32, f=64).to(torch.bfloat16).eval()
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    tp = from_torch(model, (x,))
    assert tp.program.tensor(tp.outputs[0]).dtype == "bfloat16"
    got, = tp.torch_outputs(run_unplanned(tp.program, tp.inputs(x)))
    with torch.no_grad():
        want = model(x).float().numpy()
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2)


# --- errors ----------------------------------------------------------------------------------

class Floor(nn.Module):
    def forward(self, x):
        return torch.floor(x * 2) + 1


class FloatRemainder(nn.Module):
    def forward(self, x):
        return torch.remainder(x, 0.5)


def test_an_unsupported_node_is_an_error_naming_node_target_and_source():
    with pytest.raises(ap.ProgramError,
                       match=r"torch node 'floor' \(aten\.floor\.default\) at .*"
                             r"test_torch_export\.py:\d+.*no lowering for aten\.floor\.default"):
        from_torch(Floor(), (torch.randn(4, 8),))


def test_a_node_the_registry_refuses_is_an_error_naming_node_and_reason():
    with pytest.raises(ap.ProgramError, match=r"torch node 'remainder' "
                                              r"\(aten\.remainder\.Scalar\).*does not take "
                                              r"float32"):
        from_torch(FloatRemainder(), (torch.randn(4, 8),))


def test_non_modules_are_refused():
    x = torch.randn(4, 8)
    with pytest.raises(ap.ProgramError, match="needs a torch.nn.Module"):
        from_torch(lambda x: x, (x,))


class Branch(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x


class Mask(nn.Module):
    def forward(self, x):
        return x[x > 0]


def test_export_failures_and_data_dependent_shapes_are_apportion_errors():
    with pytest.raises(ap.ProgramError, match="torch.export.export of Branch failed"):
        from_torch(Branch(), (torch.randn(4, 8),))
    with pytest.raises(ap.ProgramError, match=r"torch node 'index' \(aten\.index\.Tensor\).*"
                                              "boolean mask"):
        from_torch(Mask(), (torch.randn(4, 8),))


def test_the_parallel_ir_emitter_reads_a_whole_tensor_reshape_by_tensor_extract():
    tp = from_torch(Regroup(), (torch.randn(3, 4),))
    planned = ap.plan(tp.program, ap.targets.spyre(cores=2))
    assert "tensor.extract " in planned.forall_mlir()


def test_import_apportion_does_not_import_torch():
    code = ("import sys, apportion as ap; assert 'torch' not in sys.modules; "
            "ap.TorchProgram; ap.from_torch; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dynamic_batch_becomes_a_symbol_and_runs_at_other_sizes():
    from apportion.frontend.torch_demo import mlp

    model, (x,) = mlp()
    batch = torch.export.Dim("batch", max=128)
    tp = ap.from_torch(model, (x,), dynamic_shapes=({0: batch},))
    assert [(s.name, s.max) for s in tp.program.symbols] == [("batch", 128)]
    assert tp.program.tensor(tp.user_inputs[0]).symbols == {0: "batch"}
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8))
    for b in (3, 128):
        xb = torch.randn(b, x.shape[1])
        got, = tp.torch_outputs(planned.run(tp.inputs(xb)))
        np.testing.assert_allclose(got, model(xb).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_a_dynamic_size_merged_into_an_output_dim_comes_back_in_torch_shape():
    class Flatten(torch.nn.Module):
        def forward(self, x):
            return (x * 2).reshape(-1)

    batch = torch.export.Dim("batch", max=64)
    tp = ap.from_torch(Flatten(), (torch.randn(8, 4),), dynamic_shapes=({0: batch},))
    planned = ap.plan(tp.program, ap.targets.spyre(cores=4))
    x = torch.randn(5, 4)
    got, = tp.torch_outputs(planned.run(tp.inputs(x)))
    np.testing.assert_allclose(got, (x * 2).reshape(-1).numpy())


def test_an_arange_over_a_dynamic_size_takes_the_symbol_and_runs_at_other_sizes():
    class Positions(torch.nn.Module):
        def forward(self, x):
            return x + torch.arange(x.shape[0])[:, None]

    batch = torch.export.Dim("batch", max=64)
    tp = ap.from_torch(Positions(), (torch.randn(8, 4),), dynamic_shapes=({0: batch},))
    arange = next(op for op in tp.program.ops if op.fn == "arange")
    assert tp.program.tensor(arange.out.tensor).symbols == {0: "batch"}
    planned = ap.plan(tp.program, ap.targets.spyre(cores=4))
    x = torch.randn(5, 4)
    got, = tp.torch_outputs(planned.run(tp.inputs(x)))
    np.testing.assert_allclose(got, (x + torch.arange(5)[:, None]).numpy())


def test_a_size_that_is_a_dynamic_size_plus_one_is_refused_naming_the_node():
    class Prepend(torch.nn.Module):
        def forward(self, x):
            return torch.cat([x[:1], x]).exp()

    batch = torch.export.Dim("batch", min=2, max=64)
    with pytest.raises(ap.ProgramError, match=r"torch node 'cat' .* dim 0 is 65 when batch is "
                                              r"64 and 64 when it is 63"):
        ap.from_torch(Prepend(), (torch.randn(8, 4),), dynamic_shapes=({0: batch},))


@pytest.mark.slow
def test_causal_self_attention_runs_at_any_dynamic_sequence_length():
    torch.manual_seed(3)
    model = SelfAttention().eval()
    seq = torch.export.Dim("seq", min=2, max=32)
    tp = ap.from_torch(model, (torch.randn(2, 16, 128),), dynamic_shapes=({1: seq},))
    assert tp.program.symbol_map["seq"].planning_size == 32
    for cores in (1, 8):
        planned = ap.plan(tp.program, ap.targets.spyre(cores=cores))
        for t in (3, 17, 32):
            x = torch.randn(2, t, 128)
            got, = tp.torch_outputs(planned.run(tp.inputs(x)))
            np.testing.assert_allclose(got, eager(model, x)[0], rtol=1e-4, atol=1e-5)


def test_operands_whose_merged_dims_do_not_line_up_are_copied_by_merged_writes():
    class Mix(torch.nn.Module):
        def forward(self, x, y):  # dim 1 of 12 as digits (4, 3) against digits (3, 4)
            return x.transpose(1, 2).reshape(2, 12) + y.reshape(2, 12)

    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    tp = from_torch(Mix(), (x, y))
    merged = [op for op in tp.program.ops if op.merges_output]
    assert merged and all(op.fn == "copy" and op.kind.divisible for op in merged)
    assert "reshape" not in {op.fn for op in tp.program.ops}
    assert not [n for n in tp.nodes if n.status == "fallback"]
    check_everywhere(tp, (x, y), eager(Mix(), x, y))


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_a_lowered_model_round_trips_through_the_program_format(which, request):
    from apportion.frontend.json_format import dumps, loads

    model, ids, tp = request.getfixturevalue(which)
    back = loads(dumps(tp.program))
    assert back.ops == tp.program.ops and back.tensor_map == tp.program.tensor_map
    assert (back.inputs, back.outputs) == (tp.program.inputs, tp.program.outputs)
    assert dumps(back) == dumps(tp.program)
    planned = ap.plan(back, ap.targets.spyre(cores=8))
    got, = tp.torch_outputs(planned.run(tp.inputs(ids)))
    np.testing.assert_allclose(got, eager(model, ids)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_dynamic_sequence_in_a_hugging_face_model_is_refused_naming_node_and_size(llama):
    # the position ids' packed-sequence check concatenates one element before the sequence
    model, ids, _ = llama
    seq = torch.export.Dim("seq", min=2, max=64)
    with pytest.raises(ap.ProgramError, match=r"torch node 'cat' .* 65 when seq is 64"):
        from_torch(model, (ids,), dynamic_shapes=({1: seq},))


@pytest.mark.slow
@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_hugging_face_models_given_an_attention_mask_run_at_any_sequence_length(which, request):
    # with a mask the models skip the packed-sequence check and its seq + 1 concatenation;
    # Llama takes it as its second positional input, GPT-2 by keyword
    model, ids, _ = request.getfixturevalue(which)
    seq = torch.export.Dim("seq", min=2, max=64)
    mask = torch.ones_like(ids)
    tp = from_torch(model, (ids,), kwargs={"attention_mask": mask},
                    dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    assert [s.name for s in tp.program.symbols] == ["seq"]
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8))
    for t in (3, 40):
        x = torch.randint(0, 500, (1, t))
        got, = tp.torch_outputs(planned.run(tp.inputs(x, attention_mask=torch.ones_like(x))))
        with torch.no_grad():
            want = model(x, attention_mask=torch.ones_like(x)).logits.numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_torch_gather_along_a_dim_picks_the_elements_torch_does():
    class Gather(nn.Module):
        def forward(self, x, i, j):  # an index smaller than the input in the other dims
            return torch.gather(x, 1, i) * 2, torch.gather(x, 0, j)

    torch.manual_seed(4)
    x, i, j = torch.randn(4, 6), torch.randint(0, 6, (3, 5)), torch.randint(0, 4, (2, 6))
    tp = from_torch(Gather(), (x, i, j))
    assert {n.target for n in tp.nodes if n.status == "fallback"} >= {"aten.gather.default"}
    check_everywhere(tp, (x, i, j), eager(Gather(), x, i, j))


def test_bert_from_transformers_matches_eager_pytorch():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(6)
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=200)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 200, (1, 12))
    tp = from_torch(model, (ids,))
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8))
    got = tp.torch_outputs(planned.run(tp.inputs(ids)))[0]
    with torch.no_grad():
        want = model(ids).last_hidden_state.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
