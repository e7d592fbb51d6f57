"""Confidence intervals for rates measured on tasks, with attempts clustered by task.

Attempts at the same task are not independent (a task the policy can solve it usually solves on every
attempt), so an interval that treats k attempts at n tasks as n·k coin flips (Wilson, normal) is too
narrow whenever k > 1. Every interval here resamples *tasks* (the cluster bootstrap), keeping each
task's attempts together; paired comparisons resample the same tasks for both policies, so the task
difficulty they share cancels out (the paired bootstrap of Efron & Tibshirani, ch. 16).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

DEFAULT_RESAMPLES = 4000


def _quantiles(samples: np.ndarray, level: float) -> tuple[float, float]:
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(samples, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def task_bootstrap_ci(counts: Sequence[tuple[int, int]], level: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
                      seed: int = 0) -> tuple[float, float]:
    """Interval for the pooled rate sum(c)/sum(n) from per-task (n valid attempts, c successes).

    Tasks with no valid attempt carry no information and are left out. NaNs when none is left."""
    kept = np.array([(n, c) for n, c in counts if n > 0], dtype=float).reshape(-1, 2)
    if len(kept) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(kept), size=(resamples, len(kept)))
    n, c = kept[idx, 0].sum(axis=1), kept[idx, 1].sum(axis=1)
    return _quantiles(c / n, level)


def mean_bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
                      seed: int = 0) -> tuple[float, float]:
    """Interval for the mean of per-task values (e.g. pass@1 per task); NaN values are left out."""
    kept = np.array([v for v in values if not math.isnan(v)], dtype=float)
    if len(kept) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = kept[rng.integers(0, len(kept), size=(resamples, len(kept)))].mean(axis=1)
    return _quantiles(means, level)


def paired_bootstrap_diff(a: Mapping[str, float], b: Mapping[str, float], level: float = 0.95,
                          resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> tuple[float, float, float, int]:
    """mean(a - b) over the tasks both have (NaNs dropped), with a paired bootstrap interval.

    Returns (difference, low, high, tasks). Raises ValueError when the two share no task: a comparison
    on different tasks is not paired and would mislead."""
    common = sorted(t for t in a.keys() & b.keys() if not (math.isnan(a[t]) or math.isnan(b[t])))
    if not common:
        raise ValueError("paired comparison needs results on the same tasks; the two share none")
    diff = np.array([a[t] - b[t] for t in common], dtype=float)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    lo, hi = _quantiles(means, level)
    return float(diff.mean()), lo, hi, len(common)
