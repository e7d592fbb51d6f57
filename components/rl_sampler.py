"""Group samplers for group-relative RL: Balanced Adaptive Rollout (BAR) and fixed-size groups.

Pure logic over an abstract `RolloutSource` (prompt id, n -> n attempts), so the rules can be tested
on synthetic reward sources with known pass rates; `components/rl.py` plugs in real sandbox episodes.

BAR, as published (arXiv 2605.15040), with every knob in `RolloutConfig`:
- generate `stride` attempts at a time for a prompt, up to `max_rollouts_per_prompt` (N_max);
- after each stride try to assemble a group of `group_size` (N): split the pool into positives and
  negatives; aborted attempts (and time-truncated ones, `time_truncated_to_backfill`) go to a backfill
  pile and are never used as rewards by the balanced choice; rank each pile by status (completed >
  truncated > time_truncated > aborted, then generation order); choose the number of positives n+
  closest to round(rho* N), rho* = (rho_min + rho_max) / 2, within [ceil(rho_min N), floor(rho_max N)],
  that the pool can fill; stop on success;
- when the per-prompt budget is spent: retry with the range widened to [0, 1], then take the N
  top-ranked attempts of the whole pool;
- then drop the group if it holds any aborted sample, has zero reward std or no positive, and pull
  more prompts until the batch is full (or the global budget / prompt cap is reached).

Interpretation where the text is silent (kept explicit here so it can be argued with):
- "aborted" means no verified reward: `reward is None` or status `aborted` (sandbox crash, service
  timeout, a verification run's OOM, lost agent; a policy command's own OOM is its outcome, see
  components/core/harness.py). Such an attempt never carries a reward; the final filter drops any group
  holding one. Time-truncated attempts that were verified keep their verified reward if the last-resort
  top-N fill puts them in a group.
- A group smaller than N (only possible when the global budget runs out mid-prompt) is dropped.
- Fixed-size sampling (the DAPO-style baseline) generates exactly N attempts per prompt, removes
  attempts without a verified reward from the group (they never enter its mean/std), and applies the
  same zero-std / no-positive filter.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from components.core.schema import EpisodeStatus

STATUS_RANK = {
    EpisodeStatus.completed: 0,
    EpisodeStatus.truncated: 1,
    EpisodeStatus.time_truncated: 2,
    EpisodeStatus.aborted: 3,
}

Rule = Literal["balanced", "widened", "top_ranked", "fixed", "none"]
DropReason = Literal["aborted", "short", "zero_std", "no_positive"]


class RolloutConfig(BaseModel):
    """How groups are sampled. Defaults are the published BAR settings."""

    model_config = ConfigDict(extra="forbid")
    sampler: Literal["bar", "fixed"] = Field("bar", description="Balanced Adaptive Rollout or fixed-size groups.")
    group_size: int = Field(8, ge=2, description="N: attempts per training group.")
    max_rollouts_per_prompt: int = Field(16, ge=2, description="N_max: per-prompt attempt budget (BAR).")
    stride: int = Field(16, ge=1, description="s: attempts generated per wave before trying to assemble (BAR).")
    rho_min: float = Field(0.375, ge=0.0, le=1.0, description="Lowest target fraction of positives in a group.")
    rho_max: float = Field(0.625, ge=0.0, le=1.0, description="Highest target fraction of positives in a group.")
    time_truncated_to_backfill: bool = Field(
        True, description="Time-truncated attempts go to the backfill pile, not to the balanced choice.")
    batch_prompts: int = Field(4, ge=1, description="Groups (prompts) per training batch.")
    max_prompts_per_batch: int = Field(32, ge=1, description="Cap on prompts pulled while filling one batch.")

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.rho_min > self.rho_max:
            raise ValueError(f"rho_min={self.rho_min} > rho_max={self.rho_max}; the target range is empty")
        if self.max_rollouts_per_prompt < self.group_size:
            raise ValueError(f"max_rollouts_per_prompt={self.max_rollouts_per_prompt} < group_size="
                             f"{self.group_size}: BAR could never fill a group; raise N_max")
        lo, hi = positive_range(self.group_size, self.rho_min, self.rho_max)
        if lo > hi:
            raise ValueError(f"[rho_min, rho_max]=[{self.rho_min}, {self.rho_max}] holds no whole number of "
                             f"positives for group_size={self.group_size}; widen the range")
        return self


class Attempt(BaseModel):
    """One rollout of a prompt as the sampler sees it. The source fills reward, status and payload."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    reward: float | None = Field(description="+1/-1 from the verified outcome; None: nothing verified (infra).")
    status: EpisodeStatus = Field(EpisodeStatus.completed, description="How the episode ended.")
    prompt_id: str = Field("", description="Set by the sampler.")
    index: int = Field(-1, description="Generation order within the prompt (set by the sampler).")
    attempt_id: str | None = Field(None, description="Id of what was generated (e.g. the trajectory id).")
    payload: Any = Field(None, exclude=True, description="The trajectory behind the attempt (not logged).")

    @property
    def aborted(self) -> bool:
        return self.reward is None or self.status is EpisodeStatus.aborted

    @property
    def rank(self) -> tuple[int, int]:
        return (STATUS_RANK[EpisodeStatus.aborted] if self.aborted else STATUS_RANK[self.status], self.index)


class RolloutSource(Protocol):
    def __call__(self, prompt_id: str, n: int) -> list[Attempt]:
        """Generate n attempts for the prompt. Failures are attempts with reward None, never exceptions."""
        ...


class RolloutBudget:
    """The global rollout budget, shared across batches (None = unlimited)."""

    def __init__(self, total: int | None = None):
        self.total = total
        self.spent = 0

    @property
    def remaining(self) -> int:
        return math.inf if self.total is None else max(0, self.total - self.spent)  # type: ignore[return-value]


class StrideRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    wave: int = Field(description="0-based wave index within the prompt.")
    generated: int = Field(description="Attempts generated in this wave.")
    positives: int = Field(description="Positives in the pool after the wave.")
    negatives: int = Field(description="Negatives in the pool after the wave.")
    backfill: int = Field(description="Aborted / time-truncated attempts in the pool after the wave.")
    balanced: bool = Field(description="A balanced group could be assembled after this wave.")


class PromptRecord(BaseModel):
    """Every choice the sampler made for one prompt (one row of the BAR statistics)."""

    model_config = ConfigDict(extra="forbid")
    step: int = Field(description="Training step (batch) the prompt was pulled for.")
    prompt_id: str
    sampler: Literal["bar", "fixed"]
    generated: int = Field(description="Attempts generated for this prompt.")
    pool_positives: int
    pool_negatives: int
    pool_aborted: int = Field(description="Attempts without a verified reward.")
    waves: list[StrideRecord] = Field(default_factory=list)
    rule: Rule = Field(description="How the group was assembled.")
    group_indices: list[int] = Field(default_factory=list, description="Attempt indices chosen for the group.")
    group_attempt_ids: list[str | None] = Field(default_factory=list, description="Their attempt ids.")
    group_positives: int = 0
    group_size: int = 0
    kept: bool = Field(description="The group trains (it is informative: mixed verified rewards).")
    drop_reason: DropReason | None = None
    budget_exhausted: bool = Field(False, description="The global budget ran out while sampling this prompt.")


class PromptResult(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    group: list[Attempt]
    record: PromptRecord


class SampledBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    groups: list[list[Attempt]] = Field(description="Kept groups, each of verified attempts only.")
    records: list[PromptRecord]
    stop_reason: Literal["full", "budget", "prompt_cap", "prompts_exhausted"]

    @property
    def generated(self) -> int:
        return sum(r.generated for r in self.records)


# --------------------------------------------------------------------------------------------------
# The group rules
# --------------------------------------------------------------------------------------------------
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


def split_pool(pool: list[Attempt], time_truncated_to_backfill: bool) -> tuple[list[Attempt], ...]:
    """(positives, negatives, backfill), each sorted by rank."""
    pos, neg, back = [], [], []
    for a in pool:
        if a.aborted or (time_truncated_to_backfill and a.status is EpisodeStatus.time_truncated):
            back.append(a)
        elif a.reward > 0:  # type: ignore[operator]
            pos.append(a)
        else:
            neg.append(a)
    return tuple(sorted(p, key=lambda a: a.rank) for p in (pos, neg, back))


def drop_reason(group: list[Attempt], n: int | None) -> DropReason | None:
    """Why a group cannot train, or None if it is informative."""
    if any(a.aborted for a in group):
        return "aborted"
    if len(group) < (n if n is not None else 2):
        return "short"
    rewards = [a.reward for a in group]
    if max(rewards) == min(rewards):  # type: ignore[type-var]
        return "zero_std"
    if not any(r > 0 for r in rewards):  # type: ignore[operator]
        return "no_positive"
    return None


def _generate(source: RolloutSource, prompt_id: str, n: int, pool: list[Attempt], budget: RolloutBudget) -> int:
    new = source(prompt_id, n)
    if len(new) != n:
        raise ValueError(f"rollout source returned {len(new)} attempts for {prompt_id!r}, asked for {n}; "
                         "a source must turn every failure into an attempt with reward=None")
    for a in new:
        a.prompt_id, a.index = prompt_id, len(pool)
        pool.append(a)
    budget.spent += n
    return n


def _record(step: int, prompt_id: str, sampler: str, pool: list[Attempt], group: list[Attempt], rule: Rule,
            reason: DropReason | None, waves: list[StrideRecord], exhausted: bool) -> PromptRecord:
    usable = [a for a in pool if not a.aborted]
    return PromptRecord(
        step=step, prompt_id=prompt_id, sampler=sampler, generated=len(pool),  # type: ignore[arg-type]
        pool_positives=sum(a.reward > 0 for a in usable), pool_negatives=sum(a.reward <= 0 for a in usable),
        pool_aborted=len(pool) - len(usable), waves=waves, rule=rule, group_indices=[a.index for a in group],
        group_attempt_ids=[a.attempt_id for a in group],
        group_positives=sum(1 for a in group if not a.aborted and a.reward > 0), group_size=len(group),
        kept=reason is None and bool(group), drop_reason=reason, budget_exhausted=exhausted,
    )


def bar_sample_prompt(prompt_id: str, source: RolloutSource, cfg: RolloutConfig, budget: RolloutBudget,
                      step: int = 0) -> PromptResult:
    """Balanced Adaptive Rollout for one prompt."""
    n = cfg.group_size
    lo, hi = positive_range(n, cfg.rho_min, cfg.rho_max)
    target = target_positives(n, cfg.rho_min, cfg.rho_max)
    pool: list[Attempt] = []
    waves: list[StrideRecord] = []
    group: list[Attempt] | None = None
    rule: Rule = "none"
    exhausted = False
    while len(pool) < cfg.max_rollouts_per_prompt:
        want = min(cfg.stride, cfg.max_rollouts_per_prompt - len(pool), budget.remaining)
        if want <= 0:
            exhausted = True
            break
        generated = _generate(source, prompt_id, want, pool, budget)
        pos, neg, back = split_pool(pool, cfg.time_truncated_to_backfill)
        k = choose_positives(len(pos), len(neg), n, lo, hi, target)
        waves.append(StrideRecord(wave=len(waves), generated=generated, positives=len(pos), negatives=len(neg),
                                  backfill=len(back), balanced=k is not None))
        if k is not None:
            group, rule = pos[:k] + neg[: n - k], "balanced"
            break
    if group is None and pool:
        pos, neg, _ = split_pool(pool, cfg.time_truncated_to_backfill)
        k = choose_positives(len(pos), len(neg), n, 0, n, target)
        if k is not None:
            group, rule = pos[:k] + neg[: n - k], "widened"
        else:
            group, rule = sorted(pool, key=lambda a: a.rank)[:n], "top_ranked"
    group = group or []
    reason = drop_reason(group, n) if group else "short"
    record = _record(step, prompt_id, "bar", pool, group, rule, reason, waves, exhausted)
    return PromptResult(group=group if reason is None else [], record=record)


def fixed_sample_prompt(prompt_id: str, source: RolloutSource, cfg: RolloutConfig, budget: RolloutBudget,
                        step: int = 0) -> PromptResult:
    """Fixed-size group: exactly N attempts; attempts without a verified reward leave the group."""
    pool: list[Attempt] = []
    want = min(cfg.group_size, budget.remaining)
    exhausted = want < cfg.group_size
    if want > 0:
        _generate(source, prompt_id, want, pool, budget)
    group = [a for a in pool if not a.aborted]
    reason = drop_reason(group, None) if pool else "short"
    record = _record(step, prompt_id, "fixed", pool, group, "fixed", reason, [], exhausted)
    return PromptResult(group=group if reason is None else [], record=record)


def sample_batch(prompts: Iterator[str], source: RolloutSource, cfg: RolloutConfig, budget: RolloutBudget,
                 step: int = 0) -> SampledBatch:
    """Pull prompts until `batch_prompts` informative groups are kept (or a budget/cap stops it)."""
    sample_prompt = bar_sample_prompt if cfg.sampler == "bar" else fixed_sample_prompt
    groups: list[list[Attempt]] = []
    records: list[PromptRecord] = []
    stop: Literal["full", "budget", "prompt_cap", "prompts_exhausted"] = "full"
    while len(groups) < cfg.batch_prompts:
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
        result = sample_prompt(prompt_id, source, cfg, budget, step)
        records.append(result.record)
        if result.record.kept:
            groups.append(result.group)
    return SampledBatch(groups=groups, records=records, stop_reason=stop)


def summarize(records: list[PromptRecord]) -> dict[str, float]:
    """Sampler statistics as flat metrics (what the comparison and MLflow report)."""
    generated = sum(r.generated for r in records)
    kept = sum(r.kept for r in records)
    reasons = Counter(r.drop_reason for r in records if r.drop_reason)
    rules = Counter(r.rule for r in records)
    out = {
        "prompts": float(len(records)),
        "trajectories": float(generated),
        "informative_groups": float(kept),
        "informative_groups_per_trajectory": kept / generated if generated else 0.0,
        "trajectories_per_prompt": generated / len(records) if records else 0.0,
        "aborted_attempts": float(sum(r.pool_aborted for r in records)),
        "mean_group_positive_fraction": (sum(r.group_positives / r.group_size for r in records if r.kept) / kept
                                         if kept else 0.0),
    }
    out.update({f"dropped_{k}": float(v) for k, v in reasons.items()})
    out.update({f"rule_{k}": float(v) for k, v in rules.items()})
    return out
