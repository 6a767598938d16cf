"""The device level of the schedule: MeshSchedule values refuse what cannot run in step
(stages for the wrong number of devices, groups missing a device, a reduction without its
reducer), box helpers, and the argmax key format a finish packs and a collective unpacks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.errors import ExecutionError
from apportion.frontend.json_format import load
from apportion.schedule.mesh import (
    Collective,
    Compute,
    FinishPart,
    MeshSchedule,
    argmax_index,
    argmax_keys,
    box_shape,
    group_order,
    intersect,
    within,
)
from apportion.sharding import collectives as reference_collectives
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.search import search


def test_argmax_keys_order_values_then_the_lowest_index_as_numpy_does():
    v = np.array([1.0, np.nan, -0.0, 0.0, 3.0, np.nan, 3.0], np.float32)
    i = np.array([4, 1, 2, 3, 0, 5, 6])
    keys = argmax_keys(v, i)
    assert np.array_equal(argmax_index(keys), i)
    order = sorted(range(len(v)), key=lambda k: keys[k])
    assert order[-2:] == [5, 1]  # NaN above all, the lower index first
    assert keys[2] > keys[3] and keys[4] > keys[6]  # -0 as +0; equal: the lower index wins
    assert reference_collectives.argmax_keys is argmax_keys  # one key format


def test_a_mesh_schedule_refuses_a_stage_for_fewer_devices_than_it_has():
    s = lower_plan(search(load("examples/mlp.json"), parse("tp=2")))
    with pytest.raises(ExecutionError, match="stage .* has 1 devices' parts, the mesh 2"):
        MeshSchedule(s.program, s.mesh, s.target, s.devices,
                     (Compute(s.stages[0].launches[:1]),))


def test_a_collective_whose_groups_miss_a_device_is_refused():
    with pytest.raises(ExecutionError, match="do not cover the 2 devices once each"):
        Collective("all_gather", "x", "x", "x@1", "float32", "tp", ((0,),),
                   (((0, 1),), ((1, 2),)), (((0, 2),), ((0, 2),)), dim=0)
    with pytest.raises(ExecutionError, match="a all_reduce needs reducer"):
        Collective("all_reduce", "x", "x", "x@1", "float32", "tp", ((0, 1),),
                   (((0, 2),),) * 2, (((0, 2),),) * 2)


def test_a_finish_of_an_unknown_kind_is_refused():
    with pytest.raises(ExecutionError, match="kind 'round'; valid: scale, pack"):
        FinishPart("round", ("m",), "r", "float32")


def test_a_devices_local_flat_index_becomes_the_whole_reductions():
    part = FinishPart("pack", ("v", "i"), "k", "int64", local=(2, 3), starts=(1, 3),
                      sizes=(3, 6))
    # local (1, 2) -> global (2, 5) of 3x6
    assert part.flat_index(np.array([5])).tolist() == [2 * 6 + 5]


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5)), min_size=1, max_size=3),
       st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5)), min_size=3, max_size=3))
def test_intersect_and_within_agree_with_numpy_slicing(a, b):
    a_box = tuple((lo, lo + n) for lo, n in a)
    b_box = tuple((lo, lo + n) for lo, n in b[:len(a)])
    grid = np.arange(20 ** len(a)).reshape((20,) * len(a))
    part = intersect(a_box, b_box)
    in_a = grid[tuple(slice(lo, hi) for lo, hi in a_box)]
    if part is None:
        assert any(min(p[1], q[1]) <= max(p[0], q[0]) for p, q in zip(a_box, b_box,
                                                                       strict=True))
        return
    assert box_shape(part) == tuple(hi - lo for lo, hi in part)
    want = grid[tuple(slice(lo, hi) for lo, hi in part)]
    assert np.array_equal(in_a[tuple(slice(lo, hi) for lo, hi in within(part, a_box))], want)


def test_groups_are_ordered_by_their_first_device():
    assert group_order([(3, 1), (2, 0)]) == ((2, 0), (3, 1))  # ranks keep their order
    assert group_order([[1, 3], [0, 2]]) == ((0, 2), (1, 3))
