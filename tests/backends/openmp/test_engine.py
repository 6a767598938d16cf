"""``engine.max_threads``: the team size OMP_NUM_THREADS asks for, read in ASCII digits only."""

from __future__ import annotations

import os

import pytest

from apportion.backends.openmp.engine import max_threads


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


@pytest.mark.parametrize(("value", "threads"), [("3", 3), ("3,2", 3), (" 5 ", 5)])
def test_omp_num_threads_sets_the_team_size(value, threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert max_threads() == threads


# '²' is a digit to str.isdigit that int() fails on (a traceback); '٤' int() reads as 4 where
# the OpenMP runtime does not: neither is a team size, so the default (the cores) stands
@pytest.mark.parametrize("value", ["\u00b2", "\u0664", "0", "-2", "x", ""])
def test_omp_num_threads_that_is_no_ascii_count_leaves_the_cores(value, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert max_threads() == _cores()
