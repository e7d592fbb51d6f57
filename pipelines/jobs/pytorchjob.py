"""A training stage as a Kubeflow Training Operator PyTorchJob (kubeflow.org/v1): the object and its schema.

One builder for both cluster runners: the KFP launcher step (`pipelines/jobs/launcher.py`) fills it with
real values when it runs; the Argo resource template (`pipelines/argo/workflow.py`) fills it with
workflow placeholders at compile time. Every replica (Master + `workers` Workers) runs

    torchrun --nproc-per-node N -m pipelines.steps run <stage> --run-dir D --config-file D/config.json ...

over a run directory (`pipelines/layout.py`) on a volume every node mounts; the operator exports
PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT, which torchrun reads, so the command
names no addresses. Rank 0 writes the stage's outputs and result there (`run_in_layout`).

Failure is the pipeline's business: `restartPolicy: Never`, so the first failed pod (a Master or a
Worker) fails the job with the operator's reason ("PyTorchJob <name> is failed because 1 Worker
replica(s) failed.") and the pipeline's retry policy (the stage row's `retries`) decides whether a new
job runs. No `backoffLimit`: with one set, the operator (v1.8) fails the job on its backoff path without
counting the failed pod in `replicaStatuses`, which is all an Argo resource condition can read (found on
the test cluster: with `backoffLimit: 0` a Worker that had exited 1 stayed `active` there, and a Master
still running left the step waiting, failure condition or not). The schema below is written from the
Training Operator's published kubeflow.org/v1 PyTorchJob CRD (v1.7+: top level, runPolicy, replica
specs); pod templates are checked as real PodSpecs with kubernetes-validate.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import yaml

from components.core.distributed import LaunchConfig
from pipelines.cluster import PIPELINE_POD_LABELS

API_VERSION, KIND = "kubeflow.org/v1", "PyTorchJob"
CONTAINER = "pytorch"  # the operator finds the training container by this name
LABELS = {"app.kubernetes.io/part-of": "orchard", "app.kubernetes.io/component": "training", **PIPELINE_POD_LABELS}
# Argo resource conditions (label-selector syntax over the object's JSON, so conditions[] cannot be
# queried): the job succeeded when its Master did, failed as soon as any pod failed (Argo fails the step
# when any one failure requirement holds; a success needs all of its requirements).
SUCCESS_CONDITION = "status.replicaStatuses.Master.succeeded > 0"
FAILURE_CONDITION = "status.replicaStatuses.Master.failed > 0,status.replicaStatuses.Worker.failed > 0"


def job_command(stage: str, launch: LaunchConfig, run_dir: str, parent_run_id: str) -> list[str]:
    """What every replica runs: the stage over the run directory, `nproc_per_node` processes per node."""
    return [
        "torchrun",
        f"--nproc-per-node={launch.nproc_per_node}",
        "-m",
        "pipelines.steps",
        "run",
        stage,
        "--run-dir",
        run_dir,
        "--config-file",
        f"{run_dir}/config.json",
        "--parent-run-id",
        parent_run_id,
    ]


def pytorchjob_manifest(
    stage: Any,
    launch: LaunchConfig,
    *,
    gpu: bool,
    requests: tuple[str, str],
    image: str,
    command: list[str],
    claim_name: str,
    mount_path: str,
    secret_env: list[dict],
    node_selector: Any,
    tolerations: Any,
    security_context: dict | None = None,
    name: str | None = None,
    generate_name: str | None = None,
    deadline_seconds: int | None = None,
    labels: dict[str, str] | None = None,
) -> dict:
    """The PyTorchJob running one stage row (`pipelines.stages.Stage`) as `launch` says.

    `gpu`, `requests`: `stage.wants_gpu(config)`, `stage.requests(config)` of the run's PipelineConfig.
    `security_context`: the pods' (ClusterConfig.pod_security_context: fsGroup for the run volume).
    `node_selector`/`tolerations`: objects, or placeholder strings (Argo) that `to_yaml` leaves unquoted.
    `labels`: more labels on the job and its pods (Argo: the workflow's name, to find a run's jobs)."""
    if (name is None) == (generate_name is None):
        raise ValueError("give the job a name or a generate_name (one of them)")
    cpu, memory = requests
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}
    pod: dict[str, Any] = {"automountServiceAccountToken": False}  # the pods need no Kubernetes API
    if security_context:
        pod["securityContext"] = dict(security_context)
    if gpu:  # one GPU per process
        resources["limits"]["nvidia.com/gpu"] = launch.nproc_per_node
        pod |= {"nodeSelector": node_selector, "tolerations": tolerations}
    labels = {**LABELS, "orchard.dev/stage": stage.name, **(labels or {})}
    pod |= {
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "command": command,
                "env": secret_env,
                "resources": resources,
                "volumeMounts": [
                    {"name": "run-data", "mountPath": mount_path},
                    {"name": "dshm", "mountPath": "/dev/shm"},
                ],
            }
        ],
        "volumes": [
            {"name": "run-data", "persistentVolumeClaim": {"claimName": claim_name}},
            # NCCL/gloo and DataLoader workers share tensors through /dev/shm (64 MiB by default)
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
        ],
    }

    def replica(n: int) -> dict:  # copies: shared objects would become YAML anchors
        return {
            "replicas": n,
            "restartPolicy": "Never",
            "template": {"metadata": {"labels": dict(labels)}, "spec": copy.deepcopy(pod)},
        }

    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 86400}
    if deadline_seconds:
        run_policy["activeDeadlineSeconds"] = deadline_seconds
    specs = {"Master": replica(1)}
    if launch.workers:
        specs["Worker"] = replica(launch.workers)
    metadata: dict[str, Any] = {"labels": dict(labels)}
    metadata |= {"name": name} if name else {"generateName": generate_name}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"nprocPerNode": str(launch.nproc_per_node), "runPolicy": run_policy, "pytorchReplicaSpecs": specs},
    }


def secret_env(token_secret: str, token_key: str, endpoint_secret: str, endpoint_key: str) -> list[dict]:
    """The sandbox token and the (optional) endpoint key, from Secrets, as in every stage pod."""
    return [
        {"name": "ORCHARD_SANDBOX_TOKEN", "valueFrom": {"secretKeyRef": {"name": token_secret, "key": token_key}}},
        {
            "name": "OPENAI_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": endpoint_secret, "key": endpoint_key, "optional": True}},
        },
    ]


def to_yaml(doc: dict, unquoted: tuple[str, ...] = ()) -> str:
    """YAML of the manifest; each string in `unquoted` (a placeholder that becomes JSON) loses its quotes."""
    text = yaml.safe_dump(doc, sort_keys=False)
    for placeholder in unquoted:
        text = text.replace(f"'{placeholder}'", placeholder)
    return text


# --- Schema --------------------------------------------------------------------------------------
_REPLICA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["template"],
    "properties": {
        "replicas": {"type": "integer", "minimum": 0},
        "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
        "template": {
            "type": "object",
            "required": ["spec"],
            "properties": {"metadata": {"type": "object"}, "spec": {"type": "object"}},
        },
    },
}
PYTORCHJOB_SCHEMA = {  # from the kubeflow.org/v1 PyTorchJob CRD (Training Operator v1.7+)
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": KIND},
        "metadata": {"type": "object", "anyOf": [{"required": ["name"]}, {"required": ["generateName"]}]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["pytorchReplicaSpecs"],
            "properties": {
                "nprocPerNode": {"type": "string"},
                "elasticPolicy": {"type": "object"},
                "runPolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "cleanPodPolicy": {"enum": ["All", "Running", "None"]},
                        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                        "activeDeadlineSeconds": {"type": "integer", "minimum": 0},
                        "backoffLimit": {"type": "integer", "minimum": 0},
                        "schedulingPolicy": {"type": "object"},
                        "suspend": {"type": "boolean"},
                        "managedBy": {"type": "string"},
                    },
                },
                "pytorchReplicaSpecs": {
                    "type": "object",
                    "additionalProperties": False,
                    "minProperties": 1,
                    "properties": {"Master": _REPLICA, "Worker": _REPLICA},
                },
            },
        },
    },
}


def validate_pytorchjob(doc: dict, versions: list[str] | None = None) -> None:
    """Raise if `doc` is not a PyTorchJob the operator accepts: CRD fields, one Master, real PodSpecs."""
    import kubernetes_validate

    jsonschema.validate(doc, PYTORCHJOB_SCHEMA)
    specs = doc["spec"]["pytorchReplicaSpecs"]
    if specs.get("Master", {}).get("replicas", 1) != 1:
        raise jsonschema.ValidationError("a PyTorchJob has exactly one Master replica")
    for replica in specs.values():
        template = replica["template"]
        if not any(c.get("name") == CONTAINER for c in template["spec"].get("containers", [])):
            raise jsonschema.ValidationError(f"the operator needs a container named {CONTAINER!r}")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "template", **template.get("metadata", {})},
            "spec": template["spec"],
        }
        for version in versions or ["1.30", kubernetes_validate.latest_version()]:
            kubernetes_validate.validate(pod, version, strict=True)
