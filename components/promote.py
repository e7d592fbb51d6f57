"""Promotion gate: a retrained policy replaces the one in use only when it is measurably better.

The champion is the registered version behind the MLflow alias `champion` of the policy's registered
model. The gate evaluates the candidate and the model it must beat on the same held-out tasks with the
same attempt seeds (`components.evaluate`) and decides:

1. The candidate must be fit to compare at all: trained (at least one optimizer update), at least one
   verified attempt, and an infrastructure-error rate at most `max_infra_error_rate` (a flood of
   sandbox failures says nothing about the policy). Otherwise: rejected, with that reason.
2. The reference is the champion, or, when there is none yet, the model this run's training started
   from (the `evaluate-untrained` row): a first candidate is promoted only if it beats its own start.
   No reference evaluation: rejected (nothing was shown).
3. Promoted only when all of: at least `min_tasks` tasks with a verified result for both; the mean
   per-task pass@1 gain exceeds `margin` (strictly: an equal candidate never passes, also at margin 0);
   and the exact one-sided paired sign-flip test (`intervals.paired_sign_flip_p`, of the per-task
   differences minus `margin`; with one attempt per task the exact McNemar / sign test) rejects "no
   better than the reference + margin" at `alpha`.

False promotions. `alpha` is the rate per gate at which a candidate no better than its reference is
promoted (the test is exact, so at most alpha; discrete data make it smaller, e.g. with one attempt per
task and 16 tasks the sign test has attainable sizes 1/32, 1/16, ...). `tests/components/test_promote.py`
measures it by simulating equal policies. Over G scheduled retrains against an unchanged champion the
chance of at least one false promotion is at most 1 - (1 - alpha)^G (about 40 % for G = 10 at alpha
0.05): lower `alpha`, or raise `margin`, for frequent schedules. The paired interval in the decision
(`intervals.paired_difference_ci`) is for reading only.

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

from components.core.intervals import paired_difference_ci, paired_sign_flip_p


class PromotionConfig(BaseModel):
    """How a candidate is compared with the champion."""

    model_config = ConfigDict(extra="forbid")
    model_name: str = Field("orchard-policy", description="Registered model the champion alias lives on.")
    alias: str = Field("champion", description="Registry alias of the model in use.")
    min_tasks: int = Field(10, ge=1, description="Fewest tasks with a verified result for both models that "
                                                  "a decision may rest on; fewer: not promoted.")
    margin: float = Field(0.0, ge=0.0, description="The mean pass@1 gain must exceed this (strictly) and the test "
                                                   "runs against it: 0 = any real gain.")
    alpha: float = Field(0.05, gt=0.0, lt=0.5, description="False-promotion rate per gate: the one-sided size of "
                                                           "the exact paired test.")
    level: float = Field(0.95, gt=0.5, lt=1.0, description="Level of the paired interval reported with the "
                                                           "decision (not used to decide).")
    resamples: int = Field(4000, ge=100, description="Monte Carlo sign flips (x5) above 16 differing tasks.")
    seed: int = Field(0, description="Seed of the Monte Carlo sign flips.")
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
    champion_mean: float | None = Field(None, description="Mean pass@1 of the reference (champion, or the start).")
    difference: float | None = Field(None, description="Mean over tasks of candidate - champion pass@1.")
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = Field(None, description="One-sided exact paired test of 'no better than the reference "
                                                    "+ margin'.")
    reference: str | None = Field(None, description="champion or start: what the candidate was compared with.")
    tasks: int = Field(0, description="Tasks both were evaluated on.")
    champion_version: str | None = None
    candidate_version: str | None = Field(None, description="Registered version (set when promoted).")


def decide(candidate: Scorecard, champion: Scorecard | None, config: PromotionConfig,
           champion_version: str | None = None, start: Scorecard | None = None) -> PromotionDecision:
    """The gate's rule (module docstring), on scorecards: `champion`, else `start` (the evaluation of the
    model this run trained from) is the reference. Pure: no registry, no MLflow."""
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
    reference, name = (champion, f"champion v{champion_version}") if champion is not None else (start, "its start")
    if reference is None:
        return PromotionDecision(promoted=False, **base, reason="no champion and no evaluation of the model "
                                 "training started from: nothing shows the candidate is better")
    p, diff, n = paired_sign_flip_p(candidate.per_task_pass_at_1, reference.per_task_pass_at_1, config.margin,
                                    resamples=5 * config.resamples, seed=config.seed)
    _, lo, hi, _ = paired_difference_ci(candidate.per_task_pass_at_1, reference.per_task_pass_at_1, config.level)
    stats = {**base, "champion_mean": reference.mean, "difference": diff, "ci_low": lo, "ci_high": hi, "tasks": n,
             "p_value": p, "reference": "champion" if champion is not None else "start"}
    said = (f"pass@1 {diff:+.3f} over {name} on {n} tasks, exact paired p = {p:.4f} (alpha {config.alpha}, "
            f"margin {config.margin}; {config.level:.0%} paired interval [{lo:+.3f}, {hi:+.3f}])")
    if n < config.min_tasks:
        return PromotionDecision(promoted=False, reason=f"only {n} tasks (min_tasks {config.min_tasks}): {said}",
                                 **stats)
    if diff <= config.margin:
        return PromotionDecision(promoted=False, reason=f"not better than {name} by more than the margin: {said}",
                                 **stats)
    if p > config.alpha:
        return PromotionDecision(promoted=False, reason=f"gain over {name} not significant: {said}", **stats)
    return PromotionDecision(promoted=True, reason=f"better than {name}: {said}", **stats)


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
                                   artifacts={"model_dir": str(model_dir)}, pip_requirements=["torch", "transformers"],
                                   signature=policy_signature())
    return info.model_uri


def policy_signature():
    """What `policy_pyfunc.PolicyPyfunc.predict` takes and returns: prompts (a `prompt` column of rendered
    text) in, one completion per prompt out, `max_new_tokens` (default 64) as a parameter."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec("string", "prompt")]), outputs=Schema([ColSpec("string")]),
                          params=ParamSchema([ParamSpec("max_new_tokens", "long", 64)]))


def model_card(decision: PromotionDecision, lineage: dict[str, str]) -> str:
    """A registered version's card (its description in the registry): training, data, evaluation with its
    interval, the gate's reason, limits. `lineage`: the version's `orchard.*` tags."""
    shards = [s for s in lineage.get("orchard.trained_shards", "").split(",") if s]
    reference = f"{decision.reference} v{decision.champion_version}" if decision.champion_version else decision.reference
    evaluation = f"- held-out pass@1 {decision.candidate_mean:.3f} on {decision.tasks} tasks"
    if decision.champion_mean is not None and decision.difference is not None:
        evaluation += (f" vs {decision.champion_mean:.3f} for the {reference}: paired difference "
                       f"{decision.difference:+.3f}, 95% interval [{decision.ci_low:+.3f}, {decision.ci_high:+.3f}]")
    if decision.p_value is not None:
        evaluation += f", exact paired p = {decision.p_value:.4f}"
    store = lineage.get("orchard.data_store")
    return "\n".join([
        "# Agent policy trained by orchard", "",
        "## Training",
        f"- from: {lineage.get('orchard.parent_model', 'unknown')}; candidate stage "
        f"`{lineage.get('orchard.candidate_stage', '?')}` of distill -> credit -> SFT -> RL",
        f"- pipeline run `{lineage.get('orchard.pipeline_run_id') or '?'}`, code at git commit "
        f"`{lineage.get('orchard.git_commit', 'unknown')}`", "",
        "## Data",
        f"- {len(shards)} credited teacher-trajectory shard(s){f' of data store `{store}`' if store else ''}: "
        f"{', '.join(shards[:10])}{' ...' if len(shards) > 10 else ''}", "",
        "## Evaluation", evaluation, f"- promotion gate: {decision.reason}",
        f"- comparison table: {lineage.get('orchard.evaluation_table', '?')}", "",
        "## Limits",
        "- measured on the recipe's held-out tasks only, at the gate's sampling settings; few tasks make a wide "
        "interval",
        "- the policy writes tool calls in the format it was trained in (`harness.tool_format`); a harness that "
        "parses another format sees none",
    ])


def promote(tracking_uri: str, config: PromotionConfig, model_uri: str, lineage: dict[str, str],
            description: str) -> str:
    """Register `model_uri` as a new version with lineage tags and point the alias at it; returns the version."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    # The version's run is the pipeline's parent run (the page a researcher opens: its "Registered models"
    # lists it); `register_model` would leave it empty for a `models:/<id>` URI. The logged model keeps the
    # gate's run as its source.
    try:
        client.create_registered_model(config.model_name)
    except mlflow.exceptions.MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    model_id = model_uri.split("/")[1] if model_uri.startswith("models:/m-") else None
    version = client.create_model_version(config.model_name, model_uri, run_id=lineage.get("orchard.pipeline_run_id")
                                          or None, tags=lineage, model_id=model_id)
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
