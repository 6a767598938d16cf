"""``torch.compile`` with ``ap.backend`` on graphs apportion can take only in part: split at the
ATen nodes it cannot lower (planned subgraphs, those nodes eagerly between them, the share said
once), graphs torch made symbolic (planned at each size they are called with), and generation
with a KV cache (prefill and decode steps planned)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import apportion as ap  # noqa: E402
from apportion.frontend import torch_demo  # noqa: E402
from apportion.runtime.reference import TOLERANCES  # noqa: E402
from apportion.torch_compile import _partition, _Specializing  # noqa: E402

TOL = TOLERANCES["float32"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def apportion_records(caplog):
    return [r for r in caplog.records if r.name == "apportion"]


class Around(torch.nn.Module):
    """Supported nodes before and after an unsupported one (aten.i0), and a branch that does
    not depend on it: two planned subgraphs, i0 eagerly between them."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 4)
        self.second = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.second(torch.i0(torch.relu(self.first(x)))) * 2 + x[:, :4].sin()


class TwoCuts(torch.nn.Module):
    """Two unsupported nodes, one of whose results is also a graph output."""

    def forward(self, x):
        a = torch.i0(x.exp())
        b = torch.special.i1(a.tanh() * 3)
        return b + 1, a


@pytest.mark.parametrize("cores", [1, 8])
def test_a_graph_is_split_at_unsupported_nodes_and_gives_eagers_result(caplog, cores):
    torch.manual_seed(0)
    model, x = Around().eval(), torch.randn(6, 8)
    b = ap.backend(cores=cores, threads=2)
    fast = torch.compile(model, backend=b)
    with caplog.at_level(logging.INFO, logger="apportion"), torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fast(x), model(x), atol=TOL.atol, rtol=TOL.rtol)
    records = apportion_records(caplog)
    assert len(records) == 1, records  # the share, once per graph
    assert "split the graph at 1 unsupported ATen node (aten.i0.default" in \
        records[0].getMessage()
    (g,) = b.graphs
    assert g.planned is None and g.split and len(g.parts) == 2
    assert g.nodes_eager == 1 and g.nodes_planned >= 6
    assert f"{g.nodes_planned} of {g.nodes_planned + 1} ATen nodes" in records[0].getMessage()
    assert all(p.target.cores == cores for p in g.parts)
    assert "i0" in (g.reason or "") and 0.8 < g.share < 1.0


def test_unsupported_nodes_whose_results_are_graph_outputs(caplog):
    x = torch.randn(4, 5)
    b = ap.backend(cores=8, threads=2)
    fast = torch.compile(TwoCuts(), backend=b)
    with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
        got, want = fast(x), TwoCuts()(x)
    assert isinstance(got, tuple) and len(got) == 2
    for g_, w in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w, atol=TOL.atol, rtol=TOL.rtol)
    (g,) = b.graphs
    assert g.split and g.nodes_eager == 2 and len(g.parts) >= 2
    assert (g.reason or "").startswith("aten.i0.default, aten.special_i1.default; the first: "
                                       "torch node 'i0'")
    assert len(apportion_records(caplog)) == 1


def test_a_graph_with_no_supported_node_runs_eagerly_with_one_logged_reason(caplog):
    x = torch.randn(3, 4)
    b = ap.backend(cores=8)
    fast = torch.compile(torch.i0, backend=b)
    with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fast(x), torch.i0(x), atol=0, rtol=0)
    records = apportion_records(caplog)
    assert len(records) == 1 and "running the graph eagerly" in records[0].getMessage()
    assert b.graphs[0].planned is None and not b.graphs[0].split
    assert b.graphs[0].share == 0.0


# --- symbolic graphs ---------------------------------------------------------------------------

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU()).eval()


def test_a_symbolic_graph_is_planned_at_each_size_it_is_called_with(caplog):
    model = mlp()
    b = ap.backend(cores=8, threads=2)
    fast = torch.compile(model, backend=b, dynamic=True)
    with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
        for n in (8, 12, 8, 16):
            x = torch.randn(n, 16)
            torch.testing.assert_close(fast(x), model(x), atol=TOL.atol, rtol=TOL.rtol)
    assert not apportion_records(caplog)
    assert [g.sizes for g in b.graphs] == [(8,), (12,), (16,)]  # 8 again: the same plan
    assert all(g.planned is not None for g in b.graphs)
    assert [g.planned.program.tensor(g.planned.program.outputs[0]).shape
            for g in b.graphs] == [(8, 32), (12, 32), (16, 32)]


def test_a_symbolic_graph_past_its_limit_of_sizes_runs_them_eagerly_said_once(
        caplog, monkeypatch):
    monkeypatch.setattr(_Specializing, "limit", 2)
    model = mlp()
    b = ap.backend(cores=8, threads=2)
    fast = torch.compile(model, backend=b, dynamic=True)
    with caplog.at_level(logging.WARNING, logger="apportion"), torch.no_grad():
        for n in (4, 5, 6, 7, 4):
            x = torch.randn(n, 16)
            torch.testing.assert_close(fast(x), model(x), atol=TOL.atol, rtol=TOL.rtol)
    records = apportion_records(caplog)
    assert len(records) == 1 and "more than 2 sizes" in records[0].getMessage()
    assert [g.sizes for g in b.graphs] == [(4,), (5,)]


# --- generation with a KV cache ----------------------------------------------------------------

def tiny_llama_with_cache():
    model, (ids,) = torch_demo.tiny_llama(layers=1, hidden=64, seq=8)
    model.config.use_cache = True
    return model, ids


def generate_both(model, ids, b, cache=None):
    """Eager's tokens and the backend's, greedy, 4 new tokens (a fresh cache each)."""
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False,
                              **({"past_key_values": cache()} if cache else {}))
        model.forward = torch.compile(model.forward, backend=b)
        got = model.generate(ids, max_new_tokens=4, do_sample=False,
                             **({"past_key_values": cache()} if cache else {}))
    return want, got


@pytest.mark.slow
def test_generate_with_a_dynamic_cache_plans_prefill_and_every_decode_step(caplog):
    model, ids = tiny_llama_with_cache()
    b = ap.backend(cores=8, threads=2)
    with caplog.at_level(logging.WARNING, logger="apportion"):
        want, got = generate_both(model, ids, b)
    assert want.shape == (1, 12) and torch.equal(got, want)
    assert not apportion_records(caplog)
    # prefill (8 tokens), then decode steps: the first static, the next planned at the cache
    # lengths torch made symbolic
    assert len(b.graphs) == 4 and all(g.planned is not None for g in b.graphs), b.graphs
    assert b.graphs[0].sizes == () and b.graphs[-1].sizes != ()


@pytest.mark.slow
def test_generate_with_a_static_cache_plans_all_but_the_cache_writes():
    model, ids = tiny_llama_with_cache()

    def cache():
        return transformers.StaticCache(config=model.config, max_cache_len=64)

    b = ap.backend(cores=8, threads=2)
    want, got = generate_both(model, ids, b, cache)
    assert torch.equal(got, want)
    # the writes into the static cache (index_copy_, aten.index_put) run eagerly, the rest
    # of prefill and of each decode step planned; the cache written back each step
    assert len(b.graphs) == 4 and all(g.split for g in b.graphs), b.graphs
    assert all(g.nodes_eager == 2 and g.share > 0.95 for g in b.graphs)  # keys, values
    assert all("aten.index_put.default" in (g.reason or "") for g in b.graphs)


# --- the partition -----------------------------------------------------------------------------

@st.composite
def flagged_graphs(draw):
    """A random DAG of call nodes over one input, and the names of the nodes flagged eager."""
    graph = torch.fx.Graph()
    nodes = [graph.placeholder("x")]
    for _ in range(draw(st.integers(1, 12))):
        a, b = (draw(st.sampled_from(nodes)) for _ in range(2))
        nodes.append(graph.call_function(torch.add, (a, b)))
    graph.output(nodes[-1])
    calls = [n.name for n in nodes[1:]]
    return graph, set(draw(st.lists(st.sampled_from(calls), unique=True)))


def unsupported_ancestor(node, eager):
    return any(m.name in eager or unsupported_ancestor(m, eager)
               for m in node.all_input_nodes if m.op != "placeholder")


@settings(max_examples=60, deadline=None)
@given(flagged_graphs())
def test_subgraphs_hold_one_flag_and_every_edge_between_them_runs_forward(case):
    graph, eager = case
    part = _partition(graph, eager)
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        assert part[node.name] % 2 == (node.name in eager)  # one flag per subgraph
        for m in node.all_input_nodes:
            if m.op == "call_function":  # an operand's subgraph runs first, or is the same
                assert part[m.name] <= part[node.name]
        if node.name not in eager and not unsupported_ancestor(node, eager):
            assert part[node.name] == 0  # all of these run in the first planned subgraph
