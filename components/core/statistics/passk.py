"""pass@k with the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code"): from n attempts of which c passed, the probability that at least one of k
attempts drawn without replacement passes, 1 - C(n-c, k) / C(n, k).

Computed as a running product so that large n does not overflow.
"""

from __future__ import annotations

from collections.abc import Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: n attempts, c of them passed, k drawn."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n attempts, got n={n}, k={k}; run at least k valid attempts")
    if n - c < k:  # every k-subset holds a pass
        return 1.0
    prob_all_fail = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c, k)/C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)
        prob_all_fail *= 1.0 - k / i
    return 1.0 - prob_all_fail


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> tuple[float, int]:
    """Mean pass@k over tasks given (n, c) pairs; tasks with fewer than k valid attempts are skipped.

    Returns (mean, number of tasks used); the mean is NaN when no task had k attempts.
    """
    values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
    return (sum(values) / len(values) if values else float("nan")), len(values)
