import itertools
import math

import pytest

from components.core.statistics.passk import mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n attempts (c passing) that hold at least one pass."""
    attempts = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(attempts[i] for i in s) for s in subsets) / len(subsets)


def test_known_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))  # 0.7
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(5, 3, 3) == 1.0  # fewer than k failures: every draw holds a pass


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_1_is_the_pass_fraction_and_large_n_is_stable():
    assert pass_at_k(200, 37, 1) == pytest.approx(37 / 200)
    assert 0.0 < pass_at_k(10_000, 3, 100) < 1.0


def test_rejects_impossible_inputs():
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="at least k"):
        pass_at_k(2, 1, 3)


def test_mean_skips_tasks_with_too_few_attempts():
    mean, used = mean_pass_at_k([(5, 2), (5, 0), (1, 1)], k=2)
    assert used == 2
    assert mean == pytest.approx((0.7 + 0.0) / 2)
    assert math.isnan(mean_pass_at_k([(1, 1)], k=2)[0])
