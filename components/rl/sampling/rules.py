"""The per-prompt rules: the verified reward, BAR's group choice, the drop filter, the Beta posterior and the
advantages."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from components.core.data.schema import EpisodeStatus, Outcome, Trajectory
from components.rl.sampling.records import Attempt, DropReason


def outcome_reward(traj: Trajectory) -> float | None:
    """+1 resolved, -1 unresolved, None when the infrastructure failed (no verified outcome: never a reward)."""
    if traj.outcome is Outcome.infra_error:
        return None
    return 1.0 if traj.outcome is Outcome.resolved else -1.0


def positive_range(n: int, rho_min: float, rho_max: float) -> tuple[int, int]:
    """[ceil(rho_min N), floor(rho_max N)] (with a tolerance so 0.375 * 8 is exactly 3)."""
    return math.ceil(rho_min * n - 1e-9), math.floor(rho_max * n + 1e-9)


def target_positives(n: int, rho_min: float, rho_max: float) -> int:
    """round(rho* N) with rho* the midpoint; halves round up (not Python's banker's rounding)."""
    return math.floor((rho_min + rho_max) / 2 * n + 0.5)


def choose_positives(n_pos: int, n_neg: int, n: int, lo: int, hi: int, target: int) -> int | None:
    """The n+ in [lo, hi] closest to target that n_pos positives and n_neg negatives can fill, or None."""
    feasible = [k for k in range(lo, hi + 1) if k <= n_pos and n - k <= n_neg]
    return min(feasible, key=lambda k: (abs(k - target), k)) if feasible else None


def choose_members(side: list[Attempt], count: int, rng: random.Random | None) -> list[Attempt]:
    """`count` attempts of one side of the pool (its positives, or its negatives): drawn uniformly at random
    with `rng`, or, without one, the first `count` in rank order (published BAR: completed > truncated >
    time_truncated > aborted, then generation order). Returned in generation order either way."""
    chosen = side[:count] if rng is None else rng.sample(side, count)
    return sorted(chosen, key=lambda a: a.index)


def carries_reward(a: Attempt, time_truncated_to_backfill: bool) -> bool:
    """The one truncation rule, for every sampler: may this attempt's reward count anywhere (a group,
    the advantage baseline, the early-stop posterior, the history)?

    - No verified reward (infrastructure failure): never.
    - Cut by the step or token limit without a submit: yes, its verified reward. Both limits are
      functions of what the policy wrote, so the cut is the policy's outcome.
    - Cut by the wall-clock limit: with `time_truncated_to_backfill` (the default) never; without it,
      yes. The harness charges the wall-clock budget with policy time only (generation plus the
      commands' own run time inside the sandbox, `harness.py`), so sandbox latency cannot cause the
      cut; but generation time still moves with the load of a shared inference server, so by default
      a wall-clock cut is kept out of the rewards in both samplers, as BAR publishes for its backfill.
    """
    if a.aborted:
        return False
    return not (time_truncated_to_backfill and a.status is EpisodeStatus.time_truncated)


def split_pool(pool: list[Attempt], time_truncated_to_backfill: bool) -> tuple[list[Attempt], ...]:
    """(positives, negatives, backfill), each sorted by rank; backfill holds what carries no reward."""
    pos, neg, back = [], [], []
    for a in pool:
        if not carries_reward(a, time_truncated_to_backfill):
            back.append(a)
        elif a.reward > 0:  # type: ignore[operator]
            pos.append(a)
        else:
            neg.append(a)
    return tuple(sorted(p, key=lambda a: a.rank) for p in (pos, neg, back))


def drop_reason(group: list[Attempt], n: int | None, time_truncated_to_backfill: bool) -> DropReason | None:
    """Why a group cannot train, or None if it is informative."""
    if any(a.aborted for a in group):
        return "aborted"
    if not all(carries_reward(a, time_truncated_to_backfill) for a in group):
        return "time_truncated"  # BAR's top-ranked fill took a wall-clock cut: it may not carry its reward
    if len(group) < (n if n is not None else 2):
        return "short"
    rewards = [a.reward for a in group]
    if max(rewards) == min(rewards):  # type: ignore[type-var]
        return "zero_std"
    if not any(r > 0 for r in rewards):  # type: ignore[operator]
        return "no_positive"
    return None


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def p_all_same(alpha: float, beta: float, m: int, positive: bool) -> float:
    """P(the next m Bernoulli outcomes are all positive (or all negative)) under Beta(alpha, beta):
    E[p^m] = B(alpha + m, beta) / B(alpha, beta), E[(1 - p)^m] = B(alpha, beta + m) / B(alpha, beta)."""
    if m <= 0:
        return 1.0
    a, b = (alpha + m, beta) if positive else (alpha, beta + m)
    return math.exp(_log_beta(a, b) - _log_beta(alpha, beta))


def p_mixed(alpha: float, beta: float, n: int) -> float:
    """P(a fresh group of n holds both outcomes) under Beta(alpha, beta): how informative a prompt looks."""
    return max(0.0, 1.0 - p_all_same(alpha, beta, n, True) - p_all_same(alpha, beta, n, False))


def reward_variance(rewards: Sequence[float]) -> float:
    if not rewards:
        return 0.0
    mean = sum(rewards) / len(rewards)
    return sum((r - mean) ** 2 for r in rewards) / len(rewards)


def advantages(group: Sequence[float], baseline_from: Sequence[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / std for the group's rewards, with mean and (population) std taken over `baseline_from`:
    the group itself (GRPO's rule, `group_advantages`), or every verified attempt of the prompt (what
    `pool_advantages` then weights by each side's share in the group)."""
    if any(r is None for r in list(group) + list(baseline_from)):
        raise ValueError(
            "an attempt without a verified reward reached the advantage computation; "
            "the sampler must keep infra failures out of groups and baselines"
        )
    if not baseline_from:
        raise ValueError("empty baseline: no verified attempt for this prompt")
    mean = sum(baseline_from) / len(baseline_from)
    std = math.sqrt(reward_variance(baseline_from))
    return [0.0 if std < eps else (r - mean) / std for r in group]


def pool_advantages(group: Sequence[Attempt], pool: Sequence[Attempt]) -> list[float]:
    """GRPO's advantage over the whole verified pool, each group member weighted by the inverse of the share
    of its side (positives, or the rest) that the group holds (Horvitz-Thompson): a member drawn as one of
    6 of 14 negatives stands for 14/6 of them. With the members of each side drawn uniformly at random, the
    expected weight of every pool attempt is exactly its pool advantage, so the group's gradient is an
    unbiased estimate of GRPO on all of the pool; with +/-1 rewards the group's advantages sum to zero.
    `pool` is every attempt of the prompt that carries a reward, `group` a subset of it."""
    rewards = [a.reward for a in pool if a.reward is not None]
    group_rewards = [a.reward for a in group if a.reward is not None]
    if len(rewards) < len(pool) or len(group_rewards) < len(group):
        raise ValueError(
            "an attempt without a verified reward reached the advantage computation; "
            "the sampler must keep infra failures out of groups and baselines"
        )
    base = advantages(group_rewards, rewards)
    in_pool = {True: sum(r > 0 for r in rewards), False: sum(r <= 0 for r in rewards)}
    in_group = {True: sum(r > 0 for r in group_rewards), False: sum(r <= 0 for r in group_rewards)}
    return [adv * in_pool[r > 0] / in_group[r > 0] for r, adv in zip(group_rewards, base)]


def group_advantages(rewards: Sequence[float | None]) -> list[float]:
    """(r - mean) / std over one group (GRPO); zeros when every reward is equal; refuses an unverified reward."""
    return advantages(rewards, rewards) if rewards else []  # type: ignore[arg-type]
