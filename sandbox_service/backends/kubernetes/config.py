"""Configuration of the Kubernetes backend: one typed object, validated at the boundary.

Kept free of the `kubernetes` package so that `ServiceConfig` can embed it without importing the
client (the backend imports it lazily, only when `backend="kubernetes"`).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sandbox_service.models import Resources

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "orchard"
SANDBOX_ID_LABEL = "orchard.dev/sandbox-id"
INSTANCE_LABEL = "orchard.dev/service-instance"
OWNER_LABEL = "orchard.dev/owner"  # the replica that created the sandbox (KubernetesBackendConfig.replica)
USER_LABEL_PREFIX = "label.orchard.dev/"
SANDBOX_ID_ANNOTATION = "orchard.dev/sandbox-id"
USER_LABELS_ANNOTATION = "orchard.dev/labels"
WORKDIR_ANNOTATION = "orchard.dev/workdir"


class Toleration(BaseModel):
    """A pod toleration (the Kubernetes field names, so YAML/env values copy over as they are)."""

    model_config = ConfigDict(extra="forbid")
    key: str | None = Field(None, description="Taint key; empty with operator Exists matches every taint.")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="How key and value are compared.")
    value: str | None = Field(None, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to tolerate; None tolerates all effects."
    )
    toleration_seconds: int | None = Field(None, ge=0, description="NoExecute only: how long to stay after the taint.")


class WarmPoolEntry(BaseModel):
    """Pods kept running, ready to be claimed by creates of exactly this image, resources and workdir."""

    model_config = ConfigDict(extra="forbid")
    image: str = Field(..., min_length=1, description="Task image, as `SandboxCreate.image` names it.")
    resources: Resources = Field(default_factory=Resources, description="Must equal the create's resources.")
    workdir: str = Field("/workspace", description="Must equal the create's workdir (the agent's workspace).")
    size: int = Field(..., ge=1, le=256, description="Ready pods to keep for this key.")


class KubernetesBackendConfig(BaseSettings):
    """Where and how sandbox pods run. Every field has a safe default for a single-namespace install.

    Read from `ORCHARD_K8S_<FIELD>` environment variables (dicts and lists as JSON), e.g.
    `ORCHARD_K8S_NAMESPACE=sandboxes`, `ORCHARD_K8S_NODE_SELECTOR='{"pool": "sandbox"}'`.
    """

    model_config = SettingsConfigDict(env_prefix="ORCHARD_K8S_", extra="forbid")

    # -- cluster access ---------------------------------------------------------------------------
    namespace: str = Field("orchard", description="Namespace of sandbox pods, Secrets and NetworkPolicies.")
    api_mode: Literal["auto", "in_cluster", "kubeconfig"] = Field(
        "auto", description="auto: the pod's service account when in a cluster, else the kubeconfig."
    )
    kubeconfig: str | None = Field(None, description="Kubeconfig path (kubeconfig mode; default ~/.kube/config).")
    context: str | None = Field(None, description="Kubeconfig context (default: the current context).")
    api_timeout_seconds: float = Field(30.0, gt=0, description="Timeout of each Kubernetes API request.")
    api_pool_size: int = Field(
        96, ge=1, description="HTTP connections kept to the API server (at least the service's backend_threads)."
    )
    api_qps: float = Field(
        50.0, gt=0, description="Client-side rate limit: API requests a second, shared by every call (token bucket)."
    )
    api_burst: int = Field(100, ge=1, description="Requests the rate limiter lets through at once after a lull.")
    instance: str = Field(
        "default",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="Service instance label; orphans are only reaped among this instance's objects.",
    )
    replica: str = Field(
        "0",
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
        description="This replica's identity, the owner label of every sandbox it creates: a replica watches, "
        "adopts, sweeps and reaps only its own. Stable across restarts (a StatefulSet pod name "
        "from the downward API, or a fixed value for a one-replica Deployment) so that a restarted "
        "replica adopts what it had; two live replicas of one instance must differ.",
    )
    adopt_on_restart: bool = Field(
        True,
        description="At start, adopt this replica's running sandboxes (same ids, exec keeps working) and "
        "reap only what cannot be adopted; at shutdown, leave ready sandboxes running for the "
        "next start. False: every start reaps them all, every shutdown deletes them.",
    )

    default_image: str | None = Field(
        None,
        description="Task image of a sandbox whose create names none (generated tasks: an image with Python "
        "and pytest, e.g. the stage runtime). None: such a create is refused.",
    )

    # -- the agent ----------------------------------------------------------------------------------
    injector_image: str = Field(
        "ghcr.io/orchard-dev/agent-injector:0.1.0",
        description="Image whose init container copies a standalone Python and the agent into the pod.",
    )
    agent_port: int = Field(8700, ge=1, le=65535, description="TCP port the agent listens on (TLS) in the pod.")
    agent_mount_path: str = Field("/orchard", description="Where the injected agent and Python appear.")
    secret_mount_path: str = Field("/orchard-secret", description="Where the agent's secret and TLS key appear.")
    agent_volume_size_mb: int = Field(256, ge=32, description="Size limit of the emptyDir holding the agent.")
    agent_memory_overhead_mb: int = Field(
        64, ge=0, description="Added to the memory limit so the agent does not eat the workload's budget."
    )
    agent_ready_timeout_seconds: float = Field(
        60.0, gt=0, description="How long start() waits for the agent to answer when it must restore a snapshot."
    )

    # -- placement ------------------------------------------------------------------------------------
    service_selector: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "orchard-sandbox-service"},
        description="Labels of the sandbox service pods: the only ones admitted to sandbox agents.",
    )
    service_namespace: str | None = Field(
        None, description="Namespace of the service pods when it differs from `namespace`."
    )
    service_account_name: str | None = Field(
        None, description="Service account of sandbox pods (its token is never mounted)."
    )
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets for private registries.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of task images."
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels sandbox pods require.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints sandbox pods tolerate.")
    runtime_class_name: str | None = Field(
        None, description="RuntimeClass for stronger isolation, e.g. gvisor or kata (None = the node default)."
    )
    priority_class_name: str | None = Field(None, description="PriorityClass of sandbox pods.")
    pod_annotations: dict[str, str] = Field(
        default_factory=dict, description="Extra pod annotations, e.g. to keep a service mesh sidecar out."
    )
    cpu_request_ratio: float = Field(
        1.0, gt=0, le=1, description="CPU request = limit x this (1.0: guaranteed; lower packs nodes denser)."
    )
    guaranteed_qos: bool = Field(
        False,
        description="Requests = limits in every container, the injector too, so pods get the Guaranteed "
        "QoS class (evicted last, eligible for exclusive CPUs); overrides cpu_request_ratio.",
    )

    # -- network ----------------------------------------------------------------------------------------
    host_policy: Literal["resolve", "cilium-fqdn", "antrea-fqdn", "calico-dns"] = Field(
        "resolve",
        description="How allowlists name hosts (docs/operations/kubernetes.md: the per-CNI table). "
        "resolve: a NetworkPolicy "
        "with the addresses the hosts resolve to when applied (any enforcing CNI; "
        "CDN-hosted hosts drift; no wildcards). The others keep names as names, learnt "
        "by the CNI from the sandbox's DNS answers, nothing resolved by the service: "
        "cilium-fqdn: a CiliumNetworkPolicy with toFQDNs (Cilium); antrea-fqdn: an "
        "Antrea NetworkPolicy (crd.antrea.io/v1beta1) with fqdn peers (Antrea >= 1.13); "
        "calico-dns: a projectcalico.org/v3 NetworkPolicy with destination domains "
        "(Calico Enterprise or Calico Cloud only: Calico Open Source has no DNS "
        "policy). Each needs the Role's rule for its resource (manifests/base/rbac.yaml).",
    )
    allow_dns_for_hosts: bool = Field(
        True,
        description="Allowlists naming hosts also allow DNS to the cluster DNS (else names do not resolve); "
        "FQDN host policies always do (the CNI learns the names' addresses from it).",
    )
    dns_namespace: str = Field("kube-system", description="Namespace of the cluster DNS pods.")
    dns_selector: dict[str, str] = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"}, description="Labels of the cluster DNS pods."
    )
    dns_cidrs: list[str] = Field(
        default_factory=lambda: ["169.254.20.10/32"],
        description="DNS addresses no pod selector matches: NodeLocal DNSCache's link-local address by default.",
    )
    node_cidrs: list[str] = Field(
        default_factory=list,
        description="The nodes' own addresses (CIDRs, IPv4 or IPv6): an allowlist reaches "
        "them only by naming single addresses (a /32 or /128, or a host name), never through a wider CIDR that "
        "contains them (excepted from it), as the local backend never opens the host's own addresses to one. "
        "Empty: the CNI's own rule for pod-to-node traffic applies.",
    )

    # -- timing ------------------------------------------------------------------------------------------
    start_timeout_seconds: float = Field(300.0, gt=0, description="Give up on a pod that has no IP after this.")
    unschedulable_timeout_seconds: float = Field(
        120.0, ge=0, description="A pod unschedulable this long is reported UNAVAILABLE (retryable)."
    )
    image_pull_grace_seconds: float = Field(
        60.0,
        ge=0,
        description="Image pull errors lasting this long (from the first one seen) are IMAGE_PULL_FAILED; "
        "a registry 429 or timeout is then retried by the service, a missing image is not.",
    )
    container_error_grace_seconds: float = Field(
        60.0, ge=0, description="CreateContainerError and kin lasting this long fail the attempt (retryable)."
    )
    event_error_grace_seconds: float = Field(
        60.0,
        ge=0,
        description="Event-only errors of a pending pod (FailedCreatePodSandBox, FailedMount) lasting "
        "this long (from the first one seen) fail the attempt (retryable).",
    )
    autoscaled_nodes: bool = Field(
        True,
        description="A node autoscaler may add nodes (pools scaled to zero): a pod no current node can take "
        "waits unschedulable_timeout_seconds. False: it fails at once when the scheduler says no "
        "node could ever take it (selector, affinity, taints).",
    )
    watch_timeout_seconds: int = Field(
        240, ge=1, description="Server-side timeout of one pod watch request (it is then resumed)."
    )
    delete_grace_seconds: int = Field(1, ge=0, description="Termination grace period of sandbox pods.")
    orphan_sweep_seconds: float = Field(
        300.0,
        ge=0,
        description="After start-up, look for and delete orphans this often (leftovers of failed "
        "cleanups); 0: only at start-up. Each replica sweeps only its own (`replica`).",
    )
    agent_loss_settle_seconds: float = Field(
        15.0,
        ge=0,
        description="After an agent stops answering, how long to wait for the pod status to say why "
        "(kubelet reports an OOM kill seconds late); still running then: AGENT_LOST.",
    )
    max_ttl_seconds: float = Field(
        86400.0, gt=0, description="Cap on a pod's activeDeadlineSeconds (the service's max_ttl_seconds)."
    )
    safe_to_evict: bool = Field(
        False,
        description="The cluster autoscaler's safe-to-evict annotation of sandbox pods. False (default): "
        '"false", so scale-down never removes a node under a running episode (its state '
        "lives only in the pod; adoption keeps sandboxes across service restarts, not node "
        'removals). True: "true", nodes drain faster and running episodes die.',
    )

    # -- warm pool (kubernetes_pool) ---------------------------------------------------------------------
    warm_pools: list[WarmPoolEntry] = Field(
        default_factory=list,
        description="Warm pools, one per (image, resources, workdir); empty: off. E.g. "
        'ORCHARD_K8S_WARM_POOLS=\'[{"image": "ghcr.io/me/task:1", "size": 32}]\'.',
    )
    warm_pool_max_total: int = Field(
        512, ge=0, description="Bound on the sum of warm pool sizes (idle pods cost cluster capacity)."
    )
    warm_pool_max_age_seconds: float = Field(
        3600.0, gt=0, description="An unclaimed warm pod older than this is replaced (its deadline keeps running)."
    )
    warm_pool_refill_concurrency: int = Field(8, ge=1, description="Warm pods started at once by the refill.")

    # -- retries of API calls ------------------------------------------------------------------------------
    retry_attempts: int = Field(6, ge=1, description="Attempts per write call on 409/429/5xx/connection errors.")
    retry_base_seconds: float = Field(0.2, gt=0, description="First backoff; doubles per attempt (full jitter).")
    retry_max_seconds: float = Field(10.0, gt=0, description="Backoff cap (a Retry-After header overrides it).")
    read_deadline_seconds: float = Field(
        60.0, gt=0, description="GET/LIST calls are retried until this deadline (writes: retry_attempts)."
    )

    # -- snapshots ---------------------------------------------------------------------------------------
    snapshot_dir: Path = Field(
        Path("/var/lib/orchard/snapshots"),
        description="Service-side directory of snapshot archives (a PVC in production).",
    )

    @field_validator("node_cidrs")
    @classmethod
    def _node_cidrs(cls, cidrs: list[str]) -> list[str]:
        try:
            return [str(ipaddress.ip_network(c, strict=False)) for c in cidrs]
        except ValueError as err:
            raise ValueError(f"node_cidrs: {err} (give CIDRs such as 10.0.0.0/24)") from None

    @model_validator(mode="after")
    def _bounded_pools(self) -> "KubernetesBackendConfig":
        total = sum(entry.size for entry in self.warm_pools)
        if total > self.warm_pool_max_total:
            raise ValueError(
                f"warm_pools hold {total} pods in all, over warm_pool_max_total="
                f"{self.warm_pool_max_total}; lower the sizes or raise the bound."
            )
        return self

    @classmethod
    def from_env(cls) -> "KubernetesBackendConfig":
        """The configuration the environment describes (same as `KubernetesBackendConfig()`)."""
        return cls()
