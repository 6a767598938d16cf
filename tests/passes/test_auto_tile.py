"""Tests of pass auto_tile's candidate order (fewest iterations first, never truncated early)."""

from __future__ import annotations

import itertools
import math

from apportion.passes.auto_tile import candidate_counts
from apportion.passes.layouts import layouts
from apportion.target import spyre
from tests.helpers import program


def three_levels(m: int, n: int, k: int):
    return program({"x": ([m, n * 64], "float16"), "w": ([n * 64, k], "float16")},
                   [{"name": "mm", "op": "matmul", "out": "y[m,j]", "ins": ["x[m,n]", "w[n,j]"]}],
                   ["y"], tiling=[{"ops": ["mm"], "loops": [{"count": 1, "dims": ["m"]},
                                                            {"count": 1, "dims": ["j"]},
                                                            {"count": 1, "dims": ["n"]}]}])


def brute_force(m: int, n_sticks: int, k: int) -> list[tuple[int, ...]]:
    def divs(x: int) -> list[int]:
        return [c for c in range(1, x + 1) if x % c == 0]

    # j is a stick dim of the output (64 per stick), n one of x: counts divide their sticks
    combos = itertools.product(divs(m), divs(k // 64), divs(n_sticks))
    return sorted(combos, key=lambda c: (math.prod(c), tuple(-x for x in c)))


def test_candidates_come_in_the_order_of_a_full_sort_by_iterations():
    p = three_levels(48, 12, 64 * 24)
    got = candidate_counts(p, p.tiling[0], layouts(p, spyre()).ops, 65535, limit=10**6)
    assert got == brute_force(48, 12, 64 * 24)


def test_a_limit_keeps_the_fewest_iterations_not_the_first_found():
    # 720 has 30 divisors: 27,000 tuples over three levels; the limit keeps the smallest ones
    p = three_levels(720, 720, 64 * 720)
    got = candidate_counts(p, p.tiling[0], layouts(p, spyre()).ops, 65535, limit=50)
    assert got == brute_force(720, 720, 64 * 720)[:50]
