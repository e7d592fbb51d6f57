"""Asynchronous exec jobs: `POST .../exec` with `wait: false` returns a job at once.

A job is queued until an exec slot is free, then running, then `succeeded` (the command ran to
completion, whatever its exit code) or `failed` (it could not: infrastructure error, sandbox deleted).
Jobs run in their own tasks, so they outlive the HTTP request (and the client) that submitted them;
any later client can `GET /v1/jobs/{id}` or wait on it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sandbox_service.config import ServiceConfig
from sandbox_service.errors import CapacityExceededError, JobNotFoundError, WaitTimeoutError
from sandbox_service.metrics import ServiceMetrics
from sandbox_service.models import ExecRequest, Job, JobState
from sandbox_service.operations import SandboxOperations, check_exec_request


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(eq=False)
class _JobRecord:
    job: Job
    request: ExecRequest
    task: asyncio.Task | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    finished_mono: float | None = None


class JobManager:
    def __init__(self, config: ServiceConfig, ops: SandboxOperations, metrics: ServiceMetrics):
        self.config = config
        self.ops = ops
        self._jobs: dict[str, _JobRecord] = {}
        self._queued = 0
        metrics.on_collect(lambda: self._refresh(metrics))

    def _refresh(self, metrics: ServiceMetrics) -> None:
        counts = {s.value: 0 for s in JobState}
        for rec in self._jobs.values():
            counts[rec.job.state.value] += 1
        for state, n in counts.items():
            metrics.jobs.labels(state).set(n)

    def submit(self, sandbox_id: str, request: ExecRequest) -> Job:
        check_exec_request(request)  # 400 now rather than a failed job later
        self.ops.manager.ready(sandbox_id)  # 404/409 now rather than a failed job later
        if self._queued >= self.config.max_queued_jobs:
            raise CapacityExceededError(f"{self._queued} jobs queued (max_queued_jobs); retry later",
                                        retry_after=self.config.retry_after_seconds)
        job = Job(id="job-" + secrets.token_hex(8), sandbox_id=sandbox_id, state=JobState.queued, created_at=_now())
        rec = _JobRecord(job=job, request=request)
        self._jobs[job.id] = rec
        self._queued += 1
        rec.task = asyncio.create_task(self._run(rec), name=job.id)
        return job

    async def _run(self, rec: _JobRecord) -> None:
        acquired = False
        try:
            try:
                await self.ops.limiter.acquire()
                acquired = True
            finally:
                self._queued -= 1
            sandbox = self.ops.manager.ready(rec.job.sandbox_id)
            rec.job.state = JobState.running
            result = await self.ops.run_exec(sandbox, rec.request)
            if result.is_infra_error:
                self._finish(rec, JobState.failed, f"{result.infra_error.value}: {result.message}", result)
            else:
                self._finish(rec, JobState.succeeded, None, result)
        except asyncio.CancelledError:
            self._finish(rec, JobState.failed, rec.job.reason or "cancelled (service shutting down)")
        except Exception as err:  # noqa: BLE001 - a job records its failure, it never crashes the service
            self._finish(rec, JobState.failed, f"{type(err).__name__}: {err}")
        finally:
            if acquired:
                self.ops.limiter.release()

    def _finish(self, rec: _JobRecord, state: JobState, reason: str | None, result=None) -> None:
        if rec.done.is_set():
            return
        rec.job.state = state
        rec.job.reason = reason
        rec.job.result = result
        rec.job.finished_at = _now()
        rec.finished_mono = time.monotonic()
        rec.done.set()

    async def fail_for_sandbox(self, sandbox_id: str, reason: str) -> None:
        """`on_delete` hook: end the sandbox's unfinished jobs as failed, saying why."""
        for rec in list(self._jobs.values()):
            if rec.job.sandbox_id == sandbox_id and not rec.done.is_set():
                rec.job.reason = f"sandbox {sandbox_id} deleted: {reason}"
                self._finish(rec, JobState.failed, rec.job.reason)
                if rec.task is not None:
                    rec.task.cancel()

    def get(self, job_id: str) -> Job:
        self.prune()
        rec = self._jobs.get(job_id)
        if rec is None:
            raise JobNotFoundError(f"no job {job_id!r} (finished jobs are kept "
                                   f"{self.config.job_retention_seconds:g} s)")
        return rec.job

    async def wait(self, job_id: str, timeout: float) -> Job:
        job = self.get(job_id)
        rec = self._jobs[job_id]
        try:
            await asyncio.wait_for(rec.done.wait(), timeout)
        except asyncio.TimeoutError:
            raise WaitTimeoutError(f"job {job_id} still {job.state.value} after {timeout:g} s; it keeps running, "
                                   "wait again later") from None
        return rec.job

    def prune(self) -> None:
        horizon = time.monotonic() - self.config.job_retention_seconds
        for job_id in [j for j, r in self._jobs.items() if r.finished_mono is not None and r.finished_mono < horizon]:
            del self._jobs[job_id]

    async def shutdown(self) -> None:
        tasks = [r.task for r in self._jobs.values() if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
