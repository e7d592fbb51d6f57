"""Cluster names in one place: what the compiled pipelines reference and `manifests/` creates.

Every value here is a pipeline parameter default (KFP and Argo) or a field of the compiled YAML;
`tests/manifests/test_pipeline_references.py` renders `kubectl kustomize manifests/overlays/{dev,prod}`
and checks that each Secret, Service, ServiceAccount and PVC named here exists there (or is created
by a command in the cluster quickstart, docs/pipelines/cluster-quickstart.md). Change a name here and in the manifests
together.

Images follow one scheme everywhere (Makefile, overlays, compiled YAML): `<registry>/<name>:<tag>`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

VERSION = "0.1.0"
# Every image the manifests and pipelines use; `make images` builds exactly these (docker/<name>/Dockerfile,
# stage-runtime-gpu from docker/stage-runtime with the GPU build argument).
IMAGE_NAMES = ("sandbox-service", "agent-injector", "mlflow", "stage-runtime", "stage-runtime-gpu")
# Every pod the compiled pipelines start carries these labels: manifests/base/service-network.yaml admits
# exactly these pods (outside the sandbox namespace) to MLflow and the sandbox API.
PIPELINE_POD_LABELS = {"orchard.dev/pipeline-pod": "true"}
# Where a KFP run's store PVC is mounted in the steps and PyTorchJob pods that use it (pipelines/kfp/run_store.py).
STORE_MOUNT = "/mnt/run-store"
# The namespace of the pod a step runs in, as Kubernetes mounts it with the pod's ServiceAccount token.
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_REGISTRY = "orchard"  # what `make images` tags by default and `kind load` takes; push elsewhere with REGISTRY=


def image_ref(name: str, registry: str = DEFAULT_REGISTRY, tag: str = VERSION) -> str:
    if name not in IMAGE_NAMES:
        raise ValueError(f"unknown image {name!r}; the images are {', '.join(IMAGE_NAMES)}")
    return f"{registry.rstrip('/')}/{name}:{tag}"


def overlay_images(overlay: str | Path) -> tuple[str, str]:
    """(registry, tag) of the orchard images an overlay's kustomization.yaml points at (its `images:`, as
    `kustomize edit set image` writes them), so the pipelines compile for the registry the deployment
    pulls from: one definition, the overlay. No entry: DEFAULT_REGISTRY and VERSION (the base's)."""
    import yaml

    path = Path(overlay) / "kustomization.yaml"
    if not path.is_file():
        raise ValueError(f"{overlay}: no kustomization.yaml (give an overlay directory, e.g. manifests/overlays/prod)")
    found = set()
    for entry in (yaml.safe_load(path.read_text()) or {}).get("images") or []:
        registry, _, name = entry.get("name", "").rpartition("/")
        if registry != DEFAULT_REGISTRY or name not in IMAGE_NAMES:
            continue
        new_registry, _, new_name = (entry.get("newName") or entry["name"]).rpartition("/")
        if new_name != name:
            raise ValueError(
                f"{path}: image {entry['name']} is renamed to {new_name}; keep the name, change the registry"
            )
        found.add((new_registry, str(entry.get("newTag", VERSION))))
    if len(found) > 1:
        raise ValueError(f"{path}: the orchard images point at several registries/tags {sorted(found)}; use one")
    return found.pop() if found else (DEFAULT_REGISTRY, VERSION)


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(description="Taint key tolerated.")
    operator: str = Field("Exists", description="Exists or Equal.")
    value: str | None = Field(None, description="Taint value (operator Equal).")
    effect: str | None = Field("NoSchedule", description="Taint effect tolerated (None: all).")


class ClusterConfig(BaseModel):
    """Names and placement on the cluster; the defaults match manifests/overlays/{dev,prod}."""

    model_config = ConfigDict(extra="forbid")
    namespace: str = Field("orchard", description="Namespace of the sandbox service, MLflow and pipeline pods.")
    sandbox_namespace: str = Field(
        "orchard-sandboxes",
        description="Namespace of sandbox pods, their Secrets and NetworkPolicies, and the only "
        "one where the sandbox service may create anything (ORCHARD_K8S_NAMESPACE).",
    )
    sandbox_service: str = Field("orchard-sandbox-service", description="Service of the sandbox API.")
    sandbox_port: int = Field(8765, description="Port of the sandbox API Service.")
    mlflow_service: str = Field("orchard-mlflow", description="Service of the MLflow tracking server.")
    mlflow_port: int = Field(5000, description="Port of the MLflow Service.")
    sandbox_token_secret: str = Field("orchard-api-token", description="Secret holding the sandbox API token.")
    sandbox_token_key: str = Field("token", description="Key of the token in that Secret.")
    endpoint_secret: str = Field(
        "orchard-endpoints", description="Optional Secret with the model endpoints' API key (teacher, judge)."
    )
    endpoint_key: str = Field("api-key", description="Key of the API key in that Secret.")
    service_account: str = Field("orchard-pipeline", description="ServiceAccount pipeline pods run as.")
    storage_class: str | None = Field(
        None,
        description="StorageClass of the run volume. None: the cluster's default class (the field is left "
        'out of the claim; `storageClassName: ""` would mean *no* class, i.e. no dynamic '
        "provisioning, and the claim would stay Pending).",
    )
    access_mode: str = Field(
        "ReadWriteOnce",
        description="Access mode of the run volume. ReadWriteOnce works on every cluster but keeps a run's "
        "pods on one node; use ReadWriteMany (NFS, CephFS, EFS) to spread them.",
    )
    volume_size: str = Field(
        "20Gi",
        pattern=r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$",
        description="Size of the run volume (stores, checkpoints), a Kubernetes quantity; "
        "compiled into the Argo template, a parameter of the KFP pipeline.",
    )
    # The persistent data store (retrain.data_store) outlives every run, unlike the run volume: a PVC the
    # manifests create (manifests/base/pipelines/data-store.yaml), mounted by the stages that touch the store.
    data_store_claim: str = Field("orchard-data-store", description="PVC of the persistent data store.")
    data_store_mount: str = Field(
        "/orchard-store", pattern=r"^/", description="Where the store's stages mount that PVC (absolute)."
    )
    data_store_access_mode: str = Field(
        "ReadWriteMany",
        description="Access mode of the data store PVC: runs' provision and accumulate pods on any node share it. "
        "kind's default provisioner (local-path) only offers ReadWriteOnce (the dev overlay's): "
        "then every pod mounting it must run on one node.",
    )
    data_store_size: str = Field("50Gi", description="Size of the data store PVC (it grows with every run).")
    # The store's StorageClass is a manifest setting, not a compiled one: the PVC is created by
    # `kubectl apply -k`, and an overlay names an RWX class with the component manifests/components/
    # data-store-class (GKE: Filestore `standard-rwx`; EKS: an EFS class, e.g. `efs-sc`; AKS: `azurefile-csi`).
    stage_uid: int = Field(
        10001,
        ge=1,
        description="uid of the stage image's user (docker/stage-runtime/Dockerfile): stage pods run as "
        "it with fsGroup = it, so fresh volumes (root-owned on GKE PD, EBS, Azure Disk) are "
        "writable.",
    )
    gpu_node_selector: dict[str, str] = Field(
        default_factory=lambda: {"orchard.dev/pool": "gpu"},
        description="nodeSelector of the GPU stages (label your GPU nodes with it, or set {} to drop it).",
    )
    gpu_tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(key="nvidia.com/gpu")], description="Tolerations of the GPU stages."
    )
    stage_timeout_seconds: int = Field(6 * 3600, ge=60, description="Deadline of one stage's pod.")
    image_registry: str = Field(DEFAULT_REGISTRY, description="Registry prefix of every image.")
    image_tag: str = Field(VERSION, description="Tag of every image.")

    @property
    def sandbox_url(self) -> str:
        return f"http://{self.sandbox_service}.{self.namespace}.svc:{self.sandbox_port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.mlflow_service}.{self.namespace}.svc:{self.mlflow_port}"

    @property
    def data_store_path(self) -> str:
        """The store a schedule grows by default (a directory on the data store PVC)."""
        return f"{self.data_store_mount.rstrip('/')}/data-store"

    def image(self, name: str) -> str:
        return image_ref(name, self.image_registry, self.image_tag)

    def pod_security_context(self) -> dict:
        """The pod securityContext of every stage pod (Argo workflow pods, PyTorchJob replicas): fsGroup makes the
        kubelet give mounted volumes to the stage's group; OnRootMismatch skips the walk when already owned."""
        return {
            "runAsUser": self.stage_uid,
            "runAsGroup": self.stage_uid,
            "runAsNonRoot": True,
            "fsGroup": self.stage_uid,
            "fsGroupChangePolicy": "OnRootMismatch",
        }

    def tolerations_json(self) -> list[dict]:
        return [t.model_dump(exclude_none=True) for t in self.gpu_tolerations]
