"""Tile sizes kept symbolic: a tiled dim whose size is a run-time symbol ``S`` gets the tile size
``S/4``, a dim tiled by a symbolic count ``T`` the size ``2048/T`` (``LoopInfo.tile_sizes``;
the plan's iteration space has the size at the planning values). Each plan runs at several
sizes against the unplanned program.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import apportion as ap
from apportion.errors import ExecutionError
from apportion.frontend.json_format import dumps, loads
from apportion.plans.serialize import from_json, to_json
from apportion.target import spyre
from tests.helpers import program


def rows(loops, shape=("S", 1024), symbols=None):
    """h = x + b, y = exp(h) over ``shape`` float16, one group with ``loops``."""
    ops = [{"name": "add", "op": "add", "out": "h[m,n]", "ins": ["x[m,n]", "b[m,n]"]},
           {"name": "e", "op": "exp", "out": "y[m,n]", "ins": ["h[m,n]"]}]
    doc = {"name": "dyn",
           "symbols": {"S": {"min": 256, "max": 2048}} if symbols is None else symbols,
           "tensors": {"x": {"shape": list(shape), "dtype": "float16"},
                       "b": {"shape": list(shape), "dtype": "float16"}},
           "inputs": ["x", "b"], "outputs": ["y"], "ops": ops,
           "tiling": [{"ops": ["add", "e"], "loops": loops}]}
    return loads(json.dumps(doc))


def runs(p: ap.PlannedProgram, **params: int) -> None:
    checks = p.check(params=params)
    assert all(c.ok for c in checks), (params, checks)


def test_a_run_time_dim_tiled_by_four_has_the_tile_size_s_over_4_and_runs_at_every_size():
    p = ap.plan(rows([{"count": 4, "dims": ["m"]}]), spyre(cores=32))
    loop = p.plan.op("add").loop
    assert dict(loop.tile_sizes) == {"m": "S/4"}
    assert p.plan.op("add").sizes == {"m": 512, "n": 1024}  # at the planning size 2048
    assert "h" in p.groups[0].lx_tensors  # the tile planned at 2048 bounds every smaller one
    for s in (2048, 1024, 512, 260):
        runs(p, S=s)


def test_a_symbolic_count_keeps_its_tile_size_in_the_count():
    p = ap.plan(rows([{"count": "T", "dims": ["m"], "min": 4, "max": 64}], shape=(2048, 1024),
                     symbols={}), spyre(cores=32))
    assert dict(p.plan.op("e").loop.tile_sizes) == {"m": "2048/T"}
    for t in (4, 16, 64):
        runs(p, T=t)


def test_a_symbolic_count_over_a_run_time_dim_keeps_both():
    p = ap.plan(rows([{"count": 2, "dims": ["m"]}, {"count": "T", "dims": ["m"], "max": 8}]),
                spyre(cores=8))
    assert dict(p.plan.op("add").loop.tile_sizes) == {"m": "S/(2*T)"}
    runs(p, S=512, T=4)
    runs(p, S=2048, T=1)


def test_an_untiled_run_time_dim_of_a_tiled_op_keeps_its_symbol():
    p = ap.plan(rows([{"count": 8, "dims": ["n"]}]), spyre(cores=32))
    assert dict(p.plan.op("add").loop.tile_sizes) == {"m": "S"}
    runs(p, S=300)


def test_a_run_time_stick_dim_tiled_needs_whole_sticks_at_the_run_size():
    p = ap.plan(rows([{"count": 4, "dims": ["n"]}], shape=(64, "S"),
                     symbols={"S": {"min": 256, "max": 4096}}), spyre(cores=8))
    assert dict(p.plan.op("add").loop.tile_sizes) == {"n": "S/4"}
    runs(p, S=1280)
    with pytest.raises(ExecutionError, match=r"op 'add': a tile of 250 elements of dim 'n' is "
                                             r"not whole planning units of 64"):
        p.run(params={"S": 1000})


def test_a_run_size_the_count_does_not_divide_is_refused_naming_op_dim_and_count():
    p = ap.plan(rows([{"count": 4, "dims": ["m"]}]), spyre(cores=32))
    with pytest.raises(ExecutionError, match=r"op 'add': loop level 0 count 4 does not divide "
                                             r"dim 'm' of size 258"):
        p.run(params={"S": 258})


def test_a_planning_size_the_count_does_not_divide_is_refused_when_planning():
    with pytest.raises(ap.PlanningError, match=r"count 3 does not divide dim 'm' of op 'add' "
                                               r"\(size 2048\)"):
        ap.plan(rows([{"count": 3, "dims": ["m"]}]), spyre(cores=32))


def test_a_matmul_over_a_run_time_m_tiled_over_m_and_k_accumulates_on_chip():
    doc = {"name": "dynmm", "symbols": {"M": {"min": 64, "max": 512}},
           "tensors": {"x": {"shape": ["M", 1024], "dtype": "float16"},
                       "w": {"shape": [1024, 256], "dtype": "float16"},
                       "b": {"shape": ["M", 256], "dtype": "float16"}},
           "inputs": ["x", "w", "b"], "outputs": ["y"],
           "ops": [{"name": "mm", "op": "matmul", "out": "h[m,n]", "ins": ["x[m,k]", "w[k,n]"]},
                   {"name": "add", "op": "add", "out": "y[m,n]", "ins": ["h[m,n]", "b[m,n]"]}],
           "tiling": [{"ops": ["mm", "add"], "loops": [{"count": 2, "dims": ["m"]},
                                                       {"count": 4, "dims": ["k"]}]}]}
    p = ap.plan(loads(json.dumps(doc)), spyre(cores=16))
    assert dict(p.plan.op("mm").loop.tile_sizes) == {"m": "M/2"}
    assert p.plan.buffer("h", "accumulator").space == "lx"
    for m in (512, 128, 64):
        runs(p, M=m)


def test_tile_sizes_are_in_the_plan_json_and_round_trip():
    p = ap.plan(rows([{"count": 4, "dims": ["m"]}]), spyre(cores=32))
    doc = json.loads(p.to_json())
    assert doc["ops"][0]["loop"]["tile_sizes"] == {"m": "S/4"}
    assert from_json(to_json(p.plan)) == p.plan
    static = ap.plan(rows([{"count": 4, "dims": ["m"]}], shape=(2048, 1024), symbols={}),
                     spyre(cores=32))
    assert "tile_sizes" not in json.loads(static.to_json())["ops"][0]["loop"]


def test_the_program_with_run_time_sizes_and_tiling_round_trips_its_json():
    prog = rows([{"count": 4, "dims": ["m"]}])
    assert loads(dumps(prog)) == prog


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=25, deadline=None)
@given(count=st.sampled_from([1, 2, 4, 8]), rows_=st.integers(1, 32), cores=st.integers(1, 8),
       fn=st.sampled_from(["exp", "neg", "relu"]))
def test_any_run_size_the_count_divides_runs_exactly(count, rows_, cores, fn):
    ops = [{"name": "add", "op": "add", "out": "h[m,n]", "ins": ["x[m,n]", "b[m,n]"]},
           {"name": "e", "op": fn, "out": "y[m,n]", "ins": ["h[m,n]"]}]
    prog = program({"x": (["S", 128], "float32"), "b": (["S", 128], "float32")}, ops, ["y"],
                   symbols={"S": {"min": 8, "max": 256}},
                   tiling=[{"ops": ["add", "e"], "loops": [{"count": count, "dims": ["m"]}]}])
    p = ap.plan(prog, spyre(cores=cores))
    runs(p, S=max(8, rows_ * count) // count * count)


def test_the_torch_executor_runs_symbolic_tiles_too():
    pytest.importorskip("torch")
    p = ap.plan(rows([{"count": 4, "dims": ["m"]}]), spyre(cores=8))
    for s in (2048, 260):
        checks = p.check(params={"S": s}, backend="torch")
        assert all(c.ok for c in checks), checks
