"""Promotion gate: a retrained policy replaces the one in use only when it is measurably better, and an RL
model ships only when it beat the SFT model it started from.

The champion is the registered version behind the MLflow alias `champion` of the policy's registered
model. Every comparison below is paired: the two models were evaluated on the same held-out tasks with
the same attempt seeds (`components.evaluate`), and the test is the exact one-sided sign-flip test of the
per-task pass@1 differences minus `margin`, clustered by unit (`intervals.paired_sign_flip_p`; with one
attempt and one task per unit the exact McNemar / sign test). A test "passes" when at least `min_tasks`
tasks have a verified result for both, the mean gain exceeds `margin` (strictly: an equal model never
passes, also at margin 0), and p <= its level. The rule (`gate_decision`), in two steps:

1. **Which model is the candidate.** The RL model, if RL made optimizer updates and its evaluation passes
   the test against the SFT model's evaluation (`evaluate-rl` vs `evaluate-sft`) at the per-gate level
   `alpha / schedule_gates`; otherwise the SFT model. Making updates is not enough: RL that changed no
   result, or scored below SFT (6/16 against 7/16), is not shipped as RL; its start is.
2. **Whether it is promoted.** The candidate must be fit to compare (trained, a verified attempt, an
   infrastructure-error rate at most `max_infra_error_rate`), and must pass the test against the champion,
   or, with no champion yet, against the model training started from (`evaluate-untrained`: never against
   the untrained model only, since an RL candidate has also beaten SFT in step 1). No reference
   evaluation: rejected. The level is `alpha / schedule_gates`, halved when step 1 had two models to
   choose from (RL trained): Bonferroni over the two models the gate could promote.

False promotions (promoting a model no better than its reference). Per gate at most
`alpha / schedule_gates`, whatever step 1 chose: the promoted model passed a test at half that level, and
only the SFT or the RL model can be promoted (union bound; the tests are exact, so each is at most its
level). Over `schedule_gates` gates against an unchanged champion the chance of any false promotion is at
most `alpha` (union bound again). Defaults: `alpha` 0.05 over `schedule_gates` 10, i.e. at most 0.005 per
gate and 0.05 over ten scheduled retrains; the former rule (RL after one update, alpha 0.05 per gate)
allowed up to 1 - 0.95^10 = 0.40 over ten. `scripts/sim_gate.py` simulates the whole two-step rule with
equal policies (start = SFT = RL = champion, each evaluated independently): at the defaults, over 15,000
gates, 0.0005 per gate and 0.005 over ten (the former rule: 0.020 and 0.18; the exact tests are
conservative at small task counts); `tests/components/test_promote.py` checks both bounds at alpha 0.3.
Why these defaults: a false promotion replaces the champion until a later gate beats it, while a missed
one is retried at the next scheduled run with more data, so the schedule, not the single gate, is what the
error budget covers; one-off comparisons may set `schedule_gates=1` (0.05 per gate). `margin` stays 0, so
that any real gain can pass: at these levels the exact test already demands a large observed gain on few
tasks (the demo's 16 at one attempt: e.g. 9 improved and none worse), and a margin would only cost power
there; raise it on large evaluations to stop churn between near-equal models. The paired intervals in the
decision (`intervals.paired_difference_ci`) are for reading only.

Promotion registers the candidate as a new version (with its lineage: parent model, dataset shards,
pipeline run, git commit, evaluation table) and moves the alias; the old version is kept, so rolling
back is moving the alias again. A rejected candidate is not registered: the registry holds only
models that were, at some point, the best one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from components.core.statistics.intervals import common_tasks, count_units, paired_difference_ci, paired_sign_flip_p


class PromotionConfig(BaseModel):
    """How a candidate is chosen and compared with the champion (module docstring: the rule and its errors)."""

    model_config = ConfigDict(extra="forbid")
    model_name: str = Field("orchard-policy", description="Registered model the champion alias lives on.")
    alias: str = Field("champion", description="Registry alias of the model in use.")
    min_tasks: int = Field(
        10,
        ge=1,
        description="Fewest tasks with a verified result for both models that "
        "a comparison may rest on; fewer: the test does not pass.",
    )
    margin: float = Field(
        0.0,
        ge=0.0,
        description="The mean pass@1 gain must exceed this (strictly) and the tests run against it: 0 = any real gain.",
    )
    alpha: float = Field(
        0.05,
        gt=0.0,
        lt=0.5,
        description="Chance of at least one false promotion over "
        "`schedule_gates` gates; each gate spends "
        "alpha / schedule_gates.",
    )
    schedule_gates: int = Field(
        10,
        ge=1,
        description="Gates `alpha` is spread over (a retraining schedule's "
        "runs): per gate at most alpha / schedule_gates. 1: a "
        "one-off comparison at alpha.",
    )
    level: float = Field(
        0.95,
        gt=0.5,
        lt=1.0,
        description="Level of the paired intervals reported with the decision (not used to decide).",
    )
    resamples: int = Field(4000, ge=100, description="Monte Carlo sign flips (x5) above 16 differing units.")
    seed: int = Field(0, description="Seed of the Monte Carlo sign flips.")
    max_infra_error_rate: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Reject a candidate whose evaluation lost more attempts than this to infrastructure.",
    )

    @property
    def gate_alpha(self) -> float:
        """The false-promotion rate one gate may spend."""
        return self.alpha / self.schedule_gates


class Scorecard(BaseModel):
    """One policy's evaluation on the gate's tasks: per-task pass@1 and what makes it comparable."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
    policy: str = Field(description="Model directory or registry URI that was evaluated.")
    per_task_pass_at_1: dict[str, float] = Field(description="task id -> pass@1 (NaN: no verified attempt).")
    units: dict[str, str] = Field(
        default_factory=dict, description="task id -> its unit (repository); a task missing here is its own unit."
    )
    valid_attempts: int
    infra_error_rate: float
    trained: bool = Field(True, description="At least one optimizer update went into this model.")

    @property
    def mean(self) -> float:
        values = [v for v in self.per_task_pass_at_1.values() if v == v]
        return sum(values) / len(values) if values else float("nan")


class PairedTest(BaseModel):
    """One paired comparison the gate made (the same tasks and attempt seeds for both models)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
    better: str = Field(description="The model tested for being better (e.g. rl).")
    than: str = Field(description="The model it was compared with (e.g. sft).")
    passed: bool = Field(description="At least min_tasks tasks, mean gain > margin and p <= alpha.")
    difference: float = Field(description="Mean over tasks of pass@1(better) - pass@1(than).")
    ci_low: float
    ci_high: float
    p_value: float = Field(description="Exact one-sided paired test of 'no better than `than` + margin'.")
    alpha: float = Field(description="The level the test ran at.")
    tasks: int = Field(description="Tasks both were evaluated on.")
    units: int = Field(description="Independent units (repositories) among them: what the test counts.")

    def summary(self, config: PromotionConfig) -> str:
        return (
            f"pass@1 {self.difference:+.3f} over {self.than} on {self.tasks} tasks ({self.units} units), "
            f"exact paired p = {self.p_value:.4f} (alpha {self.alpha:.4g}, margin {config.margin}; "
            f"{config.level:.0%} paired interval [{self.ci_low:+.3f}, {self.ci_high:+.3f}])"
        )


def paired_test(
    better: Scorecard, than: Scorecard, config: PromotionConfig, alpha: float, names: tuple[str, str]
) -> PairedTest:
    """`better` against `than` on the tasks both have, clustered by unit (module docstring)."""
    units = {**than.units, **better.units}
    p, diff, n = paired_sign_flip_p(
        better.per_task_pass_at_1,
        than.per_task_pass_at_1,
        config.margin,
        resamples=5 * config.resamples,
        seed=config.seed,
        units=units,
    )
    _, lo, hi, _ = paired_difference_ci(better.per_task_pass_at_1, than.per_task_pass_at_1, config.level, units=units)
    passed = n >= config.min_tasks and diff > config.margin and p <= alpha
    units_compared = count_units(common_tasks(better.per_task_pass_at_1, than.per_task_pass_at_1), units)
    return PairedTest(
        better=names[0],
        than=names[1],
        passed=passed,
        difference=diff,
        ci_low=lo,
        ci_high=hi,
        p_value=p,
        alpha=alpha,
        tasks=n,
        units=units_compared,
    )


class PromotionDecision(BaseModel):
    """What the gate decided and why (logged to MLflow, printed by the pipeline)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
    promoted: bool
    reason: str
    candidate_mean: float
    candidate_stage: Literal["rl", "sft"] | None = Field(None, description="rl or sft: the model that was judged.")
    rl_vs_sft: PairedTest | None = Field(
        None,
        description="Step 1: RL's evaluation against SFT's (None: RL made "
        "no optimizer update, so SFT was the only candidate).",
    )
    champion_mean: float | None = Field(None, description="Mean pass@1 of the reference (champion, or the start).")
    difference: float | None = Field(None, description="Mean over tasks of candidate - champion pass@1.")
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = Field(
        None, description="One-sided exact paired test of 'no better than the reference + margin'."
    )
    alpha: float | None = Field(None, description="The level the candidate's test ran at (module docstring).")
    reference: str | None = Field(None, description="champion or start: what the candidate was compared with.")
    tasks: int = Field(0, description="Tasks both were evaluated on.")
    units: int = Field(0, description="Independent units (repositories) among those tasks.")
    champion_version: str | None = None
    candidate_version: str | None = Field(None, description="Registered version (set when promoted).")


def select_candidate(sft: Scorecard, rl: Scorecard | None, config: PromotionConfig) -> tuple[str, PairedTest | None]:
    """Step 1: ("rl", test) when RL trained and beat SFT at the per-gate level, else ("sft", the test or None:
    RL made no update, or one of the two evaluations has no verified attempt to compare)."""
    if rl is None or not rl.trained or rl.valid_attempts == 0 or sft.valid_attempts == 0:
        return "sft", None
    versus = paired_test(rl, sft, config, config.gate_alpha, ("rl", "sft"))
    ok = versus.passed and rl.infra_error_rate <= config.max_infra_error_rate
    return ("rl" if ok else "sft"), versus


def gate_decision(
    sft: Scorecard,
    rl: Scorecard | None,
    config: PromotionConfig,
    champion: Scorecard | None = None,
    champion_version: str | None = None,
    start: Scorecard | None = None,
) -> PromotionDecision:
    """The whole rule (module docstring): step 1 picks the candidate, step 2 judges it. Pure: no registry."""
    stage, versus = select_candidate(sft, rl, config)
    contenders = 1 if versus is None else 2  # the models this gate could have promoted
    decision = decide(
        rl if stage == "rl" and rl is not None else sft,  # "rl" only when there is an RL scorecard
        champion,
        config,
        champion_version,
        start,
        alpha=config.gate_alpha / contenders,
    )
    if versus is not None:
        verdict = "beat" if stage == "rl" else "did not beat"
        decision.reason = f"candidate {stage} (RL {verdict} SFT: {versus.summary(config)}); {decision.reason}"
    elif rl is not None and rl.trained:
        decision.reason = f"candidate sft (RL's or SFT's evaluation has no verified attempt); {decision.reason}"
    return decision.model_copy(update={"candidate_stage": stage, "rl_vs_sft": versus})


def decide(
    candidate: Scorecard,
    champion: Scorecard | None,
    config: PromotionConfig,
    champion_version: str | None = None,
    start: Scorecard | None = None,
    alpha: float | None = None,
) -> PromotionDecision:
    """Step 2 on scorecards: `champion`, else `start` (the evaluation of the model this run trained from) is
    the reference; the test runs at `alpha` (None: the per-gate level, for a gate with one possible
    candidate). Pure: no registry, no MLflow."""
    alpha = config.gate_alpha if alpha is None else alpha
    base = {"candidate_mean": candidate.mean, "champion_version": champion_version}
    if not candidate.trained:
        return PromotionDecision(promoted=False, reason="candidate was not trained (no optimizer update)", **base)
    if candidate.valid_attempts == 0:
        return PromotionDecision(promoted=False, reason="candidate has no verified attempt to judge it by", **base)
    if candidate.infra_error_rate > config.max_infra_error_rate:
        return PromotionDecision(
            promoted=False,
            **base,
            reason=f"candidate evaluation lost {candidate.infra_error_rate:.0%} of attempts to infrastructure "
            f"errors (limit {config.max_infra_error_rate:.0%}): fix the sandbox service and rerun",
        )
    reference, name = (champion, f"champion v{champion_version}") if champion is not None else (start, "its start")
    if reference is None:
        return PromotionDecision(
            promoted=False,
            **base,
            reason="no champion and no evaluation of the model "
            "training started from: nothing shows the candidate is better",
        )
    test = paired_test(candidate, reference, config, alpha, ("candidate", name))
    stats = {
        **base,
        "champion_mean": reference.mean,
        "difference": test.difference,
        "ci_low": test.ci_low,
        "ci_high": test.ci_high,
        "tasks": test.tasks,
        "units": test.units,
        "p_value": test.p_value,
        "alpha": alpha,
        "reference": "champion" if champion is not None else "start",
    }
    said = test.summary(config)
    if test.tasks < config.min_tasks:
        return PromotionDecision(
            promoted=False, reason=f"only {test.tasks} tasks (min_tasks {config.min_tasks}): {said}", **stats
        )
    if test.difference <= config.margin:
        return PromotionDecision(
            promoted=False, reason=f"not better than {name} by more than the margin: {said}", **stats
        )
    if not test.passed:
        return PromotionDecision(promoted=False, reason=f"gain over {name} not significant: {said}", **stats)
    return PromotionDecision(promoted=True, reason=f"better than {name}: {said}", **stats)


def scorecard_from_evaluation(eval_dir: str | Path, policy: str, trained: bool) -> Scorecard:
    """A Scorecard from what `components.evaluate.evaluate` wrote to `eval_dir`."""
    import pandas as pd

    eval_dir = Path(eval_dir)
    result = json.loads((eval_dir / "eval_result.json").read_text())
    per_task = pd.read_parquet(eval_dir / "per_task.parquet")
    units = dict(zip(per_task.task_id, per_task.unit)) if "unit" in per_task else {}
    return Scorecard(
        policy=policy,
        per_task_pass_at_1=dict(zip(per_task.task_id, per_task.pass_at_1.astype(float))),
        units=units,
        valid_attempts=result["valid_attempts"],
        infra_error_rate=result["infra_error_rate"],
        trained=trained,
    )


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
        raise FileNotFoundError(
            f"registered version {version.version} of {version.name} holds no save_pretrained "
            f"directory under {version.source}"
        )
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
    info = mlflow.pyfunc.log_model(
        name="policy",
        python_model=str(Path(__file__).parents[1] / "policy_pyfunc.py"),
        artifacts={"model_dir": str(model_dir)},
        pip_requirements=["torch", "transformers"],
        signature=policy_signature(),
    )
    return info.model_uri


def policy_signature():
    """What `policy_pyfunc.PolicyPyfunc.predict` takes and returns: prompts (a `prompt` column of rendered
    text) in, one completion per prompt out, `max_new_tokens` (default 64) as a parameter."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string", "prompt")]),
        outputs=Schema([ColSpec("string")]),
        params=ParamSchema([ParamSpec("max_new_tokens", "long", 64)]),
    )


def model_card(decision: PromotionDecision, lineage: dict[str, str]) -> str:
    """A registered version's card (its description in the registry): training, data, evaluation with its
    interval, the gate's reason, limits. `lineage`: the version's `orchard.*` tags."""
    shards = [s for s in lineage.get("orchard.trained_shards", "").split(",") if s]
    reference = (
        f"{decision.reference} v{decision.champion_version}" if decision.champion_version else decision.reference
    )
    evaluation = f"- held-out pass@1 {decision.candidate_mean:.3f} on {decision.tasks} tasks"
    if decision.champion_mean is not None and decision.difference is not None:
        evaluation += (
            f" vs {decision.champion_mean:.3f} for the {reference}: paired difference "
            f"{decision.difference:+.3f}, 95% interval [{decision.ci_low:+.3f}, {decision.ci_high:+.3f}]"
        )
    if decision.p_value is not None:
        evaluation += f", exact paired p = {decision.p_value:.4f}"
    store = lineage.get("orchard.data_store")
    return "\n".join(
        [
            "# Agent policy trained by orchard",
            "",
            "## Training",
            f"- from: {lineage.get('orchard.parent_model', 'unknown')}; candidate stage "
            f"`{lineage.get('orchard.candidate_stage', '?')}` of distill -> credit -> SFT -> RL",
            f"- pipeline run `{lineage.get('orchard.pipeline_run_id') or '?'}`, code at git commit "
            f"`{lineage.get('orchard.git_commit', 'unknown')}`",
            "",
            "## Data",
            f"- {len(shards)} credited teacher-trajectory shard(s){f' of data store `{store}`' if store else ''}: "
            f"{', '.join(shards[:10])}{' ...' if len(shards) > 10 else ''}",
            "",
            "## Evaluation",
            evaluation,
            f"- promotion gate: {decision.reason}",
            f"- comparison table: {lineage.get('orchard.evaluation_table', '?')}",
            "",
            "## Limits",
            "- measured on the recipe's held-out tasks only, at the gate's sampling settings; few tasks make a wide "
            "interval",
            "- the policy writes tool calls in the format it was trained in (`harness.tool_format`); a harness that "
            "parses another format sees none",
        ]
    )


def promote(
    tracking_uri: str, config: PromotionConfig, model_uri: str, lineage: dict[str, str], description: str
) -> str:
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
    version = client.create_model_version(
        config.model_name,
        model_uri,
        run_id=lineage.get("orchard.pipeline_run_id") or None,
        tags=lineage,
        model_id=model_id,
    )
    client.update_model_version(config.model_name, version.version, description=description)
    # The registered model itself says what it is (the registry UI lists models before versions); only
    # the gate registers, and only trained candidates, so the model exists only once one was trained.
    client.update_registered_model(
        config.model_name,
        description=(
            f"Agent policy trained by orchard (distill -> credit -> SFT -> RL). Every version is a trained candidate "
            f"the promotion gate judged better than the champion on held-out tasks; the '{config.alias}' alias is the "
            f"current champion. Version tags hold the lineage, version descriptions the gate's reason."
        ),
    )
    for key, value in {
        "orchard.kind": "agent-policy",
        "orchard.alias": config.alias,
        "orchard.latest_version": str(version.version),
    }.items():
        client.set_registered_model_tag(config.model_name, key, value)
    client.set_registered_model_alias(config.model_name, config.alias, version.version)
    return str(version.version)
