"""Planning linear in the program's size: the indexes built once per program, tiling and plan,
and the placement that looks only at overlapping buffers, answer exactly as the scans they
replace did. Nothing here is timed (speed: ``apportion bench scale --check``)."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from apportion.errors import PlanningError, ProgramError
from apportion.ir.program import Program
from apportion.passes.auto_tile import with_counts
from apportion.passes.buffers import buffer_roles, group_roles
from apportion.passes.coarse_tile import GroupTiling, OpTile, TileMemo, coarse_tile, tile_group
from apportion.passes.layouts import layouts
from apportion.passes.pipeline import plan
from apportion.passes.placement import Request, best_fit, place_around
from apportion.plans.plan import LoopInfo
from apportion.target import spyre
from tests.backends.reference.test_loops_properties import tiled_programs
from tests.helpers import program

SLOW = [HealthCheck.too_slow, HealthCheck.filter_too_much]


@st.composite
def dags(draw) -> Program:
    """Pointwise ops over two inputs, each reading one or two earlier tensors (the same one
    twice, sometimes), so tensors have many readers, one, or none."""
    tensors = {"x": ([4, 8], "float16"), "y": ([4, 8], "float16")}
    made = ["x", "y"]
    ops = []
    for i in range(draw(st.integers(0, 14))):
        ins = draw(st.lists(st.sampled_from(made), min_size=1, max_size=2))
        fn = "add" if len(ins) == 2 else draw(st.sampled_from(["exp", "neg"]))
        ops.append({"name": f"op{i}", "op": fn, "out": f"t{i}[i,j]",
                    "ins": [f"{t}[i,j]" for t in ins]})
        made.append(f"t{i}")
    outputs = draw(st.lists(st.sampled_from(made), min_size=1, unique=True))
    return program(tensors, ops, outputs)


@settings(max_examples=200, deadline=None)
@given(dags())
def test_the_producer_and_consumer_indexes_answer_as_a_scan_of_every_op(p):
    for t in p.tensors:
        assert p.producer(t) == next((o for o in p.ops if o.out.tensor == t), None)
        assert p.consumers(t) == tuple(o for o in p.ops if any(a.tensor == t for a in o.ins))
    assert p.consumers("nowhere") == () and p.producer("nowhere") is None
    assert p.output_set == set(p.outputs)


@settings(max_examples=50, deadline=None)
@given(dags())
def test_a_program_with_its_indexes_built_equals_and_hashes_as_one_without(p):
    fresh = dataclasses.replace(p)
    p.consumers("x")
    p.producer("x")
    assert p == fresh and hash(p) == hash(fresh)


def tiling_or_reject(p: Program):
    """``coarse_tile(p)``, or the example rejected where the random program does not tile."""
    try:
        return coarse_tile(p)
    except (PlanningError, ProgramError):
        assume(False)


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
@given(tiled_programs())
def test_the_tiling_indexes_answer_as_a_scan_of_every_group_and_tile(case):
    p, _ = case
    tiling = tiling_or_reject(p)
    for o in p.ops:
        group = next((g for g in tiling.groups if o.name in g.ops), None)
        assert tiling.group_of(o.name) is group
        if group is not None:
            assert group.tile(o.name) is next(t for t in group.tiles if t.op == o.name)
            assert group.positions[o.name] == group.ops.index(o.name)


@st.composite
def nests(draw) -> GroupTiling:
    """A group of ops whose loop paths are random (sibling loops at each depth, ops at
    different depths), as the placement's extents must handle any nest."""
    n = draw(st.integers(1, 10))
    paths = [(0, *draw(st.lists(st.integers(0, 2), max_size=3))) for _ in range(n)]
    ops = tuple(f"o{i}" for i in range(n))
    tiles = tuple(OpTile(name, LoopInfo(path, (1,) * len(path), (("i",),) * len(path)),
                         (("i", 1),)) for name, path in zip(ops, paths, strict=True))
    return GroupTiling(0, (0,), ops, (1,), (("i",),), tiles)


@settings(max_examples=300, deadline=None)
@given(nests(), st.data())
def test_a_loops_extent_is_the_first_and_last_op_whose_path_agrees(group, data):
    paths = [group.tile(n).loop.group for n in group.ops]
    path = data.draw(st.sampled_from(paths))
    length = data.draw(st.integers(0, 5))
    agree = [i for i, q in enumerate(paths) if q[:length] == path[:length]]
    assert group.extent(path, length) == (min(agree), max(agree))


@st.composite
def placements(draw) -> tuple[list[Request], dict[str, int], list[Request], int | None]:
    """Buffers already placed (with offsets) and new requests, lifetimes overlapping at
    random, sizes in 128-byte units."""
    def requests(prefix: str, k: int) -> list[Request]:
        out = []
        for i in range(k):
            start = draw(st.integers(0, 30))
            end = start + draw(st.integers(0, 8))
            out.append(Request(f"{prefix}{i}", start, end, 128 * draw(st.integers(1, 6))))
        return out

    placed = requests("p", draw(st.integers(0, 12)))
    offsets = {r.tensor: 128 * draw(st.integers(0, 12)) for r in placed
               if draw(st.integers(0, 5))}  # now and then a placed buffer has no offset
    capacity = draw(st.sampled_from([None, 512, 1024, 2048]))
    return placed, offsets, requests("r", draw(st.integers(0, 16))), capacity


def place_around_by_scan(placed: list[Request], offsets: dict[str, int],
                         requests: list[Request], capacity: int | None) -> dict[str, int]:
    """``place_around`` as it was: every request scans every buffer placed so far (the same
    choice of gap, ``best_fit``, over a different search for the overlapping buffers)."""
    live = [(r.start, r.end, offsets[r.tensor], r.nbytes) for r in placed
            if r.tensor in offsets]
    out: dict[str, int] = {}
    for r in sorted(requests, key=lambda q: q.start):
        busy = [(off, n) for s, e, off, n in live if not (e < r.start or s > r.end)]
        at = best_fit(busy, r.nbytes, capacity)
        if at is None:
            continue
        out[r.tensor] = at
        live.append((r.start, r.end, out[r.tensor], r.nbytes))
    return out


@settings(max_examples=400, deadline=None)
@given(placements())
def test_placing_around_overlapping_buffers_only_places_as_scanning_every_buffer(case):
    placed, offsets, requests, capacity = case
    assert place_around(placed, offsets, requests, capacity) == \
        place_around_by_scan(placed, offsets, requests, capacity)


def chain(n: int) -> Program:
    ops = [{"name": f"o{i}", "op": ("exp", "neg")[i % 2], "out": f"t{i + 1}[i,j]",
            "ins": [f"t{i}[i,j]"]} for i in range(n)]
    return program({"t0": ([64, 256], "float16")}, ops, [f"t{n}"])


def test_a_long_chain_keeps_every_intermediate_on_chip_at_two_alternating_offsets():
    # each result lives from its producer to the next op: two places suffice, whatever the
    # length (the whole-program placement of a long chain was what went quadratic)
    result = plan(chain(300), spyre(cores=32))
    kept = [b for b in result.buffers if b.space == "lx"]
    assert [b.tensor for b in kept] == [f"t{i}" for i in range(1, 300)]
    assert {b.offset for b in kept[0::2]} != {b.offset for b in kept[1::2]}
    assert len({b.offset for b in kept}) == 2


def test_the_plans_op_and_buffer_indexes_answer_as_a_scan():
    result = plan(chain(40), spyre(cores=8))
    for o in result.ops:
        assert result.op(o.name) is o
    for t in {b.tensor for b in result.buffers}:
        assert result.buffers_of(t) == tuple(b for b in result.buffers if b.tensor == t)
    assert result.buffers_of("nowhere") == ()
    assert math.isclose(sum(result.op(o.name).predicted_time_us for o in result.ops),
                        sum(o.predicted_time_us for o in result.ops))


def test_a_tiling_with_its_indexes_built_equals_and_hashes_as_one_without():
    p = program({"t0": ([64, 256], "float16")},
                [{"name": "a", "op": "exp", "out": "t1[i,j]", "ins": ["t0[i,j]"]},
                 {"name": "b", "op": "neg", "out": "t2[i,j]", "ins": ["t1[i,j]"]}], ["t2"],
                tiling=[{"ops": ["a", "b"], "loops": [{"count": 2, "dims": ["i"]}]}])
    built, fresh = coarse_tile(p), coarse_tile(p)
    assert built.group_of("b") is built.groups[0] and built.tile("b") is built.groups[0].tiles[1]
    assert built.groups[0].extent(built.tile("a").loop.group, 1) == (0, 1)
    assert built == fresh and hash(built) == hash(fresh)


def outcome(fn):
    """``fn()``'s value, or its error as (type, message)."""
    try:
        return fn()
    except (PlanningError, ProgramError) as e:
        return type(e), str(e)


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
@given(tiled_programs(), st.lists(st.lists(st.integers(1, 9), min_size=2, max_size=2),
                                  min_size=1, max_size=6))
def test_trials_of_other_loop_counts_tile_and_fail_as_a_fresh_coarse_tile(case, trials):
    # auto-tiling's trials: the same ops, other counts; a memo shared across them must give
    # every trial the tiling, or the error, that tiling it afresh gives
    p, _ = case
    memo = TileMemo()
    lay = layouts(p, spyre())
    for counts in trials:
        g = p.tiling[0]
        try:
            trial = with_counts(p, 0, tuple(counts[:len(g.loops)]))
        except ProgramError:
            continue
        assert trial == dataclasses.replace(p, tiling=trial.tiling)
        fresh = outcome(lambda t=trial: coarse_tile(dataclasses.replace(t), lay.ops, 64))
        assert outcome(lambda t=trial: coarse_tile(t, lay.ops, 64, memo)) == fresh
        if not isinstance(fresh, tuple):  # its one group alone, as a trial after the first
            assert tile_group(trial, 0, lay.ops, 64, memo) == fresh.groups[0]


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
@given(tiled_programs())
def test_a_groups_roles_are_those_buffer_roles_gives_its_tensors(case):
    p, _ = case
    tiling = tiling_or_reject(p)
    everything = buffer_roles(p, tiling)
    for group in tiling.groups:
        mine = group_roles(p, group)
        assert mine == {t: r for t, r in everything.items() if r.group == group.index}


def test_a_program_with_other_counts_keeps_its_indexes_and_equals_a_validated_one():
    p = program({"t0": ([64, 256], "float16")},
                [{"name": "a", "op": "exp", "out": "t1[i,j]", "ins": ["t0[i,j]"]},
                 {"name": "b", "op": "neg", "out": "t2[i,j]", "ins": ["t1[i,j]"]}], ["t2"],
                tiling=[{"ops": ["a", "b"], "loops": [{"count": 2, "dims": ["i"]}]}])
    p.consumers("t1")
    q = with_counts(p, 0, (4,))
    assert q.tiling[0].loops[0].count == 4 and q.consumer_map is p.consumer_map
    assert q == dataclasses.replace(p, tiling=q.tiling) and q != p


def test_planning_puts_back_the_callers_collector_thresholds_also_when_threads_overlap():
    import gc
    import threading

    saved = gc.get_threshold()
    seen: list[tuple[int, ...]] = []
    try:
        gc.set_threshold(1234, 7, 9)
        p = program({"x": ([64, 256], "float16")}, [
            {"name": "a", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"]}], ["y"])
        plan(p, spyre(cores=8), debug=lambda *_: seen.append(gc.get_threshold()))
        assert seen and all(t[0] > 1234 for t in seen)  # raised while planning
        assert gc.get_threshold() == (1234, 7, 9)
        threads = [threading.Thread(target=plan, args=(p, spyre(cores=8))) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert gc.get_threshold() == (1234, 7, 9)
        gc.set_threshold(0)  # collection turned off by the caller stays off
        seen.clear()
        plan(p, spyre(cores=8), debug=lambda *_: seen.append(gc.get_threshold()))
        assert seen and all(t[0] == 0 for t in seen) and gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*saved)

