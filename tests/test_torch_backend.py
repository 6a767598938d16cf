"""``torch.compile(model, backend=ap.backend(...))``: graphs lowered, planned and run core slice
by core slice with torch kernels give eager PyTorch's outputs; graphs apportion cannot take run
eagerly with one logged reason."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import apportion as ap  # noqa: E402
from apportion.frontend import torch_demo  # noqa: E402
from apportion.runtime import torch_exec  # noqa: E402
from apportion.runtime.reference import TOLERANCES  # noqa: E402
from apportion.torch_backend import Backend  # noqa: E402

TOL = TOLERANCES["float32"]
SEQ = 8


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def compiled_matches_eager(model, xs, cores: int, threads: int = 2) -> Backend:
    """Compile with the backend, run twice (the second call reuses the plan), compare with
    eager; every captured graph ran planned."""
    b = ap.backend(target="spyre", cores=cores, threads=threads)
    fast = torch.compile(model, backend=b)
    with torch.no_grad():
        want = logits(model(*xs))
        for _ in range(2):
            got = logits(fast(*xs))
            assert got.shape == want.shape and got.dtype == want.dtype
            torch.testing.assert_close(got, want, atol=TOL.atol, rtol=TOL.rtol)
    assert b.graphs and all(g.planned is not None for g in b.graphs), b.graphs
    assert all(g.planned.target.cores == cores for g in b.graphs)
    return b


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64), torch.nn.ReLU()).eval()
    return model, (torch.randn(16, 64),)


@pytest.mark.parametrize("cores", [1, 8, 32])
def test_a_plain_mlp(cores):
    compiled_matches_eager(*mlp(), cores=cores)


@pytest.mark.parametrize("cores", [1, 8, 32])
def test_a_gated_mlp(cores):
    compiled_matches_eager(*torch_demo.mlp(tokens=16), cores=cores)


@pytest.mark.parametrize("cores", [1, 8, 32])
def test_hugging_face_llama(cores):
    model, ids = torch_demo.tiny_llama(layers=2, hidden=256, seq=SEQ)
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size,
            cfg.use_cache) == (256, 512, 2, 4, 2, 1000, False)
    compiled_matches_eager(model, ids, cores=cores)


@pytest.mark.parametrize("cores", [1, 8, 32])
def test_hugging_face_gpt2(cores):
    model, ids = torch_demo.tiny_gpt2(layers=2, seq=SEQ)
    cfg = model.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size) == (2, 128, 4, 1000)
    compiled_matches_eager(model, ids, cores=cores)


def test_new_shapes_recompile_static_plans_or_run_eagerly_when_symbolic(caplog):
    model, _ = mlp()
    for dynamic, planned in ((False, [True, True, True]), (None, [True, False])):
        torch._dynamo.reset()
        caplog.clear()
        b = ap.backend(cores=8)
        fast = torch.compile(model, backend=b, dynamic=dynamic)
        with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
            for n in (8, 12, 16):
                x = torch.randn(n, 64)
                torch.testing.assert_close(fast(x), model(x), atol=TOL.atol, rtol=TOL.rtol)
        assert [g.planned is not None for g in b.graphs] == planned, b.graphs
        # the symbolic graph: one record, then every call of it eagerly without another
        assert len(apportion_records(caplog)) == planned.count(False)
        if dynamic is None:
            assert "SymInt" in (b.graphs[1].reason or "")


# --- eager fallbacks ---------------------------------------------------------------------------

class Conv(torch.nn.Module):
    """A convolution: no lowering in apportion's ATen table."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


def apportion_records(caplog):
    return [r for r in caplog.records if r.name == "apportion"]


def test_a_graph_that_cannot_be_lowered_runs_eagerly_with_one_logged_reason(caplog):
    torch.manual_seed(0)
    model, x = Conv().eval(), torch.randn(1, 3, 8, 8)
    b = ap.backend(cores=8)
    fast = torch.compile(model, backend=b)
    with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fast(x), model(x), atol=0, rtol=0)
    records = apportion_records(caplog)
    assert len(records) == 1, records
    assert "running the graph eagerly" in records[0].getMessage()
    assert "convolution" in records[0].getMessage()
    assert len(b.graphs) == 1 and b.graphs[0].planned is None
    assert "convolution" in (b.graphs[0].reason or "")


def test_a_graph_that_cannot_be_planned_runs_eagerly(caplog):
    model, xs = mlp()
    target = ap.targets.spyre(cores=8)
    tiny = type(target)(**{**target.__dict__, "name": "tiny", "span_limit": 64,
                           "scratchpad_bytes": 256})
    b = ap.backend(target=tiny)
    fast = torch.compile(model, backend=b)
    with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
        torch.testing.assert_close(fast(*xs), model(*xs), atol=0, rtol=0)
    records = apportion_records(caplog)
    assert len(records) == 1 and b.graphs[0].planned is None, (records, b.graphs)


def test_inputs_that_need_gradients_run_eagerly(caplog):
    model, xs = mlp()
    fast = torch.compile(model, backend=ap.backend(cores=8))
    with caplog.at_level(logging.WARNING, logger="apportion"):
        y = fast(*xs)
    assert y.requires_grad  # autograd kept: eager
    records = apportion_records(caplog)
    assert len(records) == 1 and "inference only" in records[0].getMessage()


def test_a_failed_run_is_logged_once_and_runs_eagerly_from_then_on(caplog, monkeypatch):
    model, xs = mlp()
    b = ap.backend(cores=8)
    fast = torch.compile(model, backend=b)

    def broken(self, inputs, params=None):
        raise ap.ExecutionError("the device caught fire")

    monkeypatch.setattr(torch_exec.TorchExecutor, "run", broken)
    with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fast(*xs), model(*xs), atol=0, rtol=0)
    records = apportion_records(caplog)
    assert len(records) == 1 and "the device caught fire" in records[0].getMessage()
    assert b.graphs[0].planned is not None  # it planned; the run failed


# --- the backend's arguments -------------------------------------------------------------------

def test_targets_by_name_by_value_and_their_core_counts():
    assert ap.backend().target.cores == 8
    assert ap.backend(cores=32).target.cores == 32
    own = ap.targets.spyre(cores=4)
    assert ap.backend(target=own).target == own
    assert ap.backend(target=own, cores=2).target.cores == 2
    assert ap.backend(target="cpu", cores=2).target.name == "cpu"
    assert "cores=8" in repr(ap.backend())


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"target": "tpu"}, ap.TargetError, "unknown target 'tpu'"),
    ({"cores": 64}, ap.TargetError, "cores must be in 1..32"),
    ({"strategy": "fast"}, ap.PlanningError, "unknown strategy 'fast'"),
    ({"threads": 0}, ap.ExecutionError, "threads must be an int >= 1 or None"),
])
def test_bad_arguments_are_apportion_errors_at_once(kwargs, error, match):
    with pytest.raises(error, match=match):
        ap.backend(**kwargs)


def test_import_apportion_and_making_a_backend_import_no_torch():
    code = ("import sys, apportion as ap; b = ap.backend(target='spyre', cores=8); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(type(b).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "Backend"
