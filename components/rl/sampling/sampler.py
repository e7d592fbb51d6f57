"""The group sampler: one loop, with BAR or fixed-size groups and three opt-in options.

Pure logic over an abstract `RolloutSource` (prompt id, n -> n attempts), so every rule can be tested
on synthetic reward sources with known pass rates; `components/rl/rollout.py` plugs in real sandbox episodes.

Groups (`sampler`):
- "fixed": N attempts per prompt (DAPO dynamic sampling when `refill`: uniform groups are dropped and
  more prompts are pulled until `batch_prompts` groups are informative).
- "bar", Balanced Adaptive Rollout (arXiv 2605.15040): `stride` attempts per wave up to N_max; after
  each wave choose n+ positives closest to round(rho* N) within [ceil(rho_min N), floor(rho_max N)]
  that the pool can fill (aborted / time-truncated attempts go to a backfill pile and never carry a
  reward into the balanced choice) and stop; when N_max is spent widen to [0, 1], then take the N
  top-ranked attempts (completed > truncated > time_truncated > aborted, then generation order);
  finally drop groups with an aborted sample, zero std or no positive. Which n+ positives and which
  N - n+ negatives fill the group: deviation 1.

Options (each decision lands in the prompt's `PromptRecord` / `StrideRecord`):
1. `early_stop`: after every wave whose verified attempts all agree, the Beta posterior of the pass
   rate (prior: `prior_alpha/beta`, or the prompt's history) gives the probability that every attempt
   still to come would agree too; at or above `abandon_threshold` the prompt is abandoned (or, when
   all failed and a teacher prefix exists, forked: option 3).
2. `history`: a per-prompt posterior carried across epochs (`PromptHistory`); prompts whose last
   `skip_after_uniform_visits` visits were zero-variance are skipped except with probability
   `skip_explore` (GRESO, arXiv 2506.02177); within a `lookahead` window prompts whose posterior makes
   a mixed group likeliest (pass rate nearest 1/2) go first; the posterior is the early-stop prior.
3. `prefix_fork`: for a prompt the policy does not solve (all of its first waves failed and the
   posterior says the rest would, or it was never solved in earlier epochs), the remaining attempts
   start from the state after the first `prefix_fraction` of a successful teacher trajectory (sandbox
   forked from that step's snapshot, or the prefix replayed). The prefix is context only (no loss),
   its length is recorded, and its environment steps count in the budget. The fraction adapts per
   prompt toward forked pass rate 1/2 (longer after all forked attempts fail, shorter after all pass).

Deviations from the published rule (BAR), numbered:
1. The group's members are drawn uniformly at random within each side of the pool (positives, negatives;
   `group_choice="random"`, seeded by the run's seed, the step and the prompt), not taken in rank order.
   Ranked, a completed failure always beat a step-truncated one: from 2 successes, 7 completed and 7
   step-truncated failures (N = 8 of 16) the group held 6 completed failures and never a truncated one,
   so looping to the step limit was never penalised while completed failures remained. Drawn, every
   failure is trained with the same probability (N - n+) / |negatives|, and the group's truncated share
   is the pool's in expectation (`PromptRecord.group_truncated` / `pool_truncated`). The counts n+ and
   N - n+ are still BAR's. `"ranked"` restores the published order.
2. Advantages are GRPO's over the whole verified pool, each member weighted by the inverse of its side's
   share in the group (`advantage_baseline="pool"`, `rules.pool_advantages`: a Horvitz-Thompson estimate),
   not GRPO's over the chosen group. BAR's group is deliberately balanced, so a group-level mean is ~0 and
   std ~1 whatever the prompt's pass rate: a success at 2 of 16 got +1.73 (+1.62 with TRL's sample std)
   where GRPO on the 16 gives +2.65, i.e. a prompt's weight in the update was compressed toward that of
   a prompt solved half the time. Weighted, the success gets +2.65 and each of the 6 failures drawn from 14
   gets -0.38 * 14 / 6 = -0.88; over the draw every pool attempt's expected weight is exactly its GRPO
   advantage on the pool, so the N-row group is an unbiased estimate of GRPO on all N_max-or-fewer
   attempts BAR generated (BAR decides which samples train, not how good each is judged or how much its
   prompt weighs). With +/-1 rewards the group's advantages sum to zero, so TRL's group centring leaves
   them unchanged (components/rl/stage.py: `scale_rewards="none"`). Two limits: the estimate is unbiased
   for members drawn at random (with `"ranked"` the weights only rescale a biased choice), and BAR's
   stopping rule depends on the outcomes, so the pool's pass rate is not an unbiased estimate of the
   prompt's. For fixed groups the pool is the group (weights 1): GRPO either way. `"group"` restores the
   published rule.
3. "Aborted" means no verified reward (`reward is None` or status `aborted`: sandbox crash, service
   timeout, a verification run's OOM, lost agent; a policy command's own OOM is its outcome, see
   components/core/episode/harness.py); such an attempt never carries a reward, and the final filter drops any
   group holding one.
   One truncation rule for both samplers (`rules.carries_reward`): a step/token cut is verified and
   carries its reward; a wall-clock cut carries none while `time_truncated_to_backfill` is on (the
   default) -- not in a group, a baseline, a posterior or the history -- and the final filter drops a
   top-N group holding one (published BAR let it carry its reward there; the fixed sampler counted it
   as an ordinary negative, so the two samplers disagreed). With the option off it is an ordinary
   verified attempt in both. The harness charges the wall-clock budget with policy time only, so
   sandbox latency can never cause the cut.
4. A group smaller than N (only when the global budget runs out mid-prompt) is dropped.
5. Fixed-size groups remove attempts without a verified reward (they never enter mean/std); such a group
   may train with fewer than N here, but the RL stage on TRL (exactly N rows per prompt) drops it as
   `short` (components/rl/rollout.py).
6. Options 1-3 are not part of BAR; with all three off, `group_choice="ranked"` and
   `advantage_baseline="group"` the sampler is the published rule.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Literal

from components.core.data.schema import EpisodeStatus
from components.rl.sampling.config import RolloutConfig
from components.rl.sampling.history import PromptHistory
from components.rl.sampling.records import (
    Attempt,
    PrefixForkSource,
    PromptRecord,
    PromptResult,
    RolloutBudget,
    RolloutSource,
    Rule,
    SampledBatch,
    StrideRecord,
    DropReason,
)
from components.rl.sampling.rules import (
    advantages,
    carries_reward,
    choose_members,
    choose_positives,
    drop_reason,
    p_all_same,
    pool_advantages,
    positive_range,
    reward_variance,
    split_pool,
    target_positives,
)


def _generate(
    source: RolloutSource,
    prompt_id: str,
    n: int,
    pool: list[Attempt],
    budget: RolloutBudget,
    fraction: float | None = None,
) -> int:
    new = source(prompt_id, n) if fraction is None else source.fork(prompt_id, n, fraction)  # type: ignore[attr-defined]
    if len(new) != n:
        raise ValueError(
            f"rollout source returned {len(new)} attempts for {prompt_id!r}, asked for {n}; "
            "a source must turn every failure into an attempt with reward=None"
        )
    for a in new:
        a.prompt_id, a.index = prompt_id, len(pool)
        pool.append(a)
    budget.charge(n, sum(a.env_steps + a.prefix_steps for a in new))
    return n


def _assemble(
    pool: list[Attempt], cfg: RolloutConfig, final: bool, rng: random.Random | None
) -> tuple[list[Attempt] | None, Rule]:
    """The group the pool allows now (BAR: balanced; at the end widened or top-ranked; fixed: verified).
    `rng` draws each side's members (`group_choice="random"`); None takes them in rank order."""
    n = cfg.group_size
    if cfg.sampler == "fixed":
        return (
            ([a for a in pool if carries_reward(a, cfg.time_truncated_to_backfill)], "fixed")
            if final
            else (None, "none")
        )
    target = target_positives(n, cfg.rho_min, cfg.rho_max)
    pos, neg, _ = split_pool(pool, cfg.time_truncated_to_backfill)
    k = choose_positives(len(pos), len(neg), n, *positive_range(n, cfg.rho_min, cfg.rho_max), target)
    if k is not None:
        return choose_members(pos, k, rng) + choose_members(neg, n - k, rng), "balanced"
    if not final:
        return None, "none"
    k = choose_positives(len(pos), len(neg), n, 0, n, target)
    if k is not None:
        return choose_members(pos, k, rng) + choose_members(neg, n - k, rng), "widened"
    return sorted(pool, key=lambda a: a.rank)[:n], "top_ranked"  # dropped by the final filter: no draw needed


def sample_prompt(
    prompt_id: str,
    source: RolloutSource,
    cfg: RolloutConfig,
    budget: RolloutBudget,
    step: int = 0,
    history: PromptHistory | None = None,
    seed: int = 0,
) -> PromptResult:
    """Sample one prompt under `cfg`; the result's group is empty unless it trains. `seed` (the run's), `step`
    and the prompt seed the draw of the group's members (`group_choice="random"`)."""
    rng = random.Random(f"group/{seed}/{step}/{prompt_id}") if cfg.group_choice == "random" else None
    cap = cfg.max_rollouts_per_prompt if cfg.sampler == "bar" else cfg.group_size
    stride = cfg.stride if cfg.waves_within_group else cfg.group_size
    stats = history.get(prompt_id) if history is not None else None
    prior = (stats.alpha, stats.beta) if stats is not None else (cfg.prior_alpha, cfg.prior_beta)
    can_fork = cfg.prefix_fork and isinstance(source, PrefixForkSource) and source.has_prefix(prompt_id)
    fraction = stats.prefix_fraction if stats is not None else cfg.prefix_fraction
    pool: list[Attempt] = []
    waves: list[StrideRecord] = []
    group: list[Attempt] | None = None
    rule: Rule = "none"
    forking = exhausted = abandoned = False
    while len(pool) < cap:
        want = min(stride, cap - len(pool), budget.remaining)
        if want <= 0:
            exhausted = True
            break
        generated = _generate(source, prompt_id, want, pool, budget, fraction if forking else None)
        pos, neg, back = split_pool(pool, cfg.time_truncated_to_backfill)
        group, rule = _assemble(pool, cfg, final=cfg.sampler == "fixed" and len(pool) >= cap, rng=rng)
        wave = StrideRecord(
            wave=len(waves),
            generated=generated,
            forked=forking,
            positives=len(pos),
            negatives=len(neg),
            backfill=len(back),
            balanced=rule == "balanced",
        )
        waves.append(wave)
        if group is not None:
            wave.decision = "done"
            break
        verified = [a.reward for a in pool if carries_reward(a, cfg.time_truncated_to_backfill)]
        if forking or not verified or (min(verified) != max(verified)):  # type: ignore[type-var]
            continue
        all_failed = verified[0] <= 0  # type: ignore[operator]
        alpha, beta = prior[0] + len(pos), prior[1] + len(neg)
        wave.p_rest_uniform = p_all_same(alpha, beta, cap - len(pool), positive=not all_failed)
        predicted = cfg.early_stop and wave.p_rest_uniform >= cfg.abandon_threshold
        known_unsolved = cfg.history and history is not None and history.never_solved(prompt_id)
        if all_failed and can_fork and (predicted or known_unsolved):
            forking, wave.decision = True, "fork"
        elif predicted:
            abandoned, wave.decision = True, "abandon"
            break
    if group is None and pool and not abandoned:
        group, rule = _assemble(pool, cfg, final=True, rng=rng)
    reason: DropReason | None
    if abandoned:
        group, rule, reason = [], "abandoned", "abandoned"
    else:
        group = group or []
        reason = (
            drop_reason(group, cfg.group_size if cfg.sampler == "bar" else None, cfg.time_truncated_to_backfill)
            if group
            else "short"
        )
    if reason is None:
        rewarded = [a for a in pool if carries_reward(a, cfg.time_truncated_to_backfill)]
        rewards = [a.reward for a in group]
        values = pool_advantages(group, rewarded) if cfg.advantage_baseline == "pool" else advantages(rewards, rewards)  # type: ignore[arg-type]
        for a, adv in zip(group, values):
            a.advantage = adv
    if history is not None and cfg.history and pool:
        history.update(prompt_id, pool)
    record = _record(
        step, prompt_id, cfg, pool, group, rule, reason, waves, exhausted, prior, fraction if forking else None
    )
    return PromptResult(group=group if reason is None else [], record=record)


def _record(
    step: int,
    prompt_id: str,
    cfg: RolloutConfig,
    pool: list[Attempt],
    group: list[Attempt],
    rule: Rule,
    reason: DropReason | None,
    waves: list[StrideRecord],
    exhausted: bool,
    prior: tuple[float, float] | None,
    fraction: float | None,
) -> PromptRecord:
    usable = [a for a in pool if carries_reward(a, cfg.time_truncated_to_backfill)]
    usable_rewards = [a.reward for a in usable if a.reward is not None]  # all of them: each carries a reward
    aborted = sum(a.aborted for a in pool)
    kept = reason is None and bool(group)
    cut = EpisodeStatus.truncated
    return PromptRecord(
        step=step,
        prompt_id=prompt_id,
        sampler=cfg.sampler,
        generated=len(pool),
        forked=sum(a.forked for a in pool),
        prefix_fraction=fraction,
        env_steps=sum(a.env_steps + a.prefix_steps for a in pool),
        prefix_steps=sum(a.prefix_steps for a in pool),
        pool_positives=sum(r > 0 for r in usable_rewards),
        pool_negatives=sum(r <= 0 for r in usable_rewards),
        pool_aborted=aborted,
        pool_time_truncated=len(pool) - len(usable) - aborted,
        pool_truncated=sum(a.status is cut for a in usable),
        prior=prior,
        waves=waves,
        rule=rule,
        group_indices=[a.index for a in group],
        group_attempt_ids=[a.attempt_id for a in group],
        group_positives=sum(
            1
            for a in group
            if carries_reward(a, cfg.time_truncated_to_backfill) and a.reward is not None and a.reward > 0
        ),
        group_size=len(group),
        group_truncated=sum(a.status is cut and not a.aborted for a in group),
        group_advantages=[a.advantage for a in group] if kept else [],
        group_reward_variance=reward_variance([a.reward for a in group]) if kept else 0.0,  # type: ignore[misc]
        kept=kept,
        drop_reason=reason,
        budget_exhausted=exhausted,
    )


def skipped_record(
    prompt_id: str, source: RolloutSource, cfg: RolloutConfig, history: PromptHistory | None, step: int = 0
) -> PromptRecord | None:
    """The record of a prompt `history` skips this visit (option 2), or None when it is to be sampled."""
    if not (cfg.history and history is not None):
        return None
    forkable = cfg.prefix_fork and isinstance(source, PrefixForkSource) and source.has_prefix(prompt_id)
    return _skipped(step, prompt_id, cfg, history) if history.skip(prompt_id, forkable) else None


def _skipped(step: int, prompt_id: str, cfg: RolloutConfig, history: PromptHistory) -> PromptRecord:
    s = history.get(prompt_id)
    return PromptRecord(
        step=step,
        prompt_id=prompt_id,
        sampler=cfg.sampler,
        generated=0,
        pool_positives=0,
        pool_negatives=0,
        pool_aborted=0,
        prior=(s.alpha, s.beta),
        rule="skipped",
        kept=False,
        drop_reason="skipped",
    )


def sample_batch(
    prompts: Iterator[str],
    source: RolloutSource,
    cfg: RolloutConfig,
    budget: RolloutBudget,
    step: int = 0,
    history: PromptHistory | None = None,
    seed: int = 0,
) -> SampledBatch:
    """Pull prompts until `batch_prompts` informative groups are kept (`refill`) or `batch_prompts`
    prompts were sampled, or a budget / cap / the stream stops it. `history` must outlive the batch
    (one per run) when `cfg.history` is on."""
    if cfg.history and history is None:
        raise ValueError(
            "RolloutConfig.history is on but no PromptHistory was passed; create one per run "
            "(PromptHistory(config, seed)) and pass it to every sample_batch call"
        )
    groups: list[list[Attempt]] = []
    records: list[PromptRecord] = []
    sampled = 0
    stop: Literal["full", "budget", "prompt_cap", "prompts_exhausted"] = "full"
    while (len(groups) if cfg.refill else sampled) < cfg.batch_prompts:
        if budget.remaining <= 0:
            stop = "budget"
            break
        if len(records) >= cfg.max_prompts_per_batch:
            stop = "prompt_cap"
            break
        prompt_id = next(prompts, None)
        if prompt_id is None:
            stop = "prompts_exhausted"
            break
        skipped = skipped_record(prompt_id, source, cfg, history, step)
        if skipped is not None:
            records.append(skipped)
            continue
        result = sample_prompt(prompt_id, source, cfg, budget, step, history, seed)
        records.append(result.record)
        sampled += 1
        if result.record.kept:
            groups.append(result.group)
    return SampledBatch(groups=groups, records=records, stop_reason=stop)
