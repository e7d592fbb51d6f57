"""The promotion gate stage: the run's model replaces the champion only when it is better, and an RL model
only when it also beat the SFT model it started from.

The RL and SFT evaluations are reused (`evaluate-rl`, `evaluate-sft`: the same held-out tasks and attempt
seeds); the RL model is the candidate only if it made optimizer updates and beat SFT on them, else the
SFT model is (`components.promote.gate_decision`, step 1). The champion (registry alias `champion`) is
downloaded and evaluated with the same EvalConfig on the same held-out tasks, so it gets the same attempt
seeds; with no champion yet, the candidate is compared with the evaluation of the model training started
from (`evaluate-untrained`). A promoted candidate is logged, registered with its lineage and gets the
alias; otherwise nothing is registered and the reason is the stage result, a tag on the pipeline run and a
row of the report.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sandbox_service.connection import SandboxConnection
from components.evaluate import EvalConfig
from components.promote.decision import PromotionConfig, PromotionDecision, Scorecard, scorecard_from_evaluation
from components.core.errors import StageFailed
from components.init_policy import STARTED_FROM


class GateConfig(BaseModel):
    """What the gate stage needs from the run's config (built from the run's config by `gate_config`)."""

    model_config = ConfigDict(extra="forbid")
    promotion: PromotionConfig
    evaluate: EvalConfig = Field(description="The candidate's evaluation settings, reused for the champion.")
    sandbox: SandboxConnection = Field(default_factory=SandboxConnection)
    enabled: bool = Field(True, description="False when register_model_name is None: nothing is registered.")


class GateResult(PromotionDecision):
    """The decision plus where the candidate came from (the stage's result)."""

    parent_model: str = Field("", description="What the candidate trained from (previous champion or base).")
    metrics: dict[str, float] = Field(default_factory=dict)


def _trained(model_dir: Path, name: str) -> int:
    """Optimizer updates recorded next to a model (sft_result.json / rl_result.json); 0 if none."""
    path = model_dir / f"{name}_result.json"
    if not path.exists():
        return 0
    record = json.loads(path.read_text())
    return int(record.get("steps_done", record.get("steps")) or 0)


def trained_scorecards(
    sft_model: Path, rl_model: Path, sft_results: Path, rl_results: Path
) -> tuple[Scorecard, Scorecard | None]:
    """The SFT and RL models' evaluations, each marked trained when its stage made optimizer updates; RL's is
    None when RL made none (or was not evaluated): then the SFT model is the only candidate."""
    sft = scorecard_from_evaluation(sft_results, policy="sft", trained=_trained(sft_model, "sft") > 0)
    if _trained(rl_model, "rl") == 0 or not (Path(rl_results) / "eval_result.json").exists():
        return sft, None
    return sft, scorecard_from_evaluation(rl_results, policy="rl", trained=True)


def comparison_table(candidate: Scorecard, champion: Scorecard | None):
    import pandas as pd

    rows = [
        {
            "task_id": t,
            "candidate_pass_at_1": v,
            "champion_pass_at_1": champion.per_task_pass_at_1.get(t) if champion else None,
        }
        for t, v in sorted(candidate.per_task_pass_at_1.items())
    ]
    return pd.DataFrame(rows)


def plot_comparison(decision: PromotionDecision, table):
    """Per-task pass@1 side by side, and the mean difference with its paired interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tasks_ax, diff_ax) = plt.subplots(1, 2, figsize=(9, 3), gridspec_kw={"width_ratios": [3, 1]})
    x = range(len(table))
    tasks_ax.bar([i - 0.2 for i in x], table.candidate_pass_at_1.fillna(0), 0.4, label="candidate", color="#4c72b0")
    if table.champion_pass_at_1.notna().any():
        tasks_ax.bar([i + 0.2 for i in x], table.champion_pass_at_1.fillna(0), 0.4, label="champion", color="#dd8452")
    tasks_ax.set_xticks(list(x), table.task_id, rotation=90, fontsize=6)
    tasks_ax.set_ylabel("pass@1")
    tasks_ax.legend(fontsize=7)
    diff, lo, hi = decision.difference, decision.ci_low, decision.ci_high
    if diff is not None and lo is not None and hi is not None:  # set together, from one paired test
        diff_ax.errorbar(
            [0],
            [diff],
            yerr=[[diff - lo], [hi - diff]],
            fmt="o",
        )
    diff_ax.axhline(0, color="grey", lw=0.8)
    diff_ax.set_xticks([])
    diff_ax.set_title("promoted" if decision.promoted else "kept champion", fontsize=8)
    diff_ax.set_ylabel("candidate - champion")
    fig.tight_layout()
    return fig


def run_gate(
    config: GateConfig,
    tasks: Path,
    base_model: Path,
    sft_model: Path,
    rl_model: Path,
    sft_results: Path,
    rl_results: Path,
    credited: Path,
    out: Path,
    tracking,
    base_results: Path | None = None,
) -> GateResult:
    """The gate (module docstring); `out` receives the champion's evaluation and comparison.json.
    `base_results`: the evaluation of the model training started from (the first candidate's reference)."""
    import mlflow

    from components.core.data.retrain_store import read_training_list
    from components.core.tracking import log_dataset_input, log_figure, log_table, resume_run, stage_run
    from components.evaluate import evaluate
    from components.promote.decision import (
        current_champion,
        download_champion,
        gate_decision,
        git_commit,
        log_policy_model,
        model_card,
        promote,
        select_candidate,
    )

    out.mkdir(parents=True, exist_ok=True)
    sft, rl = trained_scorecards(sft_model, rl_model, sft_results, rl_results)
    stage, versus = select_candidate(sft, rl, config.promotion)
    candidate, model_dir = (rl, rl_model) if stage == "rl" and rl is not None else (sft, sft_model)
    off = None if config.enabled else "register_model_name is None: promotion is off"
    if config.evaluate.split != "heldout":  # a tuning run: its numbers were looked at to choose settings
        off = (
            f"the evaluations ran on the {config.evaluate.split} split (tuning); only held-out results promote a model"
        )
    if off:
        result = GateResult(
            promoted=False, reason=off, candidate_mean=candidate.mean, candidate_stage=stage, rl_vs_sft=versus
        )
        (out / "comparison.json").write_text(result.model_dump_json(indent=2))
        return result
    if tracking is None or not tracking.enabled:
        raise StageFailed(
            "the promotion gate needs MLflow (the registry holds the champion): run under a pipeline "
            "run, or set register_model_name=null to turn promotion off"
        )
    uri, promo = tracking.tracking_uri, config.promotion
    champion_version = current_champion(uri, promo)
    champion = None
    if champion_version is not None and candidate.trained:  # an untrained candidate is rejected without a comparison
        champion_dir = download_champion(uri, champion_version, out / "champion_model")
        evaluation = config.evaluate.model_copy(update={"sandbox": config.sandbox})
        evaluate(evaluation, tasks, champion_dir, out / "champion_eval", tracking=None)
        champion = scorecard_from_evaluation(
            out / "champion_eval", policy=f"{promo.model_name}/{champion_version.version}", trained=True
        )
    version = str(champion_version.version) if champion_version is not None else None
    start = None
    if champion is None and base_results is not None and (Path(base_results) / "eval_result.json").exists():
        start = scorecard_from_evaluation(base_results, policy="start", trained=False)
    decision = gate_decision(sft, rl, promo, champion=champion, champion_version=version, start=start)
    origin = base_model / STARTED_FROM  # retrain.start_from=champion: trained from that version
    parent_model = json.loads(origin.read_text())["model"] if origin.exists() else "base (init-policy)"
    table = comparison_table(candidate, champion)
    with stage_run("promote", config, tracking):
        log_table(table, "promotion/comparison.json")
        mlflow.log_dict(decision.model_dump(mode="json"), "promotion/decision.json")
        import matplotlib.pyplot as plt

        fig = plot_comparison(decision, table)
        log_figure(fig, "promotion/comparison.png")
        plt.close(fig)
        if decision.promoted:
            training = read_training_list(credited)  # the accumulate stage's list: the real store shards
            shards = training["shards"] if training else sorted(p.name for p in Path(credited).glob("*.parquet"))
            source = (training or {}).get("store") or credited
            log_dataset_input([{"shard": s} for s in shards], source, name="training-shards", context="training")
            model_uri = log_policy_model(model_dir)
            mlflow.set_tag("orchard.registered_from", stage)
            run = mlflow.active_run()
            if run is None:  # set_tag starts one where none is active
                raise RuntimeError("no active MLflow run to point the promotion's evaluation table at")
            lineage = {
                "orchard.parent_model": parent_model,
                "orchard.pipeline_run_id": tracking.parent_run_id or "",
                "orchard.git_commit": git_commit(Path(__file__).resolve().parents[2]),
                "orchard.trained_shards": ",".join(shards)[:4000],
                "orchard.candidate_stage": stage,
                "orchard.data_store": str((training or {}).get("store") or ""),
                "orchard.evaluation_table": f"runs:/{run.info.run_id}/promotion/comparison.json",
            }
            decision.candidate_version = promote(
                uri, promo, model_uri, lineage, description=model_card(decision, lineage)
            )
    metrics = {"promoted": float(decision.promoted), "candidate_mean": decision.candidate_mean}
    if decision.rl_vs_sft is not None:
        metrics |= {"rl_beat_sft": float(decision.rl_vs_sft.passed), "rl_vs_sft_p": decision.rl_vs_sft.p_value}
    result = GateResult(**decision.model_dump(), parent_model=parent_model, metrics=metrics)
    if tracking.parent_run_id:
        with resume_run(tracking, tracking.parent_run_id):
            mlflow.set_tags(
                {
                    "orchard.promotion": "promoted" if result.promoted else "rejected",
                    "orchard.promotion_reason": result.reason[:5000],
                }
            )
            if result.candidate_version:
                name, version = promo.model_name, result.candidate_version
                mlflow.set_tag("orchard.registered_model", f"{name}/{version}")
                mlflow.set_tag("orchard.registered_from", stage)
                link = f"- registered: [{name} version {version}](#/models/{name}/versions/{version}) (from {stage})"
                note = mlflow.get_run(tracking.parent_run_id).data.tags.get("mlflow.note.content", "")
                mlflow.set_tag("mlflow.note.content", f"{note}\n{link}" if note else link)
    (out / "comparison.json").write_text(result.model_dump_json(indent=2))
    return result
