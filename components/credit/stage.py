"""Credit labeling stage: which steps of an unresolved trajectory still deserve to be imitated.

For every unresolved trajectory an estimator (`monte_carlo.MonteCarloEstimator`, the embedded default,
or `judge.LLMJudgeEstimator`, as published) gives V(s_0..s_T), the probability of resolving the
task before the first and after every assistant step; `segments` turns the curve into rise
segments. Resolved trajectories are kept whole (every assistant step credited); infrastructure
failures are copied through untouched (SFT never trains on them). The output store holds every step's
`value_estimate`, `credit` and `credited`; `rendering.render_trajectory(loss_on="credited")` turns
those into the per-token loss mask. A trajectory whose estimate fails is kept with no credited step
and the reason in `metadata["credit_error"]`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox_service.connection import SandboxConnection
from components.core.data.schema import Outcome, Task, Trajectory
from components.core.data.parquet_store import TaskStore, TrajectoryStore
from components.core.tracking import TrackingConfig, log_figure, log_json, log_metrics, stage_run
from components.credit.base import CreditEstimationError, ValueEstimate, ValueEstimator
from components.credit.judge import JudgeConfig, LLMJudgeEstimator
from components.credit.monte_carlo import MonteCarloConfig, MonteCarloEstimator
from components.credit.segments import SegmentConfig, credits, segments, select_segments
from components.recipes import RecipeName


class CreditConfig(BaseModel):
    """The credit stage: which estimator, how it runs, how segments are chosen."""

    model_config = ConfigDict(extra="forbid")
    recipe: RecipeName = Field("swe", description="Recipe of the tasks (Monte-Carlo continuations run in it).")
    recipe_options: dict = Field(default_factory=dict, description="Extra recipe constructor arguments.")
    sandbox: SandboxConnection = Field(default_factory=SandboxConnection, description="Sandbox service (Monte-Carlo).")
    estimator: Literal["monte_carlo", "judge"] = Field("monte_carlo", description="Value estimator.")
    monte_carlo: MonteCarloConfig = Field(default_factory=MonteCarloConfig, description="Monte-Carlo settings.")
    judge: JudgeConfig | None = Field(None, description="LLM judge endpoint (estimator='judge').")
    segments: SegmentConfig = Field(default_factory=SegmentConfig, description="Rise-segment selection.")
    max_trajectories: int | None = Field(None, ge=1, description="Label only the first N unresolved ones (smoke runs).")
    figure_trajectories: int = Field(8, ge=0, description="Value curves drawn in the MLflow figure.")

    @model_validator(mode="after")
    def _judge_has_an_endpoint(self) -> CreditConfig:
        # Checked with the config, not when the stage starts: a pipeline would otherwise fail only after
        # distillation, minutes in.
        if self.estimator == "judge" and self.judge is None:
            raise ValueError(
                "estimator='judge' needs judge settings: set judge.base_url and judge.model "
                "(e.g. --set credit.judge.base_url=http://vllm:8000/v1 --set credit.judge.model=NAME)"
            )
        return self


class CreditResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    out_dir: str
    trajectories: int
    resolved: int
    unresolved: int
    infra_error: int
    labelled: int = Field(description="Unresolved trajectories with a value curve.")
    failed: int = Field(description="Unresolved trajectories whose estimate failed (kept, no credit).")
    credited_steps: int = Field(description="Credited assistant steps of unresolved trajectories.")
    assistant_steps: int = Field(description="Assistant steps of unresolved trajectories.")
    metrics: dict[str, float] = Field(default_factory=dict)


def apply_estimate(trajectory: Trajectory, estimate: ValueEstimate, config: SegmentConfig) -> Trajectory:
    """A copy of `trajectory` with value_estimate / credit / credited on its assistant steps."""
    selected = select_segments(estimate.values, config, estimate.credit_stderr)
    c = credits(estimate.values, config)
    out = trajectory.model_copy(deep=True)
    assistant = [s for s in out.steps if s.role == "assistant"]
    if [s.index for s in assistant] != estimate.step_indices:
        raise CreditEstimationError(f"estimate for {trajectory.id} does not match its assistant steps")
    for t, step in enumerate(assistant):
        step.value_estimate = estimate.values[t + 1]
        step.credit = c[t]
        step.credited = selected[t]
    out.metadata = {
        **out.metadata,
        "credit": {
            "estimator": estimate.estimator,
            "values": estimate.values,
            "stderr": estimate.stderr,
            "samples": estimate.samples,
            "credit_stderr": estimate.credit_stderr,
            "segments": segments(selected),
            "segment_config": config.model_dump(),
        },
    }
    return out


def keep_whole(trajectory: Trajectory) -> Trajectory:
    out = trajectory.model_copy(deep=True)
    for step in out.steps:
        if step.role == "assistant":
            step.credited = True
    return out


class _Closable(Protocol):
    def close(self) -> None: ...


def _make_estimator(config: CreditConfig) -> tuple[ValueEstimator, _Closable]:
    """The estimator the config names and what it owns (closed when labelling ends)."""
    if config.estimator == "judge":
        if config.judge is None:
            raise ValueError("estimator='judge' needs CreditConfig.judge (base_url and model of the endpoint)")
        judge = LLMJudgeEstimator(config.judge)
        return judge, judge
    from components.recipes import get_recipe

    client = config.sandbox.client()
    estimator = MonteCarloEstimator(config.monte_carlo, get_recipe(config.recipe, **config.recipe_options), client)
    return estimator, client


def label_credit(
    config: CreditConfig,
    trajectories_dir: str | Path,
    tasks_dir: str | Path,
    out_dir: str | Path,
    tracking: TrackingConfig | None = None,
    estimator: ValueEstimator | None = None,
) -> CreditResult:
    """Label every trajectory of `trajectories_dir` and write them to `out_dir`.

    `estimator` overrides the one the config names (tests, custom estimators)."""
    from tqdm import tqdm

    trajectories = TrajectoryStore(trajectories_dir).read()
    tasks: dict[str, Task] = {t.id: t for t in TaskStore(tasks_dir).read()}
    store = TrajectoryStore(out_dir)
    owned: _Closable | None = None
    if estimator is None:
        estimator, owned = _make_estimator(config)
    counts = {o: sum(t.outcome is o for t in trajectories) for o in Outcome}
    out: list[Trajectory] = []
    estimates: list[tuple[Trajectory, ValueEstimate]] = []
    failed = 0
    budget = config.max_trajectories
    t0 = time.perf_counter()
    with stage_run("credit", config, tracking):
        try:
            for traj in tqdm(trajectories, desc=f"credit ({estimator.name})"):
                if traj.outcome is Outcome.resolved:
                    out.append(keep_whole(traj))
                    continue
                if traj.outcome is Outcome.infra_error:
                    out.append(traj)
                    continue
                task = tasks.get(traj.task_id)
                if task is None or (budget is not None and len(estimates) + failed >= budget):
                    reason = "task not in the task store" if task is None else "over max_trajectories"
                    out.append(traj.model_copy(update={"metadata": {**traj.metadata, "credit_error": reason}}))
                    failed += task is None
                    continue
                try:
                    estimate = estimator.estimate(traj, task)
                    labelled = apply_estimate(traj, estimate, config.segments)
                    estimates.append((labelled, estimate))
                    out.append(labelled)
                except CreditEstimationError as err:
                    failed += 1
                    out.append(traj.model_copy(update={"metadata": {**traj.metadata, "credit_error": str(err)}}))
        finally:
            if owned is not None:
                owned.close()
        store.append(out)
        seconds = time.perf_counter() - t0
        unresolved = [t for t in out if t.outcome is Outcome.unresolved]
        steps = [s for t in unresolved for s in t.steps if s.role == "assistant"]
        credited = sum(1 for s in steps if s.credited)
        errs = [e for _, est in estimates for e in est.stderr if e is not None and e > 0]
        credit_ses = sorted(e for _, est in estimates for e in (est.credit_stderr or []) if e is not None)
        result = CreditResult(
            out_dir=str(out_dir),
            trajectories=len(out),
            resolved=counts[Outcome.resolved],
            unresolved=counts[Outcome.unresolved],
            infra_error=counts[Outcome.infra_error],
            labelled=len(estimates),
            failed=failed,
            credited_steps=credited,
            assistant_steps=len(steps),
        )
        result.metrics = {
            "labelled": float(len(estimates)),
            "failed": float(failed),
            "credited_step_fraction": credited / len(steps) if steps else 0.0,
            "segments_per_trajectory": (
                sum(len(segments([bool(s.credited) for s in t.steps if s.role == "assistant"])) for t, _ in estimates)
                / len(estimates)
            )
            if estimates
            else 0.0,
            "mean_value_stderr": sum(errs) / len(errs) if errs else 0.0,
            **credit_stderr_summary(credit_ses, config.segments.epsilon),
            "seconds": seconds,
            "seconds_per_trajectory": seconds / len(estimates) if estimates else 0.0,
        }
        for attr in ("continuations", "infra_failures", "rejected_answers"):
            if hasattr(estimator, attr):
                result.metrics[attr] = float(getattr(estimator, attr))
        log_metrics(result.metrics)
        log_json(result.model_dump(mode="json"), "credit_result.json")
        if estimates and config.figure_trajectories:
            _log_value_curves(estimates[: config.figure_trajectories])
        if credit_ses:
            _log_stderr_histogram(credit_ses, config.segments)
    return result


def credit_stderr_summary(ses: list[float], epsilon: float) -> dict[str, float]:
    """The distribution of SE(c_t) over every credited-or-not step of the run (sorted input)."""
    if not ses:
        return {}

    def q(p: float) -> float:
        return ses[min(len(ses) - 1, int(p * len(ses)))]

    return {
        "credit_stderr_p50": q(0.5),
        "credit_stderr_p90": q(0.9),
        "credit_stderr_max": ses[-1],
        "credit_stderr_below_epsilon": sum(se < epsilon for se in ses) / len(ses),
        "credit_stderr_steps": float(len(ses)),
    }


def _log_stderr_histogram(ses: list[float], config: SegmentConfig) -> None:
    import mlflow

    if mlflow.active_run() is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(ses, bins=30)
    ax.axvline(config.epsilon, color="k", ls="--", label=f"epsilon = {config.epsilon}")
    ax.set_xlabel("SE(c_t), paired continuations")
    ax.set_ylabel("steps")
    ax.set_title(f"Credit standard errors ({len(ses)} steps)")
    ax.legend()
    fig.tight_layout()
    log_figure(fig, "credit_stderr_hist.png")
    plt.close(fig)


def _log_value_curves(items: list[tuple[Trajectory, ValueEstimate]]) -> None:
    import mlflow

    if mlflow.active_run() is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for traj, est in items:
        xs = list(range(len(est.values)))
        errs = [e or 0.0 for e in est.stderr]
        line = ax.errorbar(xs, est.values, yerr=errs, marker="o", ms=3, capsize=2, alpha=0.8)[0]
        flags = [bool(s.credited) for s in traj.steps if s.role == "assistant"]
        for t, flag in enumerate(flags):
            if flag:
                ax.plot([t, t + 1], [est.values[t], est.values[t + 1]], color=line.get_color(), lw=4, alpha=0.5)
    ax.set_xlabel("assistant step t (0 = before the first action)")
    ax.set_ylabel("V(s_t) = P(resolve)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Value curves of unresolved trajectories (thick = credited rise segments)")
    fig.tight_layout()
    log_figure(fig, "credit_value_curves.png")
    plt.close(fig)
