"""Halo reads and reads in place run by IREE (its device modules exchange exactly the rows a
peer lacks, the run's steps on the host) and by DTensor on gloo (point-to-point messages of
those rows), against the unplanned run, uneven cuts included."""

from __future__ import annotations

import re

import pytest

from apportion.backends.iree.mesh import run_mesh
from apportion.frontend.json_format import load
from apportion.mlir.mesh import exchange, mesh_mlir
from apportion.runtime.check import expect
from apportion.schedule.mesh import MeshSchedule
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.search import search
from apportion.sharding.spec import Sharding
from tests.helpers import runs_checked
from tests.sharding.test_peered import PEERED, ROWS4, conv_program, plan_of, shift_program


def halo_schedules() -> list[MeshSchedule]:
    """A convolution's halo (a copy: the rows are re-read per output channel) and a shifted
    slice read in place, both on 3 devices with uneven cuts."""
    conv = plan_of(conv_program(), PEERED, {"conv": {"h": "tp"}},
                   {"x": ROWS4, "w": Sharding.replicated(4)})
    rows = Sharding((("tp",), ()))
    shift = plan_of(shift_program(), PEERED, {"e": {"i": "tp"}, "shift": {"i": "tp"}},
                    {"x": rows})
    out = [lower_plan(conv), lower_plan(shift)]
    assert [[c.kind for c in s.collectives] for s in out] == [["halo"], ["peer_read"]]
    return out


def test_iree_exchanges_only_the_rows_a_peer_lacks_in_slots_of_the_halo_not_the_shard():
    conv, _ = halo_schedules()
    (c,) = conv.collectives
    lay = exchange(c, 0)
    # rows: the largest part a peer lacks is 2 rows (device 0 reads 7:9 of device 1)
    assert lay.pad == (2, 2, 6, 4) and lay.keep == ((0, 2), (0, 7), (0, 6), (0, 4))
    assert lay.sends[0] is None  # nothing to itself
    text = mesh_mlir(conv)  # verified by the compiler's bindings
    assert "flow.collective.all_to_all f32" in text
    assert re.search(r"tensor<3x2x2x6x4xf32>", text)
    assert "tensor<3x2x7x6x4xf32>" not in text  # never a slot of a whole shard


@pytest.mark.slow
def test_iree_runs_a_halo_and_a_read_in_place_to_the_unplanned_numbers(tmp_path):
    for s in halo_schedules():
        want = expect(s.program)
        checks = want.compare(run_mesh(s, want.inputs, tmp_path))
        assert all(c.ok for c in checks), [str(c) for c in checks]


def test_an_example_program_uses_a_halo_and_a_read_in_place_on_a_peered_mesh_only():
    program, ann = _example()
    peered = search(program, parse("die=3@chiplet:peered"), annotations=ann)
    assert sorted(peered.collectives) == ["halo(remote)", "peer_read(remote)"]
    plain = search(program, parse("die=3@chiplet"), annotations=ann)
    assert not {"halo", "peer_read"} & {k.split("(")[0] for k in plain.collectives}
    assert peered.predicted_us < plain.predicted_us


def _example():
    from apportion.sharding.spec import load as load_sharded

    program, ann = load_sharded("examples/halo.json")
    assert load("examples/halo.json") == program
    return program, ann


@pytest.mark.slow
def test_dtensor_on_gloo_runs_a_halo_and_a_read_in_place_by_point_to_point_rows():
    pytest.importorskip("torch")
    runner = pytest.importorskip("apportion.backends.dtensor.runner")
    for (checks, run) in runs_checked(runner, halo_schedules()):
        assert run.backend == "gloo"
        assert all(c.ok for c in checks), [str(c) for c in checks]
