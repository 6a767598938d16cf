"""Every node apportion cannot lower at once (``UnsupportedNodes``), the partial lowering of
the rest, models on the meta device, and the row-block embedding and planned fills that let a
full-size model fit a core's span."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import apportion as ap  # noqa: E402
from apportion.frontend import torch_lower  # noqa: E402
from apportion.frontend.torch_aten import LOWERINGS  # noqa: E402
from apportion.frontend.torch_export import from_torch  # noqa: E402
from apportion.frontend.torch_models import LLAMA3_TINY, llama3_tiny, meta_llama  # noqa: E402
from apportion.frontend.torch_program import UnsupportedNodes  # noqa: E402
from apportion.runtime.reference import run_unplanned  # noqa: E402

nn = torch.nn

#: the ATen ops the conv-and-topk model needs that the tests take to have no lowering (another
#: module may add one: the tests take them out of the table, so they test the collecting)
LEFT_OUT = ("aten.convolution.default", "aten.topk.default")


@pytest.fixture
def unlowerable(monkeypatch):
    for target in LEFT_OUT:
        monkeypatch.delitem(LOWERINGS, target, raising=False)


class ConvTopk(nn.Module):
    """Two convolutions and a topk, with lowerable nodes between and after them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)
        self.conv2 = nn.Conv2d(4, 4, 3)
        self.head = nn.Linear(4, 8)

    def forward(self, x):
        y = self.conv2(torch.relu(self.conv1(x)))
        scores = self.head(y.mean((2, 3)))
        top, _ = torch.topk(scores, 3)
        return torch.exp(top) + 1


def conv_topk():
    torch.manual_seed(0)
    return ConvTopk().eval(), torch.randn(2, 3, 10, 10)


def test_every_unsupported_node_is_named_at_once_in_one_table(unlowerable):
    model, x = conv_topk()
    with pytest.raises(UnsupportedNodes) as info:
        from_torch(model, (x,))
    e = info.value
    assert [u.origin.target for u in e.unsupported] == [LEFT_OUT[0], LEFT_OUT[0], LEFT_OUT[1]]
    assert [u.origin.module for u in e.unsupported] == ["conv1", "conv2", None]
    lines = str(e).splitlines()
    assert lines[0].startswith("3 ATen nodes of 'ConvTopk' cannot be lowered")
    assert "torch node 'convolution' (aten.convolution.default) at " in lines[0]
    assert lines[1].split() == ["ATen", "op", "count", "first", "source", "line", "module",
                                "path", "why"]
    conv = lines[2].split()
    assert conv[:2] == [LEFT_OUT[0], "2"] and conv[2].startswith("tests/frontend/")
    assert conv[3] == "conv1" and " ".join(conv[4:]) == "no lowering"
    assert lines[3].split()[:2] == [LEFT_OUT[1], "1"]
    assert f"3 of {e.total} ATen nodes" in lines[4]


def test_a_single_unsupported_node_still_names_node_target_source_and_reason(unlowerable):
    class OneConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(2, 2, 3)

        def forward(self, x):
            return torch.relu(self.conv(x))

    with pytest.raises(ap.ProgramError, match=r"^1 ATen node of 'OneConv' cannot be lowered "
                       r"\(1 of 2\); the first: torch node 'convolution' .* in conv: apportion "
                       r"has no lowering for aten\.convolution\.default"):
        from_torch(OneConv().eval(), (torch.randn(1, 2, 8),))


def test_partial_lowers_the_nodes_after_an_unsupported_one_reading_inputs_in_its_place(
        unlowerable):
    model, x = conv_topk()
    tp = from_torch(model, (x,), partial=True)
    assert tp.node_counts["unsupported"] == 3
    conv1, conv2, topk = tp.unsupported
    assert conv1.inputs == ("convolution",) and conv1.reads == ()  # it reads the model input
    assert conv2.inputs == ("convolution_1",) and conv2.reads == ("relu",)
    assert topk.inputs == ("topk.0", "topk.1")
    p = tp.program
    assert {"convolution", "convolution_1", "topk.0"} <= set(p.inputs)
    assert {"relu", *topk.reads} <= set(p.outputs)  # what the left-out nodes would read
    assert not any(p.producer(n) for n in ("convolution", "convolution_1", "topk.0"))
    assert tp.lowered_share == pytest.approx(tp.node_counts["lowered"] / 9)


def test_the_planned_partial_program_matches_eager_given_the_left_out_results(unlowerable):
    model, x = conv_topk()
    tp = from_torch(model, (x,), partial=True)
    with torch.no_grad():  # the left-out nodes' results, computed by torch
        c1 = model.conv1(x)
        c2 = model.conv2(torch.relu(c1))
        top, idx = torch.topk(model.head(c2.mean((2, 3))), 3)
        want = model(x).numpy()
    given = {"x": x.numpy(), "convolution": c1.numpy(), "convolution_1": c2.numpy(),
             "topk.0": top.numpy(), "topk.1": idx.numpy(), **tp.constants}
    for cores in (1, 8):
        planned = ap.plan(tp.program, ap.targets.spyre(cores=cores))
        got = tp.torch_outputs(planned.run(given))[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_partial_program_refuses_to_run_from_model_inputs(unlowerable):
    model, x = conv_topk()
    tp = from_torch(model, (x,), partial=True)
    with pytest.raises(ap.ProgramError, match="lowered part of a model: 3 ATen nodes .* "
                       "left out .* run does not support"):
        tp.inputs(x)


def test_partial_is_refused_when_nothing_is_left_to_plan(unlowerable):
    conv = nn.Conv2d(3, 4, 3).eval()
    with pytest.raises(UnsupportedNodes, match="1 ATen node"):
        from_torch(conv, (torch.randn(1, 3, 6, 6),), partial=True)


# --- meta-device models ----------------------------------------------------------------------

@pytest.mark.slow
def test_a_meta_device_llama_lowers_to_the_program_its_cpu_twin_lowers_to():
    meta, (ids,) = llama3_tiny()
    cpu, (cpu_ids,) = meta_llama(LLAMA3_TINY, 16, dtype="float32", device="cpu")
    a, b = from_torch(meta, (ids,)), from_torch(cpu, (cpu_ids,))
    assert a.program.ops == b.program.ops and a.program.tensors == b.program.tensors
    assert a.shapes_only and set(a.shapes_only).isdisjoint(a.constants)
    assert set(a.shapes_only) | set(a.constants) == set(b.constants)
    assert not b.shapes_only


def test_a_meta_device_llama_plans_but_refuses_to_run_naming_its_weights():
    model, (ids,) = llama3_tiny()
    tp = from_torch(model, (ids,))
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8))
    assert planned.plan.cores == 8 and "scf.forall" in planned.forall_mlir()
    with pytest.raises(ap.ProgramError, match=r"has 22 weights with shapes only .* meta device"
                                              r".*needs weights"):
        tp.inputs(ids)
    with pytest.raises(ap.ProgramError, match="needs weights"):
        tp.require_values()


# --- tensors larger than a core addresses ------------------------------------------------------

class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 8)

    def forward(self, ids):
        return self.emb(ids) * 2


def test_a_large_embedding_table_is_gathered_in_row_blocks_exactly(monkeypatch):
    monkeypatch.setattr(torch_lower, "BLOCK_BYTES", 1024)  # 100 x 8 float32: 4 blocks of 25
    torch.manual_seed(0)
    model = Embed().eval()
    ids = torch.tensor([[0, 24, 25, 49], [50, 74, 75, 99]])  # each block's first and last row
    tp = from_torch(model, (ids,))
    blocks = [n for n in tp.program.inputs if n.startswith("p_emb_weight.rows")]
    assert [tp.program.tensor(n).shape for n in blocks] == [(25, 8)] * 4
    assert "p_emb_weight" not in tp.program.inputs
    want = model(ids).detach().numpy()
    got = run_unplanned(tp.program, tp.inputs(ids))
    np.testing.assert_array_equal(tp.torch_outputs(got)[0], want)
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8))
    np.testing.assert_array_equal(tp.torch_outputs(planned.run(tp.inputs(ids)))[0], want)


@pytest.mark.slow
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(2, 40), width=st.integers(1, 6), block_rows=st.integers(1, 12),
       seed=st.integers(0, 2**16))
def test_row_blocks_of_any_size_pick_exactly_the_rows_one_gather_would(
        monkeypatch, rows, width, block_rows, seed):
    # the block size in bytes that gives blocks of about block_rows rows (float32)
    monkeypatch.setattr(torch_lower, "BLOCK_BYTES", block_rows * width * 4)
    torch.manual_seed(seed)
    emb = nn.Embedding(rows, width).eval()
    ids = torch.randint(0, rows, (2, 7))
    tp = from_torch(emb, (ids,))
    blocks = [n for n in tp.program.inputs if n.startswith("p_weight.rows")]
    assert bool(blocks) == (rows > block_rows)  # a table over the block size is split
    assert sum(tp.program.tensor(n).shape[0] for n in blocks) == (rows if blocks else 0)
    got = tp.torch_outputs(run_unplanned(tp.program, tp.inputs(ids)))[0]
    np.testing.assert_array_equal(got, emb(ids).detach().numpy())


def test_a_table_other_ops_read_too_stays_whole(monkeypatch):
    monkeypatch.setattr(torch_lower, "BLOCK_BYTES", 1024)

    class Tied(Embed):
        def forward(self, ids):
            return self.emb(ids) @ self.emb.weight.T

    tp = from_torch(Tied().eval(), (torch.tensor([[1, 2]]),))
    assert "p_emb_weight" in tp.program.inputs


def test_a_constant_over_the_block_size_is_a_planned_fill(monkeypatch):
    monkeypatch.setattr(torch_lower, "BLOCK_BYTES", 256)

    class Full(nn.Module):
        def forward(self, x):
            return x + torch.full_like(x, 2.5)

    x = torch.randn(16, 16)
    tp = from_torch(Full(), (x,))
    assert [o.fn for o in tp.program.ops] == ["fill", "add"]
    planned = ap.plan(tp.program, ap.targets.spyre(cores=8))
    assert planned.op(tp.program.ops[0].name).cores > 1  # divided, where "full" runs whole
    np.testing.assert_array_equal(tp.torch_outputs(planned.run(tp.inputs(x)))[0], x + 2.5)


@pytest.mark.slow
def test_llama3_8b_on_the_meta_device_plans_on_32_spyre_cores():
    from apportion.frontend.torch_models import llama3_8b

    tp = from_torch(*llama3_8b())
    assert len([n for n in tp.program.inputs if ".rows" in n]) == 8  # a 1 GiB table in blocks
    planned = ap.plan(tp.program, ap.targets.spyre(cores=32))
    assert planned.plan.cores == 32 and len(planned.ops) == len(tp.program.ops)
