"""The host's split-K table (apportion/target/host.py): the decision per measured shape, the
rows it makes, the cache per host and the measurer injected (no test here measures for real)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.errors import TargetError
from apportion.settings import cpu_split_k
from apportion.target import host
from apportion.target.presets import CPU_SPLIT_K, cpu
from apportion.target.split_k import ByCost, ByTable, ReductionShape, table_slices

FACTORS = (1, 2, 4, 8, 16, 32, 64)

times = st.dictionaries(st.sampled_from(FACTORS[1:]), st.floats(1e-6, 1.0), max_size=6).flatmap(
    lambda d: st.floats(1e-6, 1.0).map(lambda t1: {1: t1, **d}))
extent = st.integers(1, 1 << 17)


def synthetic(m: int = 1, n: int = 4096, k: int = 14336, best: int = 16) -> host.ShapeTimes:
    """A shape whose factor ``best`` is twice as fast as every other."""
    return host.ShapeTimes(m, n, k, tuple((f, 1.0 if f != best else 0.5) for f in FACTORS))


@given(times)
def test_the_chosen_factor_is_within_tolerance_of_the_fastest_and_never_slower_than_no_split(t):
    f = host.chosen_factor(t)
    assert t[f] <= min(t.values()) * (1 + host.TOLERANCE)
    assert t[f] <= t[1] or t[1] > min(t.values()) * (1 + host.TOLERANCE)
    if t[1] <= min(t.values()) * (1 + host.TOLERANCE):
        assert f == 1
    assert all(t[g] > min(t.values()) * (1 + host.TOLERANCE) for g in t if g < f)


def test_a_tie_within_tolerance_goes_to_the_smaller_factor():
    assert host.chosen_factor({1: 1.0, 4: 0.52, 8: 0.5}) == 4
    assert host.chosen_factor({1: 0.51, 4: 0.5}) == 1


@given(extent, extent, extent, times)
def test_each_measured_shape_is_held_by_its_own_row_with_its_factor(m, n, k, t):
    s = host.ShapeTimes(m, n, k, tuple(t.items()))
    (row,) = host.table_rows([s])
    if n >= host.LEAST_N:
        assert row.holds(ReductionShape(1, m, n, k)) and row.slices == s.factor
    assert row.n[0] is not None and row.n[0] >= host.LEAST_N


def test_rows_reach_twice_and_half_a_shape_and_no_plain_reduction():
    rows = host.table_rows([synthetic(128, 128, 32768, best=4)])
    assert table_slices(rows, ReductionShape(1, 64, 256, 16384)) == 4
    assert table_slices(rows, ReductionShape(1, 128, 128, 70000)) is None
    assert table_slices(rows, ReductionShape(1, 128, 1, 32768)) is None  # a row sum's N is 1


def _measurable(k: int, t: dict[int, float]) -> tuple[tuple[int, float], ...]:
    """``t`` cut to the factors measuring tries for ``k``."""
    return tuple((f, s) for f, s in t.items() if f in host.factors_of(k))


@given(st.lists(st.tuples(extent, extent, extent, times, st.integers(0, 300),
                          st.floats(0, 1)), min_size=0, max_size=4),
       st.integers(1, 512), st.one_of(st.none(), st.floats(0, 64)))
def test_a_host_table_reads_back_as_written(shapes, cores, load):
    table = host.HostTable(host.HostKey("x86_64\nmodel name : test", cores, "3.13.0"),
                           tuple(host.ShapeTimes(m, n, k, _measurable(k, t), r, spread)
                                 for m, n, k, t, r, spread in shapes), (load, load))
    assert host.HostTable.from_doc(json.loads(json.dumps(table.to_doc()))) == table


def test_the_host_key_changes_with_the_cpu_cores_and_iree():
    base = host.HostKey("cpu a", 2, "3.13.0")
    others = [host.HostKey("cpu b", 2, "3.13.0"), host.HostKey("cpu a", 4, "3.13.0"),
              host.HostKey("cpu a", 2, "3.14.0")]
    assert len({base.digest, *(o.digest for o in others)}) == 4
    assert host.host_key().cores >= 1 and host.host_key().cpu == host.host_cpu()


class Counting:
    """A measurer that counts its calls and returns one synthetic shape."""

    def __init__(self, best: int = 16) -> None:
        self.calls = 0
        self.best = best

    def __call__(self, key: host.HostKey) -> list[host.ShapeTimes]:
        self.calls += 1
        return [synthetic(best=self.best)]


@pytest.fixture
def measured_here(monkeypatch, tmp_path):
    """The host's table on (not the suite's shipped one), in a fresh cache folder, measured by
    a counting fake."""
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "host")
    fake = Counting()
    with host.injected(fake, tmp_path):
        yield fake, tmp_path


def test_a_missing_table_is_measured_once_cached_per_host_and_read_back(measured_here):
    fake, folder = measured_here
    first = host.host_table()
    assert fake.calls == 1 and first is not None and first.rows[0].slices == 16
    path = folder / f"{host.host_key().digest}.json"
    assert path.exists() and host.read_table(path, host.host_key()) == first
    host._memo.clear()
    assert host.host_table() == first and fake.calls == 1  # from the file, not measured


def test_the_stock_cpu_target_reads_the_hosts_table(measured_here):
    target = cpu(cores=2)
    assert target.split_k == ByTable() and target.split_k_table == host.host_table().rows
    assert table_slices(target.split_k_table, ReductionShape(1, 1, 4096, 14336)) == 16


def test_a_table_of_another_host_or_a_torn_file_is_measured_again(measured_here):
    fake, folder = measured_here
    path = host.cache_path(host.host_key())
    folder.mkdir(exist_ok=True)
    other = host.HostTable(host.HostKey("another cpu", 64, "3.13.0"), (synthetic(best=2),))
    path.write_text(json.dumps(other.to_doc()))
    assert host.host_table().rows[0].slices == 16 and fake.calls == 1
    host._memo.clear()
    path.write_text('{"format": "apportion.host-splitk/1", "host"')
    fake.best = 8
    assert host.host_table().rows[0].slices == 8 and fake.calls == 2


def test_measure_again_measures_a_cached_table_but_not_twice_in_one_process(measured_here):
    fake, folder = measured_here
    host.write_table(host.cache_path(host.host_key()),
                     host.HostTable(host.host_key(), (synthetic(best=2),)))
    assert host.host_table().rows[0].slices == 2 and fake.calls == 0
    assert host.host_table(measure_again=True).rows[0].slices == 16 and fake.calls == 1
    assert host.host_table(measure_again=True).rows[0].slices == 16 and fake.calls == 1


def test_shipped_takes_the_shipped_table_and_measures_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "shipped")
    fake = Counting()
    with host.injected(fake, tmp_path):
        assert host.host_table() is None and cpu().split_k_table == CPU_SPLIT_K
    assert fake.calls == 0 and not any(tmp_path.iterdir())


def test_no_measurer_is_refused_naming_the_way_out(monkeypatch, tmp_path):
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "host")
    with host.injected(None, tmp_path), pytest.raises(TargetError, match="shipped"):
        cpu()


def test_a_bad_split_k_source_is_refused_naming_the_variable():
    with pytest.raises(TargetError, match="APPORTION_CPU_SPLIT_K='fast'.*host, shipped"):
        cpu_split_k({"APPORTION_CPU_SPLIT_K": "fast"})


def test_a_measurement_without_no_split_or_with_a_bad_time_is_refused():
    with pytest.raises(TargetError, match="must include 1"):
        host.ShapeTimes(1, 64, 4096, ((2, 1.0),))
    with pytest.raises(TargetError, match="factor 2 took -1.0"):
        host.ShapeTimes(1, 64, 4096, ((1, 1.0), (2, -1.0)))
    for bad in (float("inf"), float("nan"), True):
        with pytest.raises(TargetError, match="factor 2 took"):
            host.ShapeTimes(1, 64, 4096, ((1, 1.0), (2, bad)))


# --- cache trust ---------------------------------------------------------------------------

def _cached(folder, doc) -> None:
    path = host.cache_path(host.host_key())
    folder.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("factor", [40960, 3, 128])
def test_a_cached_factor_measuring_never_tries_is_reported_and_measured_again(
        measured_here, caplog, factor):
    # 40960 ways on 2 cores was planned as read; 3 is no factor tried; 128 slices of 32768
    # hold 256 each, but measuring stops at 64
    fake, folder = measured_here
    doc = host.HostTable(host.host_key(), (synthetic(32, 32, 40960, best=2),)).to_doc()
    doc["shapes"][0]["seconds"][str(factor)] = 1e-6
    _cached(folder, doc)
    assert host.host_table().rows[0].slices == 16 and fake.calls == 1
    assert caplog.text.count(f"names factor {factor}, which measuring never tries") == 1
    assert "measuring again" in caplog.text


def test_a_cached_table_of_nonsense_times_is_measured_again(measured_here, caplog):
    fake, folder = measured_here
    doc = host.HostTable(host.host_key(), (synthetic(best=2),)).to_doc()
    doc["shapes"][0]["seconds"]["2"] = "fast"
    _cached(folder, doc)
    assert host.host_table().rows[0].slices == 16 and fake.calls == 1
    assert "bad field" in caplog.text


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_cache_path_that_is_not_a_regular_file_is_refused_naming_it_without_blocking(
        measured_here, kind):
    import os

    fake, folder = measured_here
    path = host.cache_path(host.host_key())
    folder.mkdir(exist_ok=True)
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    what = "a FIFO" if kind == "fifo" else "a folder"
    with pytest.raises(TargetError, match=f"{path.name}' is {what}, not a regular file: "
                                          "remove it"):
        cpu()  # a plain open of the FIFO would block here for ever
    assert fake.calls == 0


def test_a_lock_that_is_not_a_regular_file_is_refused_naming_it(measured_here):
    import os

    fake, folder = measured_here
    folder.mkdir(exist_ok=True)
    lock = host.cache_path(host.host_key()).with_suffix(".lock")
    os.mkfifo(lock)
    with pytest.raises(TargetError, match=f"{lock.name}' is a FIFO"):
        host.host_table()
    assert fake.calls == 0


@pytest.mark.parametrize("holder", ["running", "gone"])
def test_a_process_waiting_for_anothers_measurement_says_so_naming_the_lock_and_pid(
        measured_here, caplog, holder):
    import fcntl
    import os
    import subprocess
    import sys
    import threading

    fake, folder = measured_here
    folder.mkdir(exist_ok=True)
    lock = host.cache_path(host.host_key()).with_suffix(".lock")
    if holder == "running":
        pid = os.getppid()
    else:  # a pid the holder has not yet written over: its process has ended
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        pid = child.pid
    lock.write_text(str(pid))
    hold = open(lock, "r+")  # noqa: SIM115 - the other process's hold, released below
    fcntl.flock(hold, fcntl.LOCK_EX)
    table = host.HostTable(host.host_key(), (synthetic(best=4),))

    def finish() -> None:  # the other process caches its table, then lets go
        host.write_table(host.cache_path(host.host_key()), table)
        fcntl.flock(hold, fcntl.LOCK_UN)
        hold.close()

    waiting = threading.Timer(0.2, finish)
    waiting.start()
    try:
        got = host.host_table()
    finally:
        waiting.join()
    assert got == table and fake.calls == 0  # it read what the other one measured
    (line,) = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    by = f"process {pid}" if holder == "running" else "another process"
    assert line == f"waiting for {by} measuring this host's split-K table (it holds {lock})"
    assert lock.read_text() == str(os.getpid())


class Untrusted:
    """A measurer whose measurement could not be trusted."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, key: host.HostKey) -> host.HostMeasurement:
        self.calls += 1
        return host.HostMeasurement((synthetic(best=8),), False,
                                    "the load average 6.80 was over the machine's 2 cores",
                                    (6.8, 7.1))


def test_an_untrusted_measurement_is_not_cached_and_the_shipped_table_plans_this_run(
        monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "host")
    fake = Untrusted()
    with host.injected(fake, tmp_path):
        assert host.host_table() is None and cpu().split_k_table == CPU_SPLIT_K
        assert cpu().split_k_table == CPU_SPLIT_K and fake.calls == 1  # once a process
        assert host.untrusted_why() == "the load average 6.80 was over the machine's 2 cores"
    assert not list(tmp_path.glob("*.json"))
    (line,) = [r.getMessage() for r in caplog.records if "not cached" in r.getMessage()]
    assert line.startswith("this host's split-K table is not cached: the load average 6.80 "
                           "was over the machine's 2 cores; this run plans with the shipped "
                           "table")


def test_a_trusted_measurement_records_its_load_and_spread_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "host")
    shape = host.ShapeTimes(1, 4096, 14336, synthetic(best=4).seconds, 17, 0.031)

    def measured(key: host.HostKey) -> host.HostMeasurement:
        return host.HostMeasurement((shape,), True, "", (0.25, 1.5))

    with host.injected(measured, tmp_path):
        host.host_table()
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["load"] == {"before": 0.25, "after": 1.5}
    assert (doc["shapes"][0]["rounds"], doc["shapes"][0]["spread"]) == (17, 0.031)


def test_a_host_table_of_no_shapes_leaves_every_split_to_the_cost_model(monkeypatch, tmp_path):
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "host")
    with host.injected(lambda key: [], tmp_path):
        assert cpu().split_k == ByCost()


def test_other_code_makes_another_key_and_measures_again(monkeypatch, tmp_path):
    monkeypatch.setenv("APPORTION_CPU_SPLIT_K", "host")
    fake = Counting()
    with host.injected(fake, tmp_path, fingerprint=lambda: "emitter a"):
        a = host.host_key()
        host.host_table()
    with host.injected(fake, tmp_path, fingerprint=lambda: "emitter b"):
        b = host.host_key()
        host.host_table()
    assert (a.code, b.code) == ("emitter a", "emitter b") and a.digest != b.digest
    assert fake.calls == 2 and len(list(tmp_path.glob("*.json"))) == 2


@pytest.mark.parametrize(("measured_on", "expected"), [(2, 16), (None, 2), (4, 2)])
def test_a_factor_measured_at_the_targets_core_count_is_taken_as_measured(measured_on, expected):
    # a host's row was timed at its own core count (more slices than cores included), so a
    # target of that many cores takes it whole; a row of another machine is cut to the cores
    import apportion as ap
    from apportion.bench.splitk import matmul_program, split_of
    from apportion.target.split_k import TableRow

    target = cpu(cores=2, split_k_table=(TableRow(16, cores=measured_on),))
    factor, by, _, _ = split_of(ap.plan(matmul_program(1, 6144, 4096, "float32"), target))
    assert (factor, by) == (expected, "table")
