"""The KFP run store: the PVC a KFP run's resumable stages and PyTorchJobs write on, created by a step.

kfp-kubernetes' CreatePVC cannot ask for the cluster's default StorageClass: KFP's driver always sets
`storageClassName` (to the value given, `""` by default, or `standard` when absent), and `""` means *no*
class, so on a cluster without a class of that name the claim stays Pending. This step creates the claim
itself through the Kubernetes API (the run's ServiceAccount may create PVCs,
manifests/base/pipelines/pipelines-rbac.yaml)
and leaves the field out when no class is configured (ClusterConfig.storage_class None), as the Argo
volumeClaimTemplate does. kfp-kubernetes' DeletePVC deletes it by name at the end of the run.
"""

from __future__ import annotations

from typing import Any

from pipelines.cluster import SA_NAMESPACE
from pipelines.jobs.pytorchjob import LABELS


def claim_manifest(name: str, *, size: str, access_mode: str, storage_class: str | None) -> dict:
    """The run store's PersistentVolumeClaim; `storage_class` None or '': the cluster's default class."""
    spec: dict[str, Any] = {"accessModes": [access_mode], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {**LABELS, "app.kubernetes.io/component": "run-store"}},
        "spec": spec,
    }


def create_run_store(
    run_id: str,
    *,
    size: str,
    access_mode: str,
    storage_class: str | None,
    api: Any = None,
    namespace: str | None = None,
) -> str:
    """Create `<run_id>-run-store` in the pod's namespace (an existing one, from a retried step, is kept)."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    if api is None:
        config.load_incluster_config()
        api = client.CoreV1Api()
    namespace = namespace or SA_NAMESPACE.read_text().strip()
    name = f"{run_id}-run-store"
    try:
        api.create_namespaced_persistent_volume_claim(
            namespace,
            claim_manifest(name, size=size, access_mode=access_mode, storage_class=storage_class),
            _request_timeout=30,
        )
    except ApiException as err:
        if err.status != 409:
            raise
    return name
