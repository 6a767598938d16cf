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
    ("dp=two", r"axis 'dp': symbolic size two needs a planning size or a max: two~4"),
    ("dp=2x", r"axis 'dp': size '2x' is neither an integer nor a symbol"),
    ("dp=4~2", r"axis 'dp': size '4~2': only a symbolic size takes a planning size"),
    ("dp=N~x", r"axis 'dp': size 'N~x': 'x' is not an integer"),
    ("dp=N~4~5", r"axis 'dp': size 'N~4~5' gives a planning size twice"),
    ("dp=N~9~2..8", r"mesh axis 'dp': planning size 9 of N is outside its bounds 2..8"),
    ("dp=N~8..2", r"mesh axis 'dp': max 2 of N is below its min 8"),
    ("dp=N~2,tp=N~4", r"axes 'dp' and 'tp' share size N with different planning sizes"),
    ("dp=tp~2,tp=2", r"axis 'dp' names its size 'tp', which is an axis name"),
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


def test_a_symbolic_axis_size_has_a_planning_size_and_bounds_and_prints_back():
    m = parse("dp=N~4,tp=2@chiplet:peered")
    assert m.symbolic and m.shape == (4, 2) and m.devices == 8
    assert m.axis("dp") == Axis("dp", 4, symbol="N")
    assert str(m) == "dp=N~4,tp=2@chiplet:peered (dp=N~4,tp=2@chiplet:peered, 8 devices at N=4)"
    bounded = parse("dp=N~2..8")  # planned at its max, as a program's run-time size is
    assert bounded.axis("dp") == Axis("dp", 8, symbol="N", min=2, max=8)
    both = parse("dp=N~4~2..")
    assert (both.axis("dp").size, both.axis("dp").min, both.axis("dp").max) == (4, 2, None)
    for mesh in (m, bounded, both, parse("a=M~3,b=M~3")):
        assert parse(mesh.spec()).axes == mesh.axes
    assert bounded.to_dict()["axes"][0] == {"name": "dp", "size": 8, "level": "device",
                                            "peered": False, "symbol": "N", "min": 2, "max": 8}


def test_binding_a_symbolic_mesh_gives_a_static_one_and_refuses_bad_values():
    m = parse("dp=N~4~2..8,tp=2")
    b = m.bind({"N": 3})
    assert not b.symbolic and b.shape == (3, 2) and b.name == "dp=3,tp=2"
    assert b == parse("dp=3,tp=2") and m.bind({"N": 4}) == parse("dp=4,tp=2")
    shared = parse("a=M~2,b=M~2").bind({"M": 3})
    assert shared.shape == (3, 3)
    assert parse("tp=2").bind() == parse("tp=2") and parse("tp=2").bind({}) == parse("tp=2")
    for sizes, match in [
        (None, r"mesh 'dp=N~4~2..8,tp=2': axis 'dp' has symbolic size N \(planned at 4\); the "
               r"per-device programs need its device count: bind it \(--param N=SIZE"),
        ({"N": 9}, r"axis 'dp': N=9 is outside its bounds 2..8"),
        ({"N": 1}, r"axis 'dp': N=1 is outside its bounds 2..8"),
        ({"N": 2.5}, r"axis 'dp': its size N needs an int, got 2.5 \(float\)"),
        ({"N": "4"}, r"axis 'dp': its size N needs an int, got '4' \(str\)"),
        ({"N": True}, r"axis 'dp': its size N needs an int, got True \(bool\)"),
        ({"N": 4, "K": 2}, r"has no size 'K'; its symbolic sizes: N"),
    ]:
        with pytest.raises(TargetError, match=match):
            m.bind(sizes)
    with pytest.raises(TargetError, match="has no size 'N'; it has no symbolic size"):
        parse("tp=2").bind({"N": 2})


def test_a_mesh_toml_file_may_give_a_symbolic_axis_size(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text('axes = [{name = "dp", size = "N", plan = 4, max = 8, level = "node"}, '
                 '{name = "tp", size = 2}]\n')
    m = load_toml(f)
    assert m.axis("dp") == Axis("dp", 4, "node", symbol="N", max=8) and m.shape == (4, 2)
    f.write_text('axes = {dp = "N~2..8", tp = 2}\n')
    assert load_toml(f).axis("dp") == Axis("dp", 8, symbol="N", min=2, max=8)
    f.write_text('axes = [{name = "dp", size = "N"}]\n')
    with pytest.raises(TargetError, match=r"m.toml.*axis 'dp': symbolic size N needs plan"):
        load_toml(f)
    f.write_text('axes = [{name = "dp", size = 2, plan = 4}]\n')
    with pytest.raises(TargetError, match=r"plan, min and max belong to a symbolic size"):
        load_toml(f)


def test_a_mesh_of_more_devices_than_the_limit_is_refused_naming_axes_and_count():
    """Plans are unrolled device by device: ``tp=1000000`` ran for most of an hour; it is a
    TargetError at once, as is a symbolic axis that may grow past the limit or is bound past it."""
    from apportion.sharding.mesh import MAX_DEVICES

    assert parse(f"tp={MAX_DEVICES}").devices == MAX_DEVICES
    with pytest.raises(TargetError, match=r"tp=1000000 makes 1000000 devices, more than the "
                                          rf"{MAX_DEVICES} a mesh may have"):
        parse("tp=1000000")
    with pytest.raises(TargetError, match=r"dp=64, tp=128 makes 8192 devices"):
        parse("dp=64,tp=128")
    with pytest.raises(TargetError, match=r"axis 'dp' may take up to 100000 devices \(N max\)"):
        parse("dp=N~4~1..100000")
    with pytest.raises(TargetError, match=r"dp=8 \(N planned at 8\), tp=1024 makes 8192"):
        parse("dp=N~8,tp=1024")
