"""Stage 2, distill: run a teacher over the training tasks in sandboxes and store its trajectories.

Each (task, attempt) is one episode through the same harness a model uses, verified with the hidden
tests. Episodes run in a bounded thread pool (each holds one sandbox). An episode that ends in an
infrastructure failure is retried; if it still fails it is stored as `infra_error`, never as
`unresolved`. The stage is resumable: attempts already stored (other than infra errors) are skipped.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import re
import time
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from tqdm.auto import tqdm

from sandbox_service.connection import SandboxConnection
from components.core.episode.harness import HarnessConfig, run_episode
from components.core.policy.policies import OpenAICompatiblePolicy, OpenAIPolicyConfig
from components.core.policy.base import Policy
from components.recipes import RecipeName
from components.core.policy.teacher import TeacherConfig
from components.core.data.schema import Outcome, Task, Trajectory, hidden_pass_metrics
from components.core.data.parquet_store import TaskStore, TrajectoryStore
from components.core.tracking import TrackingConfig, log_figure, log_json, log_metrics, stage_run
from components.recipes import get_recipe
from components.teacher_policies import teacher_factory


class DistillConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    recipe: RecipeName = Field("swe", description="Recipe of the tasks (a registered recipe).")
    recipe_options: dict = Field(default_factory=dict, description="Extra recipe constructor arguments.")
    teacher: Literal["scripted", "openai"] = Field("scripted", description="Scripted expert or an endpoint.")
    openai: OpenAIPolicyConfig | None = Field(None, description="Endpoint settings (teacher='openai').")
    error_rate: float = Field(0.3, ge=0.0, le=1.0, description="Scripted teacher's mistake rate.")
    attempts_per_task: int = Field(1, ge=1, description="Trajectories per task.")
    max_parallel: int = Field(4, ge=1, description="Concurrent episodes (= sandboxes held at once).")
    harness: HarnessConfig = Field(default_factory=HarnessConfig, description="Limits and sampling per episode.")
    infra_retries: int = Field(2, ge=0, description="Reruns of an episode that ended in an infra failure.")
    retry_backoff_seconds: float = Field(1.0, ge=0, description="Wait before an infra retry (doubles each time).")
    split: Literal["train", "heldout"] = Field("train", description="Which tasks to run.")
    max_tasks: int | None = Field(None, ge=1, description="Only the first N tasks (None = all).")
    seed: int = Field(0, description="Seeds the scripted teacher per (task, attempt).")
    flush_every: int = Field(16, ge=1, description="Trajectories buffered before a shard is written.")
    sandbox: SandboxConnection = Field(default_factory=SandboxConnection, description="Sandbox service.")
    progress: bool = Field(True, description="Show a progress bar.")

    @model_validator(mode="after")
    def _endpoint_teacher_has_settings(self) -> DistillConfig:
        # With the config, not at the stage: a pipeline would otherwise find out after its first stages.
        if self.teacher == "openai" and self.openai is None:
            raise ValueError(
                "teacher='openai' needs its endpoint settings: set distill.openai={\"base_url\": "
                '"http://host:8000/v1", "model": "..."} (api_key_env names the key\'s variable)'
            )
        return self


class DistillResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trajectories_dir: str
    counts: dict[str, int] = Field(description="New trajectories per outcome (resolved/unresolved/infra_error).")
    skipped: int = Field(0, description="Attempts already in the store (resumed run).")
    throughput_per_min: float = Field(description="New trajectories per wall-clock minute.")
    failure_reasons: dict[str, int] = Field(default_factory=dict, description="Why episodes were not resolved.")
    metrics: dict[str, float] = Field(default_factory=dict)


def _stable(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "big")


def reason_category(reason: str | None) -> str:
    """'2 FAIL_TO_PASS tests not passing: tests/...' -> 'N FAIL_TO_PASS tests not passing'."""
    if not reason:
        return "none"
    return re.sub(r"\d+", "N", reason.split(":", 1)[0]).strip()[:80]


class _Teachers:
    """A fresh scripted teacher per episode (it is stateful); one shared endpoint client otherwise."""

    def __init__(self, config: DistillConfig):
        self.config = config
        self.teacher = TeacherConfig(kind=config.teacher, error_rate=config.error_rate, endpoint=config.openai)
        self.make = teacher_factory(self.teacher, config.recipe, 0)
        self.endpoint: OpenAICompatiblePolicy | None = self.make(0) if config.teacher == "openai" else None  # type: ignore[assignment]

    def get(self, task: Task, attempt: int, retry: int) -> Policy:
        if self.endpoint is not None:
            return self.endpoint
        return self.make(_stable(self.config.seed, task.id, attempt, retry))

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()


def _episode(task: Task, attempt: int, recipe, teachers: _Teachers, client, config: DistillConfig) -> Trajectory:
    for retry in range(config.infra_retries + 1):
        traj = run_episode(task, recipe, teachers.get(task, attempt, retry), client, config.harness)
        traj.attempt = attempt
        traj.metadata["infra_retries"] = retry
        if traj.outcome is not Outcome.infra_error:
            break
        if retry < config.infra_retries:
            time.sleep(config.retry_backoff_seconds * 2**retry)
    return traj


def _figure(counts: Counter, steps: list[int]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    names = ["resolved", "unresolved", "infra_error"]
    a.bar(names, [counts.get(n, 0) for n in names], color=["tab:green", "tab:red", "tab:gray"])
    a.set_title("teacher trajectories")
    b.hist(steps or [0], bins=range(0, max(steps or [1]) + 2))
    b.set_title("assistant steps per episode")
    fig.tight_layout()
    return fig


def distill(
    config: DistillConfig, tasks_dir: str | Path, out_dir: str | Path, tracking: TrackingConfig | None = None
) -> DistillResult:
    recipe = get_recipe(config.recipe, **config.recipe_options)
    tasks = TaskStore(tasks_dir).read(split=config.split)
    if config.max_tasks is not None:
        tasks = tasks[: config.max_tasks]
    store = TrajectoryStore(out_dir)
    done = store.attempts_done()
    jobs = [(t, a) for t in tasks for a in range(config.attempts_per_task) if a >= done.get(t.id, 0)]
    skipped = len(tasks) * config.attempts_per_task - len(jobs)

    counts: Counter = Counter()
    reasons: Counter = Counter()
    steps: list[int] = []
    buffer: list[Trajectory] = []
    finished: list[Trajectory] = []  # for the partial-progress summary (hidden tests passing)
    start = time.monotonic()
    teachers = _Teachers(config)
    with stage_run("distill", config, tracking), config.sandbox.client() as client:
        bar = tqdm(total=len(jobs), desc="distill", disable=(not config.progress) or None)  # None: off when piped
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=config.max_parallel) as pool:
                futures = [pool.submit(_episode, t, a, recipe, teachers, client, config) for t, a in jobs]
                for future in concurrent.futures.as_completed(futures):
                    traj = future.result()
                    counts[traj.outcome.value] += 1
                    steps.append(traj.num_assistant_steps)
                    if traj.outcome is not Outcome.resolved:
                        reasons[f"{traj.outcome.value}: {reason_category(traj.outcome_reason)}"] += 1
                    buffer.append(traj)
                    finished.append(traj)
                    if len(buffer) >= config.flush_every:
                        store.append(buffer)
                        buffer = []
                    bar.update(1)
                    bar.set_postfix(
                        resolved=counts["resolved"], unresolved=counts["unresolved"], infra=counts["infra_error"]
                    )
        finally:
            store.append(buffer)  # whatever finished is kept, even if the stage is interrupted
            bar.close()
            teachers.close()
        wall = time.monotonic() - start
        n = sum(counts.values())
        valid = counts["resolved"] + counts["unresolved"]
        metrics = {
            "n_trajectories": n,
            "resolved": counts["resolved"],
            "unresolved": counts["unresolved"],
            "infra_error": counts["infra_error"],
            "skipped": skipped,
            "resolve_rate": counts["resolved"] / valid if valid else 0.0,
            "infra_error_rate": counts["infra_error"] / n if n else 0.0,
            "throughput_per_min": n / (wall / 60) if wall > 0 and n else 0.0,
            "mean_steps": sum(steps) / len(steps) if steps else 0.0,
            "wall_seconds": wall,
            **hidden_pass_metrics(finished),
        }
        log_metrics(metrics)
        if tracking is not None and tracking.enabled:
            log_json(dict(reasons), "failure_reasons.json")
            fig = _figure(counts, steps)
            log_figure(fig, "distill_outcomes.png")
            fig.clf()
    return DistillResult(
        trajectories_dir=str(out_dir),
        counts={k: counts.get(k, 0) for k in ("resolved", "unresolved", "infra_error")},
        skipped=skipped,
        throughput_per_min=metrics["throughput_per_min"],
        failure_reasons=dict(reasons),
        metrics=metrics,
    )
