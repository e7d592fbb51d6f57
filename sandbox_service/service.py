"""The lifecycle manager: a registry of sandboxes and everything that happens to one over its life.

- Create is asynchronous: the record is `pending` at once; a background task starts it on the backend
  (under the create cap, with retries + backoff + jitter on `BackendUnavailableError`) and marks it
  `ready` only after its agent answers a ping.
- Every call on a sandbox counts as a heartbeat; a reaper deletes sandboxes whose heartbeat TTL or hard
  TTL lapsed (never one with a call in flight, for the heartbeat TTL).
- Escalation: a sandbox OOM-killed in a verification run (the infrastructure's) is recreated with memory x
  factor (up to the cap) under the same id, its files carried over through a snapshot when the backend can,
  and an `EscalationEvent` is recorded. A sandbox its own policy command took down is recreated with the
  same memory (`recover`): the command's failure stays the policy's.
- Delete frees everything, ends the sandbox's jobs and revokes its ports (through `on_delete` hooks).

Blocking backend calls run on a dedicated thread pool (the loop's default pool has only cpu+4 threads,
fewer than the create cap). Agent calls are async and never leave the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandbox_service.agent_client_base import AgentClientBase
from sandbox_service.backends.base import AdoptedSandbox, SandboxBackend
from sandbox_service.config import ServiceConfig
from sandbox_service.errors import (
    BackendUnavailableError,
    CapacityExceededError,
    SandboxNotFoundError,
    SandboxNotReadyError,
    SandboxServiceError,
    SnapshotNotFoundError,
    WaitTimeoutError,
)
from sandbox_service.metrics import ServiceMetrics
from sandbox_service.models import (
    EscalationEvent,
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

log = logging.getLogger("sandbox_service")

class SandboxManager:
    def __init__(self, config: ServiceConfig, backend: SandboxBackend, metrics: ServiceMetrics,
                 agent_factory: AgentFactory = default_agent_factory):
        self.config = config
        self.backend = backend
        self.metrics = metrics
        self.agent_factory = agent_factory
        self.sandboxes: dict[str, SandboxRecord] = {}
        self.snapshots: dict[str, SnapshotInfo] = {}
        # What start-up found left by an earlier run and removed (served on /healthz).
        self.startup_report: dict[str, Any] = {"sandboxes_adopted": [], "sandboxes_removed": [],
                                               "snapshots_removed": [], "errors": [], "finished": False}
        self._by_request: dict[str, str] = {}
        self._create_sem = asyncio.Semaphore(config.max_concurrent_creates)
        self._queued_creates = 0
        self._executor = ThreadPoolExecutor(config.backend_threads, thread_name_prefix="backend")
        self._reaper: asyncio.Task | None = None
        self._orphan_reaper: asyncio.Task | None = None
        self.on_delete: list[DeleteHook] = []
        metrics.on_collect(self._refresh_gauges)

    # -- plumbing -------------------------------------------------------------------------------
    async def in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    def _refresh_gauges(self) -> None:
        counts = {s.value: 0 for s in SandboxState}
        for rec in self.sandboxes.values():
            counts[rec.info.state.value] += 1
        for state, n in counts.items():
            self.metrics.sandboxes.labels(state).set(n)

    async def start(self) -> None:
        if self.agent_factory is default_agent_factory:
            import sandbox_service.agent_client  # noqa: F401 - import now, not inside the first create
        # Before listening: the sandboxes an earlier run left that can be kept (one LIST per kind on a
        # cluster), so their ids never answer 404 after a restart; they are pending until their agents answer.
        try:
            adopted = await self._adopt()
        except Exception as err:  # noqa: BLE001 - the background task tries again before reaping anything
            log.exception("adopting the sandboxes of an earlier run failed")
            self.startup_report["errors"].append(f"adopting sandboxes: {err!r}")
            adopted = None
        # In the background: with a thousand orphans on a cluster, reaping before listening outlasts the
        # liveness probe, and the service would be restarted again and again. `/healthz` reports progress.
        self._orphan_reaper = asyncio.create_task(self._clean_leftovers(adopted), name="orphan-reaper")
        self._reaper = asyncio.create_task(self._reap_forever(), name="reaper")

    async def _adopt(self) -> list[SandboxRecord]:
        """Register what the backend adopts as pending records (ready once their agents answer)."""
        found: list[AdoptedSandbox] = await self.in_thread(self.backend.adopt)
        wall, mono = _now(), time.monotonic()
        records = []
        for adopted in found:
            if adopted.sandbox_id in self.sandboxes:
                continue
            spec = adopted.spec
            info = SandboxInfo(id=adopted.sandbox_id, state=SandboxState.pending, image=spec.image,
                               backend=self.backend.name, labels=dict(spec.labels), resources=adopted.resources,
                               network=spec.network, created_at=adopted.created_at, last_heartbeat_at=wall,
                               attempts=1)
            age = max(0.0, (wall - adopted.created_at).total_seconds())
            rec = SandboxRecord(info=info, spec=spec, secret=adopted.secret,
                                heartbeat_ttl=min(spec.heartbeat_ttl_seconds, self.config.heartbeat_ttl_seconds),
                                hard_ttl=min(spec.ttl_seconds, self.config.max_ttl_seconds),
                                created_mono=mono - age, endpoint=adopted.endpoint, queued=False)
            self.sandboxes[rec.id] = rec
            if spec.request_id:
                self._by_request[spec.request_id] = rec.id
            records.append(rec)
        if records:
            log.warning("adopting %d sandbox(es) left running by an earlier run", len(records))
        return records

    async def _verify_adopted(self, rec: SandboxRecord) -> None:
        """An adopted sandbox is ready once its agent answers; otherwise it is freed (reaped)."""
        failed = None
        async with rec.lock:
            if rec.deleting:
                return
            try:
                await self._await_agent(rec, timeout=self.config.adopt_timeout_seconds)
            except Exception as err:  # noqa: BLE001 - whatever the cause, the sandbox cannot be served
                failed = f"could not be adopted after a service restart: {err}"
                self._fail(rec, failed, getattr(err, "infra_error", None) or InfraErrorKind.AGENT_LOST)
            else:
                rec.info.ready_at = _now()
                rec.set_state(SandboxState.ready)
                self.startup_report["sandboxes_adopted"].append(rec.id)
        if failed is not None:
            await self.delete(rec.id, reason=failed)
            self.startup_report["sandboxes_removed"].append(rec.id)

    async def _clean_leftovers(self, adopted: list[SandboxRecord] | None) -> None:
        """What an earlier run left: sandboxes to adopt (verified here), orphaned sandboxes and snapshots.
        Never fails the service: whatever cannot be removed is quarantined by the backend or reported
        (`/healthz`). Nothing is reaped before adoption has run: an adoptable sandbox is no orphan."""
        report = self.startup_report
        delay = 1.0
        while adopted is None:  # adoption failed before listening (API server down): keep trying
            await asyncio.sleep(delay)
            delay = min(60.0, delay * 2)
            try:
                adopted = await self._adopt()
            except Exception as err:  # noqa: BLE001
                log.warning("adopting the sandboxes of an earlier run failed again: %r", err)
        verifying = [asyncio.create_task(self._verify_adopted(rec)) for rec in adopted]
        try:
            report["snapshots_removed"] = await self.in_thread(self.backend.clear_stale_snapshots)
        except Exception as err:  # noqa: BLE001 - a leftover must never stop the service
            log.exception("could not clear stale snapshots")
            report["errors"].append(f"stale snapshots: {err!r}")
        try:
            orphans = await self.in_thread(self.backend.list_orphans)
        except Exception as err:  # noqa: BLE001 - the periodic reaper must still run; the next restart retries
            log.exception("listing orphaned sandboxes failed")
            report["errors"].append(f"listing orphans: {err!r}")
            orphans = []
        if orphans:
            log.warning("removing %d orphaned sandbox(es) left by an earlier run", len(orphans))
        slots = asyncio.Semaphore(max(1, self.config.backend_threads // 4))  # leave threads for creates

        async def reap(orphan: str) -> None:
            async with slots:
                try:
                    await self.in_thread(self.backend.stop, orphan)
                    report["sandboxes_removed"].append(orphan)
                except Exception as err:  # noqa: BLE001 - one stuck orphan must not keep the others
                    log.exception("could not remove orphaned sandbox %s", orphan)
                    report["errors"].append(f"sandbox {orphan}: {err!r}")

        await asyncio.gather(*(reap(o) for o in orphans), *verifying)
        report["sandboxes_adopted"].sort()
        report["sandboxes_removed"].sort()
        report["finished"] = True
        if report["sandboxes_removed"] or report["snapshots_removed"] or report["errors"]:
            log.warning("start-up clean-up of leftovers: %s", report)

    async def shutdown(self) -> None:
        for task in (self._reaper, self._orphan_reaper):
            if task:
                task.cancel()
        # Where the next start adopts them (Kubernetes), ready sandboxes outlive a restart or rollout, and
        # so do adopted ones still being verified (pending without a create task of their own).
        keep = self.backend.keeps_sandboxes_on_shutdown

        def kept(rec: SandboxRecord) -> bool:
            return keep and (rec.info.state is SandboxState.ready
                             or (rec.info.state is SandboxState.pending and rec.task is None))

        live = [r.id for r in self.sandboxes.values() if not r.deleting and not kept(r)]
        await asyncio.gather(*(self.delete(i, reason="service shutting down") for i in live),
                             return_exceptions=True)
        for rec in self.sandboxes.values():
            if rec.agent is not None and not rec.deleting:  # kept: only our connections to it close
                agent, rec.agent = rec.agent, None
                await agent.close()
        for snap_id in list(self.snapshots):
            await self.delete_snapshot(snap_id)
        await self.in_thread(self.backend.close)
        self._executor.shutdown(wait=True)

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
            raise WaitTimeoutError(f"sandbox {sandbox_id} still {rec.info.state.value} after {timeout:g} s; "
                                   "wait again or delete it") from None
        return rec.info

    # -- create ---------------------------------------------------------------------------------
    async def create(self, spec: SandboxCreate) -> SandboxInfo:
        if spec.request_id and spec.request_id in self._by_request:
            return self.record(self._by_request[spec.request_id]).info
        live = sum(1 for r in self.sandboxes.values() if r.info.state in (SandboxState.pending, SandboxState.ready))
        if live >= self.config.max_sandboxes:
            self.metrics.rejections.labels("sandboxes").inc()
            raise CapacityExceededError(f"{live} live sandboxes (cap {self.config.max_sandboxes}); "
                                        "delete some or retry later", retry_after=self.config.retry_after_seconds)
        if self._queued_creates >= self.config.max_pending_creates:
            self.metrics.rejections.labels("creates").inc()
            raise CapacityExceededError(f"{self._queued_creates} creates queued (cap {self.config.max_pending_creates})"
                                        "; retry later", retry_after=self.config.retry_after_seconds)
        if spec.from_snapshot is not None and spec.from_snapshot not in self.snapshots:
            raise SnapshotNotFoundError(f"no snapshot {spec.from_snapshot!r}; take one with POST "
                                        "/v1/sandboxes/{id}/snapshots")
        sandbox_id = "sb-" + secrets.token_hex(8)
        info = SandboxInfo(id=sandbox_id, state=SandboxState.pending, image=spec.image, backend=self.backend.name,
                           labels=dict(spec.labels), resources=spec.resources, network=spec.network,
                           created_at=_now(), last_heartbeat_at=_now(), attempts=0)
        rec = SandboxRecord(info=info, spec=spec, secret=secrets.token_urlsafe(32),
                            heartbeat_ttl=min(spec.heartbeat_ttl_seconds, self.config.heartbeat_ttl_seconds),
                            hard_ttl=min(spec.ttl_seconds, self.config.max_ttl_seconds))
        self.sandboxes[sandbox_id] = rec
        if spec.request_id:
            self._by_request[spec.request_id] = sandbox_id
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
                await self._bring_up(rec)  # a fork: the backend starts it from spec.from_snapshot
        finally:
            self._create_sem.release()
        if rec.info.state is SandboxState.ready:
            self.metrics.creates.labels("ready").inc()
            self.metrics.create_seconds.observe(time.perf_counter() - started)
        elif rec.info.state is SandboxState.failed:
            self.metrics.creates.labels("failed").inc()

    async def _bring_up(self, rec: SandboxRecord, *, recreate: bool = False, restore_from: str | None = None) -> None:
        """Start on the backend until the agent answers; retries transient failures. Caller holds rec.lock."""
        cfg = self.config
        for attempt in range(1, cfg.create_attempts + 1):
            rec.info.attempts += 1
            if cfg.create_jitter_seconds:
                await asyncio.sleep(random.uniform(0, cfg.create_jitter_seconds))
            try:
                # A recreation restores its own snapshot below, not the one the sandbox was forked from.
                spec = rec.spec.model_copy(update={"from_snapshot": None}) if recreate else rec.spec
                rec.endpoint = await self.in_thread(self.backend.start, rec.id, spec, rec.info.resources,
                                                    rec.secret)
                if restore_from is not None:
                    await self.in_thread(self.backend.restore, rec.id, restore_from)
                await self._await_agent(rec)
            except Exception as err:  # noqa: BLE001 - every failure is either retried or recorded
                await self._teardown(rec)
                transient = isinstance(err, BackendUnavailableError) or not isinstance(err, SandboxServiceError)
                if rec.deleting:
                    return
                if transient and attempt < cfg.create_attempts:
                    delay = min(cfg.create_backoff_max_seconds, cfg.create_backoff_seconds * 2 ** (attempt - 1))
                    log.info("create %s attempt %d failed (%s); retrying in ~%.2fs", rec.id, attempt, err, delay)
                    await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                    continue
                kind = getattr(err, "infra_error", None) or InfraErrorKind.UNAVAILABLE
                self._fail(rec, f"{type(err).__name__}: {err} (after {attempt} attempt(s))", kind)
                return
            if rec.deleting:
                return  # delete() is waiting for our lock and will stop it
            rec.info.ready_at = _now()
            rec.info.error = None
            rec.info.infra_error = None
            rec.set_state(SandboxState.ready)
            return

    async def _await_agent(self, rec: SandboxRecord, timeout: float | None = None) -> None:
        """Ping until the agent answers; give up early if the backend says the sandbox died."""
        assert rec.endpoint is not None
        rec.agent = self.agent_factory(rec.endpoint)
        timeout = self.config.ready_timeout_seconds if timeout is None else timeout
        deadline = time.monotonic() + timeout
        delay, next_status = 0.005, time.monotonic() + 1.0
        while True:
            try:
                await rec.agent.ping(timeout=1.0)
                return
            except Exception as err:  # noqa: BLE001 - not answering yet is the expected case
                last = err
            now = time.monotonic()
            if now >= deadline:
                raise BackendUnavailableError(f"agent did not answer within {timeout:g} s: {last}")
            if now >= next_status:
                next_status = now + 1.0
                status = await self.in_thread(self.backend.status, rec.id)
                if not status.alive:
                    raise BackendUnavailableError(f"sandbox died before its agent answered: {status.message}",
                                                  infra_error=status.infra_error)
            await asyncio.sleep(delay)
            delay = min(0.1, delay * 2)

    async def _teardown(self, rec: SandboxRecord) -> None:
        if rec.agent is not None:
            agent, rec.agent = rec.agent, None
            try:
                await agent.close()
            except Exception:  # noqa: BLE001 - closing a dead connection may fail; stop() below frees it
                pass
        try:
            await self.in_thread(self.backend.stop, rec.id)
        except Exception:  # noqa: BLE001
            log.exception("backend.stop(%s) failed; retrying once", rec.id)
            await self.in_thread(self.backend.stop, rec.id)

    def _fail(self, rec: SandboxRecord, message: str, kind: InfraErrorKind | None) -> None:
        rec.info.error = message
        rec.info.infra_error = kind
        rec.set_state(SandboxState.failed)
        self.metrics.failures.labels(kind.value if kind else "unknown").inc()
        log.warning("sandbox %s failed: %s", rec.id, message)

    async def mark_crashed(self, rec: SandboxRecord, seen: AgentClientBase | None, kind: InfraErrorKind,
                           message: str) -> None:
        """The sandbox died under us (not an OOM we can escalate): free it and say why.

        `seen` is the agent client the failed call used: if the sandbox was restored or recreated since
        (a new agent), the failure belonged to the old incarnation and nothing is done."""
        async with rec.lock:
            if rec.deleting or rec.info.state is not SandboxState.ready or rec.agent is not seen:
                return
            self._fail(rec, message, kind)
            await self._teardown(rec)

    # -- escalation -----------------------------------------------------------------------------
    async def escalate(self, rec: SandboxRecord, seen: AgentClientBase | None,
                       reason: InfraErrorKind) -> EscalationEvent | None:
        """Recreate the sandbox with more memory under the same id; None if capped/disabled/deleted.

        Only for the infrastructure's OOMs (a verification run the harness started): a policy command's
        own OOM is its outcome and never buys the sandbox more memory.
        Several execs may hit one OOM at once: only the first escalates (the others see a new agent
        and get the event already recorded)."""
        policy = rec.spec.escalation
        if not (self.config.escalation_enabled and policy.enabled):
            return None
        cap = min(policy.max_memory_mb, self.config.escalation_max_memory_mb)
        async with rec.lock:
            if rec.agent is not seen:
                return rec.info.escalations[-1] if rec.info.escalations else None
            current = rec.info.resources.memory_mb
            target = min(cap, int(current * policy.factor))
            if rec.deleting or target <= current:
                return None
            event = EscalationEvent(at=_now(), reason=reason, from_memory_mb=current, to_memory_mb=target)
            rec.info.escalations.append(event)
            self.metrics.escalations.inc()
            await self._recreate(rec, target)
            return event

    async def recover(self, rec: SandboxRecord, seen: AgentClientBase | None) -> bool:
        """Recreate a sandbox its own processes took down (e.g. a pod OOM-killed by a command) with the
        *same* resources and its files, so the policy's episode goes on and its next calls are not
        infrastructure errors. False if it was deleted or already recreated."""
        async with rec.lock:
            if rec.deleting or rec.agent is not seen:
                return False
            await self._recreate(rec, rec.info.resources.memory_mb)
            return True

    async def _recreate(self, rec: SandboxRecord, memory_mb: int) -> None:
        """Under rec.lock: tear down and bring up again with `memory_mb`, carrying the files over."""
        rec.set_state(SandboxState.pending)
        snap_id = f"esc-{rec.id}-{secrets.token_hex(4)}"
        try:  # carry the files over, so the caller can simply retry its command
            await self.in_thread(self.backend.snapshot, rec.id, snap_id)
        except Exception as err:  # noqa: BLE001 - a sandbox we cannot snapshot is still recreated
            log.warning("recreation of %s: snapshot failed (%s); files will not be kept", rec.id, err)
            snap_id = None
        await self._teardown(rec)
        rec.info.resources = rec.info.resources.model_copy(update={"memory_mb": memory_mb})
        await self._bring_up(rec, recreate=True, restore_from=snap_id)
        if snap_id is not None:
            await self.in_thread(self.backend.delete_snapshot, snap_id)

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
            await self._teardown(rec)
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
            size = await self.in_thread(self.backend.snapshot, rec.id, snap_id)
        info = SnapshotInfo(id=snap_id, sandbox_id=rec.id, created_at=_now(), size_bytes=int(size))
        self.snapshots[snap_id] = info
        return info

    def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        if snapshot_id not in self.snapshots:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id!r}; list them with GET /v1/snapshots")
        return self.snapshots[snapshot_id]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.get_snapshot(snapshot_id)
        await self.in_thread(self.backend.delete_snapshot, snapshot_id)
        self.snapshots.pop(snapshot_id, None)

    async def restore(self, sandbox_id: str, snapshot_id: str) -> SandboxInfo:
        rec = self.ready(sandbox_id)
        self.get_snapshot(snapshot_id)
        async with rec.lock:
            rec.set_state(SandboxState.pending)
            try:
                await self.in_thread(self.backend.restore, rec.id, snapshot_id)
                if rec.agent is not None:  # the backend may have restarted the agent: reconnect
                    await rec.agent.close()
                await self._await_agent(rec)
            except Exception as err:
                self._fail(rec, f"restore from {snapshot_id} failed: {err}", InfraErrorKind.SANDBOX_CRASHED)
                await self._teardown(rec)
                raise
            rec.set_state(SandboxState.ready)
        return rec.info

    async def set_network_policy(self, sandbox_id: str, policy: NetworkPolicy) -> SandboxInfo:
        rec = self.ready(sandbox_id)
        async with rec.lock:
            await self.in_thread(self.backend.apply_network_policy, rec.id, policy)
            rec.info.network = policy
            rec.spec = rec.spec.model_copy(update={"network": policy})  # a recreation keeps the policy
        return rec.info

    def resources_of(self, sandbox_id: str) -> Resources:
        return self.record(sandbox_id, touch=False).info.resources
