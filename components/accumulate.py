"""The accumulate stage: this run's credited trajectories join the data store; SFT gets the union.

With `retrain.data_store` set, the run's training tasks (claimed in provision) and its credited
teacher trajectories are added to the store as new shards, the run's entry records every shard its
SFT trains on (all runs', or the last `window_runs` runs'), and the training set is those shards in
one TrajectoryStore directory. This happens before training, so a run the promotion gate later
rejects is recorded too. The shard list is the stage's MLflow dataset input and a tag on the
pipeline run (`orchard.trained_shards`), and the gate copies it to a registered version's lineage.

Without a data store the training set is this run's credited trajectories alone (as before).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from components.core.data.retrain_store import DataStore, link_shards, read_claim
from components.core.data.parquet_store import StoreError, TaskStore, TrajectoryStore
from components.core.tracking import TrackingConfig, log_dataset_input, log_json, log_metrics, resume_run, stage_run


class RetrainConfig(BaseModel):
    """Scheduled retraining: the data store (this stage) and what a run starts from (init-policy; the
    promotion gate decides what it replaces)."""

    model_config = ConfigDict(extra="forbid")
    start_from: Literal["base", "champion"] = Field(
        "base", description="init-policy: a fresh base model, or the registry's champion (base when there is none)."
    )
    data_store: str | None = Field(
        None,
        description="Persistent data store (a path on a volume every run sees; components/core/data/retrain_store.py): "
        "each run adds provision.n_train new tasks and their credited teacher trajectories as "
        "shards, and SFT trains on the store's shards. None: each run trains on its own data.",
    )
    window_runs: int | None = Field(
        None,
        ge=1,
        description="With a data store: SFT trains on the shards of the last N runs that added data "
        "(this one included); None: on everything accumulated.",
    )


class AccumulateResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    training_dir: str = Field(description="The training set: a TrajectoryStore directory.")
    data_store: str | None = None
    run_id: str | None = Field(None, description="The run's key in the store's manifest.")
    added_shards: list[str] = Field(default_factory=list, description="Shards this run added to the store.")
    trained_on: list[str] = Field(description="Trajectory shards in the training set.")
    metrics: dict[str, float] = Field(default_factory=dict)


def accumulate(
    config: RetrainConfig,
    tasks_dir: str | Path,
    credited_dir: str | Path,
    out_dir: str | Path,
    tracking: TrackingConfig | None = None,
) -> AccumulateResult:
    out = Path(out_dir)
    with stage_run("accumulate", config, tracking):
        if config.data_store is None:
            shards = _own_shards(Path(credited_dir), out)
            result = AccumulateResult(training_dir=str(out), trained_on=shards)
        else:
            result = _add_to_store(config, config.data_store, Path(tasks_dir), Path(credited_dir), out)
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in TrajectoryStore(out).shards())
        result.metrics = {
            "training_shards": float(len(result.trained_on)),
            "training_trajectories": float(rows),
            "added_shards": float(len(result.added_shards)),
        }
        log_metrics(result.metrics)
        log_json(result.model_dump(mode="json"), "training_set.json")
        log_dataset_input(
            [{"shard": s} for s in result.trained_on],
            config.data_store or credited_dir,
            name="training-shards",
            context="training",
        )
    if tracking is not None and tracking.enabled and tracking.parent_run_id:
        import mlflow

        with resume_run(tracking, tracking.parent_run_id):  # the pipeline run's lineage, promoted or not
            mlflow.set_tags(
                {
                    "orchard.trained_shards": ",".join(result.trained_on)[:5000],
                    "orchard.data_store": config.data_store or "",
                }
            )
    return result


def _own_shards(credited: Path, out: Path) -> list[str]:
    """No data store: the run's own credited shards, linked into the training directory."""
    shards = [str(p.relative_to(credited.parent)) for p in TrajectoryStore(credited).shards()]
    link_shards(credited.parent, shards, out, store=None, run_id=None)
    return shards


def _add_to_store(
    config: RetrainConfig, data_store: str, tasks_dir: Path, credited: Path, out: Path
) -> AccumulateResult:
    claim = read_claim(tasks_dir)
    if claim is None or claim["store"] != data_store:
        raise StoreError(
            f"the run's tasks ({tasks_dir}) were not claimed from data store {data_store}: "
            "provision and accumulate must run with the same retrain.data_store"
        )
    store = DataStore(data_store)
    entry = store.add(
        claim["run_id"],
        claim["recipe"],
        TaskStore(tasks_dir).read(split="train"),
        TrajectoryStore(credited).read(),
        window_runs=config.window_runs,
    )
    store.materialize(entry.trained_on, out, run_id=entry.run_id)
    return AccumulateResult(
        training_dir=str(out),
        data_store=data_store,
        run_id=entry.run_id,
        added_shards=entry.task_shards + entry.trajectory_shards,
        trained_on=entry.trained_on,
    )
