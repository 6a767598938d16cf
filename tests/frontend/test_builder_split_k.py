"""Tests of split-K pins in the Python program builder (``ap.hint(split_k=...)``)."""

from __future__ import annotations

import pytest

import apportion as ap
from apportion.errors import ProgramError
from apportion.ir.program import SplitKPin
from apportion.plans.plan import SplitK


def test_hints_pin_slices_tiles_and_the_target_for_the_reducing_ops_inside():
    M, K, N = ap.dim("M", 64), ap.dim("K", 4096), ap.dim("N", 256)
    with ap.program("b") as p:
        x, w = p.input("x", [M, K], "float16"), p.input("w", [K, N], "float16")
        with ap.hint(split_k_tile={K: 512}):
            y = ap.matmul(x, w)
        with ap.hint(split_k="?"):
            z = ap.matmul(x, w)
        with ap.hint(split_k=4):
            s = ap.relu(ap.matmul(x, w))  # relu reduces nothing: only the matmul is pinned
        p.output(y, z, s)
    assert p.program.split_k == (("matmul0", SplitKPin(tiles=(("K", 512),))),
                                 ("matmul1", "?"), ("matmul2", 4))
    planned = ap.plan(p.program, ap.targets.spyre(cores=32))
    assert planned.op("matmul0.partial").split_k == SplitK(("K",), 8, "pinned")
    assert planned.op("matmul2.partial").split_k == SplitK(("K",), 4, "pinned")
    assert all(c.ok for c in planned.check())


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"split_k": 2, "split_k_tile": 64}, "not both"),
    ({"split_k": "all"}, r"split_k must be slices \(an int\), \"\?\""),
    ({"split_k_tile": {"K": 64}}, "split_k_tile must map dims made with ap.dim"),
])
def test_bad_split_k_hints_are_refused(kwargs, match):
    with pytest.raises(ProgramError, match=match):
        ap.hint(**kwargs)


def test_a_split_k_hint_over_ops_that_reduce_nothing_is_refused():
    M, K = ap.dim("M", 8), ap.dim("K", 64)
    with ap.program("c") as p:
        x = p.input("x", [M, K], "float16")
        with ap.hint(split_k=4):
            p.output(ap.relu(x))
    with pytest.raises(ProgramError, match="hint split_k: no op inside reduces a dim"):
        assert p.program is None  # the property raises
