"""The sampler's settings (`RolloutConfig`): group assembly, batches and the three options of `sampler.py`'s header."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from components.rl.sampling.records import Sampler
from components.rl.sampling.rules import positive_range


class RolloutConfig(BaseModel):
    """How groups are sampled. Defaults are the published BAR settings with every option off."""

    model_config = ConfigDict(extra="forbid")
    # --- how a group is assembled
    sampler: Sampler = Field("bar", description="Balanced Adaptive Rollout or fixed-size groups.")
    group_size: int = Field(8, ge=2, description="N: attempts per training group.")
    max_rollouts_per_prompt: int = Field(16, ge=2, description="N_max: per-prompt attempt budget (BAR).")
    stride: int = Field(
        16,
        ge=1,
        description="s: attempts per wave (BAR; fixed groups only with early_stop "
        "or prefix_fork, otherwise one wave of N).",
    )
    rho_min: float = Field(0.375, ge=0.0, le=1.0, description="Lowest target fraction of positives in a group.")
    rho_max: float = Field(0.625, ge=0.0, le=1.0, description="Highest target fraction of positives in a group.")
    time_truncated_to_backfill: bool = Field(
        True,
        description="A wall-clock cut carries no reward in either sampler (backfill pile, no baseline); "
        "False: it is an ordinary verified attempt, like a step/token cut (rules.carries_reward).",
    )
    group_choice: Literal["random", "ranked"] = Field(
        "random",
        description="Which positives and negatives fill a BAR group once their counts are chosen: drawn "
        "uniformly at random within each side (seeded by run seed, step and prompt), or the "
        "top-ranked (published: completed > truncated, so a step-limit loop is never chosen "
        "while completed failures remain).",
    )
    advantage_baseline: Literal["pool", "group"] = Field(
        "pool",
        description="GRPO over all verified attempts of the prompt, each group member weighted by the "
        "inverse of its side's share in the group (an unbiased estimate of GRPO on the whole "
        "pool: `rules.pool_advantages`), or GRPO over the chosen group only (published BAR). "
        "Fixed groups: the pool is the group, the same either way.",
    )
    # --- batches
    batch_prompts: int = Field(4, ge=1, description="Groups (prompts) per training batch.")
    max_prompts_per_batch: int = Field(32, ge=1, description="Cap on prompts pulled (skips included) per batch.")
    refill: bool = Field(
        True,
        description="Pull prompts until batch_prompts groups are informative (DAPO dynamic "
        "sampling); False: a batch is batch_prompts sampled prompts. In the RL "
        "stage: a dropped group is replaced by another prompt's (rl.rollout).",
    )
    # --- option 1: sequential early abandon
    early_stop: bool = Field(False, description="Abandon a prompt whose waves agree when the rest likely will too.")
    abandon_threshold: float = Field(
        0.5, gt=0.0, le=1.0, description="Abandon when P(all remaining attempts agree) >= this."
    )
    prior_alpha: float = Field(1.0, gt=0.0, description="Beta prior of a prompt's pass rate: successes.")
    prior_beta: float = Field(1.0, gt=0.0, description="Beta prior of a prompt's pass rate: failures.")
    # --- option 2: history across epochs
    history: bool = Field(False, description="Carry a per-prompt posterior across epochs (PromptHistory).")
    skip_after_uniform_visits: int = Field(1, ge=1, description="Skip after this many zero-variance visits in a row.")
    skip_explore: float = Field(0.1, ge=0.0, le=1.0, description="Probability of sampling such a prompt anyway.")
    history_decay: float = Field(1.0, ge=0.0, le=1.0, description="Weight kept by old evidence at each visit.")
    lookahead: int = Field(1, ge=1, description="Window within which likelier-informative prompts go first.")
    # --- option 3: prefix-fork sampling
    prefix_fork: bool = Field(False, description="Fork unsolved prompts from a teacher-trajectory prefix.")
    prefix_fraction: float = Field(0.5, gt=0.0, lt=1.0, description="Initial prefix fraction per prompt.")
    prefix_fraction_step: float = Field(0.1, ge=0.0, le=0.5, description="Per-visit adaptation of the fraction.")
    prefix_fraction_min: float = Field(0.1, gt=0.0, lt=1.0)
    prefix_fraction_max: float = Field(0.9, gt=0.0, lt=1.0)

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.rho_min > self.rho_max:
            raise ValueError(f"rho_min={self.rho_min} > rho_max={self.rho_max}; the target range is empty")
        if self.max_rollouts_per_prompt < self.group_size:
            raise ValueError(
                f"max_rollouts_per_prompt={self.max_rollouts_per_prompt} < group_size="
                f"{self.group_size}: BAR could never fill a group; raise N_max"
            )
        lo, hi = positive_range(self.group_size, self.rho_min, self.rho_max)
        if lo > hi:
            raise ValueError(
                f"[rho_min, rho_max]=[{self.rho_min}, {self.rho_max}] holds no whole number of "
                f"positives for group_size={self.group_size}; widen the range"
            )
        if self.prefix_fork and not (self.early_stop or self.history):
            raise ValueError(
                "prefix_fork needs early_stop or history to tell which prompts the policy does not "
                "solve; enable one of them"
            )
        if (self.prefix_fork or self.early_stop) and self.stride >= self.group_size:
            raise ValueError(
                f"early_stop / prefix_fork decide between waves; stride={self.stride} must be smaller "
                f"than group_size={self.group_size}"
            )
        if self.lookahead > 1 and not self.history:
            raise ValueError("lookahead orders prompts by their history; enable history")
        return self

    @property
    def waves_within_group(self) -> bool:
        return self.sampler == "bar" or self.early_stop or self.prefix_fork
