"""MLflow tracking shared by every stage: one parent run per pipeline run, a child run per stage.

A stage calls `with stage_run("sft", config, tracking=...) as run:` and then `log_metrics(...)`.
With `tracking=None` (or `TrackingConfig(enabled=False)`) nothing is logged, so stages stay plain
functions that also run without MLflow.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from mlflow.entities import Run


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="Log to MLflow at all.")
    tracking_uri: str = Field(
        default_factory=lambda: os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlruns.db"),
        description="MLflow tracking URI (sqlite file locally, http(s):// for a server).",
    )
    experiment: str = Field("orchard", description="MLflow experiment name.")
    parent_run_id: str | None = Field(None, description="Pipeline run under which stage runs nest.")
    run_name: str | None = None


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value if isinstance(value, (int, float, str, bool)) or value is None else json.dumps(value)


# Secrets by name: a whole word, or the last word of a snake_case name (`hf_token`, `db_password`).
# Substrings are not enough: `max_new_tokens` or `secret_env_var` (the *name* of a variable) are not secrets.
_SECRET_NAMES = ("token", "api_key", "apikey", "password", "secret", "credentials")


def _is_secret(key: str) -> bool:
    leaf = key.rsplit(".", 1)[-1].lower()
    return any(leaf == name or leaf.endswith("_" + name) for name in _SECRET_NAMES)


def artifact_location(tracking: TrackingConfig) -> str | None:
    """Where a new experiment keeps its artifacts: beside a sqlite store's file (never `./mlruns` of
    whatever directory the process happens to run in); the server's default for remote stores."""
    uri = tracking.tracking_uri
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri[len("sqlite:///") :]).resolve()
    return (db.parent / f"{db.stem}-artifacts").as_uri()


def ui_command(tracking: TrackingConfig) -> str:
    """The command that opens this store in the MLflow UI (printed at the end of a run)."""
    if tracking.tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking.tracking_uri} (experiment {tracking.experiment!r})"
    # Each experiment records its absolute artifact location, so the store URI is all the UI needs.
    return f"mlflow ui --backend-store-uri {tracking.tracking_uri}"


# The MLflow UI (3.x) opens an experiment by its kind: without this tag it guesses, and a store with traces
# opens on the GenAI pages. Ours train models: runs, metrics and the registry first.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


def ui_link(tracking: TrackingConfig, experiment_id: str, run_id: str | None = None, port: int = 5000) -> str:
    """Where a run (or the experiment's runs) opens in the MLflow UI, on its model-training pages.

    MLflow 3.17's UI decides GenAI vs model training by a UI-wide switch (the `workflowType` URL parameter,
    else the browser's last choice, GenAI by default) and ignores the experiment's kind tag while the switch
    is on: the link carries `workflowType=machine_learning` so the runs table, not the GenAI overview, opens.
    A local store's link is the command that serves it and the page on `port` (`orchard ui` picks a free one
    and prints this link with it)."""
    path = f"#/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "") + "?workflowType=machine_learning"
    if tracking.tracking_uri.startswith(("http://", "https://")):
        return f"{tracking.tracking_uri.rstrip('/')}/{path}"
    return f"{ui_command(tracking)} --port {port}, then http://127.0.0.1:{port}/{path}"


def ensure_experiment(tracking: TrackingConfig) -> str:
    """The experiment's id, created with `artifact_location` and marked as a model-training experiment
    when it does not exist yet (an experiment someone marked otherwise keeps its kind)."""
    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri)
    client = mlflow.MlflowClient(tracking.tracking_uri)
    experiment = client.get_experiment_by_name(tracking.experiment)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(
            tracking.experiment,
            artifact_location=artifact_location(tracking),
            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
        )
    except mlflow.exceptions.MlflowException:  # created meanwhile by a parallel worker
        experiment = client.get_experiment_by_name(tracking.experiment)
        if experiment is None:  # not that: the creation's own error
            raise
        return experiment.experiment_id


def config_params(config: BaseModel) -> dict[str, Any]:
    """A typed config as flat MLflow params (nested models become dotted keys).

    Secrets (a field named like token/api_key/password/secret, e.g. `sandbox.token`) are logged as
    "***" when set: params are readable by anyone with access to the tracking server.
    """
    out: dict[str, Any] = {}
    _flatten("", config.model_dump(mode="json"), out)
    return {k: ("None" if v is None else "***" if _is_secret(k) else v) for k, v in out.items()}


@contextlib.contextmanager
def stage_run(stage: str, config: BaseModel | None, tracking: TrackingConfig | None) -> Iterator[Any]:
    """Open an MLflow run for a stage (nested under the parent when given); yields the run or None."""
    if tracking is None or not tracking.enabled:
        yield None
        return
    import mlflow

    mlflow.set_experiment(experiment_id=ensure_experiment(tracking))
    kwargs: dict[str, Any] = {"run_name": tracking.run_name or stage, "tags": {"orchard.stage": stage}}
    if tracking.parent_run_id:
        kwargs["parent_run_id"] = tracking.parent_run_id
        kwargs["nested"] = True
    with mlflow.start_run(**kwargs) as run:
        if config is not None:
            for batch in _param_batches(config):
                mlflow.log_params(batch)
        try:
            yield run
        except BaseException as err:  # FAILED with its reason, or KILLED when the run was stopped
            status, reason = ended_status(err)
            mlflow.set_tag(FAILURE_REASON_TAG, reason)
            mlflow.end_run(status)
            raise


def _param_batches(config: BaseModel) -> Iterator[dict[str, Any]]:
    items = list(config_params(config).items())
    for i in range(0, len(items), 100):  # MLflow caps params per batch
        yield dict(items[i : i + 100])


def open_detached_run(
    stage: str, config: BaseModel | None, tracking: TrackingConfig | None, run_name: str | None = None
) -> str | None:
    """A run nested under `tracking.parent_run_id` but off this process's active-run stack, for work whose
    parts finish interleaved or in other processes (they nest under it by run id). Close with
    `close_detached_run`. None when tracking is off."""
    if tracking is None or not tracking.enabled:
        return None
    import mlflow
    from mlflow.entities import Param

    experiment_id = ensure_experiment(tracking)
    client = mlflow.MlflowClient(tracking.tracking_uri)
    tags = {"orchard.stage": stage}
    if tracking.parent_run_id:
        tags["mlflow.parentRunId"] = tracking.parent_run_id
    run_id = client.create_run(experiment_id, run_name=run_name or stage, tags=tags).info.run_id
    if config is not None:
        for batch in _param_batches(config):
            client.log_batch(run_id, params=[Param(k, str(v)) for k, v in batch.items()])
    return run_id


def close_detached_run(
    run_id: str | None, tracking: TrackingConfig | None, metrics: list[tuple[str, float, int]], failed: bool = False
) -> None:
    """Log (key, value, step) metrics (NaNs skipped) to a detached run and mark it finished or failed."""
    if run_id is None or tracking is None:
        return
    import mlflow
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client = mlflow.MlflowClient(tracking.tracking_uri)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v, step in metrics if v == v])
    client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")


def log_metrics(metrics: dict[str, float], step: int | None = None) -> None:
    """Log numeric metrics to the active run, if any (non-numbers are skipped)."""
    import mlflow

    if mlflow.active_run() is None:
        return
    clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v}
    if clean:
        mlflow.log_metrics(clean, step=step)


# A stage's headline curves come first on its MLflow run page. The page sorts charts into sections named by the
# key's prefix up to "/" (sections in name order, unprefixed metrics last in "Model metrics") and, within a
# section, by key: so the headline curves are `learning/<position>_<name>`, in the order their positions give.
CURVES = "learning"


def curve(position: int, name: str) -> str:
    """The metric key of a stage's `position`-th headline curve (1-9), e.g. curve(1, "loss") = "learning/1_loss"."""
    if not 1 <= position <= 9:
        raise ValueError(f"headline curve positions are 1-9 (one digit sorts as a number), got {position}")
    return f"{CURVES}/{position}_{name}"


def log_figure(fig: Any, name: str) -> None:
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.log_figure(fig, name)


def log_artifact_path(path: str | Path, artifact_path: str | None = None) -> None:
    import mlflow

    if mlflow.active_run() is None:
        return
    path = Path(path)
    if path.is_dir():
        mlflow.log_artifacts(str(path), artifact_path=artifact_path)
    else:
        mlflow.log_artifact(str(path), artifact_path=artifact_path)


def log_dataset_input(rows: list[dict[str, Any]], source: str | Path, name: str, context: str) -> None:
    """Record what a stage consumed as an MLflow dataset input (one row per trajectory or task, with
    its digest, so runs can be compared by the exact data they saw); no-op without an active run."""
    import mlflow

    if mlflow.active_run() is None or not rows:
        return
    import pandas as pd

    from mlflow.data.pandas_dataset import from_pandas  # what mlflow.data.from_pandas names (set at import)
    from mlflow.exceptions import MlflowException

    dataset = from_pandas(pd.DataFrame(rows), source=_local_source(source), name=name)
    try:
        mlflow.log_input(dataset, context=context)
    except MlflowException as err:
        # The SQL store looks a dataset up, then inserts it: two runs of one experiment logging the same
        # dataset at once (parallel evaluations, ablation arms) race, and the loser hits the unique key.
        # Once the winner's row exists, logging again links to it.
        if "UNIQUE constraint" not in str(err) and "Duplicate entry" not in str(err):
            raise
        mlflow.log_input(dataset, context=context)


def _local_source(path: str | Path) -> Any:
    """`path` as MLflow's local-file dataset source. MLflow registers that source class twice (for the "" and the
    "file" schemes), so a bare string matches both and every call warns; resolving against the first one alone
    gives the same source without the warning."""
    from mlflow.data.dataset_source_registry import get_registered_sources, resolve_dataset_source

    local = [s for s in get_registered_sources() if s._get_source_type() == "local"][:1]
    return resolve_dataset_source(str(path), candidate_sources=local) if local else str(path)


def log_json(obj: Any, name: str) -> None:
    import mlflow

    if mlflow.active_run() is None:
        return
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_text(json.dumps(obj, indent=2, default=str))
        mlflow.log_artifact(str(p))


# ---------------------------------------------------------------------------------------------
# Pipeline-level runs (added for pipelines/; the stage API above is unchanged)
# ---------------------------------------------------------------------------------------------
def open_pipeline_run(
    tracking: TrackingConfig, run_name: str, config: BaseModel | None = None, tags: dict[str, str] | None = None
) -> str:
    """Create the parent run of a pipeline run and leave it RUNNING; returns its id.

    Uses the client API (not `mlflow.start_run`) so the run stays open across processes and
    pipeline steps; `close_pipeline_run` ends it. Stage runs nest under it via `parent_run_id`.
    """
    import mlflow

    experiment_id = ensure_experiment(tracking)
    client = mlflow.MlflowClient(tracking.tracking_uri)
    run = client.create_run(experiment_id, run_name=run_name, tags={"orchard.stage": "pipeline", **(tags or {})})
    if config is not None:
        from mlflow.entities import Param

        for batch in _param_batches(config):
            client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in batch.items()])
    return run.info.run_id


def close_pipeline_run(tracking: TrackingConfig, run_id: str, status: str = "FINISHED") -> None:
    """End a pipeline's parent run (status FINISHED, FAILED or KILLED)."""
    import mlflow

    mlflow.MlflowClient(tracking.tracking_uri).set_terminated(run_id, status=status)


FAILURE_REASON_TAG = "orchard.failure_reason"
FAILED_STAGE_TAG = "orchard.failed_stage"


def ended_status(err: BaseException) -> tuple[str, str]:
    """The MLflow status of a run that `err` ended (KILLED for Ctrl-C/SIGTERM, else FAILED) and its reason in
    one line (the exception's type and first line, at most 500 characters)."""
    from components.core.interrupts import RunInterrupted

    status = "KILLED" if isinstance(err, (RunInterrupted, KeyboardInterrupt)) else "FAILED"
    text = error_line(err)
    return status, (f"{type(err).__name__}: {text}" if text else type(err).__name__)[:500]


def error_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message ("" when it has none)."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), "")


def fail_pipeline_run(tracking: TrackingConfig, run_id: str, err: BaseException, stage: str | None = None) -> str:
    """End a parent run that `err` stopped, and every run under it, with the status and reason of `ended_status`.

    The parent gets `orchard.failure_reason` (and `orchard.failed_stage`); runs still RUNNING under it (the
    stage that was running, its detached workers) end with the same status; the failing stage's own run is
    marked FAILED too when it had already finished (a runner check after the stage, e.g. too many infra
    errors). Returns the status."""
    import mlflow

    status, reason = ended_status(err)
    client = mlflow.MlflowClient(tracking.tracking_uri)
    parent = client.get_run(run_id)
    tags = {FAILURE_REASON_TAG: reason, **({FAILED_STAGE_TAG: stage} if stage else {})}
    pending: list[str] = [run_id]
    children: list[Run] = []
    while pending:  # every generation under the parent
        found = client.search_runs(
            [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{pending.pop()}'"
        )
        children += found
        pending += [c.info.run_id for c in found]
    failing = [c for c in children if c.info.run_name == stage and c.data.tags.get("mlflow.parentRunId") == run_id]
    latest = max(failing, key=lambda c: c.info.start_time, default=None)
    for child in children:
        if child.info.status == "RUNNING" or (child.info.status == "FINISHED" and child is latest):
            for key, value in tags.items():
                client.set_tag(child.info.run_id, key, value)
            client.set_terminated(child.info.run_id, status=status)
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    client.set_terminated(run_id, status=status)
    return status


@contextlib.contextmanager
def resume_run(tracking: TrackingConfig, run_id: str) -> Iterator[Any]:
    """Make an existing run the active one for logging without ending it on exit."""
    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri)
    run = mlflow.start_run(run_id=run_id)
    try:
        yield run
    finally:
        # end_run would mark it FINISHED; restore RUNNING so later steps can still nest under it.
        mlflow.end_run()
        mlflow.MlflowClient(tracking.tracking_uri).update_run(run_id, status="RUNNING")


def log_table(df: Any, name: str) -> None:
    """Log a pandas DataFrame as an MLflow table artifact (JSON, shown in the UI)."""
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.log_table(data=df, artifact_file=name)
