"""Unit tests of the planning geometry: bounded divisor search."""

import pytest

from apportion.passes.geometry import divisors

MERSENNE_127 = 2**127 - 1  # prime


def brute(n: int, limit: int) -> list[int]:
    return [i for i in range(1, n + 1) if n % i == 0 and i <= limit]


@pytest.mark.parametrize("n", range(1, 150))
def test_small_n_gives_every_divisor_up_to_the_limit_in_order(n):
    for limit in (0, 1, 2, 7, 24, 32, n - 1, n, n + 5):
        assert divisors(n, limit) == brute(n, limit)


def test_limit_at_least_n_gives_all_divisors():
    assert divisors(12, 12) == divisors(12, 10**30) == [1, 2, 3, 4, 6, 12]
    assert divisors(1, 1) == [1]


def test_limit_below_one_gives_nothing():
    assert divisors(12, 0) == divisors(12, -5) == []


def test_n_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        divisors(0, 32)


@pytest.mark.parametrize(("n", "limit", "expected"), [
    (2**62, 32, [1, 2, 4, 8, 16, 32]),
    (2**100, 24, [1, 2, 4, 8, 16]),
    (2**100, 1, [1]),
    (3 * 2**100, 32, [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]),
    (10**30, 30, [1, 2, 4, 5, 8, 10, 16, 20, 25]),
    (2**89 - 1, 65535, [1]),  # prime
    (MERSENNE_127, 65535, [1]),
    (6 * MERSENNE_127, 256, [1, 2, 3, 6]),
    (2**1000 * 3**5, 100, [1, 2, 3, 4, 6, 8, 9, 12, 16, 18, 24, 27, 32, 36, 48, 54, 64, 72, 81,
                            96]),
])
def test_huge_n_gives_the_divisors_up_to_the_limit(n, limit, expected):
    assert divisors(n, limit) == expected


def test_huge_n_with_a_loop_count_sized_limit():
    # the bound auto-tile will pass (the hardware's loop count limit)
    assert divisors(2**62, 65535) == [2**i for i in range(16)]
    assert divisors(2**100 * 5**3, 65535)[-1] == 64000  # 5**3 * 2**9
