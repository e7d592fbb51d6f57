"""The evaluation's intervals cover at their stated level, checked by simulation:
tasks with heterogeneous pass rates, k attempts each, small n and extreme rates (0/n) included."""

from __future__ import annotations

import numpy as np
import pytest

from components.core.statistics.intervals import clopper_pearson, task_mean_ci, task_rate_ci

SIMULATIONS = 400


def _coverage(rate: float, tasks: int, k: int, level: float, spread: float, seed: int) -> float:
    """Share of simulated evaluations whose interval holds the true mean pass rate. Task pass rates are
    Beta-distributed around `rate` (spread 0: every task has exactly `rate`)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(SIMULATIONS):
        if spread == 0 or rate in (0.0, 1.0):
            p = np.full(tasks, rate)
        else:
            a = rate * (1 / spread - 1)
            p = rng.beta(a, a * (1 - rate) / rate, size=tasks)
        c = rng.binomial(k, p)
        lo, hi = task_rate_ci([(k, int(x)) for x in c], level)
        hits += lo <= rate <= hi
    return hits / SIMULATIONS


@pytest.mark.parametrize("level", [0.95, 0.90])
@pytest.mark.parametrize(
    ("rate", "tasks", "k", "spread"),
    [
        (0.1, 16, 1, 0.0),  # the case a task bootstrap covered ~80 % at a stated 95 %
        (0.0, 16, 1, 0.0),  # 0/16: a bootstrap said [0, 0]
        (0.3, 16, 4, 0.3),  # clustered: k attempts per task, task rates spread out
        (0.1, 100, 4, 0.5),
        (0.5, 100, 4, 0.2),
    ],
)
def test_the_rate_interval_covers_at_its_stated_level(rate, tasks, k, spread, level):
    covered = _coverage(rate, tasks, k, level, spread, seed=7)
    # Monte Carlo error of 400 runs is ~1.1 points at 95 %: allow 3 of them below the level.
    assert covered >= level - 3 * np.sqrt(level * (1 - level) / SIMULATIONS)


def test_the_level_is_the_one_asked_for_and_0_of_n_is_not_a_point():
    lo95, hi95 = task_rate_ci([(1, 0)] * 16, 0.95)
    lo90, hi90 = task_rate_ci([(1, 0)] * 16, 0.90)
    assert lo95 == lo90 == 0.0 and hi95 > hi90 > 0.1  # exact: 1 - 0.025^(1/16) = 0.206
    assert hi95 == pytest.approx(1 - 0.025 ** (1 / 16), rel=1e-6)
    assert clopper_pearson(0, 16, 0.95) == (lo95, hi95)
    # k attempts per task at an all-or-nothing policy count as one attempt per task, not k
    lo, hi = task_rate_ci([(4, 4)] * 8 + [(4, 0)] * 8)
    cp_lo, cp_hi = clopper_pearson(8, 16)
    assert lo <= cp_lo and hi >= cp_hi and hi - lo == pytest.approx(cp_hi - cp_lo, rel=0.05)
    assert task_mean_ci([0.0] * 16, attempts_per_task=4) == task_rate_ci([(4, 0)] * 16)


@pytest.mark.parametrize(
    ("tasks", "k", "base", "gain"),
    [(16, 1, 0.0, 0.0), (16, 1, 0.3, 0.0), (16, 1, 0.2, 0.2), (40, 4, 0.3, 0.1), (100, 4, 0.1, 0.0)],
)
def test_the_paired_difference_interval_covers_at_its_stated_level(tasks, k, base, gain):
    """Two policies on the same tasks: task pass rates spread out, the second better by `gain` where it can be."""
    from components.core.statistics.intervals import paired_difference_ci

    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(SIMULATIONS):
        rates = np.zeros(tasks) if base == 0.0 else rng.beta(base * 2, (1 - base) * 2, size=tasks)
        better = np.clip(rates + gain, 0, 1)
        truth = float((better - rates).mean())
        names = [f"t{i}" for i in range(tasks)]
        a = dict(zip(names, rng.binomial(k, better) / k))
        b = dict(zip(names, rng.binomial(k, rates) / k))
        _, lo, hi, _ = paired_difference_ci(a, b, 0.95, attempts_per_task=k)
        hits += lo <= truth <= hi
    assert hits / SIMULATIONS >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / SIMULATIONS), hits / SIMULATIONS


def test_a_paired_difference_where_every_task_agrees_is_not_a_point():
    from components.core.statistics.intervals import paired_difference_ci

    zeros = {f"t{i}": 0.0 for i in range(16)}  # a task bootstrap gave [0, 0] here
    diff, lo, hi, n = paired_difference_ci(zeros, dict(zeros))
    assert (diff, n) == (0.0, 16) and lo < -0.15 and hi > 0.15


def _clustered_world(rng, units: int, per_unit: int, rate: float, spread: float):
    """Task ids, their units, and a policy's per-task pass rates where every task of a unit shares the unit's
    rate (the same repository with another issue text: solved or failed together)."""
    a = rate * (1 / spread - 1)
    names = [f"t{u}-{i}" for u in range(units) for i in range(per_unit)]
    unit_of = {n: n.split("-")[0] for n in names}

    def policy() -> np.ndarray:
        return np.repeat(rng.beta(a, a * (1 - rate) / rate, size=units), per_unit)

    return names, unit_of, policy


def test_the_rate_interval_clusters_by_unit_where_tasks_share_a_repository():
    """8 repositories x 4 tasks each: counted as 32 independent tasks the interval covers far below 95 %;
    clustered by repository it covers at its level."""
    rng = np.random.default_rng(5)
    names, unit_of, policy = _clustered_world(rng, units=8, per_unit=4, rate=0.3, spread=0.6)
    by_task = by_unit = 0
    for _ in range(SIMULATIONS):
        c = rng.binomial(1, policy())
        counts = [(1, int(x)) for x in c]
        lo, hi = task_rate_ci(counts, 0.95)
        by_task += lo <= 0.3 <= hi
        lo, hi = task_rate_ci(counts, 0.95, units=[unit_of[n] for n in names])
        by_unit += lo <= 0.3 <= hi
    floor = 0.95 - 3 * np.sqrt(0.95 * 0.05 / SIMULATIONS)
    assert by_unit / SIMULATIONS >= floor, by_unit / SIMULATIONS
    assert by_task / SIMULATIONS < floor, by_task / SIMULATIONS  # what counting tasks as independent claims
    assert task_mean_ci([0.5] * 4, units=["u"] * 4) == task_rate_ci([(1, 0.5)] * 4, units=["u"] * 4)
    with pytest.raises(ValueError, match="one unit per task"):
        task_rate_ci([(1, 1)] * 3, units=["u"])


def test_the_paired_test_flips_units_whole_and_keeps_its_size():
    """Two equally good policies, each better on some repositories and worse on others (every task of a
    repository the same way): flipping tasks one by one rejects 'no better' far more often than alpha;
    flipping each repository's summed difference as one keeps the size at alpha."""
    from components.core.statistics.intervals import count_units, paired_sign_flip_p

    rng = np.random.default_rng(9)
    names, unit_of, policy = _clustered_world(rng, units=10, per_unit=3, rate=0.4, spread=0.5)
    runs, alpha = 600, 0.05
    by_task = by_unit = 0
    for _ in range(runs):
        a = dict(zip(names, rng.binomial(4, policy()) / 4))
        b = dict(zip(names, rng.binomial(4, policy()) / 4))
        by_task += paired_sign_flip_p(a, b, resamples=1000, seed=1)[0] <= alpha
        by_unit += paired_sign_flip_p(a, b, resamples=1000, seed=1, units=unit_of)[0] <= alpha
    slack = 2 * np.sqrt(alpha * (1 - alpha) / runs)
    assert by_unit / runs <= alpha + slack, by_unit / runs
    assert by_task / runs > alpha + slack, by_task / runs
    assert count_units(names, unit_of) == 10 and count_units(names, None) == 30
    # one task per unit: the unit rule is the task rule
    a, b = {"x": 1.0, "y": 1.0, "z": 0.0}, {"x": 0.0, "y": 0.0, "z": 0.0}
    assert paired_sign_flip_p(a, b, units={"x": "1", "y": "2", "z": "3"}) == paired_sign_flip_p(a, b)
