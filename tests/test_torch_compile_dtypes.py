"""``torch.compile(backend=ap.backend(...))`` on bfloat16, float16 and mixed-precision models:
every graph runs planned, returns tensors of eager's dtypes, and matches eager within the
tolerance the least precise dtype on the way gives (``reference.eager_tolerance``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import apportion as ap  # noqa: E402
from apportion.backends.torch.tensors import from_torch_storage  # noqa: E402
from apportion.frontend import torch_demo  # noqa: E402
from apportion.runtime.reference import compare, eager_tolerance  # noqa: E402
from tests.frontend.test_torch_dtypes import Mixed  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def llama(dtype):
    model, ids = torch_demo.tiny_llama(layers=1, hidden=64, seq=8)
    return model.to(dtype), ids


def gpt2(dtype):
    model, ids = torch_demo.tiny_gpt2(layers=1, seq=8)
    return model.to(dtype), ids


def mixed(_):
    torch.manual_seed(6)
    return Mixed().eval(), (torch.randn(8, 32),)


@pytest.mark.parametrize(("make", "dtype", "narrow"), [
    (llama, torch.bfloat16, "bfloat16"), (llama, torch.float16, "float16"),
    (gpt2, torch.bfloat16, "bfloat16"), (gpt2, torch.float16, "float16"),
    (mixed, None, "bfloat16"),
], ids=["llama-bf16", "llama-fp16", "gpt2-bf16", "gpt2-fp16", "mixed"])
def test_compiled_narrow_float_models_match_eager_in_their_dtype(make, dtype, narrow):
    model, xs = make(dtype)
    b = ap.backend(target="spyre", cores=8, threads=2)
    fast = torch.compile(model, backend=b)
    with torch.no_grad():
        want = logits(model(*xs))
        for _ in range(2):  # the second call reuses the plan
            got = logits(fast(*xs))
            assert got.shape == want.shape and got.dtype == want.dtype
            assert len(b.graphs) == 1 and b.graphs[0].planned is not None, b.graphs
            program = b.graphs[0].planned.program
            (name,) = program.outputs
            w, g = from_torch_storage(want), from_torch_storage(got)
            tol = eager_tolerance(program, name, w)
            assert tol.basis.startswith(f"4 {narrow} eps")
            (check,) = compare({name: w.reshape(program.tensor(name).shape)},
                               {name: g.reshape(program.tensor(name).shape)}, program,
                               {name: tol})
            assert check.ok, check
