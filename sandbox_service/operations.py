"""What callers do inside a ready sandbox (exec, files, patches), with every failure attributed.

An exec result always says whose failure it was: the command's (non-zero exit, its own timeout, its
own OOM: `command_failed` with reason `oom`, also when it took the whole sandbox down, which is then
recreated with the same memory) or the infrastructure's (`infra_error`): the agent did not answer
without a cause inside the sandbox (AGENT_LOST), the service gave up waiting (TIMEOUT), a verification
run the harness started was killed for memory (OOM_KILLED, then escalated), the sandbox crashed
(SANDBOX_CRASHED) or was deleted under the call (SANDBOX_DELETED).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

from sandbox_service.agent_link.base import AgentUnreachableError, FileScope
from sandbox_service.config import ServiceConfig
from sandbox_service.errors import (
    CapacityExceededError,
    PathOutsideSandboxError,
    ServiceUnavailableError,
    refuse_unpassable,
)
from sandbox_service.metrics import ServiceMetrics
from sandbox_service.models import (
    ExecOutcome,
    ExecRequest,
    ExecResult,
    FileEntry,
    InfraErrorKind,
    PatchRequest,
    PatchResult,
    SandboxState,
)
from sandbox_service.records import SandboxRecord
from sandbox_service.service import SandboxManager


def check_path(path: str) -> str:
    """Refuse obviously bad paths before they reach the agent (which enforces confinement itself)."""
    if not path or "\x00" in path:
        raise PathOutsideSandboxError(f"invalid path {path!r}: it must be a non-empty path without NUL bytes")
    if ".." in path.replace("\\", "/").split("/"):
        raise PathOutsideSandboxError(f"path {path!r} contains '..'; give a path inside the sandbox without '..'")
    return path


def infra_result(kind: InfraErrorKind, message: str, duration: float = 0.0) -> ExecResult:
    return ExecResult(
        exit_code=None,
        outcome=ExecOutcome.infrastructure_error,
        infra_error=kind,
        message=message,
        duration_seconds=duration,
    )


def check_exec_request(req: ExecRequest) -> None:
    """400 for what no command can be started with (NUL bytes in argv, cwd or env)."""
    refuse_unpassable(req.env, *([req.command] if isinstance(req.command, str) else req.command), req.cwd)


class ExecLimiter:
    """The cap on concurrent execs: sync execs are refused when full (503), jobs wait their turn (FIFO)."""

    def __init__(self, limit: int, metrics: ServiceMetrics, retry_after: float):
        self.limit = limit
        self.in_use = 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._metrics = metrics
        self._retry_after = retry_after

    def try_acquire(self) -> None:
        if self.in_use >= self.limit or self._waiters:
            self._metrics.rejections.labels("execs").inc()
            raise CapacityExceededError(
                f"{self.limit} execs already running (max_concurrent_execs); retry later "
                "or submit with wait=false to queue",
                retry_after=self._retry_after,
            )
        self._take()

    async def acquire(self) -> None:
        if self.in_use < self.limit and not self._waiters:
            self._take()
            return
        slot = asyncio.get_running_loop().create_future()
        self._waiters.append(slot)
        try:
            await slot  # release() hands its slot over by resolving this
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self.release()  # handed a slot, then cancelled before using it: pass it on
            else:
                self._waiters.remove(slot)
            raise

    def _take(self) -> None:
        self.in_use += 1
        self._metrics.execs_in_flight.set(self.in_use)

    def release(self) -> None:
        while self._waiters:
            slot = self._waiters.popleft()
            if not slot.done():
                slot.set_result(None)  # the slot changes hands; in_use stays
                return
        self.in_use -= 1
        self._metrics.execs_in_flight.set(self.in_use)


class SandboxOperations:
    def __init__(self, config: ServiceConfig, manager: SandboxManager, metrics: ServiceMetrics):
        self.config = config
        self.manager = manager
        self.metrics = metrics
        self.limiter = ExecLimiter(config.max_concurrent_execs, metrics, config.retry_after_seconds)

    @contextlib.contextmanager
    def _call(self, rec: SandboxRecord):
        rec.active_calls += 1
        try:
            yield
        finally:
            rec.active_calls -= 1
            rec.last_activity = time.monotonic()

    # -- exec -----------------------------------------------------------------------------------
    async def exec(self, sandbox_id: str, req: ExecRequest) -> ExecResult:
        """A synchronous exec: refused with 503 when the exec cap is reached."""
        check_exec_request(req)
        rec = self.manager.ready(sandbox_id)
        self.limiter.try_acquire()
        try:
            return await self.run_exec(rec, req)
        finally:
            self.limiter.release()

    async def run_exec(self, rec: SandboxRecord, req: ExecRequest) -> ExecResult:
        """Run one command (caller holds an exec slot). Never raises for infrastructure failures."""
        start = time.perf_counter()
        agent = rec.agent
        if agent is None or rec.info.state is not SandboxState.ready:
            return infra_result(
                InfraErrorKind.SANDBOX_DELETED if rec.deleting else InfraErrorKind.AGENT_LOST,
                f"sandbox {rec.id} is {rec.info.state.value}",
            )
        cap = req.max_output_bytes if req.max_output_bytes is not None else self.config.max_output_bytes
        deadline = req.timeout_seconds + self.config.exec_grace_seconds
        with self._call(rec):
            try:
                # asyncio.timeout, not wait_for: wait_for wraps the call in a task of its own (one more
                # event-loop hop per exec). The agent client copies env before merging, so no copy here.
                async with asyncio.timeout(deadline):
                    result = await agent.exec(req, workdir=rec.spec.workdir, env=rec.spec.env, max_output_bytes=cap)
            except TimeoutError:
                result = infra_result(
                    InfraErrorKind.TIMEOUT,
                    f"no answer from the agent within {deadline:g} s (command timeout + grace); the service gave up",
                    time.perf_counter() - start,
                )
            except AgentUnreachableError as err:
                result = await self._agent_lost(rec, agent, err, time.perf_counter() - start, req.verification)
        if result.infra_error is InfraErrorKind.OOM_KILLED and not rec.deleting:
            result = await self._escalate(rec, agent, result)
        elapsed = time.perf_counter() - start
        self.metrics.exec_seconds.labels(result.outcome.value).observe(elapsed)
        if result.infra_error is not None:
            self.metrics.failures.labels(result.infra_error.value).inc()
        return result

    async def _agent_lost(
        self, rec: SandboxRecord, agent, err: Exception, duration: float, verification: bool = False
    ) -> ExecResult:
        """The agent stopped answering: ask the backend why. A sandbox killed for memory (as a container
        OOM is in Kubernetes) had a cause inside: for a verification run that is the infrastructure's
        OOM_KILLED (escalated by the caller); for a policy's command it is the command's outcome, and a
        dead sandbox is recreated with the same memory so the policy's next calls find it again."""
        if rec.deleting:
            return infra_result(
                InfraErrorKind.SANDBOX_DELETED, f"sandbox {rec.id} was deleted during the call", duration
            )
        status = await self.manager.runtime.in_thread(self.manager.backend.status_after_agent_loss, rec.id)
        if status.infra_error is InfraErrorKind.OOM_KILLED:
            why = status.message or "sandbox killed for memory"
            if verification:
                return infra_result(InfraErrorKind.OOM_KILLED, why, duration)
            if not status.alive:
                await self.manager.runtime.recover(rec, agent)
            return ExecResult(
                exit_code=None,
                outcome=ExecOutcome.command_failed,
                reason="oom",
                duration_seconds=duration,
                message=f"the command ran the sandbox out of memory ({why}); the sandbox was "
                "kept or recreated with the same memory and its files",
            )
        if not status.alive:
            kind = status.infra_error or InfraErrorKind.SANDBOX_CRASHED
            await self.manager.runtime.mark_crashed(rec, agent, kind, f"sandbox died: {status.message or err}")
            return infra_result(kind, f"sandbox {rec.id} died: {status.message or err}", duration)
        return infra_result(InfraErrorKind.AGENT_LOST, f"the agent of sandbox {rec.id} did not answer: {err}", duration)

    async def _escalate(self, rec: SandboxRecord, agent, result: ExecResult) -> ExecResult:
        before = rec.info.resources.memory_mb
        event = await self.manager.runtime.escalate(rec, agent, InfraErrorKind.OOM_KILLED)
        if event is None:
            note = f"killed for memory at {before} MiB; no escalation (disabled or at the cap)"
        else:
            now = rec.info.state.value
            note = (
                f"killed for memory at {event.from_memory_mb} MiB; the sandbox was recreated with "
                f"{event.to_memory_mb} MiB (now {now}); retry the command"
            )
        detail = f" [{result.message}]" if result.message else ""
        return result.model_copy(update={"message": note + detail})

    # -- files ----------------------------------------------------------------------------------
    async def _agent_call(self, sandbox_id: str, op: str, fn, *args):
        rec = self.manager.ready(sandbox_id)
        agent = rec.agent
        with self._call(rec):
            try:
                return await fn(agent, *args)
            except AgentUnreachableError as err:
                result = await self._agent_lost(rec, agent, err, 0.0)
                kind = result.infra_error.value if result.infra_error else result.reason
                raise ServiceUnavailableError(
                    f"{op} failed: {result.message} ({kind})", retry_after=self.config.retry_after_seconds
                ) from err

    async def read_file(self, sandbox_id: str, path: str, *, scope: FileScope = "workspace") -> bytes:
        return await self._agent_call(
            sandbox_id, "read_file", lambda a, p: a.read_file(p, scope=scope), check_path(path)
        )

    async def write_file(
        self, sandbox_id: str, path: str, data: bytes, mode: int | None, *, scope: FileScope = "workspace"
    ) -> None:
        await self._agent_call(
            sandbox_id, "write_file", lambda a, p: a.write_file(p, data, mode, scope=scope), check_path(path)
        )

    async def list_files(self, sandbox_id: str, path: str, *, scope: FileScope = "workspace") -> list[FileEntry]:
        return await self._agent_call(
            sandbox_id, "list_files", lambda a, p: a.list_files(p, scope=scope), check_path(path)
        )

    async def upload_small(self, sandbox_id: str, op: str, header: dict, data: bytes) -> None:
        """`write_file` / `put_archive` of a body read whole (small)."""
        if op == "write_file":
            await self.write_file(sandbox_id, header["path"], data, header.get("mode"))
        else:
            await self.put_archive(sandbox_id, header["path"], data)

    async def upload(self, sandbox_id: str, op: str, header: dict, size: int, chunks) -> None:
        """`write_file` / `put_archive` streamed from `chunks` (see transfers.py)."""
        check_path(header["path"])
        await self._agent_call(sandbox_id, op, lambda a: a.upload(op, header, size, chunks))

    async def download(self, sandbox_id: str, op: str, header: dict):
        """(size, chunks) of `read_file` / `get_archive`, capped at max_download_bytes."""
        check_path(header["path"])
        header = {**header, "limit": self.config.max_download_bytes}
        return await self._agent_call(sandbox_id, op, lambda a: a.download(op, header))

    async def put_archive(self, sandbox_id: str, path: str, tar_gz: bytes) -> None:
        await self._agent_call(sandbox_id, "put_archive", lambda a, p: a.put_archive(p, tar_gz), check_path(path))

    async def get_archive(self, sandbox_id: str, path: str) -> bytes:
        return await self._agent_call(sandbox_id, "get_archive", lambda a, p: a.get_archive(p), check_path(path))

    # -- patches --------------------------------------------------------------------------------
    async def apply_patch(self, sandbox_id: str, req: PatchRequest) -> PatchResult:
        """`git apply` (all-or-nothing) where git exists in the sandbox, else `patch --forward`."""
        if req.cwd is not None:
            check_path(req.cwd)
        p = int(req.strip)
        script = (
            f"if command -v git >/dev/null 2>&1; then exec git apply --verbose --whitespace=nowarn -p{p} -; "
            f"else exec patch -p{p} --batch --forward; fi"
        )
        exec_req = ExecRequest(command=["/bin/sh", "-c", script], cwd=req.cwd, stdin=req.patch, timeout_seconds=120.0)
        result = await self.exec(sandbox_id, exec_req)
        if result.is_infra_error:
            # an infrastructure_error outcome always names its kind (infra_result, agent_client)
            assert result.infra_error is not None
            raise ServiceUnavailableError(
                f"apply_patch could not run: {result.infra_error.value}: {result.message}",
                retry_after=self.config.retry_after_seconds,
            )
        stderr = result.stderr
        if result.outcome is ExecOutcome.command_timeout:
            stderr += "\n(apply_patch timed out)"
        return PatchResult(
            applied=result.exit_code == 0, exit_code=result.exit_code, stdout=result.stdout, stderr=stderr
        )
