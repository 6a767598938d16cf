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
from apportion.backends.torch import executor as torch_exec  # noqa: E402
from apportion.frontend import torch_demo  # noqa: E402
from apportion.runtime.reference import TOLERANCES  # noqa: E402
from apportion.torch_compile import CompileBackend  # noqa: E402

TOL = TOLERANCES["float32"]
SEQ = 8


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def compiled_matches_eager(model, xs, cores: int, threads: int = 2) -> CompileBackend:
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


def test_new_shapes_recompile_static_plans_or_plan_the_symbolic_graph_per_size(caplog):
    model, _ = mlp()
    for dynamic, sizes in ((False, [(), (), ()]), (None, [(), (12,), (16,)])):
        torch._dynamo.reset()
        caplog.clear()
        b = ap.backend(cores=8)
        fast = torch.compile(model, backend=b, dynamic=dynamic)
        with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
            for n in (8, 12, 16):
                x = torch.randn(n, 64)
                torch.testing.assert_close(fast(x), model(x), atol=TOL.atol, rtol=TOL.rtol)
        assert all(g.planned is not None for g in b.graphs), b.graphs
        # the symbolic graph (dynamo's automatic dynamic shapes): planned at each size
        assert [g.sizes for g in b.graphs] == sizes
        assert not apportion_records(caplog)


# --- outputs written through a merge of dims ---------------------------------------------------

class HeadMerge(torch.nn.Module):
    """Attention over heads, the heads merged back side by side (``.transpose(0, 1).reshape(t,
    h*d)``) and a slice of the merged features that cuts through a head: the lowering writes
    the merge once, as a copy through a merge of dims (``y[t, 16*h+d]``), before the slice."""

    def __init__(self, heads: int = 4, dim: int = 16) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.qkv = torch.nn.Linear(heads * dim, 3 * heads * dim)
        self.out = torch.nn.Linear(40, 32)

    def forward(self, x):
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.heads, self.dim).permute(1, 2, 0, 3)
        att = torch.softmax(q @ k.transpose(1, 2) / self.dim ** 0.5, dim=-1)
        o = (att @ v).transpose(0, 1).reshape(t, self.heads * self.dim)
        return self.out(o[:, 8:48]), o


class Regroup(torch.nn.Module):
    """``(t, 12)`` read as 3 x 4, transposed to 4 x 3, merged and split again as 3 x 4: the
    radices do not nest, so the result is written once through a merge of dims."""

    def forward(self, x):
        t = x.shape[0]
        y = torch.exp(x.view(t, 3, 4).transpose(1, 2).reshape(t, 12))
        return y.view(t, 3, 4) * 2


@pytest.mark.parametrize("cores", [1, 8, 32])
@pytest.mark.parametrize("make", [lambda: (HeadMerge(), torch.randn(SEQ, 64)),
                                  lambda: (Regroup(), torch.randn(SEQ, 12))],
                         ids=["head-merge", "regroup"])
def test_graphs_with_merged_writes(make, cores):
    from apportion.frontend.torch_export import from_torch

    torch.manual_seed(0)
    model, x = make()
    model.eval()
    b = ap.backend(target="spyre", cores=cores, threads=2)
    lowered = []

    def spy(gm, example_inputs):  # the program each graph lowers to, then the backend
        lowered.append(from_torch(gm, list(example_inputs)).program)
        return b(gm, example_inputs)

    fast = torch.compile(model, backend=spy)
    with torch.no_grad():
        want = model(x)
        for _ in range(2):
            torch.testing.assert_close(fast(x), want, atol=TOL.atol, rtol=TOL.rtol)
    assert lowered and any(op.merges_output for p in lowered for op in p.ops), lowered
    assert b.graphs and all(g.planned is not None for g in b.graphs), b.graphs
    assert any(op.merges_output for g in b.graphs for op in g.planned.program.ops)


# --- eager fallbacks ---------------------------------------------------------------------------

class Bessel(torch.nn.Module):
    """A modified Bessel function (aten.i0): no lowering in apportion's ATen table."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.i0(torch.relu(self.linear(x)))


def apportion_records(caplog):
    return [r for r in caplog.records if r.name == "apportion"]


def test_a_graph_that_cannot_be_lowered_whole_is_split_with_one_logged_share(caplog):
    torch.manual_seed(0)
    model, x = Bessel().eval(), torch.randn(2, 8)
    b = ap.backend(cores=8)
    fast = torch.compile(model, backend=b)
    with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fast(x), model(x), atol=TOL.atol, rtol=TOL.rtol)
    records = apportion_records(caplog)
    assert len(records) == 1, records
    assert "split the graph at 1 unsupported ATen node (aten.i0.default" in \
        records[0].getMessage()
    assert len(b.graphs) == 1 and b.graphs[0].planned is None and b.graphs[0].split
    assert (b.graphs[0].nodes_planned, b.graphs[0].nodes_eager) == (3, 1)  # linear, relu
    assert "i0" in (b.graphs[0].reason or "")


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
    assert out.stdout.strip() == "CompileBackend"
