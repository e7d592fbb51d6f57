"""The pipeline parameters, defined once for the KFP pipeline and the Argo WorkflowTemplate.

Run settings (preset, recipe, seed, anything else as `overrides_json` in PipelineConfig's own
field names, e.g. {"sft.steps": 400}) and the cluster names of `pipelines/cluster.py`, each with
its default and a one-line description.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipelines.cluster import ClusterConfig
from pipelines.config import PipelineConfig


@dataclass(frozen=True)
class Param:
    name: str
    default: Any  # str | int | dict | list; KFP keeps the type, Argo gets JSON for dict/list
    description: str
    start: bool = False  # an argument of the start step (turned into the PipelineConfig)

    @property
    def argo_value(self) -> str:
        return json.dumps(self.default) if isinstance(self.default, (dict, list)) else str(self.default)


def pipeline_parameters(config: PipelineConfig, cluster: ClusterConfig) -> list[Param]:
    return [
        Param("preset", config.preset, "Preset the run starts from (demo, tiny).", start=True),
        Param("recipe", config.recipe, "Task recipe: swe, gui or claw.", start=True),
        Param("seed", config.seed, "Seed of every stage.", start=True),
        Param("overrides_json", "{}", 'Further PipelineConfig settings as JSON, e.g. {"sft.steps": 400}.', start=True),
        Param("experiment", config.experiment, "MLflow experiment.", start=True),
        Param("sandbox_url", cluster.sandbox_url, "Sandbox service URL (the Service of manifests/).", start=True),
        Param("mlflow_uri", cluster.mlflow_url, "MLflow tracking URI (the Service of manifests/).", start=True),
        Param("image", cluster.image("stage-runtime"), "Image of the CPU stages."),
        Param("gpu_image", cluster.image("stage-runtime-gpu"), "Image of the GPU stages (sft, rl)."),
        Param("sandbox_token_secret", cluster.sandbox_token_secret,
              f"Secret with the sandbox API token (key '{cluster.sandbox_token_key}')."),
        Param("endpoint_secret", cluster.endpoint_secret,
              f"Optional Secret with model endpoints' API key (key '{cluster.endpoint_key}')."),
        Param("gpu_node_selector", dict(cluster.gpu_node_selector), "nodeSelector of the GPU stages."),
        Param("gpu_tolerations", cluster.tolerations_json(), "Tolerations of the GPU stages."),
        Param("storage_class", cluster.storage_class, "StorageClass of the run volume ('' = default)."),
        Param("access_mode", cluster.access_mode, "Access mode of the run volume."),
        Param("volume_size", cluster.volume_size, "Size of the run volume."),
    ]
