"""The lifecycle manager: the registry of sandboxes and what happens to one over its life.

- Create is asynchronous: the record is `pending` at once; a background task starts it on the backend
  (under the create cap; `runtime.SandboxRuntime.bring_up` retries) and marks it `ready` only after its
  agent answers a ping.
- Every call on a sandbox counts as a heartbeat; a reaper deletes sandboxes whose heartbeat TTL or hard
  TTL lapsed (never one with a call in flight, for the heartbeat TTL).
- Escalation and recovery of a sandbox that went down are its runtime's (`sandbox_service/runtime.py`);
  adoption and clean-up of what an earlier run left, at start-up, `sandbox_service/leftovers.py`.
- Delete frees everything, ends the sandbox's jobs and revokes its ports (through `on_delete` hooks).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from sandbox_service.backends.base import SandboxBackend
from sandbox_service.config import ServiceConfig
from sandbox_service.errors import (
    CapacityExceededError,
    SandboxNotFoundError,
    SandboxNotReadyError,
    SnapshotNotFoundError,
    WaitTimeoutError,
    refuse_unpassable,
)
from sandbox_service.leftovers import Leftovers
from sandbox_service.metrics import ServiceMetrics
from sandbox_service.models import (
    InfraErrorKind,
    NetworkPolicy,
    Resources,
    SandboxCreate,
    SandboxInfo,
    SandboxState,
    SnapshotInfo,
)
from sandbox_service.records import AgentFactory, DeleteHook, SandboxRecord, default_agent_factory
from sandbox_service.records import now as _now
from sandbox_service.runtime import SandboxRuntime

log = logging.getLogger("sandbox_service")


class SandboxManager:
    """The registry of sandboxes (and snapshots): admission, lookup, heartbeats, delete and the reaper."""

    def __init__(
        self,
        config: ServiceConfig,
        backend: SandboxBackend,
        metrics: ServiceMetrics,
        agent_factory: AgentFactory = default_agent_factory,
    ):
        self.config = config
        self.backend = backend
        self.metrics = metrics
        self.agent_factory = agent_factory
        self.runtime = SandboxRuntime(config, backend, metrics, agent_factory)
        self.sandboxes: dict[str, SandboxRecord] = {}
        self.snapshots: dict[str, SnapshotInfo] = {}
        self.leftovers = Leftovers(self)
        # What start-up found left by an earlier run and removed (served on /healthz).
        self.startup_report = self.leftovers.report
        self._by_request: dict[str, str] = {}
        self._create_sem = asyncio.Semaphore(config.max_concurrent_creates)
        self._queued_creates = 0
        self._reaper: asyncio.Task | None = None
        self._orphan_reaper: asyncio.Task | None = None
        self.on_delete: list[DeleteHook] = []
        metrics.on_collect(self._refresh_gauges)

    # -- plumbing -------------------------------------------------------------------------------
    def _refresh_gauges(self) -> None:
        counts = {s.value: 0 for s in SandboxState}
        for rec in self.sandboxes.values():
            counts[rec.info.state.value] += 1
        for state, n in counts.items():
            self.metrics.sandboxes.labels(state).set(n)

    async def start(self) -> None:
        if self.agent_factory is default_agent_factory:
            import sandbox_service.agent_link.client  # noqa: F401 - import now, not inside the first create
        # Before listening: the sandboxes an earlier run left that can be kept, so their ids never answer
        # 404 after a restart; the rest of the clean-up runs in the background (`/healthz` reports progress).
        adopted = await self.leftovers.adopt_before_listening()
        self._orphan_reaper = asyncio.create_task(self.leftovers.clean(adopted), name="orphan-reaper")
        self._reaper = asyncio.create_task(self._reap_forever(), name="reaper")

    def register(self, rec: SandboxRecord) -> None:
        """A new (or adopted) sandbox in the registry, findable by its id and its create request's id."""
        self.sandboxes[rec.id] = rec
        if rec.spec.request_id:
            self._by_request[rec.spec.request_id] = rec.id

    async def shutdown(self) -> None:
        for task in (self._reaper, self._orphan_reaper):
            if task:
                task.cancel()
        # Where the next start adopts them (Kubernetes), ready sandboxes outlive a restart or rollout, and
        # so do adopted ones still being verified (pending without a create task of their own).
        keep = self.backend.keeps_sandboxes_on_shutdown

        def kept(rec: SandboxRecord) -> bool:
            return keep and (
                rec.info.state is SandboxState.ready or (rec.info.state is SandboxState.pending and rec.task is None)
            )

        live = [r.id for r in self.sandboxes.values() if not r.deleting and not kept(r)]
        await asyncio.gather(*(self.delete(i, reason="service shutting down") for i in live), return_exceptions=True)
        for rec in self.sandboxes.values():
            if rec.agent is not None and not rec.deleting:  # kept: only our connections to it close
                agent, rec.agent = rec.agent, None
                await agent.close()
        for snap_id in list(self.snapshots):
            await self.delete_snapshot(snap_id)
        await self.runtime.in_thread(self.backend.close)
        self.runtime.close()

    # -- lookup ---------------------------------------------------------------------------------
    def record(self, sandbox_id: str, *, touch: bool = True) -> SandboxRecord:
        rec = self.sandboxes.get(sandbox_id)
        if rec is None:
            raise SandboxNotFoundError(f"no sandbox with id {sandbox_id!r}; list them with GET /v1/sandboxes")
        if touch:
            rec.last_activity = time.monotonic()
            rec.info.last_heartbeat_at = _now()
        return rec

    def ready(self, sandbox_id: str) -> SandboxRecord:
        """The record, if it can take calls now; 409 otherwise."""
        rec = self.record(sandbox_id)
        if rec.info.state is not SandboxState.ready or rec.agent is None:
            detail = f": {rec.info.error}" if rec.info.error else ""
            raise SandboxNotReadyError(
                f"sandbox {sandbox_id} is {rec.info.state.value}{detail}; "
                "wait for it with GET /v1/sandboxes/{id}/wait (or create a new one if it failed/was deleted)"
            )
        return rec

    def list(self, labels: dict[str, str], state: SandboxState | None = None) -> list[SandboxInfo]:
        out = []
        for rec in self.sandboxes.values():
            if state is None and rec.info.state is SandboxState.deleted:
                continue
            if state is not None and rec.info.state is not state:
                continue
            if all(rec.info.labels.get(k) == v for k, v in labels.items()):
                out.append(rec.info)
        return out

    async def wait(self, sandbox_id: str, timeout: float) -> SandboxInfo:
        rec = self.record(sandbox_id)
        try:
            await asyncio.wait_for(rec.settled.wait(), timeout)
        except asyncio.TimeoutError:
            raise WaitTimeoutError(
                f"sandbox {sandbox_id} still {rec.info.state.value} after {timeout:g} s; wait again or delete it"
            ) from None
        return rec.info

    # -- create ---------------------------------------------------------------------------------
    def _live(self) -> int:
        return sum(1 for r in self.sandboxes.values() if r.info.state in (SandboxState.pending, SandboxState.ready))

    async def create(self, spec: SandboxCreate) -> SandboxInfo:
        if spec.request_id and spec.request_id in self._by_request:
            return self.record(self._by_request[spec.request_id]).info
        # Counting live records is O(N) per create; none can be over the cap while all records are under it.
        if len(self.sandboxes) >= self.config.max_sandboxes and (live := self._live()) >= self.config.max_sandboxes:
            self.metrics.rejections.labels("sandboxes").inc()
            raise CapacityExceededError(
                f"{live} live sandboxes (cap {self.config.max_sandboxes}); delete some or retry later",
                retry_after=self.config.retry_after_seconds,
            )
        if self._queued_creates >= self.config.max_pending_creates:
            self.metrics.rejections.labels("creates").inc()
            raise CapacityExceededError(
                f"{self._queued_creates} creates queued (cap {self.config.max_pending_creates}); retry later",
                retry_after=self.config.retry_after_seconds,
            )
        refuse_unpassable(spec.env, spec.workdir)  # else every start attempt fails and is retried
        if spec.image is not None:
            self.backend.check_image(spec.image)  # a host path is a 400 now, not a failed sandbox later
        if spec.from_snapshot is not None and spec.from_snapshot not in self.snapshots:
            raise SnapshotNotFoundError(
                f"no snapshot {spec.from_snapshot!r}; take one with POST /v1/sandboxes/{{id}}/snapshots"
            )
        sandbox_id = "sb-" + secrets.token_hex(8)
        info = SandboxInfo(
            id=sandbox_id,
            state=SandboxState.pending,
            image=spec.image,
            backend=self.backend.name,
            labels=dict(spec.labels),
            resources=spec.resources,
            network=spec.network,
            created_at=_now(),
            last_heartbeat_at=_now(),
            attempts=0,
        )
        rec = SandboxRecord(
            info=info,
            spec=spec,
            secret=secrets.token_urlsafe(32),
            heartbeat_ttl=min(spec.heartbeat_ttl_seconds, self.config.heartbeat_ttl_seconds),
            hard_ttl=min(spec.ttl_seconds, self.config.max_ttl_seconds),
        )
        self.register(rec)
        rec.task = asyncio.create_task(self._provision(rec), name=f"create-{sandbox_id}")
        return info

    async def _provision(self, rec: SandboxRecord) -> None:
        started = time.perf_counter()
        self._queued_creates += 1
        try:
            await self._create_sem.acquire()
        finally:
            self._queued_creates -= 1
        try:
            async with rec.lock:
                rec.queued = False
                if rec.deleting:
                    return
                await self.runtime.bring_up(rec)  # a fork: the backend starts it from spec.from_snapshot
        finally:
            self._create_sem.release()
        if rec.info.state is SandboxState.ready:
            self.metrics.creates.labels("ready").inc()
            self.metrics.create_seconds.observe(time.perf_counter() - started)
        elif rec.info.state is SandboxState.failed:
            self.metrics.creates.labels("failed").inc()

    # -- delete and reap ------------------------------------------------------------------------
    async def delete(self, sandbox_id: str, *, reason: str = "deleted by request") -> SandboxInfo:
        rec = self.record(sandbox_id, touch=False)
        if rec.deleting:
            await rec.deleted.wait()
            return rec.info
        rec.deleting = True
        if rec.task is not None and rec.queued:
            rec.task.cancel()  # still waiting for a create slot: holds nothing
        for hook in self.on_delete:
            try:
                await hook(sandbox_id, reason)
            except Exception:  # noqa: BLE001 - a failing hook must not keep resources alive
                log.exception("on_delete hook failed for %s", sandbox_id)
        async with rec.lock:
            await self.runtime.teardown(rec)
            if rec.info.state is not SandboxState.failed:
                rec.info.error = reason if reason != "deleted by request" else None
            rec.set_state(SandboxState.deleted)
            rec.deleted_mono = time.monotonic()
        rec.deleted.set()
        return rec.info

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.reaper_interval_seconds)
            try:
                await self.reap_once()
            except Exception:  # noqa: BLE001 - the reaper must outlive any one bad sandbox
                log.exception("reaper pass failed")

    async def reap_once(self) -> None:
        now = time.monotonic()
        doomed: list[tuple[str, str]] = []
        for rec in list(self.sandboxes.values()):
            if rec.deleting:
                if rec.deleted_mono is not None and now - rec.deleted_mono > self.config.tombstone_seconds:
                    del self.sandboxes[rec.id]
                    if rec.spec.request_id:
                        self._by_request.pop(rec.spec.request_id, None)
                continue
            if now - rec.created_mono > rec.hard_ttl:
                doomed.append((rec.id, f"hard TTL of {rec.hard_ttl:g} s lapsed"))
            elif rec.active_calls == 0 and now - rec.last_activity > rec.heartbeat_ttl:
                doomed.append((rec.id, f"no heartbeat for {rec.heartbeat_ttl:g} s (reaped)"))
        for sandbox_id, reason in doomed:
            log.info("reaping %s: %s", sandbox_id, reason)
        await asyncio.gather(*(self.delete(i, reason=r) for i, r in doomed), return_exceptions=True)

    # -- filesystem state -----------------------------------------------------------------------
    async def snapshot(self, sandbox_id: str) -> SnapshotInfo:
        rec = self.ready(sandbox_id)
        snap_id = "snap-" + secrets.token_hex(8)
        async with rec.lock:
            size = await self.runtime.in_thread(self.backend.snapshot, rec.id, snap_id)
        info = SnapshotInfo(id=snap_id, sandbox_id=rec.id, created_at=_now(), size_bytes=int(size))
        self.snapshots[snap_id] = info
        return info

    def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        if snapshot_id not in self.snapshots:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id!r}; list them with GET /v1/snapshots")
        return self.snapshots[snapshot_id]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.get_snapshot(snapshot_id)
        await self.runtime.in_thread(self.backend.delete_snapshot, snapshot_id)
        self.snapshots.pop(snapshot_id, None)

    async def restore(self, sandbox_id: str, snapshot_id: str) -> SandboxInfo:
        rec = self.ready(sandbox_id)
        self.get_snapshot(snapshot_id)
        async with rec.lock:
            rec.set_state(SandboxState.pending)
            try:
                await self.runtime.in_thread(self.backend.restore, rec.id, snapshot_id)
                if rec.agent is not None:  # the backend may have restarted the agent: reconnect
                    await rec.agent.close()
                await self.runtime.await_agent(rec)
            except Exception as err:
                self.runtime.fail(rec, f"restore from {snapshot_id} failed: {err}", InfraErrorKind.SANDBOX_CRASHED)
                await self.runtime.teardown(rec)
                raise
            rec.set_state(SandboxState.ready)
        return rec.info

    async def set_network_policy(self, sandbox_id: str, policy: NetworkPolicy) -> SandboxInfo:
        rec = self.ready(sandbox_id)
        async with rec.lock:
            await self.runtime.in_thread(self.backend.apply_network_policy, rec.id, policy)
            rec.info.network = policy
            rec.spec = rec.spec.model_copy(update={"network": policy})  # a recreation keeps the policy
        return rec.info

    def resources_of(self, sandbox_id: str) -> Resources:
        return self.record(sandbox_id, touch=False).info.resources
