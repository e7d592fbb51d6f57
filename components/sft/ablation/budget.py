"""How many optimizer steps each arm trains: the matching rule of the package docstring, computed once.

The counts come from the arms' actual training sets (`build_samples`, the same selection, rendering and
truncation train_sft applies), so "loss tokens" here are the tokens train_sft puts loss on."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from components.tiny_model import build_tokenizer
from components.core.data.parquet_store import TrajectoryStore
from components.sft.ablation.config import ARMS, REFERENCE_ARM, AblationConfig
from components.sft.data import build_samples


class ArmPlan(BaseModel):
    """One arm's training set and budget."""

    model_config = ConfigDict(extra="forbid")
    arm: str
    samples: int = Field(description="Trajectories in the arm's training set.")
    resolved_samples: int = Field(description="Of which resolved.")
    data_loss_tokens: int = Field(description="Loss tokens in one pass over the training set.")
    resolved_loss_tokens: int = Field(description="Of which on resolved trajectories.")
    steps: int = Field(description="Optimizer steps (0: untrained).")
    loss_tokens_seen: float = Field(description="Loss tokens the steps see in expectation (steps x batch x mean).")
    epochs: float = Field(description="Passes over the arm's own training set.")
    resolved_epochs: float = Field(description="Passes over its resolved trajectories (= epochs: they are mixed in).")


def _plan(arm: str, samples: int, resolved: int, loss: int, resolved_loss: int, steps: int, batch: int) -> ArmPlan:
    epochs = steps * batch / samples if samples else 0.0
    return ArmPlan(
        arm=arm,
        samples=samples,
        resolved_samples=resolved,
        data_loss_tokens=loss,
        resolved_loss_tokens=resolved_loss,
        steps=steps,
        loss_tokens_seen=epochs * loss,
        epochs=epochs,
        resolved_epochs=epochs if resolved else 0.0,
    )


def steps_for(config: AblationConfig, counts: dict[str, tuple[int, int, int, int]]) -> dict[str, ArmPlan]:
    """Plans from per-arm (samples, resolved samples, loss tokens, resolved loss tokens); see the docstring."""
    batch = config.sft.batch_size * config.sft.grad_accum
    n_ref, _, loss_ref, _ = counts[REFERENCE_ARM]
    if n_ref == 0:
        raise ValueError(
            "the reference arm resolved_only has no training sample: the teacher resolved nothing; "
            "lower teacher_error_rate or add train_tasks"
        )
    ref_steps = math.ceil(config.resolved_epochs * n_ref / batch)
    budget = ref_steps * batch * loss_ref / n_ref  # the reference's loss tokens, in expectation
    plans = {"untrained": _plan("untrained", 0, 0, 0, 0, 0, batch)}
    for arm in ARMS:
        n, n_res, loss, res_loss = counts[arm]
        if arm == REFERENCE_ARM:
            steps = ref_steps
        elif config.match == "loss_tokens":
            steps = max(1, round(budget * n / (batch * loss)))
        else:
            steps = math.ceil(config.resolved_epochs * n / batch)
        plans[arm] = _plan(arm, n, n_res, loss, res_loss, steps, batch)
    return plans


def plan_arms(config: AblationConfig, credited_dir: str | Path) -> dict[str, ArmPlan]:
    """Each arm's plan from the credit-labelled trajectory store the arms train on."""
    trajectories = TrajectoryStore(credited_dir).read()
    tokenizer = build_tokenizer(config.sft.model.tokenizer)
    by_id = {t.id: t for t in trajectories}
    counts: dict[str, tuple[int, int, int, int]] = {}
    for arm in ARMS:
        samples, stats = build_samples(trajectories, tokenizer, arm, config.sft.max_len)
        resolved_loss = sum(sum(s.loss_mask) for s in samples if by_id[s.trajectory_id].resolved)
        counts[arm] = (len(samples), stats.resolved_used, stats.loss_tokens, resolved_loss)
    return steps_for(config, counts)
