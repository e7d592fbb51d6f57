"""The pipeline parameters, defined once for the KFP pipeline and the Argo WorkflowTemplate.

Run settings (preset, recipe, seed, anything else as `overrides_json` in PipelineConfig's own
field names, e.g. {"sft.steps": 400}) and the cluster names of `pipelines/cluster.py`, each with
its default and a one-line description.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from pipelines.cluster import ClusterConfig
from pipelines.config import PipelineConfig, overrides_of


def argo_text(value: Any) -> str:
    """A parameter value as Argo gets it: JSON for dict/list, '' for None (an optional left unset), else str."""
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


@dataclass(frozen=True)
class Param:
    name: str
    default: Any  # str | int | float | dict | list | None; KFP keeps the type, Argo gets `argo_text`
    description: str
    start: bool = False  # an argument of the start step (turned into the PipelineConfig)
    # False: KFP only. Argo parses a volumeClaimTemplate's quantities when it reads the template, before any
    # parameter is substituted ("quantities must match the regular expression"): such values are compiled in.
    argo: bool = True
    optional: type | None = None  # a typed optional (KFP: `Optional[optional]`, unset = None; Argo: '')

    @property
    def annotation(self) -> Any:
        return Optional[self.optional] if self.optional is not None else type(self.default)

    @property
    def argo_value(self) -> str:
        return argo_text(self.default)


def pipeline_parameters(config: PipelineConfig, cluster: ClusterConfig) -> list[Param]:
    return [
        Param("preset", config.preset, "Preset the run starts from (demo, tiny).", start=True),
        Param("recipe", config.recipe, "Task recipe: swe, gui or claw.", start=True),
        Param("seed", config.seed, "Seed of every stage.", start=True),
        Param(
            "overrides_json",
            json.dumps(overrides_of(config), sort_keys=True),
            'Further PipelineConfig settings as JSON, e.g. {"sft.steps": 400} (default: those compiled in).',
            start=True,
        ),
        Param("experiment", config.experiment, "MLflow experiment.", start=True),
        # Retraining (a schedule's knobs): what a run starts from and what it must beat
        Param(
            "start_from",
            config.retrain.start_from,
            "Train from the 'base' model or the registry's 'champion'.",
            start=True,
        ),
        Param(
            "promotion_margin",
            None,
            "The mean pass@1 gain over the champion must exceed this, by an exact paired test (unset: the "
            "config's promote.margin).",
            start=True,
            optional=float,
        ),
        Param(
            "train_tasks",
            0,
            "Training tasks generated per run, i.e. the data store's growth per run "
            "(0: the preset's provision.n_train).",
            start=True,
        ),
        Param(
            "data_store",
            config.retrain.data_store or "",
            f"Persistent data store path, on the PVC {cluster.data_store_claim} mounted at "
            f"{cluster.data_store_mount} ('': each run trains on its own data; schedules default to "
            f"{cluster.data_store_path}).",
            start=True,
        ),
        Param(
            "window_runs",
            config.retrain.window_runs or 0,
            "Train on the data store's last N runs' shards (0: on everything accumulated).",
            start=True,
        ),
        Param("sandbox_url", cluster.sandbox_url, "Sandbox service URL (the Service of manifests/).", start=True),
        Param("mlflow_uri", cluster.mlflow_url, "MLflow tracking URI (the Service of manifests/).", start=True),
        Param("image", cluster.image("stage-runtime"), "Image of the CPU stages."),
        Param("gpu_image", cluster.image("stage-runtime-gpu"), "Image of the GPU stages (sft, rl)."),
        Param(
            "sandbox_token_secret",
            cluster.sandbox_token_secret,
            f"Secret with the sandbox API token (key '{cluster.sandbox_token_key}').",
        ),
        Param(
            "endpoint_secret",
            cluster.endpoint_secret,
            f"Optional Secret with model endpoints' API key (key '{cluster.endpoint_key}').",
        ),
        Param("gpu_node_selector", dict(cluster.gpu_node_selector), "nodeSelector of the GPU stages."),
        Param("gpu_tolerations", cluster.tolerations_json(), "Tolerations of the GPU stages."),
        Param("volume_size", cluster.volume_size, "Size of the run volume.", argo=False),
        Param(
            "data_store_claim",
            cluster.data_store_claim,
            f"PVC of the persistent data store, mounted at {cluster.data_store_mount} by the stages that use it.",
        ),
    ]


# The parameters a retraining schedule sets (CronWorkflow arguments, KFP recurring-run params).
RETRAIN_PARAMS = ("start_from", "promotion_margin", "train_tasks", "data_store", "window_runs")


def retrain_arguments(
    config: PipelineConfig | None = None, cluster: ClusterConfig | None = None, **given: Any
) -> dict[str, Any]:
    """The retraining parameters with their defaults, `given` on top (a schedule always states them).

    A schedule grows the persistent store by default (`cluster.data_store_path`, on the store's PVC); a
    one-off run keeps the template's default ('' unless the config sets one)."""
    cluster = cluster or ClusterConfig()
    defaults = {
        p.name: p.default
        for p in pipeline_parameters(config or PipelineConfig.preset_config("demo"), cluster)
        if p.name in RETRAIN_PARAMS
    }
    defaults["data_store"] = defaults["data_store"] or cluster.data_store_path
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"unknown retraining parameter(s) {sorted(unknown)}; choose from {list(RETRAIN_PARAMS)}")
    return {**defaults, **given}
