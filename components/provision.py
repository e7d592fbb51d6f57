"""Stage 1, provision: generate the recipe's tasks into a TaskStore and check the sandbox service.

Three splits: train (what training sees), validation (for tuning: learning rate, temperature, ...) and
heldout (the final evaluation, never trained or tuned on). Generated splits share no unit and hold no task
twice, for every seed (`components.core.data.splits`): the held-out and validation sets come from a fixed seed
while the train seed varies, and no train seed can produce one of their tasks. Imported (SWE-bench) tasks
are split in file order; a held-out or validation instance whose content repeats a training one, or an
earlier one of its own split, is dropped and counted (`ProvisionResult.metrics`). Each split's number of
independent units (distinct repositories) is reported beside its number of tasks.

The service check is the pipeline's early warning: health, then one sandbox created, exec'd a few
times and deleted, with the latencies reported. Optionally a sample of tasks is checked in
sandboxes (SWE: the reference fix resolves it, the unfixed repository does not).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox_service.connection import SandboxConnection
from components.core.episode.recipe_base import TaskImportError
from components.core.data.schema import Task
from components.core.data.splits import check_disjoint, digest, unit_of
from components.core.data.parquet_store import TaskStore
from components.core.tracking import TrackingConfig, log_metrics, stage_run
from components.recipes import RecipeName, check_task, get_recipe


class ProvisionError(RuntimeError):
    """The sandbox service is not usable, or a generated task failed its check."""


class TaskSource(BaseModel):
    """Where the tasks come from: the recipe's generator, or a SWE-bench-format file (JSONL/JSON/parquet)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["generator", "swebench"] = Field("generator", description="generator | swebench (a file).")
    path: str | None = Field(None, description="The SWE-bench instances file (kind='swebench').")
    repos_dir: str | None = Field(None, description="Git checkouts of the instances' repositories (owner__name).")

    @model_validator(mode="after")
    def _check(self) -> "TaskSource":
        if self.kind == "swebench" and (not self.path or not self.repos_dir):
            raise ValueError(
                "tasks source 'swebench' needs path (the JSONL/parquet file) and repos_dir "
                "(where the repositories are cloned, e.g. repos/astropy__astropy)"
            )
        return self


class ProvisionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    recipe: RecipeName = Field(
        "swe",
        description="Recipe whose tasks are generated (a registered recipe: swe, gui, "
        "claw or one from another package).",
    )
    n_train: int = Field(24, ge=0, description="Training tasks.")
    n_heldout: int = Field(12, ge=0, description="Held-out tasks (the final evaluation; never trained or tuned on).")
    n_validation: int = Field(
        12,
        ge=0,
        description="Validation tasks: tune on these (learning rate, temperature: `evaluate.split="
        "validation`), never on the held-out ones. Disjoint from both other splits.",
    )
    seed: int = Field(0, description="Generation seed of the training tasks (tasks are a pure function of it).")
    heldout_seed: int | None = Field(
        0,
        description="Seed of the held-out and validation tasks, fixed by default so that every seed of a study "
        "(and every run) is evaluated on the same sets (ProvisionResult.heldout_digest says so); "
        "None: follow `seed`. No train seed can produce one of their tasks either way.",
    )
    heldout_families: list[str] = Field(
        default_factory=list,
        description="Task families (SWE: bug families) only the held-out split draws from; train and validation "
        "never see them. Needed for any claim that a policy generalises to kinds of task it was not "
        "trained on; without, held-out tasks are new instances (new repositories) of the trained "
        "families.",
    )
    difficulty: int | list[int] | None = Field(
        1, description="Difficulty level(s), cycled over tasks; None for recipes without levels."
    )
    recipe_options: dict[str, Any] = Field(default_factory=dict, description="Extra recipe constructor arguments.")
    source: TaskSource = Field(
        default_factory=TaskSource,
        description="generator, or a SWE-bench file: its instances sorted by id, the first "
        "n_train become train tasks and the next n_heldout held-out tasks.",
    )
    sandbox: SandboxConnection = Field(default_factory=SandboxConnection, description="Sandbox service.")
    check_sandbox: bool = Field(True, description="Check the service (health, create/exec/delete, latency).")
    latency_probes: int = Field(5, ge=1, description="Execs timed in the probe sandbox.")
    validate_tasks: int = Field(
        0,
        ge=0,
        description="Train tasks given the recipe's gold check in sandboxes "
        "(reference solution resolves, unchanged task fails; 0 = none).",
    )
    data_store: str | None = Field(
        None,
        description="Retraining data store (copied from retrain.data_store): the training tasks come from "
        "a seed no earlier run of the store used, recorded there under the pipeline run id.",
    )


class ProvisionResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tasks_dir: str = Field(description="The TaskStore directory written.")
    train_seed: int | None = Field(None, description="Seed of the training tasks (drawn from the data store).")
    counts: dict[str, int] = Field(description="Tasks per split.")
    units: dict[str, int] = Field(
        default_factory=dict,
        description="Independent units (distinct repositories, "
        "`Task.unit`) per split: what intervals count, beside `counts`.",
    )
    families: dict[str, int] = Field(default_factory=dict, description="Tasks per family (all splits).")
    heldout_digest: str = Field(
        "",
        description="sha256 of the held-out tasks (ids, prompts, environments, "
        "verifiers): equal digests, equal held-out sets.",
    )
    validation_digest: str = Field("", description="The same for the validation tasks.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Counts and sandbox latencies (seconds).")


def check_service(connection: SandboxConnection, probes: int = 5) -> dict[str, float]:
    """Health plus one sandbox created, exec'd `probes` times and deleted; latencies in seconds."""
    try:
        with connection.client() as client:
            start = time.monotonic()
            client.healthz()
            health = time.monotonic() - start
            start = time.monotonic()
            sandbox = client.create()
            created = time.monotonic() - start
            latencies = []
            try:
                for _ in range(probes):
                    start = time.monotonic()
                    result = sandbox.exec(["true"], timeout=30)
                    latencies.append(time.monotonic() - start)
                    if not result.ok:
                        raise ProvisionError(
                            f"`true` failed in a fresh sandbox: {result.outcome.value} {result.message}"
                        )
            finally:
                start = time.monotonic()
                sandbox.delete()
                deleted = time.monotonic() - start
    except ProvisionError:
        raise
    except Exception as err:
        raise ProvisionError(
            f"sandbox service at {connection.url} is not usable ({type(err).__name__}: {err}); "
            "start it (`orchard-sandbox serve`) or fix ORCHARD_SANDBOX_URL/TOKEN"
        ) from err
    return {
        "sandbox_health_seconds": health,
        "sandbox_create_seconds": created,
        "sandbox_delete_seconds": deleted,
        "exec_latency_p50": statistics.median(latencies),
        "exec_latency_max": max(latencies),
    }


def provision_environment(
    config: ProvisionConfig, out_tasks_dir: str | Path, tracking: TrackingConfig | None = None
) -> ProvisionResult:
    recipe = get_recipe(config.recipe, **recipe_options(config))
    with stage_run("provision", config, tracking):
        splits, dropped = split_tasks(config, recipe)
        train_seed = None
        if config.data_store:
            train_seed, splits["train"] = _claim_new_tasks(
                config, config.data_store, recipe, splits["heldout"], out_tasks_dir, tracking
            )
        overlaps = {k: v for k, v in check_disjoint(splits, recipe.task_content).items() if v}
        if overlaps:  # generated splits are disjoint by construction, imported ones after `_deduplicated`
            raise ProvisionError(
                f"task splits share content or repeat a task ({overlaps}): a bug in the recipe's "
                "generator or in the import's deduplication"
            )
        tasks = [t for split in splits.values() for t in split]
        TaskStore(out_tasks_dir).write(tasks)
        counts = {name: len(split) for name, split in splits.items()}
        units = {name: len({unit_of(t) for t in split}) for name, split in splits.items()}
        metrics: dict[str, float] = {
            **{f"n_{k}": float(v) for k, v in counts.items()},
            **{f"units_{k}": float(v) for k, v in units.items()},
            **{f"{k}_duplicates_dropped": float(v) for k, v in dropped.items()},
        }
        if config.check_sandbox:
            metrics.update(check_service(config.sandbox, config.latency_probes))
        if config.validate_tasks:
            metrics.update(_validate(recipe, splits["train"][: config.validate_tasks], config.sandbox))
        log_metrics(metrics)
    families = Counter(t.family or "none" for t in tasks)
    return ProvisionResult(
        tasks_dir=str(out_tasks_dir),
        train_seed=train_seed,
        counts=counts,
        units=units,
        families=dict(families),
        metrics=metrics,
        heldout_digest=heldout_digest(splits["heldout"]),
        validation_digest=heldout_digest(splits["validation"]),
    )


def recipe_options(config: ProvisionConfig) -> dict[str, Any]:
    """The recipe's constructor arguments: `recipe_options` with the difficulty and held-out families."""
    options = dict(config.recipe_options)
    if config.difficulty is not None:
        options["difficulty"] = config.difficulty
    if config.heldout_families:
        if "heldout_families" in options:
            raise ProvisionError(
                "held-out families are set twice: keep provision.heldout_families and drop "
                "provision.recipe_options.heldout_families"
            )
        options["heldout_families"] = list(config.heldout_families)
    return options


def heldout_digest(tasks: list) -> str:
    """A digest of a task set that ignores order and creation times."""
    import hashlib

    rows = sorted(
        t.model_dump_json(include={"id", "prompt", "environment", "verifier", "family", "difficulty"}) for t in tasks
    )
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def split_tasks(config: ProvisionConfig, recipe) -> tuple[dict[str, list[Task]], dict[str, int]]:
    """The splits ({train, validation, heldout}) and, for imported tasks, the duplicates dropped per split."""
    if config.source.kind == "generator":
        fixed = config.seed if config.heldout_seed is None else config.heldout_seed
        return {
            "train": recipe.tasks("train", config.n_train, config.seed),
            "validation": recipe.tasks("validation", config.n_validation, fixed),
            "heldout": recipe.tasks("heldout", config.n_heldout, fixed),
        }, {}
    if config.heldout_families:
        raise ProvisionError("provision.heldout_families splits generated tasks; an imported file is split in order")
    try:
        tasks = sorted(
            recipe.import_tasks(config.source.kind, config.source.path, config.source.repos_dir),
            key=lambda t: t.id,
        )
    except TaskImportError as err:
        raise ProvisionError(f"cannot import {config.source.path}: {err}") from err
    # File order: train first, then held-out, then validation (so adding validation keeps the held-out set).
    train = [t.model_copy(update={"split": "train"}) for t in tasks[: config.n_train]]
    seen = {digest(recipe.task_content(t)) for t in train}
    splits, dropped, rest = {"train": train}, {}, tasks[config.n_train :]
    for split, n in (("heldout", config.n_heldout), ("validation", config.n_validation)):
        kept: list[Task] = []
        count = 0
        while rest and len(kept) < n:
            task, rest = rest[0], rest[1:]
            key = digest(recipe.task_content(task))
            if key in seen:
                count += 1
                continue
            seen.add(key)
            kept.append(task.model_copy(update={"split": split}))
        splits[split], dropped[split] = kept, count
    return {name: splits[name] for name in ("train", "validation", "heldout")}, dropped


def _claim_new_tasks(
    config: ProvisionConfig,
    data_store: str,
    recipe,
    heldout: list,
    out_tasks_dir: str | Path,
    tracking: TrackingConfig | None,
) -> tuple[int, list]:
    """Training tasks of a seed no earlier run of the data store used; the claim goes to the store's
    manifest under the pipeline run id and into the tasks directory (for the accumulate stage)."""
    import uuid

    from components.core.data.retrain_store import DataStore, write_claim

    if config.source.kind != "generator":
        raise ProvisionError(
            "retrain.data_store needs generated tasks (source.kind='generator'): a SWE-bench "
            "file has no seeds to draw new tasks from"
        )
    run_id = (tracking.parent_run_id if tracking is not None else None) or f"local-{uuid.uuid4().hex}"
    seed, train = DataStore(data_store).claim(
        run_id, recipe.name, lambda s: recipe.tasks("train", config.n_train, s), heldout, first_seed=config.seed
    )
    write_claim(out_tasks_dir, data_store, run_id, recipe.name, seed)
    return seed, train


def _validate(recipe, tasks, connection: SandboxConnection) -> dict[str, float]:
    """Each task's gold check (`components.recipes.check_task`): its reference solution resolves it, the unchanged task
    does not."""
    with connection.client() as client:
        checks = [check_task(recipe, client, task) for task in tasks]
    bad = [c for c in checks if not c.ok]
    if bad:
        raise ProvisionError(f"{len(bad)} of {len(checks)} tasks failed their check: {bad[:3]}")
    return {"tasks_validated": len(checks)}
