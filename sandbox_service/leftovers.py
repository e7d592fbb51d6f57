"""At start-up: what an earlier run of the service left, adopted or removed, and the report of it.

- Before listening, the sandboxes the backend can keep (one LIST per kind on a cluster) are registered
  as pending, so their ids never answer 404 after a restart; each is ready once its agent answers, and
  freed otherwise.
- In the background, orphaned sandboxes and stale snapshots are removed: with a thousand orphans on a
  cluster, reaping before listening outlasts the liveness probe. Nothing is reaped before adoption has
  run (an adoptable sandbox is no orphan), and nothing here ever fails the service: whatever cannot be
  removed is quarantined by the backend or reported (`report`, served on `/healthz`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from sandbox_service.backends.base import AdoptedSandbox
from sandbox_service.models import InfraErrorKind, SandboxInfo, SandboxState
from sandbox_service.records import SandboxRecord
from sandbox_service.records import now as _now

if TYPE_CHECKING:
    from sandbox_service.config import ServiceConfig
    from sandbox_service.runtime import SandboxRuntime

log = logging.getLogger("sandbox_service")


class LeftoversOwner(Protocol):
    """What `Leftovers` uses of its owner (`service.SandboxManager`, which imports this module)."""

    config: ServiceConfig
    runtime: SandboxRuntime
    sandboxes: dict[str, SandboxRecord]

    def register(self, rec: SandboxRecord) -> None: ...

    async def delete(self, sandbox_id: str, *, reason: str = ...) -> SandboxInfo: ...


class Leftovers:
    """One service start's adoption and clean-up of what an earlier run left."""

    def __init__(self, manager: LeftoversOwner):
        self.manager = manager
        self.runtime = manager.runtime
        self.report: dict[str, Any] = {
            "sandboxes_adopted": [],
            "sandboxes_removed": [],
            "snapshots_removed": [],
            "errors": [],
            "finished": False,
        }

    async def adopt_before_listening(self) -> list[SandboxRecord] | None:
        """`adopt`, or None (reported) when it failed: `clean` then keeps trying before reaping anything."""
        try:
            return await self.adopt()
        except Exception as err:  # noqa: BLE001 - the background clean-up tries again before reaping anything
            log.exception("adopting the sandboxes of an earlier run failed")
            self.report["errors"].append(f"adopting sandboxes: {err!r}")
            return None

    async def adopt(self) -> list[SandboxRecord]:
        """Register what the backend adopts as pending records (ready once their agents answer)."""
        manager, config, backend = self.manager, self.manager.config, self.runtime.backend
        found: list[AdoptedSandbox] = await self.runtime.in_thread(backend.adopt)
        wall, mono = _now(), time.monotonic()
        records = []
        for adopted in found:
            if adopted.sandbox_id in manager.sandboxes:
                continue
            spec = adopted.spec
            info = SandboxInfo(
                id=adopted.sandbox_id,
                state=SandboxState.pending,
                image=spec.image,
                backend=backend.name,
                labels=dict(spec.labels),
                resources=adopted.resources,
                network=spec.network,
                created_at=adopted.created_at,
                last_heartbeat_at=wall,
                attempts=1,
            )
            age = max(0.0, (wall - adopted.created_at).total_seconds())
            rec = SandboxRecord(
                info=info,
                spec=spec,
                secret=adopted.secret,
                heartbeat_ttl=min(spec.heartbeat_ttl_seconds, config.heartbeat_ttl_seconds),
                hard_ttl=min(spec.ttl_seconds, config.max_ttl_seconds),
                created_mono=mono - age,
                endpoint=adopted.endpoint,
                queued=False,
            )
            manager.register(rec)
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
                await self.runtime.await_agent(rec, timeout=self.manager.config.adopt_timeout_seconds)
            except Exception as err:  # noqa: BLE001 - whatever the cause, the sandbox cannot be served
                failed = f"could not be adopted after a service restart: {err}"
                self.runtime.fail(rec, failed, getattr(err, "infra_error", None) or InfraErrorKind.AGENT_LOST)
            else:
                rec.info.ready_at = _now()
                rec.set_state(SandboxState.ready)
                self.report["sandboxes_adopted"].append(rec.id)
        if failed is not None:
            await self.manager.delete(rec.id, reason=failed)
            self.report["sandboxes_removed"].append(rec.id)

    async def clean(self, adopted: list[SandboxRecord] | None) -> None:
        """Verify the adopted sandboxes (adopting them first if that failed before listening), and remove
        orphaned sandboxes and stale snapshots."""
        report, backend, in_thread = self.report, self.runtime.backend, self.runtime.in_thread
        delay = 1.0
        while adopted is None:  # adoption failed before listening (API server down): keep trying
            await asyncio.sleep(delay)
            delay = min(60.0, delay * 2)
            try:
                adopted = await self.adopt()
            except Exception as err:  # noqa: BLE001
                log.warning("adopting the sandboxes of an earlier run failed again: %r", err)
        verifying = [asyncio.create_task(self._verify_adopted(rec)) for rec in adopted]
        try:
            report["snapshots_removed"] = await in_thread(backend.clear_stale_snapshots)
        except Exception as err:  # noqa: BLE001 - a leftover must never stop the service
            log.exception("could not clear stale snapshots")
            report["errors"].append(f"stale snapshots: {err!r}")
        try:
            orphans = await in_thread(backend.list_orphans)
        except Exception as err:  # noqa: BLE001 - the periodic reaper must still run; the next restart retries
            log.exception("listing orphaned sandboxes failed")
            report["errors"].append(f"listing orphans: {err!r}")
            orphans = []
        if orphans:
            log.warning("removing %d orphaned sandbox(es) left by an earlier run", len(orphans))
        slots = asyncio.Semaphore(max(1, self.manager.config.backend_threads // 4))  # leave threads for creates

        async def reap(orphan: str) -> None:
            async with slots:
                try:
                    await in_thread(backend.stop, orphan)
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
