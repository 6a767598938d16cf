"""Resharding steps: their decomposition, their cost, and the numpy collectives that run them
(any sharding to any other, partial ones too, lands every device exactly its block)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.errors import PlanningError
from apportion.schedule.mesh import argmax_index, argmax_keys
from apportion.sharding.collectives import apply, steps
from apportion.sharding.mesh import parse
from apportion.sharding.spec import Sharding, candidates

S = Sharding


@pytest.mark.parametrize(("src", "dst", "expect"), [
    (S(((), ("tp",))), S((("tp",), ())), ["all_to_all(tp) dim 1 -> dim 0"]),
    (S(((), ()), ("tp",), "sum"), S(((), ())), ["all_reduce(sum, tp)"]),
    (S(((), ()), ("tp",), "sum"), S((("tp",), ())), ["reduce_scatter(sum, tp) dim 0"]),
    (S((("dp",), ()), ("tp",), "max"), S((("dp", "tp"), ())),
     ["reduce_scatter(max, tp) dim 0"]),
    (S((("dp",), ("tp",))), S(((), ())), ["all_gather(dp) dim 0", "all_gather(tp) dim 1"]),
    (S(((), ())), S((("dp", "tp"), ())), ["slice(dp) dim 0", "slice(tp) dim 0"]),
    (S((("dp", "tp"), ())), S((("dp",), ())), ["all_gather(tp) dim 0"]),
    (S((("tp",), ()), ("dp",), "sum"), S(((), ("dp",))),
     ["all_gather(tp) dim 0", "reduce_scatter(sum, dp) dim 1"]),
    (S((("tp",), ())), S((("tp",), ())), []),
])
def test_reshardings_decompose_into_one_axis_steps(src, dst, expect):
    assert [str(s) for s in steps((8, 12), "float32", src, dst, parse("dp=2,tp=2"))] == expect


def test_nothing_becomes_partial_and_pending_reductions_must_agree():
    m = parse("tp=2")
    with pytest.raises(PlanningError, match="cannot become partial over axis 'tp'"):
        steps((4,), "float32", S(((),)), S(((),), ("tp",), "sum"), m)


def test_ring_costs_follow_the_bytes_each_device_receives():
    m = parse("tp=4")
    full = 1024 * 1024 * 2  # [1024, 1024] float16
    [ag] = steps((1024, 1024), "float16", S((("tp",), ())), S(((), ())), m)
    [ar] = steps((1024, 1024), "float16", S(((), ()), ("tp",), "sum"), S(((), ())), m)
    [rs] = steps((1024, 1024), "float16", S(((), ()), ("tp",), "sum"), S((("tp",), ())), m)
    [cut] = steps((1024, 1024), "float16", S(((), ())), S((("tp",), ())), m)
    # a float16 sum's partials move in float32, twice the bytes of the float16 gather
    assert ag.bytes == 3 * full // 4
    assert rs.bytes == 2 * 3 * full // 4 and ar.bytes == 2 * 2 * 3 * full // 4
    assert cut.bytes == 0 and cut.time_us == 0 and not cut.communicates
    link = m.link("tp")
    assert ar.time_us == pytest.approx(6 * link.latency_us + ar.bytes / link.bandwidth * 1e6)


def _shards(x: np.ndarray, s: Sharding, mesh, rng) -> list[np.ndarray]:
    """Each device's local array of global ``x`` in ``s``; partial axes hold random addends
    (sum) or the value at one coordinate and the identity elsewhere (max)."""
    sizes = {a.name: a.size for a in mesh.axes}
    out = []
    groups: dict[tuple, np.ndarray] = {}
    for d in range(mesh.devices):
        c = mesh.coords(d)
        block = tuple(slice(lo, hi) for lo, hi in s.block(x.shape, c, sizes))
        part = x[block].copy()
        if s.partial:
            key = tuple(c[a] for a in mesh.names if a not in s.partial)
            if s.reducer == "sum":
                noise = groups.setdefault(key + tuple(c[a] for a in s.partial),
                                          rng.normal(size=part.shape))
                share = 1.0 / np.prod([sizes[a] for a in s.partial])
                # addends: each device x * share + its noise, less the mean noise of its group
                part = part * share + noise
            else:  # max: the value on the first device of each group, -inf elsewhere
                first = all(c[a] == 0 for a in s.partial)
                part = part if first else np.full_like(part, -np.inf)
        out.append(part)
    if s.partial and s.reducer == "sum":
        # make the noise of each partial group sum to zero
        for d in range(mesh.devices):
            c = mesh.coords(d)
            key = tuple(c[a] for a in mesh.names if a not in s.partial)
            mates = [e for e in range(mesh.devices)
                     if tuple(mesh.coords(e)[a] for a in mesh.names if a not in s.partial) == key]
            if d == mates[-1]:
                total = sum(out[e] for e in mates) - x[tuple(
                    slice(lo, hi) for lo, hi in s.block(x.shape, c, sizes))]
                out[d] = out[d] - total
    return out


@given(st.sampled_from(["a=2", "a=3", "a=4", "a=2,b=2", "a=2,b=3"]), st.integers(2, 11),
       st.integers(2, 11), st.data())
def test_numpy_collectives_land_every_device_its_block(spec, n0, n1, data):
    """Uneven cuts too (10 over 4: 3, 3, 2, 2): every step cuts as ``Sharding.block`` does."""
    mesh = parse(spec)
    shape = (n0, n1)
    opts = candidates(shape, mesh)
    src = data.draw(st.sampled_from(opts))
    dst = data.draw(st.sampled_from(opts))
    free = [a for a in mesh.names if a not in src.axes]
    partial = tuple(a for a in free if data.draw(st.booleans()))
    reducer = data.draw(st.sampled_from(["sum", "max"]))
    if partial:
        src = Sharding(src.dims, partial, reducer)
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape)
    arrays = _shards(x, src, mesh, rng)
    for step in steps(shape, "float32", src, dst, mesh):
        arrays = apply(step, arrays, mesh, "float32")
    sizes = {a.name: a.size for a in mesh.axes}
    for d, arr in enumerate(arrays):
        block = tuple(slice(lo, hi) for lo, hi in dst.block(shape, mesh.coords(d), sizes))
        np.testing.assert_allclose(arr, x[block].astype(np.float32), rtol=1e-5, atol=1e-5)


def test_argmax_partials_wait_as_keys_combined_by_max_and_unpacked_when_reduced():
    values = np.array([[1.0, np.nan, -0.0, 3.0], [2.0, np.nan, 0.0, 3.0]], np.float32)
    index = np.array([[7, 9, 1, 4], [3, 2, 0, 4]])
    keys = argmax_keys(values, index)
    # per column: the larger value, NaN above all, equal values (and -0, +0) the lower index
    assert argmax_index(keys.max(axis=0)).tolist() == [3, 2, 0, 4]
    ints = argmax_keys(np.array([-5, 7, 7], np.int32), np.array([0, 3, 1]))
    assert argmax_index(ints.max(keepdims=True)).tolist() == [1]
    m = parse("tp=2")
    src = Sharding(((),), ("tp",), "argmax")
    (step,) = steps((4,), "int64", src, Sharding(((),)), m)
    assert str(step) == "all_reduce(argmax, tp)" and step.bytes == 4 * 8  # 8-byte keys
    out = apply(step, [keys[0], keys[1]], m, "int64")
    assert [o.tolist() for o in out] == [[3, 2, 0, 4]] * 2
    (rs,) = steps((4,), "int64", src, Sharding((("tp",),)), m)
    assert [o.tolist() for o in apply(rs, [keys[0], keys[1]], m, "int64")] == [[3, 2], [0, 4]]


def test_partial_sums_of_float16_are_priced_in_float32_and_maxes_in_float16():
    m = parse("tp=4")
    half = (1024 * 1024 * 2) * 3 // 4  # what a float16 reduce-scatter would receive
    [rs16] = steps((1024, 1024), "float16", S(((), ()), ("tp",), "sum"), S((("tp",), ())), m)
    [rs32] = steps((1024, 1024), "float32", S(((), ()), ("tp",), "sum"), S((("tp",), ())), m)
    [mx16] = steps((1024, 1024), "float16", S(((), ()), ("tp",), "max"), S((("tp",), ())), m)
    assert rs16.bytes == rs32.bytes == 2 * half and mx16.bytes == half
