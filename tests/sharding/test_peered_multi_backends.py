"""Halo reads across two peered mesh axes run by every executor that runs halo steps: IREE (its
device modules exchange exactly the rows a peer lacks over a channel of the devices along both
axes), the unrolled and dynamic shard forms compiled by upstream MLIR, and DTensor on gloo
(point-to-point messages of those rows), each against the unplanned program, uneven cuts
included. The partitioned form (upstream's ``shard.update_halo``, one grid axis) cannot say
such a halo."""

from __future__ import annotations

import re

import pytest

from apportion.backends.iree.mesh import run_mesh
from apportion.errors import EmitError
from apportion.mlir.mesh import exchange, mesh_mlir
from apportion.mlir.upstream import MISSING, available
from apportion.runtime.check import expect
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.schedule.mesh import MeshSchedule
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.spec import Sharding
from tests.helpers import assert_runs_as_unplanned, runs_checked
from tests.sharding.test_peered import plan_of, shift_program
from tests.sharding.test_peered_multi import TWO, conv_plan


def two_axis_schedules() -> list[MeshSchedule]:
    """A convolution's halo (19 rows over 2 x 2: uneven) and a shifted slice read in place
    (23 rows over 2 x 2), both across the two peered axes."""
    conv = lower_plan(conv_plan(h=19))
    shift = lower_plan(plan_of(shift_program(), TWO,
                               {"e": {"i": ("a", "b")}, "shift": {"i": ("a", "b")}},
                               {"x": Sharding((("a", "b"), ()))}))
    assert [[(c.kind, c.axes) for c in s.collectives] for s in (conv, shift)] == \
        [[("halo", ("a", "b"))], [("peer_read", ("a", "b"))]]
    return [conv, shift]


def test_iree_exchanges_the_rows_a_peer_lacks_over_a_channel_of_both_axes(tmp_path):
    conv, _ = two_axis_schedules()
    (c,) = conv.collectives
    lay = exchange(c, 1)
    # device 1 holds rows [6, 11) and reads [5, 12): row 5 of device 0, row 11 of device 2;
    # device 0 reads [0, 7) and device 2 [10, 17): it sends them rows 6 and 10
    assert [b[1] if b else None for b in lay.sends] == [(6, 7), None, (10, 11), None]
    assert [(k, b[1]) for k, b in lay.recvs] == [(0, (5, 6)), (2, (11, 12))]
    assert lay.pad[1] == 1 and lay.keep is not None and lay.keep[1] == (6, 11)
    text = mesh_mlir(conv)  # verified by the compiler's bindings
    # the one group holds every device in order: the default channel, no split by one axis
    assert "flow.collective.all_to_all f32" in text and "channel_a " not in text
    assert re.search(r"tensor<4x2x1x6x4xf32>", text)
    for s in two_axis_schedules():
        want = expect(s.program)
        checks = want.compare(run_mesh(s, want.inputs, tmp_path))
        assert all(c.ok for c in checks), [str(c) for c in checks]


def test_iree_splits_a_channel_of_the_two_axes_a_halo_runs_across_on_a_three_axis_mesh():
    """``h`` over ``(a, c)`` of ``a x b x c``: two groups of four, one channel split from the
    default by group (color) and rank, named for both axes."""
    spec = "a=2@chiplet:peered,b=2@chiplet:peered,c=2@chiplet:peered"
    s = lower_plan(conv_plan(spec, rows=Sharding(((), ("a", "c"), (), ())), split=("a", "c")))
    text = mesh_mlir(s)
    splits = re.findall(r"%channel_a_c = flow.channel.split %world, %c(\d)_index, %c(\d)_index",
                        text)
    # devices 0..7 in order: (color, rank) of each, by its group (0, 1, 4, 5) or (2, 3, 6, 7)
    assert splits == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1"), ("0", "2"), ("0", "3"),
                      ("1", "2"), ("1", "3")]
    want = expect(s.program)
    checks = want.compare(run_mesh(s, want.inputs))
    assert all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.skipif(not available(), reason=MISSING)
def test_the_unrolled_form_runs_a_halo_across_two_peered_axes_upstream():
    from apportion.sharding.forms import unrolled_mlir

    for s in two_axis_schedules():
        prog = s.program
        assert_runs_as_unplanned(unrolled_mlir(s, parse(TWO)), prog)


@pytest.mark.skipif(not available(), reason=MISSING)
def test_the_partitioned_form_refuses_a_halo_across_two_axes_naming_them():
    from apportion.sharding.forms import partitioned_mlir

    with pytest.raises(EmitError, match=r"tensor 'x' dim 1.*\ba\b.*\bb\b"):
        partitioned_mlir(conv_plan(h=18))


@pytest.mark.slow
def test_dtensor_on_gloo_runs_halos_across_two_peered_axes_by_point_to_point_rows():
    pytest.importorskip("torch")
    runner = pytest.importorskip("apportion.backends.dtensor.runner")
    for (checks, run) in runs_checked(runner, two_axis_schedules()):
        assert run.backend == "gloo"
        assert all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.skipif(not available(), reason=MISSING)
def test_the_dynamic_form_runs_a_halo_across_two_peered_axes_at_each_device_count():
    """One text for a run-time count on ``a``: the windows of ``h`` split over ``(a, b)`` are
    computed from the counts it is run with, and match at 2 and 3."""
    from apportion.sharding.forms import dynamic_mlir, run_dynamic
    from apportion.sharding.search import search

    prog = conv_plan().program
    rows = Sharding(((), ("a", "b"), (), ()))
    plan = search(prog, parse("a=N~2@chiplet:peered,b=2@chiplet:peered"),
                  annotations={"x": rows, "y": rows})
    assert [(s.kind, s.axes) for t in plan.transfers for s in t.steps] == \
        [("halo", ("a", "b"))]
    text = dynamic_mlir(plan)
    xs = random_inputs(prog, 0)
    want = run_unplanned(prog, xs)
    for n in (2, 3):
        checks = compare(want, run_dynamic(text, prog, plan.mesh, xs, {"N": n}), prog)
        assert all(c.ok for c in checks), (n, [str(c) for c in checks])
