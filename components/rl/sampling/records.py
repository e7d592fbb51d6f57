"""What the sampler consumes (attempts from a rollout source) and what it logs (one record per prompt)."""

from __future__ import annotations

import math
import threading
from collections import Counter
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from components.core.data.schema import EpisodeStatus

STATUS_RANK = {
    EpisodeStatus.completed: 0,
    EpisodeStatus.truncated: 1,
    EpisodeStatus.time_truncated: 2,
    EpisodeStatus.aborted: 3,
}

Rule = Literal["balanced", "widened", "top_ranked", "fixed", "abandoned", "skipped", "none"]
DropReason = Literal["aborted", "time_truncated", "short", "zero_std", "no_positive", "abandoned", "skipped"]
Sampler = Literal["bar", "fixed"]


class Attempt(BaseModel):
    """One rollout of a prompt as the sampler sees it. The source fills reward, status, steps and payload."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    reward: float | None = Field(description="+1/-1 from the verified outcome; None: nothing verified (infra).")
    status: EpisodeStatus = Field(EpisodeStatus.completed, description="How the episode ended.")
    env_steps: int = Field(0, ge=0, description="Environment (tool) steps this attempt executed itself.")
    prefix_steps: int = Field(
        0,
        ge=0,
        description="Teacher-prefix steps it started from (context, no loss); 0 = an ordinary on-policy attempt.",
    )
    prompt_id: str = Field("", description="Set by the sampler.")
    index: int = Field(-1, description="Generation order within the prompt (set by the sampler).")
    attempt_id: str | None = Field(None, description="Id of what was generated (e.g. the trajectory id).")
    advantage: float | None = Field(None, description="Set by the sampler on attempts of kept groups.")
    payload: Any = Field(None, exclude=True, description="The trajectory behind the attempt (not logged).")

    @property
    def aborted(self) -> bool:
        return self.reward is None or self.status is EpisodeStatus.aborted

    @property
    def forked(self) -> bool:
        return self.prefix_steps > 0

    @property
    def rank(self) -> tuple[int, int]:
        return (STATUS_RANK[EpisodeStatus.aborted] if self.aborted else STATUS_RANK[self.status], self.index)


class RolloutSource(Protocol):
    def __call__(self, prompt_id: str, n: int) -> list[Attempt]:
        """Generate n attempts for the prompt. Failures are attempts with reward None, never exceptions."""
        ...


@runtime_checkable
class PrefixForkSource(Protocol):
    """A source that can also start attempts from a prefix of a successful (teacher) trajectory."""

    def has_prefix(self, prompt_id: str) -> bool:
        """A successful reference trajectory exists for the prompt."""
        ...

    def fork(self, prompt_id: str, n: int, fraction: float) -> list[Attempt]:
        """n attempts each continuing from the state after the first `fraction` of the reference's steps
        (sandbox forked from its snapshot, or the prefix replayed); `prefix_steps` says how many."""
        ...


class RolloutBudget:
    """The global rollout budget, shared across batches (None = unlimited), in trajectories; environment
    steps (a forked attempt's prefix included: it was paid for once, and replay pays it again) are counted."""

    def __init__(self, total: int | None = None):
        self.total = total
        self.spent = 0
        self.env_steps = 0
        self._lock = threading.Lock()  # the RL stage samples a batch's prompts in threads

    def charge(self, attempts: int, env_steps: int) -> None:
        """Count `attempts` generated trajectories and their environment steps (thread-safe)."""
        with self._lock:
            self.spent += attempts
            self.env_steps += env_steps

    @property
    def remaining(self) -> int:
        return math.inf if self.total is None else max(0, self.total - self.spent)  # type: ignore[return-value]


class StrideRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    wave: int = Field(description="0-based wave index within the prompt.")
    generated: int = Field(description="Attempts generated in this wave.")
    forked: bool = Field(False, description="The wave's attempts started from a teacher prefix.")
    positives: int = Field(description="Positives in the pool after the wave.")
    negatives: int = Field(description="Negatives in the pool after the wave.")
    backfill: int = Field(description="Aborted / time-truncated attempts in the pool after the wave.")
    balanced: bool = Field(description="A balanced group could be assembled after this wave.")
    p_rest_uniform: float | None = Field(
        None,
        description="Posterior probability that the attempts still to come would all repeat the pool's single outcome.",
    )
    decision: Literal["continue", "done", "abandon", "fork"] = Field("continue", description="What followed.")


class PromptRecord(BaseModel):
    """Every choice the sampler made for one prompt (one row of the sampler statistics)."""

    model_config = ConfigDict(extra="forbid")
    step: int = Field(description="Training step (batch) the prompt was pulled for.")
    prompt_id: str
    sampler: Sampler
    generated: int = Field(description="Attempts generated for this prompt (forked ones included).")
    forked: int = Field(0, description="Of them, attempts started from a teacher prefix.")
    prefix_fraction: float | None = Field(None, description="Fraction of the reference trajectory used as prefix.")
    env_steps: int = Field(0, description="Environment steps of all attempts, prefixes included.")
    prefix_steps: int = Field(0, description="Of them, steps of teacher prefixes.")
    pool_positives: int
    pool_negatives: int
    pool_aborted: int = Field(description="Attempts without a verified reward.")
    pool_time_truncated: int = Field(
        0, description="Verified wall-clock cuts kept out of the rewards (`RolloutConfig.time_truncated_to_backfill`)."
    )
    pool_truncated: int = Field(
        0,
        description="Attempts with a reward cut by the step or token limit (status "
        "truncated): failures the policy looped into.",
    )
    prior: tuple[float, float] | None = Field(None, description="Beta prior (alpha, beta) of the pass rate used.")
    waves: list[StrideRecord] = Field(default_factory=list)
    rule: Rule = Field(description="How the group was assembled (or why no attempt was made).")
    group_indices: list[int] = Field(default_factory=list, description="Attempt indices chosen for the group.")
    group_attempt_ids: list[str | None] = Field(default_factory=list, description="Their attempt ids.")
    group_positives: int = 0
    group_size: int = 0
    group_truncated: int = Field(0, description="Of the group, attempts cut by the step or token limit.")
    group_advantages: list[float] = Field(
        default_factory=list, description="The kept group's advantages, in group order (what the update uses)."
    )
    group_reward_variance: float = Field(0.0, description="Population variance of the kept group's rewards.")
    kept: bool = Field(description="The group trains (it is informative: mixed verified rewards).")
    drop_reason: DropReason | None = None
    budget_exhausted: bool = Field(False, description="The global budget ran out while sampling this prompt.")
    replaces: str | None = Field(
        None,
        description="The dropped prompt whose place in the batch this prompt was "
        "pulled to fill (RL stage with rollout.refill).",
    )


class PromptResult(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    group: list[Attempt]
    record: PromptRecord


class SampledBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    groups: list[list[Attempt]] = Field(description="Kept groups, each of verified attempts with advantages.")
    records: list[PromptRecord]
    stop_reason: Literal["full", "budget", "prompt_cap", "prompts_exhausted"]

    @property
    def generated(self) -> int:
        return sum(r.generated for r in self.records)


def summarize(records: list[PromptRecord]) -> dict[str, float]:
    """Sampler statistics as flat metrics (what the comparison and MLflow report)."""
    generated = sum(r.generated for r in records)
    kept = [r for r in records if r.kept]
    env_steps = sum(r.env_steps for r in records)
    reasons = Counter(r.drop_reason for r in records if r.drop_reason)
    rules = Counter(r.rule for r in records)
    sampled = [r for r in records if r.generated]
    trained = sum(r.group_size for r in kept)
    trained_cut = sum(r.group_truncated for r in kept)
    pooled = sum(r.pool_positives + r.pool_negatives for r in kept)
    variance = sum(r.group_reward_variance for r in kept)
    out = {
        "prompts": float(len(records)),
        "prompts_sampled": float(len(sampled)),
        "trajectories": float(generated),
        "forked_trajectories": float(sum(r.forked for r in records)),
        "env_steps": float(env_steps),
        "prefix_env_steps": float(sum(r.prefix_steps for r in records)),
        "informative_groups": float(len(kept)),
        "informative_groups_per_trajectory": len(kept) / generated if generated else 0.0,
        "informative_groups_per_1k_env_steps": 1000 * len(kept) / env_steps if env_steps else 0.0,
        "trained_over_generated": trained / generated if generated else 0.0,
        "group_reward_variance_per_trajectory": variance / generated if generated else 0.0,
        "trajectories_per_prompt": generated / len(sampled) if sampled else 0.0,
        "aborted_attempts": float(sum(r.pool_aborted for r in records)),
        "unrewarded_time_truncated_attempts": float(sum(r.pool_time_truncated for r in records)),
        "mean_group_positive_fraction": (
            sum(r.group_positives / r.group_size for r in kept) / len(kept) if kept else 0.0
        ),
        # Step/token-cut attempts among those trained on, beside their share of the kept prompts' pools: a
        # group choice that never picks them shows 0 here against a positive pool share.
        "trained_truncated_fraction": trained_cut / trained if trained else 0.0,
        "pool_truncated_fraction": (sum(r.pool_truncated for r in kept) / pooled) if pooled else 0.0,
    }
    out.update({f"dropped_{k}": float(v) for k, v in reasons.items()})
    out.update({f"rule_{k}": float(v) for k, v in rules.items()})
    return out
