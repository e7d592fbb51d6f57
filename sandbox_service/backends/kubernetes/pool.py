"""The warm pool of the Kubernetes backend: pods started ahead of demand for the common RL case (many
sandboxes of one image), claimed by a matching create instead of starting a pod.

Key: (image, resources, workdir), as `KubernetesBackendConfig.warm_pools` lists them; anything else in a
create that shapes the pod (a fork, an allowlist network policy) takes the normal path. A warm pod is a
sandbox pod like any other (`KubernetesBackend._start_pod`), started under a pool id with a key only
this process knows, its Secret left mutable, its agent pinged until it answers.

A claim, in this order:
1. relabel: one PATCH of the pod with the resourceVersion the watch last saw as a precondition; it
   sets the sandbox id label and annotation and the caller's labels, drops the pool label and lowers
   `activeDeadlineSeconds` to the pod's age + the sandbox's TTL (the API server lets a deadline be
   lowered, never raised: warm pods start with the service's cap plus `warm_pool_max_age_seconds`
   (`kubernetes_objects.pod_deadline_seconds`), and a pod too old to give the whole TTL is not claimed); it also
   writes what adoption reads (`kubernetes_adopt.pod_annotations`: the
   sandbox's spec and resources, the claim time as the TTL's start). A 409 means another writer (a
   second replica, a sweep) got there first: the claim moves on to the next pod, so two claims never
   share one.
2. re-key: the agent's `rekey` op, authenticated with the pool key over the pod's pinned TLS, makes the
   agent accept the sandbox's key only; then one PATCH writes that key and the adoption entries
   (`kubernetes_adopt.secret_entries`: the CA, the claim's env) into the pod's Secret and makes it
   immutable (the cluster's record matches the agent; the kubelet stops watching it).
3. the backend's handle moves from the pool id to the sandbox id; the refill starts a replacement.
If a step after the relabel fails, the pod is deleted and the create takes the normal path.

Pool pods carry the label `label.orchard.dev/orchard-warm-pool` until claimed; this process keeps
their handles, so its orphan sweeps never touch them. `close()` deletes them (their keys die with the
process); those of a process that died without closing are reaped at the next start like any orphan
(`KubernetesBackend.adopt` skips them: their keys are gone). The pool never adopts another process's
warm pods, and its pods carry the replica's owner label: its LISTs (shutdown) never see another replica's.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import math
import secrets
import threading
import time
from collections import deque
import concurrent.futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from kubernetes.client.exceptions import ApiException

from sandbox_service.backends.kubernetes import adopt as kubernetes_adopt
from sandbox_service.backends.base import AgentEndpoint
from sandbox_service.backends.kubernetes.config import (
    SANDBOX_ID_ANNOTATION,
    USER_LABEL_PREFIX,
    USER_LABELS_ANNOTATION,
)
from sandbox_service.backends.kubernetes.objects import (
    SECRET_KEY_AGENT,
    instance_selector,
    object_labels,
    secret_name_for,
)
from sandbox_service.backends.kubernetes.retry import is_not_found
from sandbox_service.backends.kubernetes.snapshots import run_coroutine
from sandbox_service.errors import BackendUnavailableError
from sandbox_service.models import NetworkPolicy, Resources, SandboxCreate

if TYPE_CHECKING:
    from sandbox_service.backends.kubernetes.cleanup import Cleanup
    from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
    from sandbox_service.backends.kubernetes.snapshots import AgentSnapshots
    from sandbox_service.backends.kubernetes.status import PodAssessment
    from sandbox_service.backends.kubernetes.watch import PodCache

log = logging.getLogger("sandbox_service.kubernetes.pool")

POOL_USER_LABEL = "orchard-warm-pool"
POOL_LABEL = f"{USER_LABEL_PREFIX}{POOL_USER_LABEL}"  # on a warm pod and its Secret until claimed
CLAIM_ATTEMPTS = 3  # PATCHes per warm pod before it is dropped (each after a 409 and a fresh read)
CLOSE_WAIT_SECONDS = 15.0  # shutdown waits this long for warm pods still starting, then deletes by label


def pool_key(image: str, resources: Resources, workdir: str) -> str:
    """The pool a create can claim from: everything that shapes a warm pod's spec."""
    raw = json.dumps([image, resources.model_dump(), workdir], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def is_warm_pool_object(labels: dict[str, str] | None) -> bool:
    """An unclaimed warm pod or its Secret (not a sandbox: never adopt one, reap it)."""
    return POOL_LABEL in (labels or {})


@dataclass
class WarmPod:
    pool_id: str  # the sandbox id the pod was started under
    pod_name: str
    key: str
    endpoint: AgentEndpoint  # with the pool key
    ready_at: float  # monotonic


class PoolBackend(Protocol):
    """What the warm pool uses of its backend (`KubernetesBackend`, which owns the pool and imports this module)."""

    config: KubernetesBackendConfig
    core: Any  # kubernetes CoreV1Api
    snapshots: AgentSnapshots
    cleanup: Cleanup
    _lock: threading.Lock
    _handles: dict[str, Any]
    _clock: Callable[[], datetime]
    _call: Callable[..., Any]

    @property
    def pods(self) -> PodCache: ...

    def _handle(self, sandbox_id: str) -> Any: ...

    def _assess(self, pod: Any, errors_since: dict[str, datetime] | None = None) -> PodAssessment: ...

    def _start_pod(
        self, sandbox_id: str, spec: SandboxCreate, resources: Resources, secret: str, *, warm: bool = False
    ) -> AgentEndpoint: ...

    def stop(self, sandbox_id: str) -> None: ...


class WarmPool:
    def __init__(self, backend: PoolBackend):
        self.backend, self.config = backend, backend.config
        self.entries = {pool_key(e.image, e.resources, e.workdir): e for e in self.config.warm_pools}
        self._ready: dict[str, deque[WarmPod]] = {key: deque() for key in self.entries}
        self._starting: dict[str, int] = dict.fromkeys(self.entries, 0)
        self._pool_ids: set[str] = set()  # warm pods this pool started and nobody claimed yet
        self._futures: list[Future] = []  # starts submitted (done ones are dropped at each refill)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self.claimed = self.missed = self.started = self.failed = 0  # counters for tests and the simulation
        self._workers = ThreadPoolExecutor(self.config.warm_pool_refill_concurrency, thread_name_prefix="warm-pool")
        self._thread = threading.Thread(target=self._refill_forever, name="warm-pool-refill", daemon=True)
        self._thread.start()

    # -- claiming ------------------------------------------------------------------------------------
    def claim(self, sandbox_id: str, spec: SandboxCreate, resources: Resources, secret: str) -> AgentEndpoint | None:
        """A ready warm pod handed over to `sandbox_id` with `secret` as its agent's key, or None (no
        pool for this spec, or none ready): the caller then starts a pod the normal way."""
        if spec.from_snapshot or spec.network.mode == "allowlist" or not spec.image:
            return None
        key = pool_key(spec.image, resources, spec.workdir)
        if key not in self.entries:
            return None
        ttl = int(min(spec.ttl_seconds, self.config.max_ttl_seconds))
        try:
            while (warm := self._take(key)) is not None:
                endpoint = self._hand_over(warm, sandbox_id, spec, ttl, secret)
                if endpoint is not None:
                    with self._lock:
                        self.claimed += 1
                    return endpoint
            with self._lock:
                self.missed += 1
            return None
        finally:
            self._wake.set()  # refill what was taken (or found dead)

    def ready(self, key: str | None = None) -> int:
        with self._lock:
            return sum(len(q) for k, q in self._ready.items() if key in (None, k))

    def _take(self, key: str) -> WarmPod | None:
        with self._lock:
            return self._ready[key].popleft() if self._ready[key] else None

    def _hand_over(
        self, warm: WarmPod, sandbox_id: str, spec: SandboxCreate, ttl: int, secret: str
    ) -> AgentEndpoint | None:
        backend = self.backend
        pod = backend.pods.get(warm.pod_name, self.config.read_deadline_seconds)
        if pod is None or pod.metadata.deletion_timestamp is not None or backend._assess(pod).state != "running":
            self._discard(warm, "gone or not running")
            return None
        started = (pod.status.start_time if pod.status else None) or pod.metadata.creation_timestamp
        deadline = math.ceil((backend._clock() - started).total_seconds()) + ttl + 1
        if deadline > (pod.spec.active_deadline_seconds or deadline):
            self._discard(warm, "too old to give the whole TTL")
            return None
        resource_version = pod.metadata.resource_version
        for _ in range(CLAIM_ATTEMPTS):
            if self.relabel(warm, resource_version, sandbox_id, spec, deadline):
                break
            # 409: a status update from the kubelet (the watch lags it), or another writer's claim
            current = self._read(warm.pod_name)
            if current is None or not is_warm_pool_object(current.metadata.labels):
                self._forget(warm)  # gone, or someone else's now: not ours to delete
                return None
            resource_version = current.metadata.resource_version
        else:
            self._discard(warm, f"the claim kept conflicting ({CLAIM_ATTEMPTS} attempts)")
            return None
        try:
            endpoint = self._rekey(warm, sandbox_id, spec, secret)
        except Exception:  # noqa: BLE001 - the create goes on the normal path
            log.exception("re-keying warm pod %s for %s failed; deleting it", warm.pod_name, sandbox_id)
            self._discard(warm, "re-key failed")
            return None
        with backend._lock:  # the sandbox's handle from now on: stop(), snapshots and sweeps find it
            handle = backend._handles.pop(warm.pool_id)
            handle.endpoint, handle.has_policy = endpoint, False
            backend._handles[sandbox_id] = handle
        with self._lock:
            self._pool_ids.discard(warm.pool_id)
        return endpoint

    def _read(self, pod_name: str):
        try:
            return self.backend._call(
                "read pod",
                self.backend.core.read_namespaced_pod,
                pod_name,
                self.config.namespace,
                passthrough=is_not_found,
            )
        except ApiException as err:
            if is_not_found(err):
                return None
            raise

    def relabel(
        self, warm: WarmPod, resource_version: str, sandbox_id: str, spec: SandboxCreate, deadline: int
    ) -> bool:
        """The claim proper: True if this PATCH won the pod (its resourceVersion was still the one seen)."""
        labels: dict[str, str | None] = dict(object_labels(sandbox_id, self.config, spec.labels))
        labels[POOL_LABEL] = None
        # What a restarted service needs to adopt the sandbox, over the pool's own spec: the claim's spec,
        # resources (the pool key's: a claim matches them) and the claim time its TTL counts from.
        annotations = {
            SANDBOX_ID_ANNOTATION: sandbox_id,
            USER_LABELS_ANNOTATION: json.dumps(spec.labels, sort_keys=True),
            **kubernetes_adopt.pod_annotations(
                spec, self.entries[warm.key].resources, claimed_at=self.backend._clock()
            ),
        }
        body = {
            "metadata": {"resourceVersion": resource_version, "labels": labels, "annotations": annotations},
            "spec": {"activeDeadlineSeconds": deadline},
        }
        try:
            self.backend._call(
                "patch pod (claim)",
                self.backend.core.patch_namespaced_pod,
                warm.pod_name,
                self.config.namespace,
                body,
                retry_conflicts=False,
                passthrough=lambda e: e.status in (404, 409),
            )
        except ApiException as err:
            log.info("warm pod %s was not claimed (%s %s)", warm.pod_name, err.status, err.reason)
            return False
        return True

    def _rekey(self, warm: WarmPod, sandbox_id: str, spec: SandboxCreate, secret: str) -> AgentEndpoint:
        async def rekey() -> None:
            agent = self.backend.snapshots.agent_factory(warm.endpoint)
            try:
                await agent.rekey(secret)
            finally:
                await agent.close()

        run_coroutine(rekey)
        labels: dict[str, str | None] = dict(object_labels(sandbox_id, self.config, spec.labels))
        labels[POOL_LABEL] = None
        # The adoption entries too: the CA stays the pod's (its certificate is unchanged), the env is the claim's.
        entries = {**kubernetes_adopt.secret_entries(spec, warm.endpoint.ca_cert_pem or ""), SECRET_KEY_AGENT: secret}
        self.backend._call(
            "patch secret (re-key)",
            self.backend.core.patch_namespaced_secret,
            secret_name_for(warm.pod_name),
            self.config.namespace,
            {
                "metadata": {"labels": labels, "annotations": {SANDBOX_ID_ANNOTATION: sandbox_id}},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in entries.items()},
                "immutable": True,
            },
        )
        return warm.endpoint.model_copy(update={"secret": secret})

    def _discard(self, warm: WarmPod, why: str) -> None:
        log.info("dropping warm pod %s: %s", warm.pod_name, why)
        with self._lock:
            self._pool_ids.discard(warm.pool_id)
        try:
            self.backend.stop(warm.pool_id)
        except Exception:  # noqa: BLE001 - the orphan sweep retries
            log.exception("deleting warm pod %s failed", warm.pod_name)

    def _forget(self, warm: WarmPod) -> None:
        with self.backend._lock:
            self.backend._handles.pop(warm.pool_id, None)
        with self._lock:
            self._pool_ids.discard(warm.pool_id)

    # -- refilling -------------------------------------------------------------------------------------
    def _refill_forever(self) -> None:
        while not self._closed.is_set():
            try:
                self._recycle_old()
                self._refill()
            except Exception:  # noqa: BLE001 - try again at the next wake-up
                log.exception("warm pool refill failed")
            self._wake.wait(min(30.0, self.config.warm_pool_max_age_seconds / 4))
            self._wake.clear()

    def _refill(self) -> None:
        with self._lock:
            deficits = {
                key: entry.size - len(self._ready[key]) - self._starting[key] for key, entry in self.entries.items()
            }
            for key, missing in deficits.items():
                self._starting[key] += max(0, missing)
        futures = [
            self._workers.submit(self._start_one, key) for key, missing in deficits.items() for _ in range(missing)
        ]
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()] + futures

    def _start_one(self, key: str) -> None:
        entry = self.entries[key]
        pool_id = f"warm-{key}-{secrets.token_hex(4)}"
        spec = SandboxCreate(
            image=entry.image,
            resources=entry.resources,
            workdir=entry.workdir,
            labels={POOL_USER_LABEL: key},
            network=NetworkPolicy(),
            ttl_seconds=self.config.max_ttl_seconds,
        )
        warm = None
        try:
            with self._lock:
                if self._closed.is_set():
                    return
                self._pool_ids.add(pool_id)
            endpoint = self.backend._start_pod(pool_id, spec, entry.resources, secrets.token_urlsafe(32), warm=True)
            self._await_agent(endpoint)
            handle = self.backend._handle(pool_id)
            if handle is None:
                raise BackendUnavailableError("the pool closed while the pod started")
            warm = WarmPod(pool_id, handle.pod_name, key, endpoint, time.monotonic())
        except Exception as err:  # noqa: BLE001 - the next refill tries again
            log.warning("starting a warm pod for %s failed: %s", entry.image, err)
            with self._lock:
                self.failed += 1
                self._pool_ids.discard(pool_id)
            if self.backend._handle(pool_id) is not None:
                self.backend.stop(pool_id)
        finally:
            with self._lock:
                self._starting[key] -= 1
                if warm is not None and not self._closed.is_set():
                    self._ready[key].append(warm)
                    self.started += 1
                    warm = None
        if warm is not None:  # closed while it started
            self._discard(warm, "pool closed")

    def _await_agent(self, endpoint: AgentEndpoint) -> None:
        """A warm pod is ready when its agent answers, so a claim hands over a sandbox that is. Gives up
        at agent_ready_timeout_seconds, or at once when the pool closes (shutdown must not wait)."""

        async def ping() -> None:
            agent = self.backend.snapshots.agent_factory(endpoint)
            deadline = time.monotonic() + self.config.agent_ready_timeout_seconds
            try:
                while True:
                    try:
                        await agent.ping(timeout=1.0)
                        return
                    except Exception as err:  # noqa: BLE001 - not answering yet is expected
                        if self._closed.is_set() or time.monotonic() >= deadline:
                            raise BackendUnavailableError(
                                f"warm pod agent at {endpoint.address} did not answer (pool closed or timed out): {err}"
                            ) from err
                        await asyncio.sleep(0.1)
            finally:
                await agent.close()

        run_coroutine(ping)

    def _recycle_old(self) -> None:
        """Unclaimed pods past warm_pool_max_age_seconds are replaced: their deadline keeps running."""
        cutoff = time.monotonic() - self.config.warm_pool_max_age_seconds
        with self._lock:
            old = [w for q in self._ready.values() for w in q if w.ready_at < cutoff]
            for q in self._ready.values():
                for w in old:
                    if w in q:
                        q.remove(w)
        for warm in old:
            self._discard(warm, "past warm_pool_max_age_seconds")

    def close(self) -> None:
        """Stop refilling and delete every warm pod: ready ones at once; then, after starts in flight end
        (bounded: CLOSE_WAIT_SECONDS), whatever still carries the pool label, found by one LIST per pool
        (a start may have created its pod after the first round of deletes)."""
        self._closed.set()
        self._wake.set()
        self._workers.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for q in self._ready.values():
                q.clear()
            pool_ids, self._pool_ids = sorted(self._pool_ids), set()
            running = [f for f in self._futures if not f.done()]
        for pool_id in pool_ids:
            try:
                self.backend.stop(pool_id)
            except Exception:  # noqa: BLE001 - the LIST below and the next start's reap retry
                log.exception("deleting warm pod %s at shutdown failed", pool_id)
        concurrent.futures.wait(running, timeout=CLOSE_WAIT_SECONDS)
        cleanup = self.backend.cleanup
        for key in self.entries:
            selector = f"{instance_selector(self.config)},{POOL_LABEL}={key}"
            try:
                for kind, list_fn in (
                    ("pod", self.backend.core.list_namespaced_pod),
                    ("secret", self.backend.core.list_namespaced_secret),
                ):
                    items = self.backend._call(
                        f"list {kind}s", list_fn, self.config.namespace, label_selector=selector
                    ).items
                    cleanup.delete_named([(kind, obj.metadata.name) for obj in items])
            except Exception:  # noqa: BLE001 - the next start reaps them as orphans
                log.exception("deleting leftover warm pods of pool %s at shutdown failed", key)
