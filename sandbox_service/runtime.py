"""One sandbox's incarnations: bringing it up on the backend, taking it down, and bringing it back.

- `bring_up` starts it on the backend (retries + backoff + jitter on `BackendUnavailableError` and
  unexpected errors) and returns once its agent answers a ping, or records why it failed.
- Escalation: a sandbox OOM-killed in a verification run (the infrastructure's) is recreated with memory x
  factor (up to the cap) under the same id, its files carried over through a snapshot when the backend can,
  and an `EscalationEvent` is recorded. A sandbox its own policy command took down is recreated with the
  same memory (`recover`): the command's failure stays the policy's. One that simply died is freed
  (`mark_crashed`).

Every method that changes an incarnation holds (or says its caller holds) the record's lock. Blocking
backend calls run on a dedicated thread pool (the loop's default pool has only cpu+4 threads, fewer than
the create cap). Agent calls are async and never leave the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

from sandbox_service.agent_link.base import AgentClientBase
from sandbox_service.backends.base import SandboxBackend
from sandbox_service.config import ServiceConfig
from sandbox_service.errors import BackendUnavailableError, SandboxServiceError
from sandbox_service.metrics import ServiceMetrics
from sandbox_service.models import EscalationEvent, InfraErrorKind, SandboxState
from sandbox_service.records import AgentFactory, SandboxRecord
from sandbox_service.records import now as _now

log = logging.getLogger("sandbox_service")


class SandboxRuntime:
    """Starts, stops and recreates sandboxes on one backend (the manager keeps the registry)."""

    def __init__(
        self, config: ServiceConfig, backend: SandboxBackend, metrics: ServiceMetrics, agent_factory: AgentFactory
    ):
        self.config = config
        self.backend = backend
        self.metrics = metrics
        self.agent_factory = agent_factory
        self._executor = ThreadPoolExecutor(config.backend_threads, thread_name_prefix="backend")

    async def in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    def close(self) -> None:
        """Wait for the backend calls in flight, then free the thread pool (after `backend.close`)."""
        self._executor.shutdown(wait=True)

    # -- up and down ----------------------------------------------------------------------------
    async def bring_up(self, rec: SandboxRecord, *, recreate: bool = False, restore_from: str | None = None) -> None:
        """Start on the backend until the agent answers; retries transient failures. Caller holds rec.lock."""
        cfg = self.config
        for attempt in range(1, cfg.create_attempts + 1):
            rec.info.attempts += 1
            if cfg.create_jitter_seconds:
                await asyncio.sleep(random.uniform(0, cfg.create_jitter_seconds))
            try:
                # A recreation restores its own snapshot below, not the one the sandbox was forked from.
                spec = rec.spec.model_copy(update={"from_snapshot": None}) if recreate else rec.spec
                rec.endpoint = await self.in_thread(self.backend.start, rec.id, spec, rec.info.resources, rec.secret)
                if rec.endpoint.boot_secret is not None:
                    await self.take_over(rec)
                if restore_from is not None:
                    await self.in_thread(self.backend.restore, rec.id, restore_from)
                await self.await_agent(rec)
            except Exception as err:  # noqa: BLE001 - every failure is either retried or recorded
                await self.teardown(rec)
                transient = isinstance(err, BackendUnavailableError) or not isinstance(err, SandboxServiceError)
                if rec.deleting:
                    return
                if transient and attempt < cfg.create_attempts:
                    delay = min(cfg.create_backoff_max_seconds, cfg.create_backoff_seconds * 2 ** (attempt - 1))
                    log.info("create %s attempt %d failed (%s); retrying in ~%.2fs", rec.id, attempt, err, delay)
                    await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                    continue
                kind = getattr(err, "infra_error", None) or InfraErrorKind.UNAVAILABLE
                self.fail(rec, f"{type(err).__name__}: {err} (after {attempt} attempt(s))", kind)
                return
            if rec.deleting:
                return  # delete() is waiting for our lock and will stop it
            rec.info.ready_at = _now()
            rec.info.error = None
            rec.info.infra_error = None
            rec.set_state(SandboxState.ready)
            return

    async def take_over(self, rec: SandboxRecord) -> None:
        """Re-key a fresh agent from its boot key (readable inside the sandbox) to the sandbox's own, which
        only the service holds; from then on the boot key is refused."""
        live = rec.endpoint
        assert live is not None  # bring_up takes over the endpoint the backend just started
        rec.endpoint = live.model_copy(update={"secret": live.boot_secret})
        try:
            await self.await_agent(rec)
            fresh = rec.agent
            assert fresh is not None  # await_agent returned: it set one, and the caller holds rec.lock
            await fresh.rekey(live.secret)
        finally:
            if rec.agent is not None:
                agent, rec.agent = rec.agent, None
                await agent.close()
            rec.endpoint = live.model_copy(update={"boot_secret": None})

    async def await_agent(self, rec: SandboxRecord, timeout: float | None = None) -> None:
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
                    raise BackendUnavailableError(
                        f"sandbox died before its agent answered: {status.message}", infra_error=status.infra_error
                    )
            await asyncio.sleep(delay)
            delay = min(0.1, delay * 2)

    async def teardown(self, rec: SandboxRecord) -> None:
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

    def fail(self, rec: SandboxRecord, message: str, kind: InfraErrorKind | None) -> None:
        rec.info.error = message
        rec.info.infra_error = kind
        rec.set_state(SandboxState.failed)
        self.metrics.failures.labels(kind.value if kind else "unknown").inc()
        log.warning("sandbox %s failed: %s", rec.id, message)

    async def mark_crashed(
        self, rec: SandboxRecord, seen: AgentClientBase | None, kind: InfraErrorKind, message: str
    ) -> None:
        """The sandbox died under us (not an OOM we can escalate): free it and say why.

        `seen` is the agent client the failed call used: if the sandbox was restored or recreated since
        (a new agent), the failure belonged to the old incarnation and nothing is done."""
        async with rec.lock:
            if rec.deleting or rec.info.state is not SandboxState.ready or rec.agent is not seen:
                return
            self.fail(rec, message, kind)
            await self.teardown(rec)

    # -- escalation -----------------------------------------------------------------------------
    async def escalate(
        self, rec: SandboxRecord, seen: AgentClientBase | None, reason: InfraErrorKind
    ) -> EscalationEvent | None:
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
        snap_id: str | None = f"esc-{rec.id}-{secrets.token_hex(4)}"
        try:  # carry the files over, so the caller can simply retry its command
            await self.in_thread(self.backend.snapshot, rec.id, snap_id)
        except Exception as err:  # noqa: BLE001 - a sandbox we cannot snapshot is still recreated
            log.warning("recreation of %s: snapshot failed (%s); files will not be kept", rec.id, err)
            snap_id = None
        await self.teardown(rec)
        rec.info.resources = rec.info.resources.model_copy(update={"memory_mb": memory_mb})
        await self.bring_up(rec, recreate=True, restore_from=snap_id)
        if snap_id is not None:
            await self.in_thread(self.backend.delete_snapshot, snap_id)
