"""The sampler's options on synthetic sources with known pass rates: early abandon, history-aware
selection, prefix-fork sampling, DAPO refill and the pool baseline of the advantages."""

import math

import pytest

from components.rl.sampling import group_advantages
from components.rl.sampling import (
    Attempt,
    PromptHistory,
    RolloutBudget,
    RolloutConfig,
    p_mixed,
    sample_batch,
    sample_prompt,
    summarize,
)
from components.rl.sampling.synthetic import SyntheticPrompt, SyntheticSource

P, N = +1.0, -1.0


def prompts(**rates) -> dict[str, SyntheticPrompt]:
    return {k: SyntheticPrompt(pass_rate=v, steps=10) for k, v in rates.items()}


def adaptive(**kw) -> RolloutConfig:
    return RolloutConfig(**{"sampler": "fixed", "stride": 4, "early_stop": True, **kw})


class ScriptedForks(SyntheticSource):
    """On-policy attempts from pass rates; forked attempts from a fixed script (exact outcomes)."""

    def __init__(self, rates: dict[str, SyntheticPrompt], forks: list[float]):
        super().__init__(rates)
        self.forks = list(forks)

    def fork(self, prompt_id, n, fraction):
        out = super().fork(prompt_id, n, fraction)
        for a in out:
            a.reward = self.forks.pop(0)
        return out


# --- option 1: sequential early abandon ----------------------------------------------------------
def test_never_solved_prompt_is_abandoned_after_the_first_wave():
    src = SyntheticSource(prompts(zero=0.0, one=1.0))
    for pid, positive in (("zero", False), ("one", True)):
        res = sample_prompt(pid, src, adaptive(), RolloutBudget())
        r = res.record
        assert (r.generated, r.rule, r.drop_reason, r.kept) == (4, "abandoned", "abandoned", False)
        # Beta(1, 1) prior, 4 equal outcomes: P(the 4 still to come agree) = 5/9 >= 0.5.
        assert r.waves[0].p_rest_uniform == pytest.approx(5 / 9)
        assert r.waves[0].decision == "abandon" and res.group == []
    # Without the option the same prompt costs the full group.
    res = sample_prompt("zero", SyntheticSource(prompts(zero=0.0)), RolloutConfig(sampler="fixed"), RolloutBudget())
    assert (res.record.generated, res.record.drop_reason) == (8, "zero_std")


def test_mixed_first_wave_continues_and_a_higher_threshold_keeps_sampling():
    src = SyntheticSource(prompts(half=0.5))
    res = sample_prompt("half", src, adaptive(stride=2), RolloutBudget())
    assert res.record.generated == 8 and res.record.kept and len(res.group) == 8
    res = sample_prompt("zero", SyntheticSource(prompts(zero=0.0)), adaptive(abandon_threshold=0.6), RolloutBudget())
    assert res.record.generated == 8 and [w.decision for w in res.record.waves] == ["continue", "done"]


def test_bar_with_early_stop_abandons_once_the_posterior_is_sure():
    # N_max = 16: after 4 failures P(12 more fail) = 5/17 < 0.5; after 8, P(8 more) = 9/17 >= 0.5.
    res = sample_prompt(
        "zero",
        SyntheticSource(prompts(zero=0.0)),
        RolloutConfig(sampler="bar", stride=4, early_stop=True),
        RolloutBudget(),
    )
    assert res.record.generated == 8 and res.record.rule == "abandoned"
    assert [w.p_rest_uniform for w in res.record.waves] == pytest.approx([5 / 17, 9 / 17])
    res = sample_prompt(
        "zero", SyntheticSource(prompts(zero=0.0)), RolloutConfig(sampler="bar", stride=4), RolloutBudget()
    )
    assert res.record.generated == 16


# --- option 2: history across epochs ------------------------------------------------------------
def test_zero_variance_prompts_are_skipped_at_the_configured_rate():
    rates = prompts(**{f"z{i}": 0.0 for i in range(400)}, mixed=0.5)
    ids = sorted(rates)
    for explore, lo, hi in ((0.0, 0, 0), (1.0, 400, 400), (0.25, 72, 128)):  # 0.25 * 400 = 100 +- 3.2 sigma
        cfg = adaptive(history=True, skip_explore=explore, batch_prompts=1000, max_prompts_per_batch=1000)
        history, src = PromptHistory(cfg, seed=3), SyntheticSource(rates)
        first = sample_batch(iter(ids), src, cfg, RolloutBudget(), history=history)
        assert sum(r.rule == "skipped" for r in first.records) == 0
        assert history.get("z0").model_dump(include={"alpha", "beta", "uniform_streak"}) == {
            "alpha": 1.0,
            "beta": 5.0,
            "uniform_streak": 1,
        }
        second = sample_batch(iter(ids), src, cfg, RolloutBudget(), history=history)
        sampled = [r.prompt_id for r in second.records if r.rule != "skipped"]
        assert lo <= len([p for p in sampled if p != "mixed"]) <= hi
        assert "mixed" in sampled or history.get("mixed").uniform_streak > 0
        assert all(r.generated == 0 and r.drop_reason == "skipped" for r in second.records if r.rule == "skipped")


def test_posterior_is_the_next_visits_prior_and_lookahead_prefers_a_mixed_group():
    cfg = adaptive(history=True, lookahead=3)
    history = PromptHistory(cfg)
    src = SyntheticSource(prompts(x=0.0, y=0.5, z=0.5))
    sample_prompt("x", src, cfg, RolloutBudget(), history=history)  # 4 failures: Beta(1, 5)
    history.update("y", [Attempt(reward=r) for r in (P, P, N, N)])  # Beta(3, 3)
    assert list(history.prefer(iter(["x", "z", "y"]))) == ["y", "z", "x"]
    assert p_mixed(3, 3, 8) > p_mixed(1, 1, 8) > p_mixed(1, 5, 8)
    res = sample_prompt("x", src, cfg, RolloutBudget(), history=history)
    # The carried posterior Beta(1, 5) is the prior: after 4 more failures P(4 more) = B(1,13)/B(1,9) = 9/13.
    assert res.record.prior == (1.0, 5.0) and res.record.waves[0].p_rest_uniform == pytest.approx(9 / 13)


def test_history_must_be_passed_when_enabled():
    with pytest.raises(ValueError, match="PromptHistory"):
        sample_batch(iter(["a"]), SyntheticSource(prompts(a=0.5)), adaptive(history=True), RolloutBudget())
    with pytest.raises(ValueError, match="enable history"):
        RolloutConfig(lookahead=2)
    with pytest.raises(ValueError, match="early_stop or history"):
        RolloutConfig(sampler="fixed", stride=4, prefix_fork=True)
    with pytest.raises(ValueError, match="must be smaller"):
        RolloutConfig(sampler="fixed", stride=8, early_stop=True)


# --- option 3: prefix-fork sampling -------------------------------------------------------------
def test_unsolved_prompt_is_forked_from_a_teacher_prefix_and_its_steps_are_counted():
    src = ScriptedForks(prompts(zero=0.0), forks=[P, N, N, P])
    budget = RolloutBudget()
    res = sample_prompt("zero", src, adaptive(prefix_fork=True), budget)
    r = res.record
    assert src.calls == [("zero", 4, None), ("zero", 4, 0.5)]
    assert [w.decision for w in r.waves] == ["fork", "done"] and [w.forked for w in r.waves] == [False, True]
    assert (r.generated, r.forked, r.prefix_fraction, r.kept, r.group_positives) == (8, 4, 0.5, True, 2)
    assert [a.prefix_steps for a in res.group] == [0] * 4 + [5] * 4  # half of a 10-step teacher trajectory
    assert [a.env_steps for a in res.group] == [10] * 4 + [5] * 4
    assert (r.env_steps, r.prefix_steps, budget.env_steps, budget.spent) == (80, 20, 80, 8)
    s = summarize([r])
    assert (s["forked_trajectories"], s["env_steps"], s["prefix_env_steps"]) == (4, 80, 20)
    # No teacher trajectory: nothing to fork, the prompt is abandoned.
    no_teacher = {"zero": SyntheticPrompt(pass_rate=0.0, steps=10, has_teacher=False)}
    res = sample_prompt("zero", SyntheticSource(no_teacher), adaptive(prefix_fork=True), RolloutBudget())
    assert (res.record.generated, res.record.rule) == (4, "abandoned")


def test_prefix_fraction_adapts_and_never_solved_prompts_are_forked_not_skipped():
    cfg = RolloutConfig(sampler="fixed", stride=4, history=True, prefix_fork=True, skip_explore=0.0)
    history = PromptHistory(cfg)
    src = ScriptedForks(prompts(zero=0.0), forks=[N] * 4 + [P] * 4 + [P, N, N, N])
    first = sample_prompt("zero", src, cfg, RolloutBudget(), history=history)
    assert (first.record.generated, first.record.forked) == (8, 0)  # nothing known yet, no early stop
    fractions = []
    for _ in range(3):
        assert not history.skip("zero", forkable=True) and history.skip("zero", forkable=False)
        res = sample_prompt("zero", src, cfg, RolloutBudget(), history=history)
        assert res.record.forked == 4
        fractions.append(res.record.prefix_fraction)
    # All 4 forked failed -> longer prefix; all passed -> shorter; mixed -> unchanged.
    assert fractions == pytest.approx([0.5, 0.6, 0.5])
    assert history.get("zero").prefix_fraction == pytest.approx(0.5)
    assert history.get("zero").solved == 0  # forked successes never count as the policy solving it


# --- DAPO refill and batches --------------------------------------------------------------------
def test_dapo_refill_fills_the_batch_and_fixed_does_not():
    rates = prompts(**{f"u{i}": 0.0 for i in range(6)}, **{f"m{i}": 0.5 for i in range(6)})
    order = [f"{k}{i}" for i in range(6) for k in ("u", "m")]
    dapo = sample_batch(
        iter(order), SyntheticSource(rates, seed=1), RolloutConfig(sampler="fixed", batch_prompts=4), RolloutBudget()
    )
    assert dapo.stop_reason == "full" and len(dapo.groups) == 4 and all(len(g) == 8 for g in dapo.groups)
    assert [r.prompt_id for r in dapo.records] == order[:8] and dapo.generated == 64
    fixed = sample_batch(
        iter(order),
        SyntheticSource(rates, seed=1),
        RolloutConfig(sampler="fixed", batch_prompts=4, refill=False),
        RolloutBudget(),
    )
    assert [r.prompt_id for r in fixed.records] == order[:4] and len(fixed.groups) == 2


# --- advantages: GRPO over the prompt's whole pool --------------------------------------------------
def test_pool_advantages_are_grpo_on_the_whole_pool_in_expectation():
    """The review's pool (2 successes, 14 failures of 16; N = 8): GRPO over the chosen group gives a success
    +1.73 (+1.62 with TRL's sample std) whatever the pass rate; GRPO over the 16 gives +2.65. The pool rule
    gives the success +2.65 in every draw, and over the draw each attempt's expected advantage (included or
    not) is exactly its GRPO advantage over the 16: the group is an unbiased estimate of GRPO on the pool."""
    from tests.components.rl.test_rl_sampler import FINDING_POOL, ScriptedSource

    mean, std = -12 / 16, math.sqrt(1 - (12 / 16) ** 2)
    grpo = {P: (1 - mean) / std, N: (-1 - mean) / std}
    assert grpo[P] == pytest.approx(2.6458, abs=1e-4)
    draws, weight = 3000, [0.0] * 16
    for step in range(draws):
        res = sample_prompt("s", ScriptedSource({"s": FINDING_POOL}), RolloutConfig(), RolloutBudget(), step=step)
        advantages = [a.advantage for a in res.group]
        assert [adv for a, adv in zip(res.group, advantages) if a.reward > 0] == pytest.approx([grpo[P]] * 2)
        assert [adv for a, adv in zip(res.group, advantages) if a.reward < 0] == pytest.approx([grpo[N] * 14 / 6] * 6)
        assert sum(advantages) == pytest.approx(0.0, abs=1e-9)  # TRL's group centring leaves them as they are
        assert res.record.group_advantages == advantages
        for a in res.group:
            weight[a.index] += a.advantage / draws
    for i, outcome in enumerate(FINDING_POOL):
        assert weight[i] == pytest.approx(grpo[P] if outcome == P else grpo[N], abs=0.04), i
    # The published rule: GRPO over the balanced group, compressed whatever the pool's pass rate.
    res = sample_prompt(
        "s", ScriptedSource({"s": FINDING_POOL}), RolloutConfig(advantage_baseline="group"), RolloutBudget()
    )
    assert [a.advantage for a in res.group] == pytest.approx(group_advantages([a.reward for a in res.group]))
    assert max(a.advantage for a in res.group) == pytest.approx(1.5 / math.sqrt(0.75))
    # Fixed groups: the pool is the group, the rule is GRPO's either way.
    res = sample_prompt("h", SyntheticSource(prompts(h=0.5), seed=2), RolloutConfig(sampler="fixed"), RolloutBudget())
    assert res.record.kept
    assert [a.advantage for a in res.group] == pytest.approx(group_advantages([a.reward for a in res.group]))


def test_positives_drawn_from_a_larger_side_stand_for_all_of_it():
    """12 successes and 4 failures in one wave of 16: BAR trains 4 of the 12 successes (drawn) and all 4
    failures; each drawn success stands for 3, so the success side weighs what GRPO over the 16 gives it."""
    from tests.components.rl.test_rl_sampler import ScriptedSource

    script = [P] * 12 + [N] * 4
    res = sample_prompt("s", ScriptedSource({"s": script}), RolloutConfig(stride=16), RolloutBudget(), seed=3)
    std = math.sqrt(1 - 0.5**2)
    assert sorted(a.advantage for a in res.group) == pytest.approx([(-1 - 0.5) / std] * 4 + [3 * (1 - 0.5) / std] * 4)
    assert {a.index for a in res.group} >= {12, 13, 14, 15} and res.record.group_positives == 4


# --- the synthetic source and the comparison ----------------------------------------------------
def test_synthetic_source_uses_common_random_numbers_and_the_prefix_rule():
    a, b = SyntheticSource(prompts(q=0.3), seed=5), SyntheticSource(prompts(q=0.3), seed=5)
    first = [x.reward for x in a("q", 3)] + [x.reward for x in a("q", 5)]
    assert first == [x.reward for x in b("q", 8)]
    assert a.forked_pass_rate("q", 0.5) == pytest.approx(0.3 + 0.7 * 0.25)
    forked = SyntheticSource(prompts(z=0.0), seed=0).fork("z", 2000, 0.5)
    assert abs(sum(x.reward > 0 for x in forked) / 2000 - 0.25) < 0.04


def test_comparison_arms_spend_equal_trajectories_and_the_fork_gain_is_the_assumptions():
    import math
    import random

    from scripts.compare_rollout import ARMS, HEADLINE, POPULATIONS, run_arm, synthetic_prompts

    rng = random.Random(0)
    ps = synthetic_prompts([POPULATIONS["bimodal"](rng) for _ in range(96)], 0, 0.8)
    per, spent = {}, {}
    for arm in ("fixed N=8", "DAPO N=8", "+ history", HEADLINE):
        for exponent in (2.0, math.inf):
            s = summarize(
                run_arm(
                    ARMS[arm].model_copy(update={"batch_prompts": 8, "max_prompts_per_batch": 960}),
                    ps,
                    2000,
                    0,
                    prefix_exponent=exponent,
                )
            )
            per[arm, exponent], spent[arm, exponent] = s["informative_groups_per_trajectory"], s["trajectories"]
    assert set(spent.values()) == {2000}  # equal trajectories in every arm, not equal passes
    assert per["DAPO N=8", 2.0] == per["fixed N=8", 2.0]  # same stream, same draws: refill changes batches only
    assert per[HEADLINE, 2.0] > 1.5 * per["fixed N=8", 2.0]
    # Forking adds nothing (p_fork = p): the fork arm's edge over history alone is gone. It came from the formula.
    assert per[HEADLINE, math.inf] <= 1.02 * per["+ history", math.inf]
    assert per[HEADLINE, 2.0] > per["+ history", 2.0]


def test_arm_ratio_plot_draws_one_bar_per_population_and_arm():
    from components.rl.plots import plot_arm_ratios

    rows = [
        {"population": p, "arm": a, "informative_groups_per_trajectory": v}
        for p, a, v in [
            ("hard", "fixed", 0.05),
            ("hard", "ours", 0.08),
            ("bimodal", "fixed", 0.04),
            ("bimodal", "ours", 0.1),
        ]
    ]
    fig = plot_arm_ratios(rows, "fixed")
    heights = sorted(round(b.get_height(), 6) for b in fig.axes[0].patches)
    assert heights == [1.0, 1.0, 1.6, 2.5]


def test_a_prompt_whose_forks_fail_from_the_longest_prefix_is_skipped_again():
    cfg = RolloutConfig(
        sampler="fixed",
        stride=4,
        history=True,
        prefix_fork=True,
        skip_explore=0.0,
        prefix_fraction=0.8,
        prefix_fraction_max=0.9,
    )
    history = PromptHistory(cfg)
    src = ScriptedForks(prompts(zero=0.0), forks=[N] * 8)
    sample_prompt("zero", src, cfg, RolloutBudget(), history=history)  # no history yet: 8 on-policy failures
    fractions = []
    while not history.skip("zero", forkable=True):
        fractions.append(sample_prompt("zero", src, cfg, RolloutBudget(), history=history).record.prefix_fraction)
    assert fractions == pytest.approx([0.8, 0.9]) and history.get("zero").fork_stuck


def test_every_comparison_arm_is_a_valid_config():
    from scripts.compare_rollout import ARMS, REAL_ARMS

    assert {cfg.group_size for cfg in ARMS.values()} == {8}  # the same N in every arm
    from components.rl.config import RLConfig

    for arm, options in REAL_ARMS.items():
        cfg = RolloutConfig(**({"stride": 16} | options), batch_prompts=2, max_prompts_per_batch=64)
        assert cfg.group_size == 8 and (cfg.prefix_fork == (arm == "adaptive"))
        RLConfig(rollout=cfg)  # each real arm is a train_rl run: its options must be ones TRL can honour
