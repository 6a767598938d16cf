"""Convolutional PyTorch models (apportion.frontend.torch_conv): convolutions, batch norm in eval,
pooling and padding lowered to planned ops, planned on Spyre cores and run by the reference and
torch backends (IREE in a slow test) against eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import apportion as ap  # noqa: E402
from apportion.errors import ProgramError  # noqa: E402
from apportion.frontend import torch_cnn_demo as demo  # noqa: E402
from apportion.frontend.torch_export import from_torch  # noqa: E402
from apportion.frontend.torch_program import TorchProgram  # noqa: E402
from apportion.runtime import run_unplanned  # noqa: E402

# torch.export deep-copies pytree specs, which warns inside torch; torch warns that its own
# padding="same" with an even kernel copies the input
pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
              pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")]

#: (strategy, cores, backend) each model is planned and run with
CASES = [("balanced", 8, "reference"), ("greedy", 32, "reference"), ("balanced", 32, "torch")]


def eager(model, *xs):
    with torch.no_grad():
        out = model(*xs)
    return [o.numpy() for o in (out if isinstance(out, tuple | list) else (out,))]


def check_planned(tp: TorchProgram, xs, want, cases=CASES, rtol=1e-4, atol=1e-5):
    """Unplanned, then planned on Spyre cores and run by each case's backend: torch's numbers."""
    inputs = tp.inputs(*xs)
    runs = [("unplanned", run_unplanned(tp.program, inputs))]
    for strategy, cores, backend in cases:
        planned = ap.plan(tp.program, ap.targets.spyre(cores=cores), strategy=strategy)
        runs.append((f"{strategy}, {cores} cores, {backend}",
                     planned.run(inputs, backend=backend)))
    for what, run in runs:
        for g, w in zip(tp.torch_outputs(run), want, strict=True):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=what)


def lowered(model, *xs) -> TorchProgram:
    return from_torch(model.eval(), xs)


def no_fallbacks(tp: TorchProgram) -> bool:
    """Every op divides over cores: none runs whole on one core."""
    return all(op.category != "fallback" for op in tp.program.ops)


def kinds(tp: TorchProgram) -> set[str]:
    return {op.fn for op in tp.program.ops}


def _seeded(make):
    torch.manual_seed(0)
    return make()


# --- whole models ------------------------------------------------------------------------------

@pytest.mark.parametrize("factory", ["small_cnn", "audio_frontend", "patch_embed",
                                     "depthwise_block"])
def test_demo_models_match_eager_pytorch_planned_on_spyre_cores(factory):
    model, xs = getattr(demo, factory)()
    tp = lowered(model, *xs)
    assert no_fallbacks(tp)
    assert all(n.status == "lowered" for n in tp.nodes)
    check_planned(tp, xs, eager(model, *xs))


def test_small_cnn_lowers_to_conv_pool_and_matmul_ops_without_fallbacks():
    model, xs = demo.small_cnn()
    tp = lowered(model, *xs)
    assert {"conv", "max_pool", "avg_pool", "matmul"} <= kinds(tp)
    assert tp.lowered_share == 1.0 and no_fallbacks(tp)


def test_a_conv_divides_over_output_channels_and_spatial_dims():
    conv = _seeded(lambda: nn.Conv2d(64, 64, 3))
    tp = lowered(conv, torch.randn(1, 64, 34, 34))
    planned = ap.plan(tp.program, ap.targets.spyre(cores=32))
    op = next(o for o in planned.plan.ops if o.op == "conv")
    splits = dict(op.splits)
    assert op.reduction_dims == ("c", "k0", "k1")
    assert splits["f"] > 1 and splits["o0"] > 1
    assert np.prod(list(splits.values())) == 32


def test_a_target_whose_split_k_rules_split_the_channel_reduction_rewrites_the_conv():
    # the gpu preset's split-K rule (IREE's convolution family) splits a long reduction over a
    # small output: the conv becomes partial convs over channel and filter-tap slices (every
    # one of the 5 taps, then every channel: 1280 slices) and a sum combining them
    conv = _seeded(lambda: nn.Conv1d(256, 8, 5, padding=2))
    x = torch.randn(1, 256, 4)
    tp = lowered(conv, x)
    planned = ap.plan(tp.program, ap.targets.gpu())
    by_name = {o.name: o for o in planned.plan.ops}
    partial = by_name["convolution.conv.partial"]
    assert partial.op == "conv" and partial.split_k.dims == ("c", "k0")
    assert partial.split_k.factor > 1 and by_name["convolution.conv.combine"].op == "sum"
    want = eager(conv, x)
    for backend in ("reference", "torch"):
        got = tp.torch_outputs(planned.run(tp.inputs(x), backend=backend))
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5, err_msg=backend)


def test_a_patch_embedding_is_one_conv_reading_the_image_at_stride_times_patch_plus_offset():
    model, xs = demo.patch_embed(size=16, patch=4, width=32)
    tp = lowered(model, *xs)
    conv = next(op for op in tp.program.ops if op.fn == "conv")
    assert str(conv.ins[0]) == "x[0, c, 4*o0+k0, 4*o1+k1]"
    assert dict(conv.dims) == {"f": 32, "o0": 4, "o1": 4, "c": 3, "k0": 4, "k1": 4}


def test_a_cnn_compiled_with_the_apportion_backend_runs_planned_and_matches_eager():
    model, xs = demo.small_cnn()
    backend = ap.backend(target="spyre", cores=8)
    fast = torch.compile(model, backend=backend)
    with torch.no_grad():
        got = fast(*xs)
    assert [g.reason for g in backend.graphs] == [None]  # planned, not run eagerly
    np.testing.assert_allclose(got.numpy(), eager(model, *xs)[0], rtol=1e-4, atol=1e-5)


# --- convolutions ----------------------------------------------------------------------------

CONVS = {
    "strided": lambda: nn.Conv2d(4, 6, 3, stride=2),
    "padded": lambda: nn.Conv2d(4, 6, 3, padding=2),
    "dilated": lambda: nn.Conv2d(4, 6, 3, dilation=2, padding=1),
    "asymmetric": lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0)),
    "same": lambda: nn.Conv2d(4, 6, 4, padding="same", bias=False),
    "grouped": lambda: nn.Conv2d(4, 6, 3, groups=2, padding=1),
    "depthwise": lambda: nn.Conv2d(4, 8, 3, groups=4, padding=1),
    "1x1": lambda: nn.Conv2d(4, 6, 1),
    "conv1d": lambda: nn.Conv1d(4, 6, 5, stride=3, padding=2, dilation=2),
    "conv1d_grouped": lambda: nn.Conv1d(4, 4, 3, groups=4),
    "conv3d_pooled": lambda: nn.Sequential(nn.Conv3d(4, 6, 3, stride=(1, 2, 2), padding=1),
                                           nn.MaxPool3d(2), nn.AvgPool3d(2, ceil_mode=True)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolutions_match_eager_pytorch(name):
    conv = _seeded(CONVS[name])
    shape = {"conv1d": (2, 4, 11), "conv3d": (1, 4, 6, 8, 8)}.get(name[:6], (2, 4, 9, 10))
    x = torch.randn(*shape)
    tp = lowered(conv, x)
    assert "conv" in kinds(tp)
    check_planned(tp, (x,), eager(conv, x))


def test_a_grouped_conv_reads_the_group_and_channel_as_one_input_channel():
    conv = _seeded(lambda: nn.Conv2d(4, 6, 3, groups=2, bias=False))
    tp = lowered(conv, torch.randn(1, 4, 5, 5))
    op, = tp.program.ops
    assert str(op) == ("convolution: convolution[0, g, f, o0, o1] = conv(input[0, c+2*g, "
                       "o0+k0, o1+k1], p_weight[f+3*g, c, k0, k1])")


def test_a_padded_conv_is_exact_for_infinities_and_nan_in_its_input():
    conv = _seeded(lambda: nn.Conv2d(2, 3, 3, padding=1))
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 0, 0], x[0, 1, 3, 3], x[0, 1, 5, 5] = float("inf"), float("nan"), -float("inf")
    tp = lowered(conv, x)
    got, = tp.torch_outputs(run_unplanned(tp.program, tp.inputs(x)))
    want, = eager(conv, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_padding_is_one_select_per_padded_dim_that_the_conv_reads_at_an_offset():
    conv = _seeded(lambda: nn.Conv2d(2, 3, 3, padding=1, bias=False))
    x = torch.randn(1, 2, 12, 12)
    tp = lowered(conv, x)
    assert [str(op) for op in tp.program.ops] == [
        "convolution.pad0: convolution.pad0[0, b1, 12*c+r, b3] = where(convolution.pad0.select[c],"
        " input[0, b1, r, b3], scalar.0[])",
        "convolution.pad1: convolution.pad1[0, b1, b2, 12*c+r] = where(convolution.pad1.select[c],"
        " convolution.pad0[0, b1, b2+11, r], scalar.0[])",
        "convolution: convolution[0, 0, f, o0, o1] = conv(convolution.pad1[0, c, o0+k0, "
        "o1+k1+11], p_weight[f, c, k0, k1])"]
    check_planned(tp, (x,), eager(conv, x), cases=[("balanced", 8, "reference")])


def test_a_padding_wider_than_its_dim_is_a_concatenation():
    model = Fn(lambda x: F.pad(x, (4, 5), value=2.0))
    x = torch.randn(2, 3, 3)
    tp = lowered(model, x)
    assert "concat" in kinds(tp)  # 4, 3 and 5 elements: no common block
    check_planned(tp, (x,), eager(model, x), cases=[("balanced", 8, "reference")])


class ChannelsLast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1, groups=2)
        self.pool = nn.MaxPool2d(2, padding=1)

    def forward(self, x):  # an NHWC input, then a slice with a step of the conv's result
        y = self.conv(x.permute(0, 3, 1, 2))
        return self.pool(y[:, :, 1:, ::2])


def test_permuted_and_sliced_operands_are_read_through_their_index_maps_without_copies():
    model = _seeded(ChannelsLast)
    x = torch.randn(1, 5, 7, 4)
    tp = lowered(model, x)
    assert "copy" not in kinds(tp)
    pad = tp.program.op("convolution.pad0")
    assert str(pad.ins[1]) == "x[0, r, b3, b1]"  # the NHWC input read as NCHW
    pool_pad = tp.program.op("max_pool2d_with_indices.pad0")
    assert str(pool_pad.ins[1]) == "convolution[0, b1_0, b1_1, r+1, 2*b3]"
    check_planned(tp, (x,), eager(model, x))


def test_a_transposed_convolution_is_refused_naming_the_node():
    deconv = _seeded(lambda: nn.ConvTranspose2d(2, 3, 3))
    with pytest.raises(ProgramError, match=r"convolution.*transposed"):
        lowered(deconv, torch.randn(1, 2, 5, 5))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_convolutions_match_eager_pytorch(data):
    rank = data.draw(st.sampled_from([1, 2]), "spatial dims")
    groups = data.draw(st.sampled_from([1, 2, 3]), "groups")
    c_in = groups * data.draw(st.integers(1, 2), "channels per group")
    c_out = groups * data.draw(st.integers(1, 3), "filters per group")
    k = data.draw(st.integers(1, 3), "kernel")
    dilation = data.draw(st.integers(1, 2), "dilation")
    stride = data.draw(st.integers(1, 3), "stride")
    padding = data.draw(st.integers(0, 2), "padding")
    size = data.draw(st.integers(dilation * (k - 1) + 1, 9), "input size")
    cls = nn.Conv1d if rank == 1 else nn.Conv2d
    torch.manual_seed(data.draw(st.integers(0, 100), "seed"))
    conv = cls(c_in, c_out, k, stride=stride, padding=padding, dilation=dilation, groups=groups,
               bias=data.draw(st.booleans(), "bias"))
    x = torch.randn(1, c_in, *([size] * rank))
    tp = lowered(conv, x)
    check_planned(tp, (x,), eager(conv, x), cases=[("balanced", 4, "reference")])


# --- batch norm, pooling, padding ------------------------------------------------------------

class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn2 = nn.BatchNorm2d(3)
        self.bn1 = nn.BatchNorm1d(5, affine=False)

    def forward(self, x, v):
        return self.bn2(x), self.bn1(v)


def test_batch_norm_in_eval_is_a_per_channel_scale_and_shift_from_the_running_stats():
    model = demo._randomize_batch_norms(_seeded(Norms))
    x, v = torch.randn(2, 3, 4, 5), torch.randn(4, 5)
    tp = lowered(model, x, v)
    assert kinds(tp) <= {"add", "rsqrt", "mul", "sub", "neg"}
    scale = next(op for op in tp.program.ops if op.name.endswith(".scaled"))
    assert tp.program.tensor(scale.ins[1].tensor).shape == (3,)  # one scale per channel
    check_planned(tp, (x, v), eager(model, x, v))


class StatsGiven(nn.Module):
    def forward(self, x, mean, var, weight):  # statistics the caller passes: not constants
        return F.batch_norm(x, mean, var, weight, None, training=False, eps=1e-3)


def test_batch_norm_folds_its_buffers_into_two_constants_and_computes_given_statistics():
    model = demo._randomize_batch_norms(_seeded(lambda: nn.BatchNorm2d(3)))
    x = torch.randn(2, 3, 4, 5)
    tp = lowered(model, x)
    assert [op.fn for op in tp.program.ops] == ["mul", "add"]
    scale = tp.constants[tp.program.ops[0].ins[1].tensor]
    bn = model
    want = bn.weight.detach().numpy() / np.sqrt(bn.running_var.numpy() + bn.eps)
    np.testing.assert_allclose(scale, want, rtol=1e-6)
    given_stats = (x, torch.rand(3), torch.rand(3) + 0.5, torch.rand(3))
    tp = lowered(StatsGiven(), *given_stats)
    assert {"rsqrt", "mul", "neg"} <= kinds(tp)
    check_planned(tp, given_stats, eager(StatsGiven(), *given_stats),
                  cases=[("balanced", 8, "reference")])


POOLS = {
    "max": lambda x: F.max_pool2d(x, 2),
    "max_padded_strided": lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
    "max_dilated_ceil": lambda x: F.max_pool2d(x, 2, stride=2, dilation=2, ceil_mode=True),
    "max1d": lambda x: F.max_pool1d(x.flatten(2), 3, stride=2, padding=1),
    "avg": lambda x: F.avg_pool2d(x, 2),
    "avg_padded": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
    "avg_padded_excluded": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1,
                                                  count_include_pad=False),
    "avg_ceil": lambda x: F.avg_pool2d(x, 2, stride=2, ceil_mode=True, padding=1),
    "avg_divisor": lambda x: F.avg_pool2d(x, 3, divisor_override=4),
    "avg1d": lambda x: F.avg_pool1d(x.flatten(2), 4, stride=3, padding=2,
                                    count_include_pad=False),
    "adaptive_even": lambda x: F.adaptive_avg_pool2d(x, (3, 5)),
    "adaptive_uneven": lambda x: F.adaptive_avg_pool2d(x, (4, 3)),
    "adaptive_larger": lambda x: F.adaptive_avg_pool2d(x, (7, 13)),
    "adaptive_global": lambda x: F.adaptive_avg_pool2d(x, 1),
    "adaptive1d": lambda x: F.adaptive_avg_pool1d(x.flatten(2), 7),
    "pad": lambda x: F.pad(x, (1, 2, 0, 3), value=-1.5),
    "hardswish_hardsigmoid": lambda x: F.hardswish(x * 4) + F.hardsigmoid(x * 4),
    "pad_negative": lambda x: F.pad(x, (-1, 2, 1, -2)),
}


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pooling_and_padding_match_eager_pytorch(name):
    model = Fn(POOLS[name])
    x = torch.randn(2, 3, 9, 10)
    tp = lowered(model, x)
    check_planned(tp, (x,), eager(model, x))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_poolings_match_eager_pytorch(data):
    kind = data.draw(st.sampled_from(["max", "avg", "adaptive"]), "kind")
    k = data.draw(st.integers(1, 4), "kernel")
    stride = data.draw(st.integers(1, 3), "stride")
    padding = data.draw(st.integers(0, k // 2), "padding")
    ceil = data.draw(st.booleans(), "ceil_mode")
    dilation = data.draw(st.integers(1, 2), "dilation") if kind == "max" else 1
    size = data.draw(st.integers(dilation * (k - 1) + 1, 9), "input size")
    if kind == "max":
        def fn(x):
            return F.max_pool2d(x, k, stride, padding, dilation, ceil_mode=ceil)
    elif kind == "avg":
        include = data.draw(st.booleans(), "count_include_pad")
        def fn(x):
            return F.avg_pool2d(x, k, stride, padding, ceil_mode=ceil, count_include_pad=include)
    else:
        out = data.draw(st.tuples(st.integers(1, 9), st.integers(1, 9)), "output size")
        def fn(x):
            return F.adaptive_avg_pool2d(x, out)
    model = Fn(fn)
    x = torch.randn(1, 2, size, size + 1)
    check_planned(lowered(model, x), (x,), eager(model, x), cases=[("balanced", 4, "reference")])


def test_max_pooling_pads_with_minus_infinity_and_keeps_nan():
    model = Fn(lambda x: F.max_pool2d(x, 3, stride=2, padding=1))
    x = -torch.rand(1, 2, 6, 6) - 1.0  # every value below the zero a zero padding would add
    x[0, 1, 2, 2] = float("nan")
    tp = lowered(model, x)
    got, = tp.torch_outputs(run_unplanned(tp.program, tp.inputs(x)))
    np.testing.assert_array_equal(got, eager(model, x)[0])


def test_uneven_adaptive_pooling_is_one_avg_pool_per_residue_of_the_output():
    # 10 -> 6: windows [0, 2), [1, 4), [3, 5), then the same 5 further on
    model = Fn(lambda x: F.adaptive_avg_pool1d(x, 6))
    x = torch.randn(1, 2, 10)
    tp = lowered(model, x)
    pools = [op for op in tp.program.ops if op.fn == "avg_pool"]
    assert [(dict(op.dims)["k0"], str(op.ins[0]).split(", ")[-1]) for op in pools] == [
        (2, "5*o0+k0]"), (3, "5*o0+k0+1]"), (2, "5*o0+k0+3]")]
    check_planned(tp, (x,), eager(model, x), cases=[("balanced", 4, "reference")])


class PoolIndices(nn.Module):
    def __init__(self, **kw) -> None:
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return F.max_pool2d(x, return_indices=True, **self.kw)


@pytest.mark.parametrize("kw", [
    {"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": (1, 3), "stride": 2, "dilation": 2, "ceil_mode": True},
    {"kernel_size": (3, 1)}, {"kernel_size": 1, "stride": 2}])
def test_max_pool_indices_read_by_the_model_are_torchs_flat_spatial_indices(kw):
    model = PoolIndices(**kw)
    x = torch.randn(2, 3, 9, 10)
    tp = lowered(model, x)
    assert kw["kernel_size"] == 1 or "argmax" in kinds(tp)
    values, indices = eager(model, x)
    assert indices.dtype == np.int64
    check_planned(tp, (x,), [values, indices], cases=[("balanced", 8, "reference"),
                                                      ("balanced", 8, "torch")], atol=0)


def test_max_pool_indices_nobody_reads_make_no_ops():
    model = Fn(lambda x: F.max_pool2d(x, 2))
    assert "argmax" not in kinds(lowered(model, torch.randn(1, 2, 4, 4)))


# --- the IREE backend --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("factory", ["small_cnn", "audio_frontend", "patch_embed",
                                     "depthwise_block"])
def test_demo_models_run_compiled_by_iree_and_match_eager_pytorch(factory):
    model, xs = getattr(demo, factory)()
    tp = lowered(model, *xs)
    check_planned(tp, xs, eager(model, *xs), cases=[("balanced", 8, "iree")])


@pytest.mark.slow
def test_pooling_with_uneven_windows_runs_compiled_by_iree():
    def pools(x):
        return (F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
                *F.max_pool2d(x, 2, stride=2, dilation=2, ceil_mode=True, return_indices=True),
                F.adaptive_avg_pool2d(x, (4, 3)))

    model = Fn(pools)
    x = torch.randn(2, 3, 9, 10)
    check_planned(lowered(model, x), (x,), eager(model, x), cases=[("balanced", 8, "iree")])
