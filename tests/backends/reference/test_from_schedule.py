"""The reference backend consumes only the schedule (``schedule.lower``): what it adds to the
schedule, runs from a schedule value, and refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import apportion as ap
import apportion.backends.reference.execute as execute
import apportion.backends.reference.loops as loops
from apportion.backends.reference.execute import run_sliced_schedule
from apportion.backends.reference.loops import run_schedule
from apportion.errors import ExecutionError, PlanningError, ProgramError
from apportion.frontend.json_format import load
from apportion.frontend.random_programs import Seeded, random_case
from apportion.passes.pipeline import plan
from apportion.runtime import compare, random_inputs, run_unplanned
from apportion.schedule.lower import lower
from apportion.schedule.values import Copy, Host, Launch, Loop, WorkerAxis, outer_tile
from apportion.target import spyre
from tests.helpers import program, run_planned, run_sliced
from tests.passes.test_coarse_tile import fused

ROOT = Path(__file__).parents[3]


def fallback_in_loop():
    """A cumsum (a host step) in a loop group, its result read in the loop and after it."""
    t = {"x": ([64, 256], "float32")}
    ops = [{"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["x[m,n]"]},
           {"name": "c", "op": "cumsum", "out": "z[m,n]", "ins": ["y[m,n]"]},
           {"name": "f", "op": "neg", "out": "w[m,n]", "ins": ["z[m,n]"]}]
    return program(t, ops, ["w", "z"], tiling=[{"ops": ["e", "c", "f"], "count": 4,
                                                "dims": ["m"]}])


def matches_unplanned(p, got, xs) -> bool:
    return all(c.ok for c in compare(run_unplanned(p, xs), got, p))


def test_outer_tile_is_the_tile_of_the_outer_loops_with_deeper_dims_whole():
    # m cut in 4 by level 0 (tiles of 4), then n in 2 by level 1 (tiles of 4)
    tile, steps = ((0, 4), (0, 4)), ((4, 0), (0, 4))
    assert outer_tile(tile, steps, ((0, 16), (0, 8)), 0) == (((0, 16), (0, 8)), ())
    assert outer_tile(tile, steps, ((0, 16), (0, 8)), 1) == (((0, 4), (0, 8)), ((4, 0),))
    assert outer_tile(tile, steps, ((0, 16), (0, 8)), 2) == (tile, steps)


def test_a_host_step_in_a_loop_carries_its_tile_and_is_followed_by_its_copy():
    p = fallback_in_loop()
    s = lower(p, plan(p, spyre(cores=8)), "spyre")
    loop = s.steps[0]
    assert isinstance(loop, Loop)
    host, copy = loop.body[1], loop.body[2]
    assert isinstance(host, Host) and isinstance(copy, Copy)
    assert host.tile_at((3,)) == ((48, 64), (0, 256))
    assert (copy.op, copy.tensor, copy.at((3,))) == ("c", "z", ((48, 64), (0, 256)))


@pytest.mark.parametrize("threads", [None, 3])
def test_a_fallback_in_a_loop_group_runs_tile_by_tile_and_is_copied_out(threads):
    p = fallback_in_loop()
    pl = plan(p, spyre(cores=8))
    assert pl.buffer("z", "tile") is not None and pl.buffer("z", "full") is not None
    xs = random_inputs(p)
    assert matches_unplanned(p, run_planned(p, pl, xs, threads=threads), xs)


def test_a_schedule_value_runs_as_its_plan_does():
    p = fused(loops=[{"count": "T", "dims": ["m"]}, {"count": 2, "dims": ["n"]}])
    pl = plan(p, spyre())
    xs = random_inputs(p)
    s = lower(p, pl, "spyre", params={"T": 4})
    got = run_schedule(s, xs)
    assert matches_unplanned(p, got, xs)
    want = run_planned(p, pl, xs, params={"T": 4})
    assert sorted(got) == sorted(want)
    assert all((got[k] == want[k]).all() for k in got)


def test_the_sliced_run_walks_the_schedule_of_an_untiled_plan():
    p = load(ROOT / "examples/mlp.json")
    pl = plan(p, spyre(cores=24))
    xs = random_inputs(p)
    s = lower(p, pl, "spyre")
    assert not any(isinstance(step, Loop) for step in s.steps)
    got = run_sliced_schedule(s, xs, threads=2)
    assert matches_unplanned(p, got, xs)
    assert sorted(got) == sorted(t.name for t in p.tensors)  # every tensor, whole


def test_the_sliced_run_refuses_a_loop_nest_naming_its_op_and_the_entry_that_runs_it():
    p = load(ROOT / "examples/fused.json")
    pl = plan(p, spyre())
    with pytest.raises(ExecutionError, match=r"op '\w+' sits in a loop nest: run the schedule "
                                             r"with execute"):
        run_sliced(p, pl, random_inputs(p))


def _with_first_launch(s, change):
    """``s`` with its first launch (at any depth) replaced by ``change(launch)``."""
    def go(steps):
        out, done = [], False
        for step in steps:
            if not done and isinstance(step, Launch):
                out.append(change(step))
                done = True
            elif not done and isinstance(step, Loop):
                body, done = go(step.body)
                out.append(dataclasses.replace(step, body=body))
            else:
                out.append(step)
        return tuple(out), done
    return dataclasses.replace(s, steps=go(s.steps)[0])


@pytest.mark.parametrize("example", ["mlp", "fused"])
def test_a_launch_over_the_devices_of_a_mesh_is_refused_naming_op_and_axis(example):
    p = load(ROOT / f"examples/{example}.json")
    s = lower(p, plan(p, spyre(cores=8)), "spyre")

    def on_devices(launch):
        axes = tuple(WorkerAxis(a.name, a.size, "device") for a in launch.axes)
        return dataclasses.replace(launch, axes=axes)

    bad = _with_first_launch(s, on_devices)
    first = next(step for step, _ in bad.walk() if isinstance(step, Launch))
    run = run_schedule if example == "fused" else run_sliced_schedule
    with pytest.raises(ExecutionError, match=rf"launch of op '{first.op}' over \w+:\d+ "
                                             r"\(device\).*one device's schedule"):
        run(bad, random_inputs(p))


@dataclasses.dataclass(frozen=True)
class Barrier:
    """A step kind the reference backend does not know."""

    op: str

    def __str__(self) -> str:
        return f"barrier after {self.op}"


def test_a_step_the_executor_cannot_run_is_refused_naming_it():
    p = load(ROOT / "examples/fused.json")
    s = lower(p, plan(p, spyre()), "spyre")
    loop = s.steps[0]
    assert isinstance(loop, Loop)
    bad = dataclasses.replace(s, steps=(dataclasses.replace(
        loop, body=(*loop.body, Barrier("x"))), *s.steps[1:]))
    with pytest.raises(ExecutionError, match="cannot run schedule step Barrier: barrier after x"):
        run_schedule(bad, random_inputs(p))
    untiled = load(ROOT / "examples/mlp.json")
    s = lower(untiled, plan(untiled, spyre()), "spyre")
    with pytest.raises(ExecutionError, match="cannot run schedule step Barrier outside a loop "
                                             "nest: barrier after y"):
        run_sliced_schedule(dataclasses.replace(s, steps=(*s.steps, Barrier("y"))),
                            random_inputs(untiled))


def test_the_executor_derives_no_box_of_its_own():
    """The tiles, boxes and counts come from the schedule: the modules hold none of the
    plan-walking helpers."""
    for module in (loops, execute):
        for name in ("core_boxes", "tile_box", "core_slices", "resolve_counts", "loop_tree"):
            assert not hasattr(module, name), (module.__name__, name)


@settings(derandomize=True, deadline=None, database=None, max_examples=25,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_random_loop_nests_run_from_their_schedule_match_unplanned_on_any_thread_count(seed):
    """Nested loop groups (ops at two depths, fallbacks inside, several outputs, dead ops):
    the schedule's walk matches the unplanned run, with the same numbers on 1 and 3 threads."""
    c = random_case(Seeded(seed), seed, family="nested")
    try:
        planned = ap.plan(c.program, c.target, c.strategy)
    except (PlanningError, ProgramError):
        assume(False)
    p = planned.program
    xs = random_inputs(p, seed=5)
    one = run_planned(p, planned.plan, xs)
    assert matches_unplanned(p, one, xs)
    three = run_planned(p, planned.plan, xs, threads=3)
    assert sorted(one) == sorted(three)
    for name, a in one.items():
        np.testing.assert_array_equal(a, three[name])
