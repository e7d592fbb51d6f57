"""Evaluation stage: a policy on held-out tasks, k attempts each, through the same harness and sandboxes.

Reports the resolved rate and pass@1, each with a 95 % interval that covers at its level (attempts
at one task, and tasks of one unit, i.e. one repository, are clustered: see `components.core.statistics.intervals`),
the number of tasks and of independent units beside it, unbiased pass@k, mean steps and
tokens, and the infrastructure-error rate. Attempts that ended in `infra_error` (after
`infra_retries` re-runs) are excluded from every denominator and reported on their own: a crashed
sandbox says nothing about the policy. Per-task results go to a parquet artifact, the summary to a
rich table and to MLflow. Any recipe (`get_recipe`) and any policy: a local model directory, an
OpenAI-compatible endpoint, or the recipe's scripted teacher as a reference (`model_dir=None`).
"""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox_service.connection import SandboxConnection
from components.core.data.episode_traces import TraceConfig, log_episode_traces
from components.core.episode.harness import HarnessConfig, run_episode
from components.core.statistics.intervals import task_mean_ci, task_rate_ci
from components.core.policy.modeling import LoadOptions
from components.core.statistics.passk import mean_pass_at_k, pass_at_k
from components.core.policy.policies import OpenAIPolicyConfig
from components.core.data.schema import Outcome, Split, Task, Trajectory, hidden_pass_metrics
from components.core.data.splits import unit_of
from components.core.data.parquet_store import TaskStore, TrajectoryStore
from components.recipes import RecipeName
from components.core.tracking import (
    TrackingConfig,
    log_artifact_path,
    log_dataset_input,
    log_figure,
    log_json,
    log_metrics,
    stage_run,
)

PolicyKind = Literal["local", "openai", "scripted"]


class EvalConfig(BaseModel):
    """Everything that decides an evaluation run."""

    model_config = ConfigDict(extra="forbid")
    recipe: RecipeName = Field("swe", description="Task suite the tasks belong to (a registered recipe).")
    recipe_options: dict = Field(default_factory=dict, description="Extra recipe constructor arguments.")
    split: Split = Field(
        "heldout",
        description="Which tasks of the store are evaluated: heldout (the final "
        "evaluation) or validation (to tune on, never on heldout).",
    )
    k: int = Field(3, ge=1, description="Attempts per task (pass@k uses all valid ones).")
    policy: PolicyKind = Field("local", description="local model dir | OpenAI-compatible endpoint | scripted teacher.")
    endpoint: OpenAIPolicyConfig | None = Field(None, description="The endpoint when policy='openai'.")
    scripted_error_rate: float = Field(0.3, ge=0.0, le=1.0, description="Mistake rate of the scripted teacher.")
    temperature: float = Field(0.7, ge=0.0, description="Sampling temperature (k > 1 needs > 0 to differ).")
    greedy: bool = Field(
        False,
        description="Also one greedy attempt (temperature 0) per task, reported beside the "
        "sampled ones as greedy_* (what a deployment decoding greedily sees); "
        "pass@1 and the gate stay on the k sampled attempts.",
    )
    harness: HarnessConfig = Field(default_factory=HarnessConfig, description="Episode limits and sampling.")
    load: LoadOptions = Field(
        default_factory=LoadOptions, description="Device, dtype and attention kernel of a local model (policy='local')."
    )
    sandbox: SandboxConnection = Field(default_factory=SandboxConnection, description="Sandbox service to use.")
    max_tasks: int | None = Field(None, ge=1, description="Evaluate only the first N tasks (by id).")
    infra_retries: int = Field(1, ge=0, description="Re-runs of an attempt that ended in infra_error.")
    workers: int = Field(
        1,
        ge=1,
        description="Episodes in parallel (one policy instance per worker, or one batched local model: batch_local).",
    )
    batch_local: bool = Field(
        True,
        description="policy='local', workers > 1: the workers share one model whose "
        "turns are batched (BatchingPolicy); a sampled attempt then depends "
        "on its batch-mates, greedy ones do not. False: a model per worker.",
    )
    seed: int = Field(0, description="Base seed of per-attempt sampling seeds.")
    traces: TraceConfig = Field(
        default_factory=TraceConfig,
        description="Which episodes become MLflow traces (components/core/data/episode_traces.py).",
    )

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if self.policy == "openai" and self.endpoint is None:
            raise ValueError("policy='openai' needs endpoint=OpenAIPolicyConfig(base_url=..., model=...)")
        return self


class EvalResult(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")  # NaN: no valid attempt
    policy_id: str
    tasks: int
    units: int = Field(
        description="Independent units among the tasks (distinct repositories, `Task.unit`): what "
        "the intervals count as independent; below `tasks` where repositories repeat."
    )
    attempts: int
    valid_attempts: int = Field(description="Attempts with a verified outcome (the denominator).")
    resolved: int
    resolved_rate: float
    resolved_rate_ci95: tuple[float, float] = Field(
        description="Clopper-Pearson at the effective number of attempts "
        "(attempts clustered by unit; components.core.statistics.intervals)."
    )
    pass_at_1: float
    pass_at_1_ci95: tuple[float, float] = Field(description="The same interval for the mean of per-task pass@1.")
    pass_at_k: float
    k: int
    pass_at_k_tasks: int = Field(description="Tasks with at least k valid attempts (pass@k's population).")
    mean_steps: float
    mean_completion_tokens: float
    infra_errors: int
    infra_error_rate: float = Field(description="Share of attempts that ended in infra_error after retries.")
    infra_retries_used: int
    greedy_resolved: int | None = Field(None, description="Tasks resolved by the greedy attempt (greedy=True).")
    greedy_valid: int | None = Field(None, description="Greedy attempts with a verified outcome.")
    greedy_resolved_rate_ci95: tuple[float, float] | None = Field(
        None, description="Clopper-Pearson interval of the greedy resolved rate."
    )
    mean_hidden_pass_fraction: float = Field(
        float("nan"),
        description="Mean share of hidden FAIL_TO_PASS tests "
        "passing over valid attempts that have one (analysis only; NaN: none).",
    )
    hidden_pass_fraction_n: int = Field(0, description="Attempts behind mean_hidden_pass_fraction.")
    per_task_path: str
    trajectories_dir: str
    metrics: dict[str, float] = Field(default_factory=dict)


def make_policy(config: EvalConfig, model_dir: str | Path | None) -> Any:
    """The policy under evaluation (a fresh instance; workers each get their own)."""
    if config.policy == "local":
        if model_dir is None:
            raise ValueError(
                "policy='local' needs model_dir (a save_pretrained directory); "
                "use policy='scripted' to evaluate the teacher without a model"
            )
        from components.core.policy.local import LocalTransformersPolicy

        tool_format = None if config.harness.tool_format == "auto" else config.harness.tool_format
        return LocalTransformersPolicy(str(model_dir), spec=config.load, tool_format=tool_format)
    if config.policy == "openai":
        from components.core.policy.policies import OpenAICompatiblePolicy

        return OpenAICompatiblePolicy(config.endpoint)
    from components.recipes import get_scripted_teacher

    return get_scripted_teacher(config.recipe, config.scripted_error_rate, config.seed)


def summarize_attempts(tasks: list[Task], trajectories: list[Trajectory], k: int) -> tuple[list[dict], dict]:
    """Per-task rows and the aggregate metrics; infra errors leave every denominator."""
    by_task: dict[str, list[Trajectory]] = {t.id: [] for t in tasks}
    for traj in trajectories:
        by_task.setdefault(traj.task_id, []).append(traj)
    rows = []
    counts: list[tuple[int, int]] = []  # (valid attempts, resolved) per task
    for task in tasks:
        atts = by_task[task.id]
        valid = [t for t in atts if t.outcome is not Outcome.infra_error]
        c = sum(t.resolved for t in valid)
        counts.append((len(valid), c))
        rows.append(
            {
                "task_id": task.id,
                "unit": unit_of(task),
                "family": task.family,
                "difficulty": task.difficulty,
                "attempts": len(atts),
                "valid_attempts": len(valid),
                "resolved": c,
                "infra_errors": len(atts) - len(valid),
                "pass_at_1": pass_at_k(len(valid), c, 1) if valid else float("nan"),
                f"pass_at_{k}": pass_at_k(len(valid), c, k) if len(valid) >= k else float("nan"),
                "mean_steps": sum(t.num_assistant_steps for t in valid) / len(valid) if valid else float("nan"),
                "mean_completion_tokens": (
                    sum(t.completion_tokens for t in valid) / len(valid) if valid else float("nan")
                ),
                "hidden_pass_fraction": hidden_pass_metrics(valid)["hidden_pass_fraction_mean"],
            }
        )
    valid = [t for t in trajectories if t.outcome is not Outcome.infra_error]
    p1, _ = mean_pass_at_k(counts, 1)
    pk, pk_tasks = mean_pass_at_k(counts, k)
    resolved = sum(t.resolved for t in valid)
    metrics = {
        "tasks": float(len(tasks)),
        "units": float(len({unit_of(t) for t in tasks})),
        "attempts": float(len(trajectories)),
        "valid_attempts": float(len(valid)),
        "resolved": float(resolved),
        "resolved_rate": resolved / len(valid) if valid else float("nan"),
        "pass_at_1": p1,
        f"pass_at_{k}": pk,
        "pass_at_k_tasks": float(pk_tasks),
        "mean_steps": sum(t.num_assistant_steps for t in valid) / len(valid) if valid else float("nan"),
        "mean_completion_tokens": sum(t.completion_tokens for t in valid) / len(valid) if valid else float("nan"),
        "infra_errors": float(len(trajectories) - len(valid)),
        "infra_error_rate": (len(trajectories) - len(valid)) / len(trajectories) if trajectories else 0.0,
        **hidden_pass_metrics(valid),
    }
    return rows, metrics


def plot_resolved_rates(rows: list[dict], title: str, seed: int = 0) -> Any:
    """Resolved rate per task family and overall, each with its 95% interval (attempts clustered by task, tasks
    by unit) and the n of valid attempts it rests on (the figure logged with every evaluation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[tuple[int, int, str]]] = {}
    for i, r in enumerate(rows):  # rows without a unit (or task id) are their own unit
        groups.setdefault(str(r["family"] or "-"), []).append(
            (r["valid_attempts"], r["resolved"], str(r.get("unit") or r.get("task_id") or i))
        )
    groups["all"] = [c for family in list(groups) for c in groups[family]]
    bars_data = []  # (name, rate %, below %, above %, n)
    for name, counts in groups.items():
        n = sum(v for v, _, _ in counts)
        if n:
            rate = sum(c for _, c, _ in counts) / n
            lo, hi = task_rate_ci([(v, c) for v, c, _ in counts], units=[u for _, _, u in counts])
            bars_data.append((name, 100 * rate, 100 * max(0.0, rate - lo), 100 * max(0.0, hi - rate), n))
    names, rates, below, above, ns = zip(*bars_data) if bars_data else ((), (), (), (), ())
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(names) + 1.5), 3.2))
    bars = ax.bar(list(names), list(rates), yerr=[list(below), list(above)], capsize=4, color="#4c72b0")
    for bar, n in zip(bars, ns):
        ax.annotate(f"n={n}", (bar.get_x() + bar.get_width() / 2, 1), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_ylabel("resolved rate (%)")
    ax.set_title(f"{title}: 95% interval (clustered by unit), n valid attempts", fontsize=9)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    return fig


def print_summary(result: EvalResult, title: str = "evaluation") -> None:
    from rich.console import Console
    from rich.table import Table

    lo, hi = result.resolved_rate_ci95
    table = Table(title=f"{title}: {result.policy_id}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("tasks (independent units)", f"{result.tasks} ({result.units})"),
        ("valid / attempts", f"{result.valid_attempts} / {result.attempts}"),
        ("resolved rate [95% CI]", f"{result.resolved_rate:.3f} [{lo:.3f}, {hi:.3f}]"),
        ("pass@1 [95% CI]", f"{result.pass_at_1:.3f} [{result.pass_at_1_ci95[0]:.3f}, {result.pass_at_1_ci95[1]:.3f}]"),
    ]
    if result.k > 1:
        rows.append((f"pass@{result.k}", f"{result.pass_at_k:.3f} ({result.pass_at_k_tasks} tasks)"))
    rows += [
        ("mean steps", f"{result.mean_steps:.1f}"),
        ("mean completion tokens", f"{result.mean_completion_tokens:.0f}"),
        ("infra errors (excluded)", f"{result.infra_errors} ({result.infra_error_rate:.1%})"),
    ]
    if result.greedy_valid:
        lo, hi = result.greedy_resolved_rate_ci95  # type: ignore[misc]
        rows.append(
            ("greedy resolved [95% CI]", f"{result.greedy_resolved} / {result.greedy_valid} [{lo:.3f}, {hi:.3f}]")
        )
    if result.hidden_pass_fraction_n:
        rows.append(
            (
                "hidden tests passing (mean share)",
                f"{result.mean_hidden_pass_fraction:.3f} (n={result.hidden_pass_fraction_n})",
            )
        )
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


GREEDY = -1  # the attempt number of the greedy attempt (EvalConfig.greedy): never one of the k sampled ones


def _greedy_summary(rows: list[dict], greedy: list[Trajectory], metrics: dict[str, float]) -> dict[str, Any]:
    """Each task's greedy result into its row (`greedy_resolved`: 1, 0 or NaN for an infra error), the greedy
    counts into `metrics`, and the EvalResult fields."""
    from components.core.statistics.intervals import clopper_pearson

    by_task = {t.task_id: t for t in greedy}
    for row in rows:
        traj = by_task.get(row["task_id"])
        row["greedy_resolved"] = (
            float("nan") if traj is None or traj.outcome is Outcome.infra_error else float(traj.resolved)
        )
    valid = [t for t in greedy if t.outcome is not Outcome.infra_error]
    resolved = sum(t.resolved for t in valid)
    ci = clopper_pearson(resolved, len(valid)) if valid else (float("nan"), float("nan"))
    metrics.update(
        {
            "greedy_resolved": float(resolved),
            "greedy_valid": float(len(valid)),
            "greedy_resolved_rate": resolved / len(valid) if valid else float("nan"),
            "greedy_infra_errors": float(len(greedy) - len(valid)),
        }
    )
    return {"greedy_resolved": resolved, "greedy_valid": len(valid), "greedy_resolved_rate_ci95": ci}


def _attempt_seed(base: int, task_index: int, attempt: int) -> int:
    return (base * 1_000_003 + task_index * 7_919 + attempt) % (2**31)


def evaluate(
    config: EvalConfig,
    tasks_dir: str | Path,
    model_dir: str | Path | None,
    out_dir: str | Path,
    tracking: TrackingConfig | None = None,
) -> EvalResult:
    """Run k attempts per task and write per_task.parquet, trajectories/ and eval_result.json to out_dir."""
    import pandas as pd
    from tqdm import tqdm

    from components.recipes import get_recipe

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = sorted(TaskStore(tasks_dir).read(split=config.split), key=lambda t: t.id)[: config.max_tasks]
    if not tasks:
        raise ValueError(f"no {config.split!r} tasks in {tasks_dir}; provision the environment first")
    recipe = get_recipe(config.recipe, **config.recipe_options)
    spare = [make_policy(config, model_dir)]  # built now so a bad model_dir fails before any episode
    policy_id = spare[0].policy_id
    shared = None
    if config.policy == "local" and config.workers > 1 and config.batch_local:
        from components.core.policy.batching import BatchingPolicy

        shared = BatchingPolicy(spare[0], max_batch=config.workers)
    local = threading.local()
    retries_used = 0
    lock = threading.Lock()

    def attempt(job: tuple[int, Task, int]) -> Trajectory:
        nonlocal retries_used
        index, task, a = job
        if not hasattr(local, "policy"):
            with lock:
                local.policy = shared or (spare.pop() if spare else make_policy(config, model_dir))
        generation = config.harness.generation.model_copy(
            update={  # attempt GREEDY: temperature 0
                "temperature": 0.0 if a == GREEDY else config.temperature,
                "seed": _attempt_seed(config.seed, index, a),
            }
        )
        harness = config.harness.model_copy(update={"generation": generation})
        for retry in range(config.infra_retries + 1):
            traj = run_episode(task, recipe, local.policy, client, harness)
            traj.attempt = a
            traj.metadata["infra_retry"] = retry
            if traj.outcome is not Outcome.infra_error:
                break
            if retry < config.infra_retries:
                with lock:
                    retries_used += 1
        return traj

    jobs = [(i, task, a) for i, task in enumerate(tasks) for a in range(config.k)]
    if config.greedy:
        jobs += [(i, task, GREEDY) for i, task in enumerate(tasks)]
    with stage_run("evaluate", config, tracking), config.sandbox.client() as client:
        log_dataset_input(
            [{"task_id": t.id, "family": t.family, "difficulty": t.difficulty, "seed": t.seed} for t in tasks],
            tasks_dir,
            name=f"{config.recipe}-{config.split}",
            context="evaluation",
        )
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=config.workers) as pool:
                everything = list(tqdm(pool.map(attempt, jobs), total=len(jobs), desc="evaluate", leave=False))
        finally:
            if shared is not None:
                shared.close()
        trajectories = [t for t in everything if t.attempt != GREEDY]
        greedy = [t for t in everything if t.attempt == GREEDY]
        store = TrajectoryStore(out / "trajectories")
        store.append(trajectories)
        if greedy:
            TrajectoryStore(out / "trajectories_greedy").append(greedy)
        sampling = config.harness.generation.model_dump(include={"max_new_tokens", "top_p"})
        log_episode_traces(
            trajectories,
            config.traces,
            stage=(tracking.run_name if tracking else None) or "evaluate",
            sampling={**sampling, "temperature": config.temperature},
        )
        rows, metrics = summarize_attempts(tasks, trajectories, config.k)
        greedy_fields = _greedy_summary(rows, greedy, metrics) if config.greedy else {}
        per_task = out / "per_task.parquet"
        pd.DataFrame(rows).to_parquet(per_task, index=False)
        metrics["infra_retries_used"] = float(retries_used)
        valid = int(metrics["valid_attempts"])
        units = [r["unit"] for r in rows]
        result = EvalResult(
            policy_id=policy_id,
            tasks=len(tasks),
            units=int(metrics["units"]),
            attempts=len(trajectories),
            valid_attempts=valid,
            resolved=int(metrics["resolved"]),
            resolved_rate=metrics["resolved_rate"],
            resolved_rate_ci95=task_rate_ci([(r["valid_attempts"], r["resolved"]) for r in rows], units=units),
            pass_at_1=metrics["pass_at_1"],
            pass_at_1_ci95=task_mean_ci([r["pass_at_1"] for r in rows], attempts_per_task=config.k, units=units),
            pass_at_k=metrics[f"pass_at_{config.k}"],
            k=config.k,
            pass_at_k_tasks=int(metrics["pass_at_k_tasks"]),
            mean_steps=metrics["mean_steps"],
            mean_completion_tokens=metrics["mean_completion_tokens"],
            infra_errors=int(metrics["infra_errors"]),
            infra_error_rate=metrics["infra_error_rate"],
            infra_retries_used=retries_used,
            mean_hidden_pass_fraction=metrics["hidden_pass_fraction_mean"],
            hidden_pass_fraction_n=int(metrics["hidden_pass_fraction_n"]),
            per_task_path=str(per_task),
            trajectories_dir=str(out / "trajectories"),
            metrics=metrics,
            **greedy_fields,
        )
        for name in ("resolved_rate", "pass_at_1"):
            lo, hi = getattr(result, f"{name}_ci95")
            metrics.update({f"{name}_ci95_low": lo, f"{name}_ci95_high": hi})
        (out / "eval_result.json").write_text(result.model_dump_json(indent=2))
        log_metrics(metrics)
        log_artifact_path(per_task)
        log_json(result.model_dump(mode="json"), "eval_result.json")
        if tracking is not None and tracking.enabled and result.valid_attempts:
            import matplotlib.pyplot as plt

            fig = plot_resolved_rates(rows, policy_id, seed=config.seed)
            log_figure(fig, "resolved_rate.png")
            plt.close(fig)
    from components.core.console import stage_tables

    if stage_tables():  # under a quiet pipeline run the runner prints the result in its stage line
        print_summary(result)
    return result
