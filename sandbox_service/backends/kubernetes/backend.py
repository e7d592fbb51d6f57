"""The Kubernetes backend: a Pod per sandbox, on the user's cluster.

What it does, per sandbox:
- a Secret with the agent's shared secret and a TLS certificate from a CA made for this sandbox alone
  (`kubernetes_tls`: the service pins that CA in the endpoint);
- a Pod from the task's image, with the agent injected at run time (init container + emptyDir, see
  `kubernetes_objects`), no service-account token, no restarts, the hard TTL as activeDeadlineSeconds;
- network policies (`kubernetes_network`): a shared deny-all, and for an allowlist one policy of its
  own that opens egress; the Secret and that policy are owned by the Pod (deleting it cascades);
- exec and file calls go from the service straight to the agent at the pod IP, over TLS: never through
  the API server's exec channel, which does not scale (API server memory grows with long execs).

Creation: start() blocks until the sandbox container runs (image pulled, `kubernetes_startup`) and
returns the pod IP; the service then pings the agent, and readiness is that answer, not the pod phase.
Pod status comes from one watch per backend (`kubernetes_watch.PodCache`): a create costs its POSTs
and no status reads, and `status()` costs no API call. Every API call is rate-limited and retried the
same way (`kubernetes_api`). Deletes go by name (`kubernetes_cleanup`). After an agent loss,
`status_after_agent_loss` waits on the watch until the pod's status is final, so a late-reported OOM
kill is escalated as one. It never creates anything outside its namespace.

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
import secrets
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from sandbox_service.agent_link.base import AgentClientBase
from sandbox_service.backends.kubernetes import adopt as kubernetes_adopt
from sandbox_service.backends.base import AdoptedSandbox, AgentEndpoint, BackendStatus, SandboxBackend
from sandbox_service.backends.kubernetes.api import KubernetesApi, load_api_client
from sandbox_service.backends.kubernetes.cleanup import Cleanup, Objects, names
from sandbox_service.backends.kubernetes.config import (
    SANDBOX_ID_LABEL,
    KubernetesBackendConfig,
)
from sandbox_service.backends.kubernetes.events import EventCache
from sandbox_service.backends.kubernetes.network.policies import SandboxNetwork
from sandbox_service.backends.kubernetes.objects import (
    Resolver,
    agent_address,
    build_pod,
    build_secret,
    instance_selector,
    label_value,
    owner_reference,
    pod_name_for,
    secret_name_for,
    to_dict,
)
from sandbox_service.backends.kubernetes.pool import WarmPool, is_warm_pool_object
from sandbox_service.backends.kubernetes.snapshots import AgentFactory, AgentSnapshots
from sandbox_service.backends.kubernetes.startup import PodStartError, wait_running
from sandbox_service.backends.kubernetes.status import PodAssessment, assess_pod
from sandbox_service.backends.kubernetes.tls import AgentCertificates
from sandbox_service.backends.kubernetes.watch import PodCache
from sandbox_service.errors import BackendUnavailableError, SandboxNotFoundError
from sandbox_service.models import InfraErrorKind, NetworkPolicy, Resources, SandboxCreate

__all__ = ["KubernetesBackend", "PodStartError", "load_api_client", "secret_name_for"]

log = logging.getLogger("sandbox_service.kubernetes")


@dataclass
class _Handle:
    pod_name: str
    workdir: str
    endpoint: AgentEndpoint | None = None
    has_policy: bool = True  # a per-sandbox NetworkPolicy (allowlists only) may exist
    policy_kind: str = "networkpolicy"  # or an FQDN policy's kind (kubernetes_host_policy)

    def objects(self) -> list[tuple[str, str]]:
        """(kind, name) of everything start() creates for this pod: deleted by name, never by a LIST."""
        return [("pod", self.pod_name), ("secret", secret_name_for(self.pod_name))] + (
            [(self.policy_kind, self.pod_name)] if self.has_policy else []
        )


def _default_agent_factory(endpoint: AgentEndpoint) -> AgentClientBase:
    from sandbox_service.agent_link.client import AgentClient  # lazy: only snapshots need it here

    return AgentClient(endpoint)


class KubernetesBackend(SandboxBackend):
    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesBackendConfig | None = None,
        *,
        api_client: k8s.ApiClient | None = None,
        agent_factory: AgentFactory = _default_agent_factory,
        resolver: Resolver | None = None,
        certificates: AgentCertificates | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.config = config or KubernetesBackendConfig()
        self.api_client = api_client or load_api_client(self.config)
        self.api = KubernetesApi(self.config, self.api_client, sleep)
        self.core, self.limiter = self.api.core, self.api.limiter
        self._call, self._create = self.api.call, self.api.create
        # A certificate outliving its pod's hard deadline would only widen what a leaked key opens.
        self.certificates = certificates or AgentCertificates((self.config.max_ttl_seconds + 3600) / 86400)
        self._clock = clock
        self._cache: PodCache | None = None
        self._events: EventCache | None = None
        self._closed = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._handles: dict[str, _Handle] = {}
        self._orphans: dict[str, Objects] = {}  # sandbox id -> its objects, from list_orphans
        self._unadopted: dict[str, Objects] | None = None  # what adopt() found and left: list_orphans' answer
        self.network = SandboxNetwork(
            self.api,
            self.config,
            {"resolver": resolver} if resolver else {},
            delete_named=lambda objects: self.cleanup.delete_named(objects),
        )
        self.cleanup = Cleanup(
            self.core, self.api.net, self.config, self._call, fqdn_deletes=self.network.fqdn_deletes()
        )
        self._lock = threading.Lock()
        self.snapshots = AgentSnapshots(
            self.config.snapshot_dir,
            agent_factory,
            python=f"{self.config.agent_mount_path}/python/bin/python3",
            ready_timeout=self.config.agent_ready_timeout_seconds,
        )
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
    @property
    def pods(self) -> PodCache:
        """The watch of this instance's pods, started on first use (one per backend, whatever the load)."""
        with self._lock:
            if self._cache is None:
                self._cache = PodCache(
                    self.core,
                    self.config.namespace,
                    instance_selector(self.config),
                    before_request=self.limiter.acquire,
                    watch_timeout_seconds=self.config.watch_timeout_seconds,
                    request_timeout_seconds=self.config.api_timeout_seconds,
                    backoff_max_seconds=self.config.retry_max_seconds,
                )
            return self._cache

    @property
    def events(self) -> EventCache:
        """The watch of Warning events about pods (kubernetes_events), started on first use."""
        pods = self.pods
        with self._lock:
            if self._events is None:
                self._events = EventCache(
                    self.core,
                    self.config.namespace,
                    on_event=pods.poke,
                    before_request=self.limiter.acquire,
                    watch_timeout_seconds=self.config.watch_timeout_seconds,
                    request_timeout_seconds=self.config.api_timeout_seconds,
                    backoff_max_seconds=self.config.retry_max_seconds,
                )
            return self._events

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
        return max(
            pods, key=lambda p: p.metadata.creation_timestamp or datetime.min.replace(tzinfo=timezone.utc), default=None
        )

    def _assess(self, pod: k8s.V1Pod, errors_since: dict[str, datetime] | None = None) -> PodAssessment:
        return assess_pod(
            pod,
            self._clock(),
            unschedulable_timeout=self.config.unschedulable_timeout_seconds,
            image_pull_grace=self.config.image_pull_grace_seconds,
            container_error_grace=self.config.container_error_grace_seconds,
            errors_since=errors_since,
        )

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, sandbox_id: str, spec: SandboxCreate, resources: Resources, secret: str) -> AgentEndpoint:
        if not spec.image and self.config.default_image:
            spec = spec.model_copy(update={"image": self.config.default_image})
        if self.pool is not None and (endpoint := self.pool.claim(sandbox_id, spec, resources, secret)):
            return endpoint  # a warm pod, re-keyed and relabelled for this sandbox (kubernetes_pool)
        return self._start_pod(sandbox_id, spec, resources, secret)

    def _start_pod(
        self, sandbox_id: str, spec: SandboxCreate, resources: Resources, secret: str, *, warm: bool = False
    ) -> AgentEndpoint:
        cfg, ns = self.config, self.config.namespace
        pod_name = pod_name_for(sandbox_id)
        cidrs = self.network.check(pod_name, sandbox_id, spec)  # a bad allowlist fails before anything exists
        secret_name = secret_name_for(pod_name)
        ca_pem, cert_pem, key_pem = self.certificates.issue(pod_name)
        allowlist = spec.network.mode == "allowlist"
        with self._lock:
            self._handles[sandbox_id] = _Handle(
                pod_name=pod_name, workdir=spec.workdir, has_policy=allowlist, policy_kind=self.network.kind
            )
        try:
            self.network.ensure_shared()
            # A warm pod boots with its pool key (the claim re-keys it); any other with a key the service
            # re-keys away as soon as the agent answers: the pod's files never hold a key still accepted.
            boot = secret if warm else secrets.token_urlsafe(32)
            self._create(
                "secret",
                self.core.create_namespaced_secret,
                self.core.read_namespaced_secret,
                build_secret(
                    secret_name,
                    sandbox_id,
                    spec,
                    cfg,
                    agent_secret=secret,
                    boot_secret=boot,
                    cert_pem=cert_pem,
                    key_pem=key_pem,
                    immutable=not warm,
                    extra=kubernetes_adopt.secret_entries(spec, ca_pem),
                ),
            )
            pod = self._create(
                "pod",
                self.core.create_namespaced_pod,
                self.core.read_namespaced_pod,
                build_pod(
                    pod_name,
                    sandbox_id,
                    spec,
                    resources,
                    cfg,
                    secret_name=secret_name,
                    annotations=kubernetes_adopt.pod_annotations(spec, resources),
                    warm=warm,
                ),
            )
            owner = owner_reference(pod)
            # The Secret had to exist before the pod (its volume); only now is the owner's uid known.
            self._call(
                "patch secret owner",
                self.core.patch_namespaced_secret,
                secret_name,
                ns,
                {"metadata": {"ownerReferences": [to_dict(owner)]}},
            )
            if allowlist:
                self.network.create(pod_name, sandbox_id, spec, cidrs, owner)
            ip = self._wait_running(pod_name)
            endpoint = AgentEndpoint(
                transport="tcp",
                address=agent_address(ip, cfg.agent_port),
                secret=secret,
                tls=True,
                ca_cert_pem=ca_pem,
                boot_secret=None if warm else boot,
            )
            if spec.from_snapshot:
                # A fork: the service leaves restoring the snapshot to the backend (the local backend
                # starts from the snapshot's filesystem; here the workdir is restored through the agent,
                # which still has its boot key).
                self.snapshots.restore(endpoint.model_copy(update={"secret": boot}), spec.workdir, spec.from_snapshot)
        except BaseException:
            with self._lock:
                self._handles.pop(sandbox_id, None)
            try:
                self.cleanup.delete_named(
                    _Handle(
                        pod_name,
                        spec.workdir,
                        has_policy=allowlist,  # leak nothing
                        policy_kind=self.network.kind,
                    ).objects()
                )
            except Exception:  # noqa: BLE001 - keep the original error; stop() and list_orphans() retry
                log.exception("cleanup after a failed start of %s failed", sandbox_id)
            raise
        with self._lock:  # the backend's own agent calls (snapshots) come after the take-over: the live key
            self._handles[sandbox_id].endpoint = endpoint.model_copy(update={"boot_secret": None})
        return endpoint

    def _wait_running(self, pod_name: str) -> str:
        """The pod IP once its sandbox container runs (kubernetes_startup; scripts/sim_k8s_scale.py swaps it)."""
        return wait_running(pod_name, self.events, self.pods, self._assess, self._clock, self.config)

    def status(self, sandbox_id: str) -> BackendStatus:
        pod = self._find_pod(sandbox_id)
        if pod is None:
            return BackendStatus(
                alive=False,
                infra_error=InfraErrorKind.SANDBOX_DELETED,
                message="The sandbox pod no longer exists (deleted, or evicted and removed).",
            )
        seen = self._assess(pod)
        if seen.state == "failed":
            return BackendStatus(alive=False, infra_error=seen.infra_error, message=seen.message)
        return BackendStatus(alive=True, message=seen.message)

    def status_after_agent_loss(self, sandbox_id: str) -> BackendStatus:
        """Wait on the watch (no API calls) until the pod's status is final, so an OOM kill the kubelet
        reports late is OOM_KILLED (and escalated), not AGENT_LOST."""
        handle = self._handle(sandbox_id)
        if handle is not None:
            self.pods.wait(
                handle.pod_name,
                lambda pod: pod is None or self._assess(pod).state == "failed",
                self.config.agent_loss_settle_seconds,
            )
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
                # FQDN policies are not listed (no `list` right): an allowlist's is deleted by name, and
                # the garbage collector takes it with the pod anyway (ownerReference from its creation).
                has_policy = ("networkpolicy", pod_name) in names(objects) or (
                    self.network.fqdn_type is not None and sandbox.spec.network.mode == "allowlist"
                )
                self._handles[sid] = _Handle(
                    pod_name=pod_name,
                    workdir=sandbox.spec.workdir,
                    endpoint=sandbox.endpoint,
                    has_policy=has_policy,
                    policy_kind=self.network.kind,
                )
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
        def mark_policy() -> None:  # stop() deletes it by name from now on
            if (handle := self._handle(sandbox_id)) is not None:
                handle.has_policy = True

        self.network.apply(sandbox_id, policy, self._find_pod, mark_policy)

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

    def health(self) -> str | None:
        return self.api.health()

    def close(self) -> None:
        self._closed.set()
        if self.pool is not None:
            self.pool.close()  # deletes its idle pods: nobody else knows their keys
        for cache in (self._cache, self._events):
            if cache is not None:
                cache.close()
        self.api_client.close()
