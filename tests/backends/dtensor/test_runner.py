"""Mesh schedules run on torch.distributed: two gloo processes on loopback, DTensors placed
and redistributed as the schedule's layouts say, results equal to the single-device reference;
a failing rank ends the run with a clear error naming the rank at fault (not a peer that saw
the broken connection), never a hang; the run's temporary folder never outlives it."""

from __future__ import annotations

import multiprocessing
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from apportion.errors import ExecutionError, TargetError
from apportion.frontend.json_format import from_dict
from apportion.runtime.check import expect
from apportion.runtime.reference import compare, random_inputs, run_unplanned
from apportion.sharding.lower import lower_plan
from apportion.sharding.mesh import parse
from apportion.sharding.propagate import propagate
from apportion.sharding.spec import Sharding
from tests.sharding.programs import attention, hard_inputs, reduction

pytest.importorskip("torch")
runner = pytest.importorskip("apportion.backends.dtensor.runner")
launch = pytest.importorskip("apportion.backends.dtensor.launch")

pytestmark = pytest.mark.distributed

S = Sharding
REP = S(((), ()))
TP = parse("tp=2")


def mlp():
    return from_dict({
        "name": "mlp", "inputs": ["x", "w1", "w2"], "outputs": ["y"],
        "tensors": {"x": {"shape": [16, 32], "dtype": "float32"},
                    "w1": {"shape": [32, 64], "dtype": "float32"},
                    "w2": {"shape": [64, 32], "dtype": "float32"}},
        "ops": [{"name": "up", "op": "matmul", "out": "h[t,f]", "ins": ["x[t,n]", "w1[n,f]"]},
                {"name": "act", "op": "gelu", "out": "a[t,f]", "ins": ["h[t,f]"]},
                {"name": "down", "op": "matmul", "out": "y[t,n]", "ins": ["a[t,f]",
                                                                          "w2[f,n]"]}]})


def matmul():
    return from_dict({
        "name": "kmm", "inputs": ["x", "w"], "outputs": ["y"],
        "tensors": {"x": {"shape": [12, 32], "dtype": "float32"},
                    "w": {"shape": [32, 10], "dtype": "float32"}},
        "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}]})


#: pointwise kinds torch runs on the DTensors by the registry's formula (with attributes)
POINTWISE = [("exp", "x"), ("tanh", "x"), ("sigmoid", "x"), ("silu", "x"), ("gelu", "x"),
             ("softplus", "x"), ("sqrt", "p"), ("rsqrt", "p"), ("log", "p"),
             ("reciprocal", "p"), ("sin", "x"), ("cos", "x"), ("erf", "x"), ("sign", "x"),
             ("square", "x"), ("neg", "x"), ("abs", "x"), ("relu", "x"),
             ("clamp", "x", {"min": -0.5, "max": 0.5}), ("add", "x", "y"), ("sub", "x", "y"),
             ("mul", "x", "y"), ("div", "x", "p"), ("max", "x", "y"), ("min", "x", "y"),
             ("pow", "p", "y")]


def leading_slice():
    """Ops reading the leading part of longer inputs (``dims`` declared below the axes): a
    pointwise op over x's first 6 of 12 rows beside z read whole, and a matmul over w's first 8
    of 12 rows. Torch on the DTensors would compute over the whole axes."""
    return from_dict({
        "name": "lead", "inputs": ["x", "z", "a", "w"], "outputs": ["y", "p"],
        "tensors": {"x": {"shape": [12, 8], "dtype": "float32"},
                    "z": {"shape": [6, 8], "dtype": "float32"},
                    "a": {"shape": [4, 8], "dtype": "float32"},
                    "w": {"shape": [12, 6], "dtype": "float32"}},
        "ops": [{"name": "sl", "op": "add", "out": "y[i,j]", "ins": ["x[i,j]", "z[i,j]"],
                 "dims": {"i": 6}},
                {"name": "mk", "op": "matmul", "out": "p[m,n]", "ins": ["a[m,k]", "w[k,n]"],
                 "dims": {"k": 8}}]})


def pointwise():
    """Every float pointwise kind of ``POINTWISE`` on x, y and p (> 0), one output each."""
    ops = [{"name": f"k{i}", "op": fn, "out": f"o{i}[i,j]",
            "ins": [f"{a}[i,j]" for a in rest if isinstance(a, str)],
            **next((a for a in rest if isinstance(a, dict)), {})}
           for i, (fn, *rest) in enumerate(POINTWISE)]
    ops.insert(0, {"name": "pos", "op": "add", "out": "p[i,j]", "ins": ["a[i,j]", "one[i,j]"]})
    ops.insert(0, {"name": "abs0", "op": "abs", "out": "a[i,j]", "ins": ["x[i,j]"]})
    return from_dict({
        "name": "pointwise", "inputs": ["x", "y", "one"],
        "outputs": [f"o{i}" for i in range(len(POINTWISE))],
        "tensors": {n: {"shape": [6, 8], "dtype": "float32"} for n in ("x", "y", "one")},
        "ops": ops})


COLS = S(((), ("tp",)))
PLANS = {
    "megatron": lambda: propagate(mlp(), TP, annotations={
        "x": REP, "w1": S(((), ("tp",))), "w2": S((("tp",), ())), "y": REP}),
    "data-parallel": lambda: propagate(mlp(), TP, annotations={"x": S((("tp",), ()))}),
    "k-split all-reduce": lambda: propagate(matmul(), TP, annotations={
        "x": S(((), ("tp",))), "w": S((("tp",), ())), "y": REP}),
    "k-split reduce-scatter": lambda: propagate(matmul(), TP, annotations={
        "x": S(((), ("tp",))), "w": S((("tp",), ())), "y": S((("tp",), ()))}),
    # a mean and an argmax with the reduced dim split: 9 elements, 5 + 4
    "mean split": lambda: propagate(reduction("mean", (6, 9)), TP, annotations={"x": COLS}),
    "argmax all-reduce": lambda: propagate(reduction("argmax", (6, 9)), TP,
                                           annotations={"x": COLS}),
    "argmax reduce-scatter": lambda: propagate(reduction("argmax", (6, 9), "float16"), TP,
                                               annotations={"x": COLS, "r": S((("tp",),))}),
    # heads split over the devices and written back merged, o[t, 64*h+e]
    "merged heads": lambda: propagate(attention(), TP, annotations={
        "wq": COLS, "wk": COLS, "wv": COLS, "wo": S((("tp",), ())), "x": REP, "y": REP}),
    "pointwise kinds": lambda: propagate(pointwise(), TP, annotations={
        "x": S((("tp",), ())), "y": S((("tp",), ())), "one": S((("tp",), ()))}),
    # leading slices: cut along the read whole dim (native on DTensors were it whole), and
    # along the sliced one (x's rows 6..12 are nobody's read; w's k gathered)
    "leading slice by columns": lambda: propagate(leading_slice(), TP, annotations={
        "x": COLS, "z": COLS, "a": REP, "w": COLS}),
    "leading slice by rows": lambda: propagate(leading_slice(), TP, annotations={
        "x": S((("tp",), ())), "z": S((("tp",), ())), "a": REP, "w": S((("tp",), ()))}),
    # planned at N=4, lowered and run at N=2 (lower_plan's sizes bind it)
    "symbolic mesh": lambda: propagate(mlp(), parse("tp=N~4"), annotations={
        "x": REP, "w1": S(((), ("tp",))), "w2": S((("tp",), ())), "y": REP}),
}
COLLECTIVES = {"megatron": "1 all_reduce", "data-parallel": "none",
               "k-split all-reduce": "1 all_reduce",
               "k-split reduce-scatter": "1 reduce_scatter", "mean split": "1 all_reduce",
               "argmax all-reduce": "1 all_reduce", "argmax reduce-scatter": "1 reduce_scatter",
               "merged heads": "1 all_reduce", "symbolic mesh": "1 all_reduce",
               "pointwise kinds": "none", "leading slice by columns": "none",
               "leading slice by rows": "1 all_gather, 1 all_to_all"}
#: inputs with ties, NaNs and signed zeros where an argmax's pick is at stake
INPUTS = {"argmax all-reduce": hard_inputs, "argmax reduce-scatter": hard_inputs}


@pytest.fixture(scope="module")
def run_tmp(tmp_path_factory):
    """The temporary folder the launch of ``runs`` works under (its ``tempfile`` folder and
    its ranks' TMPDIR)."""
    return tmp_path_factory.mktemp("launch-tmp")


def _in_temp(mp: pytest.MonkeyPatch, folder: Path) -> None:
    # tempfile caches its folder once asked, so TMPDIR alone would not move the parent's
    mp.setattr(tempfile, "tempdir", str(folder))
    mp.setenv("TMPDIR", str(folder))


def _left_behind(folder: Path) -> list[str]:
    """What a run left in its temporary folder, but for torch's own inductor cache, which a
    rank's import of torch makes (empty, and meant to outlive runs)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("torchinductor_"))


@pytest.fixture(scope="module")
def runs(run_tmp):
    """Every plan's schedule in one launch of two processes (torch imported once per rank),
    each output compared with the reference executor's run of the unsharded program."""
    plans = {name: make() for name, make in PLANS.items()}
    schedules = [lower_plan(p, {"N": 2} if p.mesh.symbolic else None) for p in plans.values()]
    inputs = [INPUTS.get(name, lambda p: random_inputs(p, 0))(p.program)
              for name, p in plans.items()]
    with pytest.MonkeyPatch.context() as mp:
        _in_temp(mp, run_tmp)
        results = runner.run_mesh_many(schedules, inputs, timeout_s=180)
    return {name: (plan, compare(run_unplanned(plan.program, xs), run.outputs, plan.program),
                   run)
            for (name, plan), xs, run in zip(plans.items(), inputs, results, strict=True)}


@pytest.mark.parametrize("name", list(PLANS))
def test_two_gloo_processes_match_the_single_device_result(runs, name):
    plan, checks, run = runs[name]
    assert plan.collectives_text() == COLLECTIVES[name]
    assert all(c.ok for c in checks), checks
    # every input, op and step checked its placement; torch's own propagation placed the
    # matmuls as the plan did (a split K gives Partial(sum)); those that read or write heads
    # through a sum of dims ran on the local shards
    assert run.placement_checks >= len(plan.ops) + len(plan.program.inputs)
    plain = {o.name for o in plan.program.ops if o.kind.name == "matmul" and
             all(e.single_dim for a in o.operands for e in a.index) and
             all(o.sizes[e.single_dim] == n for a in o.ins
                 for e, n in zip(a.index, plan.program.tensor(a.tensor).shape, strict=True))}
    assert plain <= set(run.native_ops)


def test_pointwise_kinds_run_on_the_dtensors_by_the_registry_s_formula(runs):
    plan, checks, run = runs["pointwise kinds"]
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    # no table of kind names: each ran as its formula on torch, DTensor placing the result
    assert {f"k{i}" for i in range(len(POINTWISE))} <= set(run.native_ops)


@pytest.mark.parametrize("name", ["leading slice by columns", "leading slice by rows"])
def test_an_op_reading_a_leading_slice_runs_on_the_local_shards_as_the_unplanned_program(
        runs, name):
    plan, checks, run = runs[name]
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert {c.tensor for c in checks} == {"y", "p"}
    # torch would compute over the DTensors' whole axes, 12 rows, where the ops read 6 and 8
    assert not {"sl", "mk"} & set(run.native_ops)


def test_a_split_mean_waits_as_a_sum_and_a_split_argmax_as_keys_then_gathers_exactly(runs):
    assert runs["mean split"][0].strategy("r").out == S(((),), ("tp",), "sum")
    for name in ("argmax all-reduce", "argmax reduce-scatter"):
        plan, checks, run = runs[name]
        assert plan.strategy("r").out == S(((),), ("tp",), "argmax")
        want = run_unplanned(plan.program, hard_inputs(plan.program))["r"]
        assert np.array_equal(run.outputs["r"], want)  # ties and NaNs picked as numpy picks
    plan = runs["merged heads"][0]
    assert str(plan.strategy("pv").out) == "[-, tp]"


def test_an_unbound_symbolic_mesh_never_reaches_a_launch_its_schedule_is_lowered_bound():
    with pytest.raises(TargetError, match=r"axis 'tp' has symbolic size N \(planned at 4\)"):
        lower_plan(PLANS["symbolic mesh"]())
    with pytest.raises(TargetError, match=r"has no size 'K'"):
        lower_plan(PLANS["symbolic mesh"](), {"K": 2})


def test_the_k_split_is_partial_then_all_reduced_or_reduce_scattered(runs):
    ar = runs["k-split all-reduce"][0]
    rs = runs["k-split reduce-scatter"][0]
    assert ar.strategy("mm").out == S(((), ()), ("tp",), "sum") == rs.strategy("mm").out
    assert [str(s) for t in ar.transfers for s in t.steps] == ["all_reduce(sum, tp)"]
    assert [str(s) for t in rs.transfers for s in t.steps] == ["reduce_scatter(sum, tp) dim 0"]


@pytest.mark.parametrize(("how", "match"), [
    ("raise", r"rank 1 of 2 failed at op 'down': RuntimeError: injected fault at op 'down'; "
              "the other ranks were stopped"),
    ("kill", r"rank 1 of 2 was killed by signal SIGKILL at op 'act'; the other ranks were "
             "stopped"),
])
def test_a_failing_rank_ends_the_whole_run_with_a_clear_error(how, match, tmp_path,
                                                              monkeypatch):
    # rank 0, waiting in the all-reduce of 'down' for rank 1, fails too with a reset
    # connection, maybe seen first: the error still names rank 1
    plan = PLANS["megatron"]()
    op = "down" if how == "raise" else "act"
    _in_temp(monkeypatch, tmp_path)
    with pytest.raises(ExecutionError, match=match):
        runner.run_mesh(lower_plan(plan), timeout_s=120,
                        fault={"rank": 1, "op": op, "how": how})
    assert _left_behind(tmp_path) == []  # the run's folder went with it


def test_a_successful_run_leaves_no_temporary_folder_behind(runs, run_tmp):
    assert runs and _left_behind(run_tmp) == []


def test_a_run_interrupted_while_it_waits_stops_its_ranks_and_removes_its_folder(
        tmp_path, monkeypatch):
    started, folders = [], []

    def interrupted(procs, *_):
        started.extend(procs)
        folders.extend(_left_behind(tmp_path))
        raise KeyboardInterrupt  # Ctrl-C while the parent waits for its ranks

    _in_temp(monkeypatch, tmp_path)
    monkeypatch.setattr(launch, "_watch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run_mesh(lower_plan(PLANS["megatron"]()), timeout_s=120)
    assert len(started) == 2 and not any(p.is_alive() for p in started)
    assert [f[:18] for f in folders] == ["apportion-dtensor-"]  # the run's folder, now gone
    assert _left_behind(tmp_path) == []


# --- attribution: which rank's failure is reported -----------------------------------------

F = launch.RankFailure
#: what gloo raises on a rank whose peer died (torch 2.13)
RESET_TEXT = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:28890: Connection reset by peer")
RESET = f"RuntimeError: {RESET_TEXT}"


def test_a_killed_rank_is_named_over_a_peer_whose_connection_error_is_dated_earlier():
    # the parent dates a signal death when it sees the exit, which can be after the peer
    # recorded the reset the death caused
    peer = F(0, 10.0, "at all_reduce(sum, tp) of tensor 'y'", RESET, peer=True)
    killed = F(1, 12.0, "at op 'act'", exitcode=-signal.SIGKILL)
    assert launch.root_cause([peer, killed]) is killed
    assert launch.root_cause([killed, peer]) is killed
    assert killed.describe() == "was killed by signal SIGKILL at op 'act'"


def test_a_rank_that_raised_is_named_over_peers_and_the_earliest_own_failure_wins():
    peer = F(0, 1.0, "at all_reduce(sum, tp) of tensor 'y'", RESET, peer=True)
    raised = F(2, 3.0, "at op 'down'", "RuntimeError: injected fault at op 'down'")
    killed = F(1, 2.0, "at op 'act'", exitcode=-signal.SIGSEGV)
    assert launch.root_cause([peer, raised]) is raised
    assert launch.root_cause([peer, raised, killed]) is killed
    assert raised.describe() == "failed at op 'down': RuntimeError: injected fault at op 'down'"


def test_equal_times_go_to_the_lower_rank():
    a, b = F(3, 5.0, error="ValueError: x"), F(1, 5.0, exitcode=-signal.SIGABRT)
    assert launch.root_cause([a, b]) is b
    p, q = F(1, 5.0, error=RESET, peer=True), F(0, 5.0, error=RESET, peer=True)
    assert launch.root_cause([p, q]) is q


def test_a_peer_error_is_named_only_when_no_rank_failed_on_its_own():
    late = F(0, 9.0, "at all_reduce(sum, tp) of tensor 'y'", RESET, peer=True)
    early = F(1, 4.0, "at all_gather(tp) of tensor 'h'", "RuntimeError: Timed out waiting "
              "120000ms for recv operation to complete", peer=True)
    assert launch.root_cause([late, early]) is early
    with pytest.raises(ValueError, match="at least one failure"):
        launch.root_cause([])


def test_exit_statuses_and_unknown_signals_are_described_plainly():
    assert F(0, 0.0, "at op 'x'", exitcode=3).describe() == "exited with status 3 at op 'x'"
    assert F(0, 0.0, exitcode=-200).describe() == "was killed by signal 200"


@pytest.mark.parametrize(("types", "message", "peer"), [
    (["RuntimeError"], "[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1443: "
                       "Connection reset by peer", True),
    (["RuntimeError"], "[../gloo/transport/tcp/pair.cc:598] Connection closed by peer "
                       "[127.0.0.1]:4312", True),
    (["RuntimeError"], "[../gloo/transport/tcp/pair.cc:414] Write error: Broken pipe", True),
    (["DistBackendError", "DistError", "RuntimeError"],
     "[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 120000ms for recv "
     "operation to complete", True),
    (["DistBackendError"], "NCCL communicator was aborted on rank 0", True),
    (["ConnectionResetError", "ConnectionError", "OSError"], "[Errno 104]", True),
    (["DistNetworkError", "DistError", "RuntimeError"], "failed to recv", True),
    (["RuntimeError"], "injected fault at op 'down'", False),
    (["ExecutionError", "ApportionError"], "rank 1: op 'up': tensor 'h' is (Replicate(),)",
     False),
    (["KeyboardInterrupt", "BaseException"], "", False),
])
def test_connection_errors_and_timeouts_are_what_a_peer_sees_and_others_are_own(
        types, message, peer):
    assert launch.is_peer_error(types, message) is peer


# Fake ranks for the launcher's watch: plain spawned processes that play a rank's part
# (write its records, exit, die by a signal, hang) without torch, in a fixed order.
PEER_RESET = """
from apportion.backends.dtensor import launch
launch.record_failure(OUT, 0, "at all_reduce(sum, tp) of tensor 'y'", RuntimeError(RESET))
import os
os._exit(1)
"""
KILLED_AFTER_PEER = """
import os, signal, time
from pathlib import Path
# dies only once its peer has recorded the reset and exited (bounded, lest a broken test hang)
for _ in range(6000):
    if Path(OUT, "rank0.err").exists():
        break
    time.sleep(0.01)
Path(OUT, "rank1.at").write_text("at op 'act'")
os.kill(os.getpid(), signal.SIGKILL)
"""
KILLED = """
import os, signal
from pathlib import Path
Path(OUT, "rank1.at").write_text("at op 'act'")
os.kill(os.getpid(), signal.SIGKILL)
"""
HANGS = "import time\ntime.sleep(3600)\n"


def _fake_ranks(out: Path, *codes: str) -> list:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=exec, args=(c, {"OUT": str(out), "RESET": RESET_TEXT}),
                         daemon=True) for c in codes]
    for p in procs:
        p.start()
    return procs


def test_the_launcher_waits_for_a_rank_killed_after_its_peer_reported_the_broken_link(
        tmp_path, monkeypatch):
    # rank 0 exits first with the reset; the launcher must wait for rank 1's death (no grace
    # limit here, so the order cannot change the outcome) and name it
    monkeypatch.setattr(launch, "GRACE_S", 3600.0)
    procs = _fake_ranks(tmp_path, PEER_RESET, KILLED_AFTER_PEER)
    try:
        with pytest.raises(ExecutionError, match=r"^dtensor run of 'fake': rank 1 of 2 was "
                           r"killed by signal SIGKILL at op 'act'; the other ranks were "
                           r"stopped$"):
            launch._watch(procs, tmp_path, time.monotonic() + 3600, 3600, "'fake'")
    finally:
        launch._stop(procs)
    assert [p.exitcode for p in procs] == [1, -signal.SIGKILL]


def test_a_killed_rank_whose_peer_hangs_ends_the_run_after_the_grace_period(
        tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "GRACE_S", 0.1)
    procs = _fake_ranks(tmp_path, HANGS, KILLED)
    try:
        with pytest.raises(ExecutionError, match=r"rank 1 of 2 was killed by signal SIGKILL "
                           r"at op 'act'; the other ranks were stopped$"):
            launch._watch(procs, tmp_path, time.monotonic() + 3600, 3600, "'fake'")
        assert not procs[0].is_alive()  # the hanging rank was stopped, not waited for
    finally:
        launch._stop(procs)


def test_a_run_past_its_deadline_stops_every_rank_and_says_which_were_running(tmp_path):
    procs = _fake_ranks(tmp_path, HANGS, HANGS)
    try:
        with pytest.raises(ExecutionError, match=r"timed out after 5 s; ranks \[0, 1\] were "
                           "still running and were stopped"):
            launch._watch(procs, tmp_path, time.monotonic(), 5, "'fake'")
        assert not any(p.is_alive() for p in procs)
    finally:
        launch._stop(procs)


def test_only_a_peer_error_is_named_as_such_when_the_peer_at_fault_left_no_trace(
        tmp_path, monkeypatch):
    # rank 1 hangs (stopped by the launcher, so not a failure of its own): the reset is all
    # there is, and the error says it is a communication error
    monkeypatch.setattr(launch, "GRACE_S", 0.1)
    procs = _fake_ranks(tmp_path, PEER_RESET, HANGS)
    try:
        with pytest.raises(ExecutionError, match=r"rank 0 of 2 failed at all_reduce\(sum, tp\) "
                           r"of tensor 'y': RuntimeError: \[.*Connection reset by peer \(an "
                           r"error of communication with a peer, and no rank failed on its "
                           r"own\); the other ranks were stopped$"):
            launch._watch(procs, tmp_path, time.monotonic() + 3600, 3600, "'fake'")
    finally:
        launch._stop(procs)


def test_a_dim_split_out_of_mesh_order_is_refused_before_launch():
    plan = propagate(matmul(), parse("a=1,b=2"), annotations={"x": S((("b", "a"), ()))})
    with pytest.raises(ExecutionError, match=r"dim 0 is split over b\*a, not in mesh order"):
        runner.run_mesh(lower_plan(plan))


def test_the_device_is_cpu_with_gloo_unless_there_is_a_gpu_per_rank():
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert runner.resolve_device("cpu", 2) == "cpu"
    assert runner.resolve_device("auto", 2) == ("cuda" if gpus >= 2 else "cpu")
    if gpus < 64:
        with pytest.raises(ExecutionError, match="the mesh has 64 devices, one process each"):
            runner.resolve_device("cuda", 64)
    with pytest.raises(ExecutionError, match="expected auto, cpu or cuda"):
        runner.resolve_device("tpu", 2)


@pytest.mark.gpu
def test_megatron_on_nccl_with_one_gpu_per_rank_matches_the_single_device_result():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    s = lower_plan(PLANS["megatron"]())
    want = expect(s.program)
    run = runner.run_mesh(s, want.inputs, timeout_s=120, device="cuda")
    checks = want.compare(run)
    assert run.backend == "nccl" and all(c.ok for c in checks), checks


def test_the_registry_s_run_mesh_gives_the_program_s_outputs_by_name():
    from apportion.backends import get

    schedule = lower_plan(PLANS["k-split reduce-scatter"]())
    xs = random_inputs(schedule.program, 3)
    out = get("dtensor").run_mesh(schedule, xs, seed=3, timeout_s=120, device="cpu")
    assert set(out) == set(schedule.program.outputs)
    checks = compare(run_unplanned(schedule.program, xs), out, schedule.program)
    assert all(c.ok for c in checks), checks
