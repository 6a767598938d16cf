"""Integer floor division and remainder by 0, and of the least value by -1: x86's division
instruction traps there (SIGFPE), which ended the whole process when IREE ran a mesh case's
padded tile (bench conformance mesh seed 100034: an int32 remainder over dp=2). The program
defines them as numpy does (``x // 0`` and ``x % 0`` are 0, ``x % -1`` is 0, ``x // -1`` is
``-x``, wrapping at the least value), and the reference, IREE and OpenMP give exactly that,
each compared with values computed here with Python integers."""

from __future__ import annotations

import numpy as np
import pytest

import apportion as ap
from apportion.mlir import upstream
from tests.helpers import program

SHAPE = [4, 16]
DTYPES = ("int8", "int32", "int64")
OPENMP = upstream.available() and upstream.openmp_library() is not None


def numpy_like(a: int, b: int, bits: int) -> tuple[int, int]:
    """``a // b`` and ``a % b`` as numpy defines them for ``bits``-bit integers."""
    if b == 0:
        return 0, 0
    q = a // b  # Python's floor division, exact
    wrap = (q + 2 ** (bits - 1)) % 2 ** bits - 2 ** (bits - 1)  # -min // -1 wraps to min
    return wrap, a % b


def case(dtype: str) -> tuple[ap.PlannedProgram, dict[str, np.ndarray], dict[str, np.ndarray]]:
    info = np.iinfo(dtype)
    n = np.resize(np.array([info.min, info.max, info.min + 1, 0, 7, -7, 5, -1]), 64)
    d = np.resize(np.array([-1, 0, 0, -1, 0, 2, -3, -1, 3, 1, info.min, info.max]), 64)
    inputs = {"a": n.astype(dtype).reshape(SHAPE), "b": d.astype(dtype).reshape(SHAPE)}
    bits = info.bits
    pairs = [numpy_like(int(x), int(y), bits) for x, y in zip(n, d, strict=True)]
    want = {"q": np.array([q for q, _ in pairs], dtype=dtype).reshape(SHAPE),
            "r": np.array([r for _, r in pairs], dtype=dtype).reshape(SHAPE)}
    ops = [{"name": "fd", "op": "floor_div", "out": "q[i,j]", "ins": ["a[i,j]", "b[i,j]"]},
           {"name": "rm", "op": "remainder", "out": "r[i,j]", "ins": ["a[i,j]", "b[i,j]"]}]
    prog = program({"a": (SHAPE, dtype), "b": (SHAPE, dtype)}, ops, ["q", "r"],
                   name=f"division_{dtype}")
    return ap.plan(prog, ap.targets.spyre(cores=4)), inputs, want


def check(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name, w in want.items():
        g = np.asarray(got[name])
        bad = g != w
        assert not bad.any(), (name, np.argwhere(bad)[:3].tolist(), g[bad][:5], w[bad][:5])


@pytest.mark.parametrize("dtype", DTYPES)
def test_division_by_zero_and_of_the_least_value_by_minus_one_is_numpys_on_the_reference(dtype):
    planned, inputs, want = case(dtype)
    with np.errstate(all="ignore"):
        check(planned.run(inputs, backend="reference"), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_division_by_zero_and_of_the_least_value_by_minus_one_is_numpys_on_torch(dtype):
    pytest.importorskip("torch")
    planned, inputs, want = case(dtype)
    check(planned.run(inputs, backend="torch"), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_division_by_zero_and_of_the_least_value_by_minus_one_does_not_trap_in_iree(dtype):
    planned, inputs, want = case(dtype)
    check(planned.run(inputs, backend="iree"), want)


@pytest.mark.skipif(not OPENMP, reason="the mlir extra (upstream MLIR and an OpenMP runtime)")
@pytest.mark.parametrize("dtype", DTYPES)
def test_division_by_zero_and_of_the_least_value_by_minus_one_does_not_trap_on_openmp(dtype):
    planned, inputs, want = case(dtype)
    check(planned.run(inputs, backend="openmp"), want)


def test_the_mesh_case_that_trapped_in_iree_runs_and_matches():
    from apportion.bench.conformance import run_mesh_case

    record = run_mesh_case(100034, ("iree",))
    assert record.planned == "yes"
    assert [(o.backend, o.status) for o in record.outcomes] == [("reference", "match"),
                                                                ("iree", "match")]
