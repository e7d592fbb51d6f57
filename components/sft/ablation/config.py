"""The ablation's settings, shared by every arm; `quick_config` is the toy size the test suite runs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from components.core.policy.modeling import ModelConfig, TokenizerConfig
from components.credit.stage import CreditConfig
from components.credit.monte_carlo import MonteCarloConfig
from components.credit.segments import SegmentConfig
from components.sft.stage import SFTConfig
from components.sft.data import SFTMode

ARMS: tuple[SFTMode, ...] = ("resolved_only", "whole", "credited")
ALL_ARMS: tuple[str, ...] = ("untrained", *ARMS)
REFERENCE_ARM: SFTMode = "resolved_only"


class AblationConfig(BaseModel):
    """The whole ablation: data, credit, SFT budget and evaluation settings shared by every arm."""

    model_config = ConfigDict(extra="forbid")
    train_tasks: int = Field(200, ge=1, description="Training tasks (SWE level 1).")
    heldout_tasks: int = Field(200, ge=1, description="Held-out tasks (>= 200 resolves ~10-point differences).")
    task_seed: int = Field(0, description="Seed of the task generator.")
    # Two-bug tasks are where an unresolved attempt can hold progress (one bug fixed) that the credited arm
    # can find; one-bug tasks keep the resolved data plentiful. Cycled over tasks in both splits.
    bugs: list[int] = Field(default_factory=lambda: [1, 2], description="Planted bugs per task, cycled (1 or 2).")
    teacher_error_rate: float = Field(0.5, ge=0.0, le=1.0, description="Distillation teacher's error rate.")
    teacher_attempts: int = Field(1, ge=1, description="Teacher attempts per training task.")
    credit: CreditConfig = Field(default_factory=CreditConfig, description="Credit stage settings.")
    # 400 steps of 8 at lr 3e-3 was the shortest schedule measured to make the tiny policy resolve held-out
    # tasks; with ~100 resolved trajectories that is ~30 epochs, hence the default.
    sft: SFTConfig = Field(
        default_factory=lambda: SFTConfig(steps=1, batch_size=8, learning_rate=3e-3, max_len=1024, num_threads=1),
        description="SFT settings (mode, seed and steps are set per arm and seed).",
    )
    resolved_epochs: float = Field(30.0, gt=0, description="Epochs of the reference arm over the resolved data.")
    match: Literal["loss_tokens", "resolved_epochs"] = Field(
        "loss_tokens", description="What every arm matches the reference arm in (see the package docstring)."
    )
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2, 3, 4], description="Training seeds.")
    eval_k: int = Field(4, ge=1, description="Sampled attempts per held-out task (pass@1 from all of them).")
    eval_temperature: float = Field(0.7, ge=0.0, description="Sampling temperature of the held-out attempts.")
    eval_max_steps: int = Field(8, ge=1, description="Assistant turns per held-out episode.")
    eval_max_new_tokens: int = Field(160, ge=8, description="Tokens per generated turn.")
    eval_workers: int = Field(1, ge=1, description="Episodes in parallel inside one evaluation job.")
    workers: int = Field(2, ge=1, description="Parallel episodes in distillation.")
    jobs: int = Field(2, ge=1, description="Arm/seed runs (train + evaluate) in parallel processes.")

    @model_validator(mode="after")
    def _check(self) -> AblationConfig:
        if self.eval_k > 1 and self.eval_temperature <= 0:
            raise ValueError("eval_k > 1 attempts need eval_temperature > 0, or every attempt is the same")
        if not self.seeds:
            raise ValueError("seeds must name at least one training seed")
        if not set(self.bugs) <= {1, 2} or not self.bugs:
            raise ValueError(f"bugs per task are 1 or 2, got {self.bugs}")
        return self


def quick_config() -> AblationConfig:
    """Toy sizes that still exercise every piece (matched budgets, k sampled attempts, paired intervals,
    MLflow arm runs). The credit bar is lowered to "every step that does not lose value" (epsilon 0, no
    noise bar, one short continuation per state, two
    unresolved trajectories labelled): toy Monte-Carlo values are too coarse to clear the real
    bar, and the point here is that the credited arm's data provably differ from both other arms'. Task
    and teacher seeds are fixed, so the data are the same on every run."""
    return AblationConfig(
        train_tasks=6,
        heldout_tasks=2,
        bugs=[1],
        teacher_error_rate=0.5,
        seeds=[0, 1],
        jobs=2,
        credit=CreditConfig(
            monte_carlo=MonteCarloConfig(k=1, stride=1, max_steps=3, parallel=2),
            segments=SegmentConfig(epsilon=0.0, z=0.0),
            max_trajectories=2,
        ),
        sft=SFTConfig(
            steps=1,
            batch_size=2,
            max_len=1024,
            num_threads=1,
            warmup_steps=0,
            model=ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[])),
        ),
        resolved_epochs=1.0,
        eval_k=2,
        eval_temperature=1.0,
        eval_max_steps=2,
        eval_max_new_tokens=16,
    )
