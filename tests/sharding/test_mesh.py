"""Meshes: spec strings, coordinates, presets, TOML files (a target file may carry one)."""

from __future__ import annotations

import pytest

from apportion.errors import TargetError
from apportion.sharding.collectives import steps
from apportion.sharding.mesh import (
    DEFAULT_LINKS,
    PRESETS,
    Axis,
    Mesh,
    cluster,
    load_toml,
    parse,
    resolve,
)
from apportion.sharding.spec import Sharding
from apportion.target.presets import load_toml as load_target


def test_devices_are_row_major_over_the_axes_and_groups_vary_one_axis():
    m = parse("dp=2,tp=3")
    assert m.shape == (2, 3) and m.devices == 6 and m.names == ("dp", "tp")
    assert [m.coords(d) for d in (0, 4)] == [{"dp": 0, "tp": 0}, {"dp": 1, "tp": 1}]
    assert all(m.device(m.coords(d)) == d for d in range(6))
    assert m.group(4, "tp") == (3, 4, 5) and m.group(4, "dp") == (1, 4)


def test_a_spec_names_each_axis_level_and_peering_and_prints_back():
    m = parse("node=2@node,die=2@chiplet:peered,tp=4")
    assert m.axes == (Axis("node", 2, "node"), Axis("die", 2, "chiplet", True), Axis("tp", 4))
    assert parse(m.spec()).axes == m.axes
    assert m.link("node").bandwidth < m.link("tp").bandwidth < m.link("die").bandwidth


@pytest.mark.parametrize(("spec", "match"), [
    ("dp", r"'dp' is not AXIS=SIZE"),
    ("dp=two", r"size 'two' is not an integer \(symbolic axis sizes are not supported\)"),
    ("dp=0", r"mesh axis 'dp': size must be an int >= 1"),
    ("dp=2,dp=2", r"axis 'dp' is named twice"),
    ("dp=2@rack", r"level must be one of node, device, chiplet"),
    ("dp=2@device:fast", r"unknown flag 'fast'"),
    ("", r"non-empty string"),
])
def test_bad_specs_are_target_errors_naming_the_axis(spec, match):
    with pytest.raises(TargetError, match=match):
        parse(spec)


def test_presets_carry_memory_and_levels():
    assert set(PRESETS) >= {"spyre-x8", "spyre-2x8", "chiplets-4x2"}
    c = cluster(2, 4)
    assert [a.level for a in c.axes] == ["node", "device"] and c.memory_bytes == 128 * 10**9
    assert resolve("spyre-x8").devices == 8 and resolve("tp=2").devices == 2


def test_a_peered_axis_reshards_by_remote_reads_with_one_latency():
    plain, peered = parse("tp=4"), parse("tp=4:peered")
    src, dst = Sharding((("tp",), ())), Sharding(((), ()))
    a = steps((1024, 1024), "float32", src, dst, plain)[0]
    b = steps((1024, 1024), "float32", src, dst, peered)[0]
    assert a.bytes == b.bytes == 3 * 1024 * 1024  # (n - 1) / n of the gathered 4 MiB
    assert not a.remote and b.remote and "remote reads" in str(b)
    link = plain.link("tp")
    assert a.time_us == pytest.approx(3 * link.latency_us + a.bytes / link.bandwidth * 1e6)
    assert b.time_us == pytest.approx(link.latency_us + b.bytes / link.bandwidth * 1e6)


def test_a_mesh_toml_file_sets_axes_links_and_memory(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text('name = "two"\nmemory_gib = 2\n'
                 'axes = [{name = "dp", size = 2, level = "node"}, {name = "tp", size = 4}]\n'
                 '[links.node]\nbandwidth_gbs = 10\nlatency_us = 7\n')
    m = load_toml(f)
    assert m.name == "two" and m.shape == (2, 4) and m.memory_bytes == 2 << 30
    assert m.link("dp").bandwidth == 10e9 and m.link("dp").latency_us == 7
    assert m.link("tp") == next(lk for lk in DEFAULT_LINKS if lk.level == "device")
    f.write_text("axes = {dp = 2}\nspeed = 3\n")
    with pytest.raises(TargetError, match=r"m.toml.*unknown field 'speed'"):
        load_toml(f)


def test_a_target_file_carries_a_mesh_and_the_target_loader_ignores_it(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('preset = "spyre"\nmax_cores = 16\n[mesh]\naxes = {tp = 4}\nmemory_gib = 64\n')
    target = load_target(f)
    assert target.max_cores == 16
    mesh = load_toml(f)
    assert mesh.shape == (4,) and mesh.target == target and mesh.memory_bytes == 64 << 30
    g = tmp_path / "u.toml"
    g.write_text('[target]\npreset = "cpu"\n[mesh]\naxes = {dp = 2}\n')
    assert load_target(g).name == "cpu" and load_toml(g).target.name == "cpu"


def test_a_mesh_checks_its_fields():
    with pytest.raises(TargetError, match="has no axes"):
        Mesh(())
    with pytest.raises(TargetError, match="memory_bytes must be an int >= 1"):
        Mesh((Axis("a", 2),), memory_bytes=0)
    with pytest.raises(TargetError, match="no axis 'x'; axes: a"):
        parse("a=2").axis("x")
