"""Confidence intervals and paired tests for rates measured on tasks, with attempts clustered by task.

Attempts at the same task are not independent (a task the policy can solve it usually solves on every
attempt), so an interval that treats k attempts at n tasks as n·k coin flips is too narrow whenever
k > 1. A plain bootstrap over tasks has the opposite failure at the small n and extreme rates we
evaluate at: it cannot see beyond the observed tasks, so 0/16 gives [0, 0] and p = 0.1 at 16 tasks
covers about 80 % at a stated 95 %.

The rates' intervals here are Clopper-Pearson intervals at an *effective* number of attempts
(Korn & Graubard 1998, "Confidence intervals for proportions with small expected number of positive
counts estimated from survey data"): the pooled attempts divided by the design effect, i.e. by how much
more the per-task results vary than independent attempts would (never below 1: attempts are never
counted as more than independent). At 0/n and n/n they stay exact and wide; at one attempt per task they
are plain Clopper-Pearson. `tests/components/test_intervals.py` checks their coverage by simulation,
0/n included.

Paired comparisons (candidate vs champion on the same tasks) use an exact sign-flip permutation test of
the per-task differences (`paired_sign_flip_p`): with one attempt per task it is the exact McNemar / sign
test; with k attempts it is Fisher's randomisation test. A paired difference is reported with Newcombe's
interval (`paired_difference_ci`): each arm's interval above, combined through the per-task correlation.

Units. Tasks are not always independent either: held-out tasks drawn from one repository (the same code
with another issue text; SWE-bench instances of one upstream project) succeed and fail together. Every
function here takes the tasks' units (`Task.unit`; task id -> unit for the paired ones) and then clusters by
unit instead of by task: the design effect is computed over units, and the sign-flip test flips a unit's
summed difference as one (flipping tasks of one unit apart is not a symmetry of the null when they move
together). With one task per unit this is exactly the per-task rule. `tests/components/test_intervals.py`
shows the per-task rule under-covering and over-rejecting when units repeat, and the unit rule holding.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

EXACT_FLIPS_UP_TO = 16  # nonzero differences enumerated exactly (2^16 sign patterns); Monte Carlo above


def clopper_pearson(successes: float, n: float, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval; `successes` and `n` may be fractional (an effective sample)."""
    from scipy.special import betaincinv  # the Beta quantile, without scipy.stats' per-call overhead (~100x)

    if n <= 0:
        return (float("nan"), float("nan"))
    alpha = 1.0 - level
    x = min(max(successes, 0.0), n)
    lo = 0.0 if x <= 0 else float(betaincinv(x, n - x + 1, alpha / 2))
    hi = 1.0 if x >= n else float(betaincinv(x + 1, n - x, 1 - alpha / 2))
    return lo, hi


def task_rate_ci(
    counts: Sequence[tuple[float, float]], level: float = 0.95, units: Sequence[str] | None = None
) -> tuple[float, float]:
    """Interval for the pooled rate sum(c)/sum(n) from per-task (n valid attempts, c successes), clustered by
    task, or by unit when `units` (one per task, aligned with `counts`) is given.

    Tasks with no valid attempt carry no information and are left out; NaNs when none is left."""
    if units is not None:
        counts = _by_unit([(n, c) for n, c in counts], units)
    kept = np.array([(n, c) for n, c in counts if n > 0], dtype=float).reshape(-1, 2)
    if len(kept) == 0:
        return (float("nan"), float("nan"))
    n, c = kept[:, 0], kept[:, 1]
    total, rate = n.sum(), c.sum() / n.sum()
    deff = 1.0
    if len(kept) > 1 and 0.0 < rate < 1.0:
        m = len(kept)
        var_cluster = m / (m - 1) * ((c - rate * n) ** 2).sum() / total**2  # ratio estimator over tasks
        deff = max(1.0, var_cluster / (rate * (1 - rate) / total))
    n_eff = total / deff
    return clopper_pearson(rate * n_eff, n_eff, level)


def task_mean_ci(
    values: Sequence[float], level: float = 0.95, attempts_per_task: int = 1, units: Sequence[str] | None = None
) -> tuple[float, float]:
    """Interval for the mean of per-task rates in [0, 1] (e.g. pass@1 per task from `attempts_per_task`
    attempts each), clustered by unit when `units` (aligned with `values`) is given; NaN values are left out."""
    keep = [i for i, v in enumerate(values) if not math.isnan(v)]
    k = max(1, attempts_per_task)
    return task_rate_ci(
        [(k, values[i] * k) for i in keep],
        level,
        None if units is None else [units[i] for i in keep],
    )


def _by_unit(counts: list[tuple[float, float]], units: Sequence[str]) -> list[tuple[float, float]]:
    """Per-task (n, c) summed per unit (a unit's tasks are one cluster)."""
    if len(units) != len(counts):
        raise ValueError(f"{len(units)} units for {len(counts)} tasks: give one unit per task")
    sums: dict[str, list[float]] = {}
    for (n, c), unit in zip(counts, units):
        total = sums.setdefault(unit, [0.0, 0.0])
        total[0] += n
        total[1] += c
    return [(n, c) for n, c in sums.values()]


def count_units(tasks: Sequence[str], units: Mapping[str, str] | None) -> int:
    """Independent units among `tasks` (task ids; a task without a unit is its own)."""
    return len({(units or {}).get(t, t) for t in tasks})


def common_tasks(a: Mapping[str, float], b: Mapping[str, float]) -> list[str]:
    """The tasks both results have a value for (NaN: no verified attempt); ValueError when none."""
    common = sorted(t for t in a.keys() & b.keys() if not (math.isnan(a[t]) or math.isnan(b[t])))
    if not common:
        raise ValueError("paired comparison needs results on the same tasks; the two share none")
    return common


def paired_sign_flip_p(
    a: Mapping[str, float],
    b: Mapping[str, float],
    margin: float = 0.0,
    resamples: int = 20000,
    seed: int = 0,
    units: Mapping[str, str] | None = None,
) -> tuple[float, float, int]:
    """One-sided p-value that `a` is no better than `b` over the tasks both have (NaNs dropped), by the
    exact sign-flip permutation test of the per-task differences d_i = a_i - b_i - margin, summed per unit
    when `units` (task id -> unit) is given.

    Under the null every d_i (every unit's sum) is as likely positive as negative (the two policies are
    exchangeable on each task, or unit), so p = P(sum of randomly signed |d| >= observed sum). Exact for up
    to `EXACT_FLIPS_UP_TO` nonzero differences (all sign patterns enumerated), else a Monte Carlo estimate
    with the (count + 1) / (resamples + 1) correction, which keeps the test valid. Returns
    (p, mean difference a - b over tasks, tasks). Raises ValueError when the two share no task."""
    common = common_tasks(a, b)
    raw = np.array([a[t] - b[t] for t in common], dtype=float)
    d = raw - margin
    if units is not None:
        sums: dict[str, float] = {}
        for task, value in zip(common, d):
            unit = units.get(task, task)
            sums[unit] = sums.get(unit, 0.0) + float(value)
        d = np.array(list(sums.values()), dtype=float)
    d = d[np.abs(d) > 1e-12]
    observed = d.sum()
    if len(d) == 0:
        return 1.0, float(raw.mean()), len(common)
    mags = np.abs(d)
    if len(d) <= EXACT_FLIPS_UP_TO:
        pattern_sums = _sign_patterns(len(d)) @ mags
        p = float(np.mean(pattern_sums >= observed - 1e-9))
    else:
        rng = np.random.default_rng(seed)
        signs = rng.choice((-1.0, 1.0), size=(resamples, len(d)))
        p = float((np.sum(signs @ mags >= observed - 1e-9) + 1) / (resamples + 1))
    return p, float(raw.mean()), len(common)


@functools.lru_cache(maxsize=EXACT_FLIPS_UP_TO + 1)
def _sign_patterns(m: int) -> np.ndarray:
    """Every one of the 2^m sign patterns of m differences, as rows (built once per m: the gate asks often)."""
    return np.array(list(itertools.product((-1.0, 1.0), repeat=m)))


def paired_difference_ci(
    a: Mapping[str, float],
    b: Mapping[str, float],
    level: float = 0.95,
    attempts_per_task: int = 1,
    units: Mapping[str, str] | None = None,
) -> tuple[float, float, float, int]:
    """mean(a - b) over the tasks both have (NaNs dropped) with Newcombe's paired interval (his method 10,
    Stat. Med. 1998): each arm's own interval (`task_mean_ci`: Clopper-Pearson at the effective number of
    attempts, clustered by unit when `units` is given) combined through the correlation of the per-task
    results. Unlike a bootstrap it stays an interval when every task agrees (0/16 vs 0/16: about +-0.21).
    Returns (difference, low, high, tasks)."""
    common = common_tasks(a, b)
    x, y = np.array([a[t] for t in common], dtype=float), np.array([b[t] for t in common], dtype=float)
    p1, p2 = float(x.mean()), float(y.mean())
    clusters = None if units is None else [units.get(t, t) for t in common]
    l1, u1 = task_mean_ci(list(x), level, attempts_per_task, clusters)
    l2, u2 = task_mean_ci(list(y), level, attempts_per_task, clusters)
    phi = float(np.corrcoef(x, y)[0, 1]) if len(common) > 1 and x.std() > 0 and y.std() > 0 else 0.0
    phi = max(phi, 0.0)  # a negative correlation only widens; taking 0 keeps the interval conservative
    low = (p1 - p2) - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = (p1 - p2) + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return p1 - p2, max(-1.0, low), min(1.0, high), len(common)


def paired_difference_over_seeds(
    runs: Mapping[int, tuple[Mapping[str, float], Mapping[str, float]]],
    level: float = 0.95,
    units: Mapping[str, str] | None = None,
) -> dict:
    """B - A over tasks and training seeds, from {seed: (a, b)} per-task scores (pass@1), with an interval that
    covers both sources of noise: which tasks were held out, and how training went (the seed).

    d_{i,s} = b_i - a_i on the tasks every seed verified in both arms; the estimate is their mean. Its standard
    error combines the SE of the per-unit means of d (tasks averaged within a unit when `units` maps task -> unit,
    so repeated repositories are not counted as independent; over seeds first) and the SE of the seed means of d;
    their sum of squares counts the task-by-seed interaction twice, so the interval is conservative. 95 %
    Student-t with Welch-Satterthwaite degrees of freedom (units - 1 with one seed, whose interval then covers
    task sampling only). Also the exact one-sided sign-flip p-value (`paired_sign_flip_p`, by unit) that B is no
    better than A, on the seed-averaged scores."""
    import statistics

    from scipy.stats import t as student_t

    tasks = sorted(set.intersection(*[set(common_tasks(a, b)) for a, b in runs.values()]))
    if not tasks:
        raise ValueError("no task has a verified result in both arms of every seed")
    d = {s: {t: b[t] - a[t] for t in tasks} for s, (a, b) in runs.items()}
    by_task = {t: statistics.fmean(d[s][t] for s in d) for t in tasks}
    groups: dict[str, list[float]] = {}
    for t, v in by_task.items():
        groups.setdefault((units or {}).get(t, t), []).append(v)
    by_unit = [statistics.fmean(v) for v in groups.values()]
    by_seed = [statistics.fmean(v.values()) for v in d.values()]
    mean = statistics.fmean(by_task.values())
    se_unit = statistics.stdev(by_unit) / math.sqrt(len(by_unit)) if len(by_unit) > 1 else float("nan")
    se_seed = statistics.stdev(by_seed) / math.sqrt(len(by_seed)) if len(by_seed) > 1 else 0.0
    se = math.sqrt(se_unit**2 + se_seed**2)
    parts = [(se_unit, len(by_unit) - 1), (se_seed, len(by_seed) - 1)]
    denominator = sum(v**4 / n for v, n in parts if n >= 1 and v > 0)  # Welch-Satterthwaite
    df = se**4 / denominator if denominator > 0 else len(by_unit) - 1
    # No task differs between the arms (se 0): a t-interval would be the point [d, d]; say "no interval".
    half = float(student_t.ppf(0.5 + level / 2, df)) * se if df >= 1 and se > 0 else float("nan")
    a_mean = {t: statistics.fmean(runs[s][0][t] for s in runs) for t in tasks}
    b_mean = {t: statistics.fmean(runs[s][1][t] for s in runs) for t in tasks}
    p, _, _ = paired_sign_flip_p(b_mean, a_mean, units=units)
    return {
        "difference": mean,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "level": level,
        "se": se,
        "se_units": se_unit,
        "se_seeds": se_seed,
        "df": df,
        "tasks": len(tasks),
        "units": len(by_unit),
        "seeds": len(by_seed),
        "seed_differences": dict(zip(d, by_seed)),
        "sign_flip_p": p,
        "a_pass_at_1": statistics.fmean(a_mean.values()),
        "b_pass_at_1": statistics.fmean(b_mean.values()),
    }
