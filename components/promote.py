"""Promotion gate: a retrained policy replaces the one in use only when it is measurably better.

The champion is the registered version behind the MLflow alias `champion` of the policy's registered
model. The gate evaluates the candidate and the champion on the same held-out tasks with the same
attempt seeds (`components.evaluate`), compares per-task pass@1 with a paired bootstrap over tasks
(`components.core.intervals.paired_bootstrap_diff`), and decides:

1. The candidate must be fit to compare at all: trained (at least one optimizer update), at least one
   verified attempt, and an infrastructure-error rate at most `max_infra_error_rate` (a flood of
   sandbox failures says nothing about the policy). Otherwise: rejected, with that reason.
2. No champion yet: the candidate is promoted (the first run has nothing to beat).
3. Otherwise promoted only when the paired interval of (candidate - champion) lies above zero, or,
   when `margin` is set, when the mean gain is at least `margin`. Otherwise the champion stays.

Promotion registers the candidate as a new version (with its lineage: parent model, dataset shards,
pipeline run, git commit, evaluation table) and moves the alias; the old version is kept, so rolling
back is moving the alias again. A rejected candidate is not registered: the registry holds only
models that were, at some point, the best one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from components.core.intervals import paired_bootstrap_diff


class PromotionConfig(BaseModel):
    """How a candidate is compared with the champion."""

    model_config = ConfigDict(extra="forbid")
    model_name: str = Field("orchard-policy", description="Registered model the champion alias lives on.")
    alias: str = Field("champion", description="Registry alias of the model in use.")
    margin: float | None = Field(None, ge=0.0, description="Also promote when the mean pass@1 gain is at least this (None = interval rule only).")
    level: float = Field(0.95, gt=0.5, lt=1.0, description="Confidence level of the paired bootstrap interval.")
    resamples: int = Field(4000, ge=100, description="Bootstrap resamples.")
    seed: int = Field(0, description="Seed of the bootstrap.")
    max_infra_error_rate: float = Field(0.5, ge=0.0, le=1.0, description="Reject a candidate whose evaluation lost more attempts than this to infrastructure.")


class Scorecard(BaseModel):
    """One policy's evaluation on the gate's tasks: per-task pass@1 and what makes it comparable."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
    policy: str = Field(description="Model directory or registry URI that was evaluated.")
    per_task_pass_at_1: dict[str, float] = Field(description="task id -> pass@1 (NaN: no verified attempt).")
    valid_attempts: int
    infra_error_rate: float
    trained: bool = Field(True, description="At least one optimizer update went into this model.")

    @property
    def mean(self) -> float:
        values = [v for v in self.per_task_pass_at_1.values() if v == v]
        return sum(values) / len(values) if values else float("nan")


class PromotionDecision(BaseModel):
    """What the gate decided and why (logged to MLflow, printed by the pipeline)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
    promoted: bool
    reason: str
    candidate_mean: float
    champion_mean: float | None = None
    difference: float | None = Field(None, description="Mean over tasks of candidate - champion pass@1.")
    ci_low: float | None = None
    ci_high: float | None = None
    tasks: int = Field(0, description="Tasks both were evaluated on.")
    champion_version: str | None = None
    candidate_version: str | None = Field(None, description="Registered version (set when promoted).")


def decide(candidate: Scorecard, champion: Scorecard | None, config: PromotionConfig,
           champion_version: str | None = None) -> PromotionDecision:
    """The gate's rule (module docstring), on two scorecards. Pure: no registry, no MLflow."""
    base = {"candidate_mean": candidate.mean, "champion_version": champion_version}
    if not candidate.trained:
        return PromotionDecision(promoted=False, reason="candidate was not trained (no optimizer update)", **base)
    if candidate.valid_attempts == 0:
        return PromotionDecision(promoted=False, reason="candidate has no verified attempt to judge it by", **base)
    if candidate.infra_error_rate > config.max_infra_error_rate:
        return PromotionDecision(
            promoted=False, **base,
            reason=f"candidate evaluation lost {candidate.infra_error_rate:.0%} of attempts to infrastructure "
                   f"errors (limit {config.max_infra_error_rate:.0%}): fix the sandbox service and rerun")
    if champion is None:
        return PromotionDecision(promoted=True, reason="no champion yet: the first trained candidate is promoted", **base)
    diff, lo, hi, n = paired_bootstrap_diff(candidate.per_task_pass_at_1, champion.per_task_pass_at_1,
                                            level=config.level, resamples=config.resamples, seed=config.seed)
    stats = {**base, "champion_mean": champion.mean, "difference": diff, "ci_low": lo, "ci_high": hi, "tasks": n}
    interval = f"{diff:+.3f} [{lo:+.3f}, {hi:+.3f}] over {n} tasks ({config.level:.0%} paired bootstrap)"
    if lo > 0:
        return PromotionDecision(promoted=True, reason=f"better than the champion: pass@1 {interval}", **stats)
    if config.margin is not None and diff >= config.margin:
        return PromotionDecision(promoted=True, reason=f"gain {diff:+.3f} reaches the margin {config.margin}: "
                                                      f"pass@1 {interval}", **stats)
    return PromotionDecision(promoted=False, reason=f"not better than champion v{champion_version}: pass@1 {interval}",
                             **stats)


def scorecard_from_evaluation(eval_dir: str | Path, policy: str, trained: bool) -> Scorecard:
    """A Scorecard from what `components.evaluate.evaluate` wrote to `eval_dir`."""
    import pandas as pd

    eval_dir = Path(eval_dir)
    result = json.loads((eval_dir / "eval_result.json").read_text())
    per_task = pd.read_parquet(eval_dir / "per_task.parquet")
    return Scorecard(policy=policy, per_task_pass_at_1=dict(zip(per_task.task_id, per_task.pass_at_1.astype(float))),
                     valid_attempts=result["valid_attempts"], infra_error_rate=result["infra_error_rate"],
                     trained=trained)


# -- the registry side -----------------------------------------------------------------------------
def current_champion(tracking_uri: str, config: PromotionConfig) -> Any | None:
    """The ModelVersion behind the alias, or None when there is none (first run)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient(tracking_uri)
    try:
        return client.get_model_version_by_alias(config.model_name, config.alias)
    except MlflowException:  # no such registered model, or no such alias on it
        return None


def download_champion(tracking_uri: str, version: Any, dst: str | Path) -> Path:
    """The champion's save_pretrained directory, downloaded from its registered artifacts."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source, dst_path=str(dst)))
    found = [p.parent for p in local.rglob("config.json") if (p.parent / "tokenizer_config.json").exists()]
    if not found:
        raise FileNotFoundError(f"registered version {version.version} of {version.name} holds no save_pretrained "
                                f"directory under {version.source}")
    return found[0]


def git_commit(repo: str | Path = ".") -> str:
    """The commit the code ran at ('unknown' outside a git checkout, e.g. in a built image without .git)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def log_policy_model(model_dir: str | Path) -> str:
    """Log a save_pretrained directory as a pyfunc model under the active run (not registered); its URI.

    Requirements are given explicitly so MLflow does not spend a minute inferring them."""
    import mlflow

    if mlflow.active_run() is None:
        raise RuntimeError("log_policy_model needs an active MLflow run")
    if not (Path(model_dir) / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} is not a save_pretrained directory (no config.json)")
    info = mlflow.pyfunc.log_model(name="policy", python_model=str(Path(__file__).with_name("policy_pyfunc.py")),
                                   artifacts={"model_dir": str(model_dir)}, pip_requirements=["torch", "transformers"])
    return info.model_uri


def promote(tracking_uri: str, config: PromotionConfig, model_uri: str, lineage: dict[str, str],
            description: str) -> str:
    """Register `model_uri` as a new version with lineage tags and point the alias at it; returns the version."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    version = mlflow.register_model(model_uri, config.model_name, tags=lineage)
    client.update_model_version(config.model_name, version.version, description=description)
    # The registered model itself says what it is (the registry UI lists models before versions); only
    # the gate registers, and only trained candidates, so the model exists only once one was trained.
    client.update_registered_model(config.model_name, description=(
        f"Agent policy trained by orchard (distill -> credit -> SFT -> RL). Every version is a trained candidate "
        f"the promotion gate judged better than the champion on held-out tasks; the '{config.alias}' alias is the "
        f"current champion. Version tags hold the lineage, version descriptions the gate's reason."))
    for key, value in {"orchard.kind": "agent-policy", "orchard.alias": config.alias,
                       "orchard.latest_version": str(version.version)}.items():
        client.set_registered_model_tag(config.model_name, key, value)
    client.set_registered_model_alias(config.model_name, config.alias, version.version)
    return str(version.version)
