"""BAR and fixed-size sampling on synthetic reward sources with known outcomes."""

import math
import random

import pytest

from components.core.data.schema import EpisodeStatus as S
from components.core.data.schema import Outcome, Trajectory
from components.rl.sampling import group_advantages, outcome_reward
from components.rl.sampling import (
    Attempt,
    RolloutBudget,
    RolloutConfig,
    sample_batch,
    sample_prompt,
    summarize,
)

P, N = +1.0, -1.0
CRASH = (None, S.aborted)  # sandbox crash: no verified outcome
TIMEOUT = (None, S.time_truncated)  # service timed out before verification: no verified outcome


class ScriptedSource:
    """Returns the next outcomes of a fixed script per prompt, and counts every call."""

    def __init__(self, scripts: dict[str, list]):
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.calls: list[tuple[str, int]] = []

    def __call__(self, prompt_id: str, n: int) -> list[Attempt]:
        self.calls.append((prompt_id, n))
        out = []
        for _ in range(n):
            item = self.scripts[prompt_id].pop(0)
            reward, status = item if isinstance(item, tuple) else (item, S.completed)
            out.append(Attempt(reward=reward, status=status))
        return out


class BernoulliSource:
    """Pass rate p per prompt; a fraction of attempts crash or time out in the infrastructure."""

    def __init__(self, rates: dict[str, float], infra_rate: float = 0.0, seed: int = 0):
        self.rates, self.infra_rate, self.rng = rates, infra_rate, random.Random(seed)

    def __call__(self, prompt_id: str, n: int) -> list[Attempt]:
        out = []
        for _ in range(n):
            if self.rng.random() < self.infra_rate:
                out.append(Attempt(reward=None, status=self.rng.choice([S.aborted, S.time_truncated])))
            else:
                out.append(Attempt(reward=P if self.rng.random() < self.rates[prompt_id] else N))
        return out


def cfg(**kw) -> RolloutConfig:
    return RolloutConfig(**{"group_size": 8, "max_rollouts_per_prompt": 16, "stride": 4, **kw})


def rewards(result) -> list:
    return [a.reward for a in result.group]


def test_all_fail_and_all_pass_prompts_spend_the_budget_and_are_dropped():
    src = ScriptedSource({"p0": [N] * 16, "p1": [P] * 16})
    for pid in ("p0", "p1"):
        res = sample_prompt(pid, src, cfg(), RolloutBudget())
        r = res.record
        assert (r.generated, len(r.waves), r.rule, r.kept, r.drop_reason) == (16, 4, "widened", False, "zero_std")
        assert res.group == []
    assert src.calls == [("p0", 4)] * 4 + [("p1", 4)] * 4


def test_balanced_prompt_stops_after_the_first_stride():
    src = ScriptedSource({"half": [P, N] * 8})
    res = sample_prompt("half", src, cfg(stride=8), RolloutBudget())
    assert (res.record.generated, len(res.record.waves), res.record.rule) == (8, 1, "balanced")
    assert sorted(rewards(res)) == [N] * 4 + [P] * 4
    assert src.calls == [("half", 8)]
    # With a smaller stride it cannot assemble before N attempts exist, then stops at once.
    res = sample_prompt("half", ScriptedSource({"half": [P, N] * 8}), cfg(stride=4), RolloutBudget())
    assert res.record.generated == 8 and [w.balanced for w in res.record.waves] == [False, True]


def test_skewed_prompt_keeps_sampling_until_the_group_can_be_balanced():
    # N=8, [0.375, 0.625] -> 3..5 positives, target 4. Two positives in the first 8, a third at 12.
    script = [P, N, N, N, N, N, P, N] + [N, N, N, P] + [P] * 4
    res = sample_prompt("skew", ScriptedSource({"skew": script}), cfg(group_choice="ranked"), RolloutBudget())
    assert res.record.generated == 12 and res.record.rule == "balanced"
    assert res.record.group_positives == 3 and len(res.group) == 8
    # Published order: positives first in generation order, then the earliest negatives.
    assert res.record.group_indices == [0, 6, 11, 1, 2, 3, 4, 5]
    # Drawn (the default): the same counts, all three positives, five of the nine negatives.
    res = sample_prompt("skew", ScriptedSource({"skew": script}), cfg(), RolloutBudget(), seed=1)
    assert res.record.group_indices[:3] == [0, 6, 11] and res.record.group_positives == 3
    assert set(res.record.group_indices[3:]) < {1, 2, 3, 4, 5, 7, 8, 9, 10}


def test_budget_exhaustion_widens_to_any_mix():
    script = [N] * 9 + [P] + [N] * 6  # one success in 16: never balanced
    res = sample_prompt("rare", ScriptedSource({"rare": script}), cfg(), RolloutBudget())
    r = res.record
    assert (r.generated, r.rule, r.group_positives, r.kept) == (16, "widened", 1, True)
    assert sorted(rewards(res)) == [N] * 7 + [P]


def test_target_is_the_closest_feasible_positive_count():
    # One wave of 16 with 12 positives and 4 negatives: the target n+ = 4 can be filled.
    res = sample_prompt("hi", ScriptedSource({"hi": [P] * 12 + [N] * 4}), cfg(stride=16), RolloutBudget())
    assert res.record.group_positives == 4
    # Only 3 negatives: n+ must be >= 5, the range's upper end.
    res = sample_prompt("hi", ScriptedSource({"hi": [P] * 13 + [N] * 3}), cfg(stride=16), RolloutBudget())
    assert (res.record.rule, res.record.group_positives) == ("balanced", 5)
    # Only 2 negatives: no balanced group; widened picks 6 (closest to 4 that can be filled).
    res = sample_prompt("hi", ScriptedSource({"hi": [P] * 14 + [N] * 2}), cfg(stride=16), RolloutBudget())
    assert (res.record.rule, res.record.group_positives, res.record.kept) == ("widened", 6, True)


def test_infra_failures_are_never_negatives():
    # 4 successes and 4 crashes/timeouts first: counting those as -1 would "balance" after wave 1.
    script = [P, CRASH, P, TIMEOUT, P, CRASH, P, TIMEOUT] + [N, CRASH, N, N, N, P, P, P]
    res = sample_prompt("x", ScriptedSource({"x": script}), cfg(stride=8), RolloutBudget())
    r = res.record
    assert r.generated == 16 and [w.balanced for w in r.waves] == [False, True]
    assert (r.pool_aborted, r.group_positives) == (5, 4)
    assert all(a.reward is not None for a in res.group)
    assert all(a.index not in (1, 3, 5, 7, 9) for a in res.group)


def test_too_few_verified_attempts_fall_back_to_top_ranked_and_drop_the_group():
    script = [CRASH] * 5 + [P, P, P, N, N, N] + [TIMEOUT] * 5
    res = sample_prompt("sick", ScriptedSource({"sick": script}), cfg(), RolloutBudget())
    r = res.record
    assert (r.rule, r.kept, r.drop_reason, r.group_size) == ("top_ranked", False, "aborted", 8)
    assert r.group_indices[:6] == [5, 6, 7, 8, 9, 10]  # verified attempts rank above aborted ones
    assert res.group == []


def test_ranking_prefers_completed_over_truncated_and_time_truncated_goes_to_backfill():
    script = [(N, S.truncated)] * 4 + [(N, S.time_truncated)] * 4 + [P] * 4 + [N] * 4
    res = sample_prompt("r", ScriptedSource({"r": script}), cfg(stride=16, group_choice="ranked"), RolloutBudget())
    r = res.record
    assert r.rule == "balanced" and r.group_positives == 4
    assert r.waves[0].backfill == 4  # the time-truncated ones
    assert r.group_indices == [8, 9, 10, 11, 12, 13, 14, 15]  # completed negatives beat truncated ones
    # Time-truncated attempts may count as verified negatives when configured so.
    res = sample_prompt(
        "r",
        ScriptedSource({"r": [(N, S.time_truncated)] * 4 + [P] * 4}),
        cfg(stride=8, time_truncated_to_backfill=False),
        RolloutBudget(),
    )
    assert res.record.rule == "balanced" and res.record.generated == 8


# The pool of the review: 2 successes, 7 completed failures, 7 failures cut by the step limit (N = 8 of 16).
FINDING_POOL = [
    P,
    N,
    (N, S.truncated),
    N,
    (N, S.truncated),
    N,
    (N, S.truncated),
    N,
    (N, S.truncated),
    N,
    (N, S.truncated),
    P,
    (N, S.truncated),
    N,
    (N, S.truncated),
    N,
]


def test_failures_are_drawn_without_regard_to_how_they_ended():
    """Ranked (published BAR), completed > truncated put every step-limit loop last: the group took 6 completed
    failures and never a truncated one, so looping to the step limit was never penalised. Drawn (the default,
    seeded by run seed, step and prompt), each failure is trained with probability 6/14 and the group's truncated
    share is the pool's (7/14) in expectation: 3 of the 6 negatives."""
    draws = 3000
    included: dict[int, int] = {}
    truncated = 0
    for step in range(draws):
        res = sample_prompt("f", ScriptedSource({"f": FINDING_POOL}), cfg(), RolloutBudget(), step=step)
        assert (res.record.generated, res.record.rule, res.record.group_positives) == (16, "widened", 2)
        truncated += sum(a.status is S.truncated for a in res.group)
        for i in res.record.group_indices:
            included[i] = included.get(i, 0) + 1
    # Hypergeometric(14, 7, 6): mean 3, sd 0.96 per draw, so 0.1 is ~6 standard errors of the mean of 3000.
    assert truncated / draws == pytest.approx(3.0, abs=0.1)
    failures = [i for i, x in enumerate(FINDING_POOL) if x != P]
    assert all(included[i] == draws for i in (0, 11))  # both successes, always
    assert all(included.get(i, 0) / draws == pytest.approx(6 / 14, abs=0.05) for i in failures)
    again = sample_prompt("f", ScriptedSource({"f": FINDING_POOL}), cfg(), RolloutBudget(), step=7)
    assert (
        again.record.group_indices
        == sample_prompt("f", ScriptedSource({"f": FINDING_POOL}), cfg(), RolloutBudget(), step=7).record.group_indices
    )  # seeded
    ranked = sample_prompt("f", ScriptedSource({"f": FINDING_POOL}), cfg(group_choice="ranked"), RolloutBudget())
    assert sum(a.status is S.truncated for a in ranked.group) == 0  # the published order: never one
    assert (ranked.record.pool_truncated, ranked.record.group_truncated) == (7, 0)
    assert summarize([ranked.record])["trained_truncated_fraction"] == 0.0
    assert summarize([ranked.record])["pool_truncated_fraction"] == 7 / 16


def test_batch_replenishes_from_more_prompts_until_full():
    src = ScriptedSource({"p0": [N] * 16, "a": [P, N] * 8, "p1": [P] * 16, "b": [N, P] * 8, "c": [P, N] * 8})
    batch = sample_batch(iter(["p0", "a", "p1", "b", "c"]), src, cfg(batch_prompts=2, stride=8), RolloutBudget())
    assert batch.stop_reason == "full"
    assert [r.prompt_id for r in batch.records] == ["p0", "a", "p1", "b"]  # "c" never pulled
    assert [r.kept for r in batch.records] == [False, True, False, True]
    assert batch.generated == 16 + 8 + 16 + 8
    assert len(batch.groups) == 2 and all(len(g) == 8 for g in batch.groups)


def test_global_budget_and_prompt_cap_stop_the_batch():
    budget = RolloutBudget(total=20)
    src = ScriptedSource({"a": [P, N] * 8, "z": [N] * 16})
    batch = sample_batch(iter(["a", "z", "a"]), src, cfg(batch_prompts=3, stride=8), budget)
    assert batch.stop_reason == "budget" and budget.remaining == 0
    z = batch.records[1]
    assert (z.generated, z.budget_exhausted, z.drop_reason) == (12, True, "zero_std")
    assert src.calls == [("a", 8), ("z", 8), ("z", 4)]

    src = ScriptedSource({f"z{i}": [N] * 16 for i in range(5)})
    batch = sample_batch(iter(f"z{i}" for i in range(5)), src, cfg(max_prompts_per_batch=3), RolloutBudget())
    assert batch.stop_reason == "prompt_cap" and len(batch.records) == 3 and batch.groups == []

    batch = sample_batch(iter([]), src, cfg(), RolloutBudget())
    assert batch.stop_reason == "prompts_exhausted"


def test_fixed_sampler_uses_exactly_n_and_excludes_infra_failures():
    src = ScriptedSource({"f": [P, CRASH, N, N, TIMEOUT, N, P, N], "u": [N] * 8})
    res = sample_prompt("f", src, cfg(sampler="fixed"), RolloutBudget())
    assert (res.record.generated, res.record.kept, len(res.group), res.record.pool_aborted) == (8, True, 6, 2)
    assert sorted(rewards(res)) == [N, N, N, N, P, P]
    res = sample_prompt("u", src, cfg(sampler="fixed"), RolloutBudget())
    assert (res.record.kept, res.record.drop_reason) == (False, "zero_std")


def test_kept_groups_never_hold_infra_failures_under_random_faults():
    rates = {f"t{i}": p for i, p in enumerate([0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0] * 6)}
    for sampler in ("bar", "fixed"):
        src = BernoulliSource(rates, infra_rate=0.25, seed=1)
        budget = RolloutBudget(total=600)
        prompts = iter(rates)
        kept = 0
        for step in range(6):
            batch = sample_batch(prompts, src, cfg(sampler=sampler, batch_prompts=3), budget, step=step)
            for g in batch.groups:
                assert all(a.reward is not None and a.status is not S.aborted for a in g)
                adv = group_advantages([a.reward for a in g])
                assert abs(sum(adv)) < 1e-9 and any(x > 0 for x in adv)
                kept += 1
        assert kept > 0


def test_summary_counts_informative_groups_per_trajectory():
    src = ScriptedSource({"p0": [N] * 16, "a": [P, N] * 8})
    batch = sample_batch(iter(["p0", "a"]), src, cfg(batch_prompts=2, stride=8), RolloutBudget())
    s = summarize(batch.records)
    assert s["trajectories"] == 24 and s["informative_groups"] == 1
    assert s["informative_groups_per_trajectory"] == pytest.approx(1 / 24)
    assert s["dropped_zero_std"] == 1 and s["rule_balanced"] == 1 and s["rule_widened"] == 1


def test_source_must_return_what_was_asked_and_config_is_validated():
    with pytest.raises(ValueError, match="asked for 4"):
        sample_prompt("x", lambda pid, n: [], cfg(), RolloutBudget())
    with pytest.raises(ValueError, match="rho_min"):
        RolloutConfig(rho_min=0.7, rho_max=0.6)
    with pytest.raises(ValueError, match="raise N_max"):
        RolloutConfig(group_size=8, max_rollouts_per_prompt=4)
    with pytest.raises(ValueError, match="no whole number"):
        RolloutConfig(group_size=2, rho_min=0.6, rho_max=0.9)
    with pytest.raises(ValueError):
        RolloutConfig(strid=3)


# --- rewards and advantages --------------------------------------------------------------------
def _traj(outcome: Outcome) -> Trajectory:
    return Trajectory(task_id="t", recipe="swe", policy_id="p", outcome=outcome)


def test_rewards_come_only_from_verified_outcomes():
    assert outcome_reward(_traj(Outcome.resolved)) == 1.0
    assert outcome_reward(_traj(Outcome.unresolved)) == -1.0
    assert outcome_reward(_traj(Outcome.infra_error)) is None


def test_group_advantages():
    assert group_advantages([1, 1, -1, -1]) == pytest.approx([1, 1, -1, -1])
    mean, std = -0.5, math.sqrt(0.75)
    assert group_advantages([1, -1, -1, -1]) == pytest.approx([(1 - mean) / std] + [(-1 - mean) / std] * 3)
    assert group_advantages([-1, -1, -1]) == [0.0, 0.0, 0.0]
    assert group_advantages([]) == []


@pytest.mark.parametrize("sampler", ["fixed", "bar"])
def test_infra_failures_never_enter_a_group_mean_or_std(sampler):
    verified = [_traj(Outcome.resolved), _traj(Outcome.unresolved), _traj(Outcome.unresolved)]
    crashed = _traj(Outcome.infra_error).model_copy(update={"status": S.aborted})
    with pytest.raises(ValueError, match="without a verified reward"):
        group_advantages([outcome_reward(t) for t in verified + [crashed]])

    # The RL stage's path: episodes -> attempts (as EpisodeSource builds them) -> the sampler's group and
    # advantages. The crash must leave the group and the baseline, so the siblings get exactly the
    # verified-only advantages, not the ones counting it as a failure.
    def source(prompt_id, n):
        return [
            Attempt(reward=outcome_reward(t), status=t.status, attempt_id=t.id, payload=t)
            for t in (verified + [crashed])[:n]
        ]

    config = RolloutConfig(
        sampler=sampler,
        group_size=3 if sampler == "bar" else 4,
        max_rollouts_per_prompt=4,
        stride=4,
        rho_min=0.0,
        rho_max=0.5,
        advantage_baseline="group",
    )
    result = sample_prompt("p", source, config, RolloutBudget())
    assert result.record.kept and [a.payload for a in result.group] == verified
    advantages = [a.advantage for a in result.group]
    assert advantages == pytest.approx(group_advantages([1, -1, -1]))
    assert advantages != pytest.approx(group_advantages([1, -1, -1, -1])[:3])  # what counting it would give
    assert result.record.pool_aborted == 1
