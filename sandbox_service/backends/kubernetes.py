"""The Kubernetes backend: a Pod per sandbox, on the user's cluster.

What it does, per sandbox:
- a Secret with the agent's shared secret and a TLS certificate from a CA made for this sandbox alone
  (`kubernetes_tls`: the service pins that CA in the endpoint);
- a Pod from the task's image, with the agent injected at run time (init container + emptyDir, see
  `kubernetes_objects`), no service-account token, no restarts, the hard TTL as activeDeadlineSeconds;
- a NetworkPolicy: ingress only from the service pods to the agent port, egress denied unless the
  policy allows it; the Secret and the NetworkPolicy are owned by the Pod (deleting it cascades);
- exec and file calls go from the service straight to the agent at the pod IP, over TLS: never through
  the API server's exec channel, which does not scale (API server memory grows with long execs).

Creation: start() blocks until the sandbox container runs (image pulled) and returns the pod IP; the
service then pings the agent, and readiness is that answer, not the pod phase. Pod status comes from
one watch per backend (`kubernetes_watch.PodCache`): a create costs its POSTs and no status reads, and
`status()` costs no API call. Every call takes a token from one client-side bucket
(`kubernetes_ratelimit`); reads retry until a deadline, writes for a number of attempts. Deletes go
by name. After an agent loss, `status_after_agent_loss` waits on the watch until the pod's status is
final, so a late-reported OOM kill is escalated as one.

What it does not do: it never creates anything outside its namespace; it cannot stop a pod's own
processes from using the pod's loopback (NetworkPolicy has no say there); NetworkPolicy is enforced
only by a CNI that implements it.

Restarts and replicas: a restarted service adopts its running sandboxes (`adopt`, `kubernetes_adopt`:
their state is on the pod and its Secret) and keeps serving them under the same ids; only what cannot be
adopted is reaped, in the background after listening (list_orphans: the same one LIST per kind, then
deletes by name), and sweeps repeat every `orphan_sweep_seconds`. Every object carries its replica's
identity as the owner label (`replica`), and a replica watches, adopts, sweeps and reaps only its own.
Owner labels rather than a coordination.k8s.io Lease for the sweeper: a Lease elects one sweeper but does
not tell it which sandboxes another live replica holds in memory, so the leader would still reap them;
ownership answers exactly that with no API calls, no leader failover window and no extra RBAC. Its
cost: the sandboxes of a replica that never comes back (a StatefulSet scaled down) are reaped by nobody
and end at their hard TTL (activeDeadlineSeconds, capped at max_ttl_seconds), or when a service with
that `replica` starts. The heartbeat TTL is the service's to enforce.

A fork (`SandboxCreate.from_snapshot`) starts from the image and restores the snapshot through the
agent before start() returns. The agent runs with `--inherit-env`, so commands get the
task image's ENV (the runtime sets it for the container's first process). Snapshots hold the sandbox's
workdir only (a tar through the agent, kept on the service's disk): changes elsewhere in the image's
filesystem are not carried, and an OOM-killed pod (cgroup v2 kills the whole container) cannot be
snapshotted at all, so an escalated sandbox restarts from its image then.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from sandbox_service.agent_client_base import AgentClientBase
from sandbox_service.backends import kubernetes_adopt
from sandbox_service.backends.kubernetes_cilium import CiliumPolicies, build_cilium_policy, is_cilium
from sandbox_service.backends.base import AdoptedSandbox, AgentEndpoint, BackendStatus, SandboxBackend
from sandbox_service.backends.kubernetes_cleanup import Cleanup, Objects, names
from sandbox_service.backends.kubernetes_config import (
    SANDBOX_ID_LABEL,
    KubernetesBackendConfig,
)
from sandbox_service.backends.kubernetes_decode import FastApiClient
from sandbox_service.backends.kubernetes_events import EventCache, assess_events
from sandbox_service.backends.kubernetes_objects import (
    Resolver,
    agent_address,
    allowlist_cidrs,
    build_network_policy,
    build_pod,
    build_secret,
    build_shared_network_policy,
    instance_selector,
    label_value,
    owner_reference,
    pod_name_for,
    to_dict,
)
from sandbox_service.backends.kubernetes_pool import WarmPool, is_warm_pool_object
from sandbox_service.backends.kubernetes_ratelimit import TokenBucket
from sandbox_service.backends.kubernetes_retry import RetryPolicy, call, is_already_exists, is_not_found
from sandbox_service.backends.kubernetes_snapshots import AgentFactory, AgentSnapshots
from sandbox_service.backends.kubernetes_status import PodAssessment, assess_pod
from sandbox_service.backends.kubernetes_tls import AgentCertificates
from sandbox_service.backends.kubernetes_watch import PodCache
from sandbox_service.errors import BackendUnavailableError, SandboxNotFoundError, SandboxServiceError
from sandbox_service.models import InfraErrorKind, NetworkPolicy, Resources, SandboxCreate

log = logging.getLogger("sandbox_service.kubernetes")


class PodStartError(SandboxServiceError):
    """The pod cannot come up and waiting will not help (bad image, crash on start)."""

    code = "sandbox_start_failed"

    def __init__(self, message: str, infra_error: InfraErrorKind):
        super().__init__(message)
        self.infra_error = infra_error  # the service records this kind on the failed sandbox


@dataclass
class _Handle:
    pod_name: str
    workdir: str
    endpoint: AgentEndpoint | None = None
    has_policy: bool = True  # a per-sandbox NetworkPolicy (allowlists only) may exist
    policy_kind: str = "networkpolicy"  # or ciliumnetworkpolicy (host_policy="cilium-fqdn")

    def objects(self) -> list[tuple[str, str]]:
        """(kind, name) of everything start() creates for this pod: deleted by name, never by a LIST."""
        return [("pod", self.pod_name), ("secret", secret_name_for(self.pod_name))] + (
            [(self.policy_kind, self.pod_name)] if self.has_policy else [])


def secret_name_for(pod_name: str) -> str:
    return f"{pod_name}-agent"


def _default_agent_factory(endpoint: AgentEndpoint) -> AgentClientBase:
    from sandbox_service.agent_client import AgentClient  # lazy: only snapshots need it here

    return AgentClient(endpoint)


def load_api_client(config: KubernetesBackendConfig) -> k8s.ApiClient:
    """An API client from the pod's service account (in a cluster) or a kubeconfig."""
    configuration = k8s.Configuration()
    in_cluster = config.api_mode == "in_cluster" or (
        config.api_mode == "auto" and "KUBERNETES_SERVICE_HOST" in os.environ)
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(config_file=config.kubeconfig, context=config.context,
                                        client_configuration=configuration)
    except (k8s_config.ConfigException, OSError) as err:
        raise BackendUnavailableError(
            f"cannot reach a Kubernetes cluster ({'in-cluster' if in_cluster else 'kubeconfig'} mode): {err}. "
            "Run the service in the cluster (manifests/) or point ORCHARD_K8S_KUBECONFIG at a kubeconfig.") from err
    configuration.connection_pool_maxsize = config.api_pool_size
    return FastApiClient(configuration)  # the client's own decoding costs ~2 ms a pod (kubernetes_decode)


class KubernetesBackend(SandboxBackend):
    name = "kubernetes"

    def __init__(self, config: KubernetesBackendConfig | None = None, *, api_client: k8s.ApiClient | None = None,
                 agent_factory: AgentFactory = _default_agent_factory, resolver: Resolver | None = None,
                 certificates: AgentCertificates | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 sleep: Callable[[float], None] = time.sleep):
        self.config = config or KubernetesBackendConfig()
        self.api_client = api_client or load_api_client(self.config)
        self.core = k8s.CoreV1Api(self.api_client)
        self.net = k8s.NetworkingV1Api(self.api_client)
        self.cilium = CiliumPolicies(k8s.CustomObjectsApi(self.api_client))
        # A certificate outliving its pod's hard deadline would only widen what a leaked key opens.
        self.certificates = certificates or AgentCertificates((self.config.max_ttl_seconds + 3600) / 86400)
        self._resolver_kw = {"resolver": resolver} if resolver else {}
        self._clock, self._sleep = clock, sleep
        self._retry = RetryPolicy(attempts=self.config.retry_attempts, base_seconds=self.config.retry_base_seconds,
                                  max_seconds=self.config.retry_max_seconds,
                                  read_deadline_seconds=self.config.read_deadline_seconds)
        self.limiter = TokenBucket(self.config.api_qps, self.config.api_burst)
        self._cache: PodCache | None = None
        self._events: EventCache | None = None
        self._shared_policy = False  # the instance's deny-all policy is known to exist
        self._closed = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._handles: dict[str, _Handle] = {}
        self._orphans: dict[str, Objects] = {}  # sandbox id -> its objects, from list_orphans
        self._unadopted: dict[str, Objects] | None = None  # what adopt() found and left: list_orphans' answer
        self.cleanup = Cleanup(self.core, self.net, self.config, self._call, cilium_delete=self.cilium.delete)
        self._lock = threading.Lock()
        self.snapshots = AgentSnapshots(self.config.snapshot_dir, agent_factory,
                                        python=f"{self.config.agent_mount_path}/python/bin/python3",
                                        ready_timeout=self.config.agent_ready_timeout_seconds)
        self.pool = WarmPool(self) if self.config.warm_pools else None  # refills in its own threads

    @classmethod
    def from_service_config(cls, service_config: Any) -> "KubernetesBackend":
        """The backend `ServiceConfig(backend="kubernetes")` gets: settings from `ORCHARD_K8S_*`
        variables; snapshots under the service's state_dir unless ORCHARD_K8S_SNAPSHOT_DIR says otherwise."""
        config = KubernetesBackendConfig.from_env()
        if "ORCHARD_K8S_SNAPSHOT_DIR" not in os.environ and getattr(service_config, "state_dir", None):
            config = config.model_copy(update={"snapshot_dir": Path(service_config.state_dir) / "snapshots"})
        if getattr(service_config, "max_ttl_seconds", None):
            config = config.model_copy(update={"max_ttl_seconds": service_config.max_ttl_seconds})
        threads = getattr(service_config, "backend_threads", 0)
        if threads and config.api_pool_size < threads:  # a smaller pool makes worker threads queue for sockets
            config = config.model_copy(update={"api_pool_size": threads})
        return cls(config)

    # -- plumbing ---------------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self.config.api_timeout_seconds)
        return call(what, fn, *args, policy=self._retry, sleep=self._sleep, limiter=self.limiter.acquire,
                    read=what.startswith(("read ", "list ")), **kwargs)

    @property
    def pods(self) -> PodCache:
        """The watch of this instance's pods, started on first use (one per backend, whatever the load)."""
        with self._lock:
            if self._cache is None:
                self._cache = PodCache(self.core, self.config.namespace, instance_selector(self.config),
                                       before_request=self.limiter.acquire,
                                       watch_timeout_seconds=self.config.watch_timeout_seconds,
                                       request_timeout_seconds=self.config.api_timeout_seconds,
                                       backoff_max_seconds=self.config.retry_max_seconds)
            return self._cache

    @property
    def events(self) -> EventCache:
        """The watch of Warning events about pods (kubernetes_events), started on first use."""
        pods = self.pods
        with self._lock:
            if self._events is None:
                self._events = EventCache(self.core, self.config.namespace, on_event=pods.poke,
                                          before_request=self.limiter.acquire,
                                          watch_timeout_seconds=self.config.watch_timeout_seconds,
                                          request_timeout_seconds=self.config.api_timeout_seconds,
                                          backoff_max_seconds=self.config.retry_max_seconds)
            return self._events

    def _create(self, what: str, create: Callable[..., Any], read: Callable[..., Any], body: Any) -> Any:
        """Create, or read back what an earlier attempt of this very call already created."""
        ns = self.config.namespace
        try:
            return self._call(f"create {what}", create, ns, body)
        except ApiException as err:
            if not is_already_exists(err):
                raise
            name = body["metadata"]["name"] if isinstance(body, dict) else body.metadata.name  # custom objects: dicts
            return self._call(f"read {what}", read, name, ns)

    def _handle(self, sandbox_id: str) -> _Handle | None:
        with self._lock:
            return self._handles.get(sandbox_id)

    def _find_pod(self, sandbox_id: str) -> k8s.V1Pod | None:
        """The sandbox's live pod, from the watch: by name when this process started it, else by its labels."""
        handle, timeout = self._handle(sandbox_id), self.config.read_deadline_seconds
        try:
            if handle is not None:
                return self.pods.get(handle.pod_name, timeout)
            pods = self.pods.find(SANDBOX_ID_LABEL, label_value(sandbox_id), timeout)
        except TimeoutError as err:
            raise BackendUnavailableError(f"cannot see sandbox pods: {err}") from err
        pods = [p for p in pods if p.metadata.deletion_timestamp is None] or pods
        return max(pods, key=lambda p: p.metadata.creation_timestamp or datetime.min.replace(tzinfo=timezone.utc),
                   default=None)

    def _assess(self, pod: k8s.V1Pod, errors_since: dict[str, datetime] | None = None) -> PodAssessment:
        return assess_pod(pod, self._clock(), unschedulable_timeout=self.config.unschedulable_timeout_seconds,
                          image_pull_grace=self.config.image_pull_grace_seconds,
                          container_error_grace=self.config.container_error_grace_seconds,
                          errors_since=errors_since)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, sandbox_id: str, spec: SandboxCreate, resources: Resources, secret: str) -> AgentEndpoint:
        if self.pool is not None and (endpoint := self.pool.claim(sandbox_id, spec, resources, secret)):
            return endpoint  # a warm pod, re-keyed and relabelled for this sandbox (kubernetes_pool)
        return self._start_pod(sandbox_id, spec, resources, secret)

    def _start_pod(self, sandbox_id: str, spec: SandboxCreate, resources: Resources, secret: str, *,
                   warm: bool = False) -> AgentEndpoint:
        cfg, ns = self.config, self.config.namespace
        cilium = is_cilium(cfg)
        pod_name = pod_name_for(sandbox_id)
        # A bad allowlist fails before anything exists (cilium-fqdn: names stay names, nothing is resolved).
        cidrs = [] if cilium else allowlist_cidrs(spec.network, **self._resolver_kw)
        if cilium:
            build_cilium_policy(pod_name, sandbox_id, spec, cfg, spec.network)
        secret_name = secret_name_for(pod_name)
        ca_pem, cert_pem, key_pem = self.certificates.issue(pod_name)
        allowlist = spec.network.mode == "allowlist"
        with self._lock:
            self._handles[sandbox_id] = _Handle(pod_name=pod_name, workdir=spec.workdir, has_policy=allowlist,
                                                policy_kind=self._policy_kind)
        try:
            self._ensure_shared_policy()
            self._create("secret", self.core.create_namespaced_secret, self.core.read_namespaced_secret,
                         build_secret(secret_name, sandbox_id, spec, cfg, agent_secret=secret,
                                      cert_pem=cert_pem, key_pem=key_pem, immutable=not warm,
                                      extra=kubernetes_adopt.secret_entries(spec, ca_pem)))
            pod = self._create("pod", self.core.create_namespaced_pod, self.core.read_namespaced_pod,
                               build_pod(pod_name, sandbox_id, spec, resources, cfg, secret_name=secret_name,
                                         annotations=kubernetes_adopt.pod_annotations(spec, resources)))
            owner = owner_reference(pod)
            # The Secret had to exist before the pod (its volume); only now is the owner's uid known.
            self._call("patch secret owner", self.core.patch_namespaced_secret, secret_name, ns,
                       {"metadata": {"ownerReferences": [to_dict(owner)]}})
            if allowlist and cilium:
                self._create("ciliumnetworkpolicy", self.cilium.create, self.cilium.read,
                             build_cilium_policy(pod_name, sandbox_id, spec, cfg, spec.network, owner=owner))
            elif allowlist:
                self._create("networkpolicy", self.net.create_namespaced_network_policy,
                             self.net.read_namespaced_network_policy,
                             build_network_policy(pod_name, sandbox_id, spec, cfg, spec.network, cidrs, owner=owner))
            ip = self._wait_running(pod_name)
            endpoint = AgentEndpoint(transport="tcp", address=agent_address(ip, cfg.agent_port), secret=secret,
                                     tls=True, ca_cert_pem=ca_pem)
            if spec.from_snapshot:
                # A fork: the service leaves restoring the snapshot to the backend (the local backend
                # starts from the snapshot's filesystem; here the workdir is restored through the agent).
                self.snapshots.restore(endpoint, spec.workdir, spec.from_snapshot)
        except BaseException:
            with self._lock:
                self._handles.pop(sandbox_id, None)
            try:
                self.cleanup.delete_named(_Handle(pod_name, spec.workdir, has_policy=allowlist,  # leak nothing
                                                  policy_kind=self._policy_kind).objects())
            except Exception:  # noqa: BLE001 - keep the original error; stop() and list_orphans() retry
                log.exception("cleanup after a failed start of %s failed", sandbox_id)
            raise
        with self._lock:
            self._handles[sandbox_id].endpoint = endpoint
        return endpoint

    @property
    def _policy_kind(self) -> str:
        return "ciliumnetworkpolicy" if is_cilium(self.config) else "networkpolicy"

    def _ensure_shared_policy(self) -> None:
        """Create the instance's deny-all policy once (it outlives sandboxes and service restarts)."""
        if self._shared_policy:
            return
        self._create("shared networkpolicy", self.net.create_namespaced_network_policy,
                     self.net.read_namespaced_network_policy, build_shared_network_policy(self.config))
        self._shared_policy = True

    def _wait_running(self, pod_name: str) -> str:
        """Wait until the sandbox container runs (its image pulled, the agent starting); return the pod IP.

        This waits longer than "has an IP" on purpose: pulling a multi-GB task image is the pod's
        start, and the service's agent-readiness timeout is sized for the agent, not for a pull.
        """
        cfg = self.config
        last: dict[str, Any] = {}
        errors_since: dict[str, datetime] = {}  # grace periods run from the first error seen, not from creation
        events = self.events

        def settled(pod: k8s.V1Pod | None) -> PodAssessment | None:
            if pod is None:  # not in the watch yet (it lags the create), or gone since
                return PodAssessment(state="failed", infra_error=InfraErrorKind.SANDBOX_DELETED,
                                     message=f"pod {pod_name} was deleted while starting") if last else None
            seen = self._assess(pod, errors_since)
            if seen.state == "pending":  # failures only Events tell (no pod IPs left, a mount that fails)
                seen = assess_events(pod, events.for_pod(pod_name), self._clock(), errors_since,
                                     grace=cfg.event_error_grace_seconds,
                                     scheduling_grace=cfg.unschedulable_timeout_seconds,
                                     autoscaled_nodes=cfg.autoscaled_nodes) or seen
            last["pod"], last["seen"] = pod, seen
            return seen if seen.state != "pending" else None

        seen = self.pods.wait(pod_name, settled, cfg.start_timeout_seconds)
        if seen is None:
            pod, pending = last.get("pod"), last.get("seen")
            err = BackendUnavailableError(
                f"pod {pod_name} was not running after {cfg.start_timeout_seconds:g} s "
                f"(phase {pod.status.phase if pod is not None and pod.status else 'not seen'}"
                f"{': ' + pending.message if pending is not None and pending.message else ''}"
                f"{''.join('; ' + e.get('reason', '') + ': ' + e.get('message', '') for e in events.for_pod(pod_name))}"
                f"{'; pod watch: ' + self.pods.last_error if self.pods.last_error else ''})",
                infra_error=InfraErrorKind.TIMEOUT)
            raise err
        if seen.state == "running" and seen.pod_ip:
            return seen.pod_ip
        assert seen.infra_error is not None
        if seen.retryable:
            raise BackendUnavailableError(seen.message or "sandbox pod failed", infra_error=seen.infra_error)
        raise PodStartError(seen.message or "sandbox pod failed", seen.infra_error)

    def status(self, sandbox_id: str) -> BackendStatus:
        pod = self._find_pod(sandbox_id)
        if pod is None:
            return BackendStatus(alive=False, infra_error=InfraErrorKind.SANDBOX_DELETED,
                                 message="The sandbox pod no longer exists (deleted, or evicted and removed).")
        seen = self._assess(pod)
        if seen.state == "failed":
            return BackendStatus(alive=False, infra_error=seen.infra_error, message=seen.message)
        return BackendStatus(alive=True, message=seen.message)

    def status_after_agent_loss(self, sandbox_id: str) -> BackendStatus:
        """Wait on the watch (no API calls) until the pod's status is final, so an OOM kill the kubelet
        reports late is OOM_KILLED (and escalated), not AGENT_LOST."""
        handle = self._handle(sandbox_id)
        if handle is not None:
            self.pods.wait(handle.pod_name, lambda pod: pod is None or self._assess(pod).state == "failed",
                           self.config.agent_loss_settle_seconds)
        return self.status(sandbox_id)

    def stop(self, sandbox_id: str) -> None:
        with self._lock:
            handle = self._handles.pop(sandbox_id, None)
            orphaned = self._orphans.pop(sandbox_id, None)
        if handle is not None and self._events is not None:
            self._events.forget(handle.pod_name)
        if handle is not None or orphaned is not None:
            # By name: a label LIST is a whole-namespace read on API servers before 1.31, per delete.
            self.cleanup.delete_named(sorted((handle.objects() if handle else []) + list(orphaned or [])))
        else:
            self.cleanup.delete_labelled(sandbox_id)

    @property
    def keeps_sandboxes_on_shutdown(self) -> bool:
        return self.config.adopt_on_restart

    def adopt(self) -> list[AdoptedSandbox]:
        """This replica's running sandboxes that an earlier run left, taken over (see kubernetes_adopt):
        one LIST per kind, no per-sandbox call. What cannot be adopted is what list_orphans() names next."""
        if not self.config.adopt_on_restart:
            return []
        found = self.cleanup.list_all()
        adopted: list[AdoptedSandbox] = []
        with self._lock:
            self._unadopted = {}
            for sid, objects in found.items():
                if sid in self._handles:
                    continue
                if any(is_warm_pool_object(o.metadata.labels) for o in objects.get("pod", [])):
                    # an unclaimed warm pod of an earlier run: the pool's, its key died with that run
                    result: tuple[AdoptedSandbox, str] | str = "an unclaimed warm-pool pod (reaped, never adopted)"
                else:
                    result = kubernetes_adopt.judge(sid, objects, self._assess, self.config, self._clock())
                if isinstance(result, str):
                    log.info("not adopting sandbox %s: %s", sid, result)
                    self._unadopted[sid] = names(objects)
                    continue
                sandbox, pod_name = result
                # CiliumNetworkPolicies are not listed (no `list` right): an allowlist's is deleted by name,
                # and the garbage collector takes it with the pod anyway (ownerReference from its creation).
                has_policy = ("networkpolicy", pod_name) in names(objects) or (
                    is_cilium(self.config) and sandbox.spec.network.mode == "allowlist")
                self._handles[sid] = _Handle(pod_name=pod_name, workdir=sandbox.spec.workdir, endpoint=sandbox.endpoint,
                                             has_policy=has_policy,
                                             policy_kind=self._policy_kind)
                adopted.append(sandbox)
        return adopted

    def list_orphans(self) -> list[str]:
        """Sandboxes of this replica on the cluster that this process does not hold: after a restart,
        those adopt() left (incomplete, expired, failed), else all (their agents' secrets died with the
        old process); later (sweeps), leftovers of failed cleanups."""
        with self._lock:
            found, self._unadopted = self._unadopted, None  # adopt() just listed: no second round of LISTs
        if found is None:
            found = self.cleanup.find_all()
        with self._lock:
            for sid in set(found) - set(self._handles):
                self._orphans[sid] = found[sid]  # stop() then deletes them by name: 3 LISTs for all, not 3 each
            if self._sweeper is None and self.config.orphan_sweep_seconds > 0:  # the service's start-up call
                self._sweeper = threading.Thread(target=self._sweep_forever, name="orphan-sweep", daemon=True)
                self._sweeper.start()
            return sorted(set(found) - set(self._handles))

    def _sweep_forever(self) -> None:
        """Periodic sweeps: a create whose cleanup failed (API down at that moment) leaves objects that no
        handle knows; they are deleted at the next sweep, not at the next restart."""
        while not self._closed.wait(self.config.orphan_sweep_seconds):
            try:
                for orphan in self.list_orphans():
                    log.warning("sweeping orphaned sandbox %s", orphan)
                    self.stop(orphan)
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("orphan sweep failed")

    # -- network ----------------------------------------------------------------------------------
    def apply_network_policy(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        cfg, ns = self.config, self.config.namespace
        if is_cilium(cfg):
            return self._apply_cilium_policy(sandbox_id, policy)
        cidrs = allowlist_cidrs(policy, **self._resolver_kw)
        pod = self._find_pod(sandbox_id)
        if pod is None:
            raise SandboxNotFoundError(f"no pod for sandbox {sandbox_id!r}; it was deleted or never started")
        name = pod.metadata.name
        handle = self._handle(sandbox_id)
        if policy.mode != "allowlist":  # the shared policy denies all egress: drop the sandbox's own
            try:
                self._call("delete networkpolicy", self.net.delete_namespaced_network_policy, name, ns,
                           passthrough=is_not_found)
            except ApiException as err:
                if not is_not_found(err):
                    raise
            return
        if handle is not None:
            handle.has_policy = True
        spec = SandboxCreate(image=pod.spec.containers[0].image, network=policy)
        desired = build_network_policy(name, sandbox_id, spec, cfg, policy, cidrs, owner=owner_reference(pod))
        for attempt in range(cfg.retry_attempts):
            try:
                current = self._call("read networkpolicy", self.net.read_namespaced_network_policy, name, ns,
                                     passthrough=is_not_found)
            except ApiException:
                self._create("networkpolicy", self.net.create_namespaced_network_policy,
                             self.net.read_namespaced_network_policy, desired)
                return
            current.spec = desired.spec  # keep its metadata: labels, owner, resourceVersion
            try:
                self._call("replace networkpolicy", self.net.replace_namespaced_network_policy, name, ns, current,
                           retry_conflicts=False, passthrough=lambda e: e.status == 409)
                return
            except ApiException:  # 409: someone changed it since our read; read again
                self._sleep(min(cfg.retry_max_seconds, cfg.retry_base_seconds * 2 ** attempt))
        raise BackendUnavailableError(f"networkpolicy {name}: kept conflicting after {cfg.retry_attempts} attempts")

    def _apply_cilium_policy(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Delete the sandbox's CiliumNetworkPolicy and create the new one (kubernetes_cilium: no `update`
        right; between the two calls the shared policy denies all egress, the safe direction)."""
        pod = self._find_pod(sandbox_id)
        if pod is None:
            raise SandboxNotFoundError(f"no pod for sandbox {sandbox_id!r}; it was deleted or never started")
        name = pod.metadata.name
        spec = SandboxCreate(image=pod.spec.containers[0].image, network=policy)
        desired = (build_cilium_policy(name, sandbox_id, spec, self.config, policy, owner=owner_reference(pod))
                   if policy.mode == "allowlist" else None)  # built first: a bad allowlist changes nothing
        self.cleanup.delete_named([("ciliumnetworkpolicy", name)])
        if desired is not None:
            if (handle := self._handle(sandbox_id)) is not None:
                handle.has_policy = True
            self._create("ciliumnetworkpolicy", self.cilium.create, self.cilium.read, desired)

    # -- snapshots (through the agent, see kubernetes_snapshots) ------------------------------------
    def _agent_handle(self, sandbox_id: str) -> _Handle:
        handle = self._handle(sandbox_id)
        if handle is None or handle.endpoint is None:
            raise SandboxNotFoundError(f"sandbox {sandbox_id!r} is not running on this service instance")
        return handle

    def snapshot(self, sandbox_id: str, snapshot_id: str) -> int:
        handle = self._agent_handle(sandbox_id)
        return self.snapshots.save(handle.endpoint, handle.workdir, snapshot_id)

    def restore(self, sandbox_id: str, snapshot_id: str) -> None:
        handle = self._agent_handle(sandbox_id)
        self.snapshots.restore(handle.endpoint, handle.workdir, snapshot_id)

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.snapshots.delete(snapshot_id)

    def close(self) -> None:
        self._closed.set()
        if self.pool is not None:
            self.pool.close()  # deletes its idle pods: nobody else knows their keys
        for cache in (self._cache, self._events):
            if cache is not None:
                cache.close()
        self.api_client.close()
