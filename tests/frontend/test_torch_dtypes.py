"""bfloat16, float16 and mixed-precision PyTorch models through the frontend: every tensor keeps
torch's dtype, bfloat16 values travel in float32 arrays that hold them exactly (numpy has no
bfloat16), and every plan's run matches the model run eagerly in its own dtype within the
tolerance that dtype's precision gives (``reference.eager_tolerance``)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
F = torch.nn.functional

import apportion as ap  # noqa: E402
from apportion.backends.torch.tensors import from_torch_storage  # noqa: E402
from apportion.frontend import torch_demo  # noqa: E402
from apportion.frontend.torch_export import from_torch  # noqa: E402
from apportion.frontend.torch_program import TorchProgram  # noqa: E402
from apportion.runtime.kernels import round_bf16  # noqa: E402
from apportion.runtime.reference import compare, eager_tolerance, run_unplanned  # noqa: E402
from tests.frontend.test_torch_export import MLP, Sink  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
PLANS = [(s, c) for s in ("greedy", "balanced") for c in (1, 8, 32)]


def eager(model, *xs) -> list[np.ndarray]:
    """The model's outputs as a run stores them (bfloat16 in float32)."""
    with torch.no_grad():
        out = model(*xs)
    out = getattr(out, "logits", out)
    return [from_torch_storage(o) for o in (out if isinstance(out, tuple | list) else (out,))]


def assert_matches_eager(tp: TorchProgram, got, want) -> None:
    """Every output within its eager tolerance, in the dtype torch gave it."""
    for name, g, w in zip(tp.outputs, got, want, strict=True):
        assert g.dtype == w.dtype, name
        tol = {name: eager_tolerance(tp.program, name, w)}
        (check,) = compare({name: w}, {name: g}, _Only(name, tp, w.shape), tol)
        assert check.ok, check


class _Only:
    """The one output ``compare`` reads, in its torch shape."""

    def __init__(self, name: str, tp: TorchProgram, shape: tuple[int, ...]) -> None:
        import dataclasses

        self.outputs = (name,)
        self._t = dataclasses.replace(tp.program.tensor(name), shape=tuple(shape), dynamic=())

    def tensor(self, name: str):
        return self._t


@pytest.fixture(scope="module", params=["llama-bfloat16", "llama-float16", "gpt2-bfloat16",
                                        "gpt2-float16"])
def hf_model(request):
    which, dtype = request.param.split("-")
    make = torch_demo.tiny_llama if which == "llama" else torch_demo.tiny_gpt2
    model, (ids,) = (make(layers=2, seq=8) if which == "gpt2" else
                     make(layers=2, hidden=64, seq=8))
    model = model.to(DTYPES[dtype])
    return model, ids, dtype, from_torch(model, (ids,))


@pytest.mark.slow
def test_hugging_face_models_in_bf16_and_fp16_match_eager_on_every_plan(hf_model):
    model, ids, dtype, tp = hf_model
    assert tp.program.tensor(tp.outputs[0]).dtype == dtype
    want = eager(model, ids)
    inputs = tp.inputs(ids)
    for strategy, cores in PLANS:
        planned = ap.plan(tp.program, ap.targets.spyre(cores=cores), strategy=strategy)
        assert_matches_eager(tp, tp.torch_outputs(planned.run(inputs)), want)


def test_weights_keep_their_dtype_and_bfloat16_ones_are_held_exactly_in_float32(hf_model):
    model, _, dtype, tp = hf_model
    state = dict(model.named_parameters())
    # parameters (torch.export names them p_...); buffers such as masks keep their own dtypes
    weights = [n for n in tp.constants if n.startswith("p_")]
    assert len(weights) == len(state)
    assert {tp.program.tensor(n).dtype for n in weights} == {dtype}
    for name in weights:
        value = tp.constants[name]
        assert value.dtype == (np.float32 if dtype == "bfloat16" else np.float16)
        if dtype == "bfloat16":
            assert np.array_equal(round_bf16(value), value)  # no value between two bf16s
    # the embedding table, bit for bit: torch's bfloat16 values widened, never rounded
    table = next(p for n, p in state.items() if "embed_tokens" in n or "wte" in n)
    held = next(tp.constants[n] for n in weights if tp.program.tensor(n).shape == table.shape)
    assert np.array_equal(held, table.detach().float().numpy().astype(held.dtype))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_many_aten_ops_in_a_narrow_float_match_eager(dtype):
    torch.manual_seed(4)
    x = torch.randn(4, 8, 16).to(DTYPES[dtype])
    ids = torch.tensor([1, 0, 3, 2])
    tp = from_torch(Sink(), (x, ids))
    assert tp.program.tensor(tp.user_inputs[0]).dtype == dtype
    want = eager(Sink(), x, ids)
    assert_matches_eager(tp, tp.torch_outputs(run_unplanned(tp.program, tp.inputs(x, ids))),
                         want)
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8), strategy="balanced")
    assert_matches_eager(tp, tp.torch_outputs(planned.run(tp.inputs(x, ids))), want)


def test_a_bfloat16_input_binds_as_float32_holding_its_values():
    torch.manual_seed(5)
    model = MLP(d=32, f=64).to(torch.bfloat16).eval()
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    tp = from_torch(model, (x,))
    bound = tp.inputs(x)[tp.user_inputs[0]]
    assert bound.dtype == np.float32 and np.array_equal(bound, x.float().numpy())


class Mixed(torch.nn.Module):
    """bfloat16 linears between float32 norms: float32 in, float32 out."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width).to(torch.bfloat16)
        self.down = torch.nn.Linear(4 * width, width).to(torch.bfloat16)
        self.out_norm = torch.nn.RMSNorm(width)

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x).to(torch.bfloat16))))
        return self.out_norm(x + h.float())


def test_a_mixed_model_keeps_each_tensors_dtype_and_matches_eager_at_bf16_precision():
    torch.manual_seed(6)
    model = Mixed().eval()
    x = torch.randn(8, 32)
    tp = from_torch(model, (x,))
    dtypes = {t.name: t.dtype for t in tp.program.tensors}
    assert dtypes[tp.outputs[0]] == "float32" and dtypes[tp.user_inputs[0]] == "float32"
    assert {"float32", "bfloat16"} <= set(dtypes.values())
    want = eager(model, x)
    tol = eager_tolerance(tp.program, tp.outputs[0], want[0])
    assert tol.basis.startswith("4 bfloat16 eps")  # bfloat16 on the way to the float32 output
    for strategy, cores in PLANS:
        planned = ap.plan(tp.program, ap.targets.spyre(cores=cores), strategy=strategy)
        assert_matches_eager(tp, tp.torch_outputs(planned.run(tp.inputs(x))), want)


class DtypeOps(torch.nn.Module):
    """The ATen ops where dtypes meet: dtype= arguments, casts between the narrow floats and
    to and from float32 and integers, infinities and finfo masks, norms and attention."""

    def forward(self, x, ids):
        dt = x.dtype
        other = torch.float16 if dt == torch.bfloat16 else torch.bfloat16
        return (x.sum(-1, dtype=torch.float32), F.softmax(x, -1, dtype=torch.float32),
                x.mean(-1, keepdim=True), (x @ x.transpose(-1, -2)).float(), x.to(other),
                torch.where(x > 0, x, torch.tensor(float("-inf"), dtype=dt)).amax(-1),
                torch.full_like(x, 0.1) * x, (x > 0).to(dt) + ids.to(dt)[:, None],
                x.float().log_softmax(-1).to(dt), torch.cumsum(x, 0),
                F.layer_norm(x, (x.shape[-1],)), F.rms_norm(x, (x.shape[-1],)),
                x.clamp(min=-1e4) * 1e3, F.gelu(x, approximate="tanh"),
                F.scaled_dot_product_attention(x[None], x[None], x[None], is_causal=True),
                x.masked_fill(x < 0, torch.finfo(dt).min), x.int() + 3, x.pow(2).rsqrt())


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_casts_dtype_arguments_and_masks_in_a_narrow_float_match_eager(dtype, backend):
    torch.manual_seed(7)
    x, ids = torch.randn(8, 16).to(DTYPES[dtype]), torch.arange(8)
    tp = from_torch(DtypeOps(), (x, ids))
    want = eager(DtypeOps(), x, ids)
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8), strategy="balanced")
    assert_matches_eager(tp, tp.torch_outputs(planned.run(tp.inputs(x, ids), backend=backend)),
                         want)
