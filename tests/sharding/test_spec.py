"""Shardings: the cores' cuts (and torch.chunk's, for DTensor), nested axes, checks naming
tensor/dim/axis, annotations from the builder and from program files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import ProgramError, TargetError
from apportion.sharding.mesh import parse
from apportion.sharding.spec import (
    Sharding,
    annotations_of,
    candidates,
    check_annotations,
    chunk,
    chunk_agrees,
    dim_block,
    dumps,
    load,
    loads,
    shard,
    torch_chunk,
)


@given(st.integers(1, 40), st.integers(1, 9))
def test_torch_chunk_is_torch_s_and_agrees_with_our_cut_exactly_where_said(n, parts):
    torch = pytest.importorskip("torch")
    ours = [hi - lo for lo, hi in torch_chunk(n, parts)]
    theirs = [len(c) for c in torch.arange(n).chunk(parts)]
    assert ours[:len(theirs)] == theirs and not any(ours[len(theirs):])
    assert chunk_agrees(n, ("a",), {"a": parts}) == (chunk(n, parts) == torch_chunk(n, parts))


@given(st.integers(1, 40), st.sampled_from([("a",), ("b",), ("a", "b"), ("b", "a")]))
def test_nested_cuts_tile_the_dim_outer_axis_first(n, axes):
    sizes = {"a": 2, "b": 3}
    blocks = sorted(dim_block(n, axes, {"a": i, "b": j}, sizes)
                    for i in range(2) for j in range(3))
    unique = sorted(set(blocks))
    assert unique[0][0] == 0 and unique[-1][1] == n
    assert all(p[1] == q[0] for p, q in zip(unique, unique[1:], strict=False))
    outer = dim_block(n, axes, {"a": 1, "b": 0}, sizes)  # the first shard of a's second half
    if axes[0] == "a":
        assert outer[0] == chunk(n, 2)[1][0]


def test_shards_are_exact_and_uneven():
    s = Sharding((("dp",), ("tp",)))
    sizes = {"dp": 2, "tp": 3}
    assert s.block((5, 7), {"dp": 1, "tp": 2}, sizes) == ((3, 5), (5, 7))  # 7 as 3, 2, 2
    assert s.largest_shape((5, 7), sizes) == (3, 3)
    assert s.local_bytes((5, 7), "float16", sizes) == 3 * 3 * 2


@pytest.mark.parametrize(("spec", "match"), [
    ((("dp", "dp"), ()), r"dim 0 is split twice on mesh axis 'dp'"),
    ((("dp",), ("dp",)), r"mesh axis 'dp' splits both dim 0 and dim 1"),
])
def test_an_axis_splits_one_dim_once(spec, match):
    with pytest.raises(ProgramError, match=match):
        Sharding(spec)


def test_partial_needs_a_combinable_reducer():
    with pytest.raises(ProgramError, match="both splits dim 0 and is partial"):
        Sharding((("a",),), ("a",), "sum")
    with pytest.raises(ProgramError, match="needs its reducer"):
        Sharding(((),), ("a",))
    with pytest.raises(ProgramError, match="cannot wait on a 'mean' reduction"):
        Sharding(((),), ("a",), "mean")
    s = Sharding(((), ("b",)), ("a",), "max")
    assert Sharding.from_json(s.to_json()) == s and str(s) == "[-, b] partial max over a"


def test_check_names_the_tensor_the_dim_and_the_missing_axis():
    mesh = parse("dp=2,tp=2")
    with pytest.raises(ProgramError, match=r"tensor 'x' dim 1: mesh axis 'dq' is not an axis "
                                           r"of mesh 'dp=2,tp=2' \(axes: dp, tp\)"):
        Sharding(((), ("dq",))).check(mesh, (4, 4), "x")
    with pytest.raises(ProgramError, match=r"tensor 'x' dim 0 of size 3 split over dp=2 x tp=2 "
                                           "leaves a device an empty shard"):
        Sharding((("dp", "tp"), ())).check(mesh, (3, 4), "x")
    with pytest.raises(ProgramError, match="has 1 dims, the tensor has rank 2"):
        Sharding(((),)).check(mesh, (3, 4), "x")


def test_parse_takes_partition_spec_like_entries():
    assert Sharding.parse(("dp", None, ["a", "b"])).dims == (("dp",), (), ("a", "b"))
    with pytest.raises(ProgramError, match="one entry per tensor dim"):
        Sharding.parse("dp")
    with pytest.raises(ProgramError, match="dim 1: expected an axis name"):
        Sharding.parse(("dp", 3))


def test_candidates_are_every_valid_sharding_replicated_first():
    mesh = parse("a=2,b=2")
    got = candidates((4, 3), mesh)
    assert got[0] == Sharding.replicated(2)
    # a and b each on dim 0, dim 1 or none: 9, less both on dim 1 (3 over 4 leaves one empty)
    assert len(got) == len(set(got)) == 8
    for s in got:
        s.check(mesh, (4, 3), "t")


def test_the_builder_records_annotations_and_checks_them_at_once():
    mesh = parse("dp=2")
    with ap.program("p") as p:
        x = shard(p.input("x", [8, 4], "float32"), mesh, ("dp", None))
        y = ap.exp(x)
        p.output(y)
        with pytest.raises(ProgramError, match=r"tensor 'exp0_out' dim 1: mesh axis 'tp' is "
                                               "not an axis"):
            shard(y, mesh, (None, "tp"))
        with pytest.raises(TargetError, match="needs a Mesh"):
            shard(y, "dp=2", (None, None))
    assert annotations_of(p) == {"x": Sharding((("dp",), ()))}
    assert annotations_of(p.program) == {}
    assert ap.shard is shard


def test_a_program_file_carries_shardings_that_ap_load_ignores(tmp_path):
    doc = json.loads(Path("examples/megatron.json").read_text())
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    program, ann = load(f)
    assert ann == {"w1": Sharding(((), ("tp",))), "w2": Sharding((("tp",), ()))}
    assert ap.load(f) == program
    again, ann2 = loads(dumps(program, ann))
    assert again == program and ann2 == ann
    check_annotations(program, ann, parse("tp=2"))
    with pytest.raises(ProgramError, match=r"tensor 'w1' dim 1: mesh axis 'tp' is not"):
        check_annotations(program, ann, parse("dp=2"))
    doc["shardings"] = {"nope": [[], []]}
    f.write_text(json.dumps(doc))
    with pytest.raises(ProgramError, match="tensor 'nope' is not a tensor of program"):
        load(f)
    doc["shardings"] = {"x": [["tp", "tp"], []]}
    f.write_text(json.dumps(doc))
    with pytest.raises(ProgramError, match=r"tensor 'x'.*dim 0 is split twice on mesh axis 'tp'"):
        load(f)
