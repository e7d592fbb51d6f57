"""Asynchronous exec jobs: `POST .../exec` with `wait: false` returns a job at once.

A job is queued until an exec slot is free, then running, then `succeeded` (the command ran to
completion, whatever its exit code) or `failed` (it could not: infrastructure error, sandbox deleted).
Jobs run in their own tasks, so they outlive the HTTP request (and the client) that submitted them;
any later client can `GET /v1/jobs/{id}` or wait on it.

Bookkeeping is O(1) per job, however many jobs the service has run: jobs are found by id, a sandbox's
unfinished jobs by an index on the sandbox, and finished jobs leave in the order they finished. A finished
job stays queryable for `job_retention_seconds`, and at most `max_finished_jobs` of them are kept (the
oldest go first). Pruning happens when a job finishes, in the job's own task, never in a request: a
lookup only checks the one job it was asked for.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
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
class JobRecord:
    """One job and what the manager needs to run and keep it."""

    job: Job
    request: ExecRequest
    command_text: str  # the command as its submitter wrote it (the published API echoes it back)
    task: asyncio.Task | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    finished_mono: float | None = None


class JobLedger:
    """Where jobs are kept: by id, unfinished ones by sandbox, finished ones in the order they finished.

    Every operation is O(1) (amortised for `prune`, which only ever looks at the oldest finished jobs).
    Separate from `JobManager` so the retention rules can be tested without running anything.
    """

    def __init__(self, retention_seconds: float, max_finished: int, clock=time.monotonic):
        self.retention_seconds = retention_seconds
        self.max_finished = max_finished
        self.clock = clock
        self._records: dict[str, JobRecord] = {}
        self._unfinished: dict[str, dict[str, JobRecord]] = {}  # sandbox id -> job id -> record
        self._finished: deque[JobRecord] = deque()  # oldest first
        self.counts: dict[JobState, int] = {s: 0 for s in JobState}

    def __len__(self) -> int:
        return len(self._records)

    def add(self, rec: JobRecord) -> None:
        self._records[rec.job.id] = rec
        self._unfinished.setdefault(rec.job.sandbox_id, {})[rec.job.id] = rec
        self.counts[rec.job.state] += 1

    def set_state(self, rec: JobRecord, state: JobState) -> None:
        self.counts[rec.job.state] -= 1
        rec.job.state = state
        self.counts[state] += 1

    def finished(self, rec: JobRecord) -> None:
        """`rec` has just finished: out of its sandbox's index, into the retention queue; prune."""
        rec.finished_mono = self.clock()
        pending = self._unfinished.get(rec.job.sandbox_id)
        if pending is not None:
            pending.pop(rec.job.id, None)
            if not pending:
                del self._unfinished[rec.job.sandbox_id]
        self._finished.append(rec)
        self.prune()

    def prune(self) -> None:
        """Drop finished jobs past their retention or beyond the count bound, oldest first."""
        horizon = self.clock() - self.retention_seconds
        while self._finished and (len(self._finished) > self.max_finished or self._finished[0].finished_mono < horizon):
            self._drop(self._finished.popleft())

    def _drop(self, rec: JobRecord) -> None:
        if self._records.get(rec.job.id) is rec:
            del self._records[rec.job.id]
            self.counts[rec.job.state] -= 1

    def get(self, job_id: str) -> JobRecord | None:
        """The job's record, or None when unknown or past its retention (checked on this job alone)."""
        rec = self._records.get(job_id)
        if (
            rec is not None
            and rec.finished_mono is not None
            and rec.finished_mono < self.clock() - self.retention_seconds
        ):
            return None  # expired: `prune` drops it with the next finished job
        return rec

    def unfinished_of(self, sandbox_id: str) -> list[JobRecord]:
        return list(self._unfinished.get(sandbox_id, {}).values())

    def running_tasks(self) -> list[asyncio.Task]:
        return [
            r.task
            for group in self._unfinished.values()
            for r in group.values()
            if r.task is not None and not r.task.done()
        ]


class JobManager:
    def __init__(self, config: ServiceConfig, ops: SandboxOperations, metrics: ServiceMetrics):
        self.config = config
        self.ops = ops
        self.ledger = JobLedger(config.job_retention_seconds, config.max_finished_jobs)
        self._queued = 0
        metrics.on_collect(lambda: self._refresh(metrics))

    def _refresh(self, metrics: ServiceMetrics) -> None:
        for state, n in self.ledger.counts.items():
            metrics.jobs.labels(state.value).set(n)

    def submit(self, sandbox_id: str, request: ExecRequest, *, command_text: str | None = None) -> Job:
        """Queue `request`; `command_text` is how the submitter wrote the command (default: argv joined)."""
        check_exec_request(request)  # 400 now rather than a failed job later
        self.ops.manager.ready(sandbox_id)  # 404/409 now rather than a failed job later
        if self._queued >= self.config.max_queued_jobs:
            raise CapacityExceededError(
                f"{self._queued} jobs queued (max_queued_jobs); retry later",
                retry_after=self.config.retry_after_seconds,
            )
        job = Job(id="job-" + secrets.token_hex(8), sandbox_id=sandbox_id, state=JobState.queued, created_at=_now())
        text = (
            command_text
            if command_text is not None
            else (request.command if isinstance(request.command, str) else " ".join(request.command))
        )
        rec = JobRecord(job=job, request=request, command_text=text)
        self.ledger.add(rec)
        self._queued += 1
        rec.task = asyncio.create_task(self._run(rec), name=job.id)
        return job

    async def _run(self, rec: JobRecord) -> None:
        acquired = False
        try:
            try:
                await self.ops.limiter.acquire()
                acquired = True
            finally:
                self._queued -= 1
            if rec.done.is_set():  # ended while it queued (its sandbox was deleted)
                return
            sandbox = self.ops.manager.ready(rec.job.sandbox_id)
            self.ledger.set_state(rec, JobState.running)
            result = await self.ops.run_exec(sandbox, rec.request)
            if result.is_infra_error:
                # an infrastructure_error outcome always names its kind (operations.infra_result, agent_client)
                assert result.infra_error is not None
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

    def _finish(self, rec: JobRecord, state: JobState, reason: str | None, result=None) -> None:
        if rec.done.is_set():
            return
        self.ledger.set_state(rec, state)
        rec.job.reason = reason
        rec.job.result = result
        rec.job.finished_at = _now()
        rec.done.set()
        self.ledger.finished(rec)

    async def fail_for_sandbox(self, sandbox_id: str, reason: str) -> None:
        """`on_delete` hook: end the sandbox's unfinished jobs as failed, saying why."""
        for rec in self.ledger.unfinished_of(sandbox_id):
            rec.job.reason = f"sandbox {sandbox_id} deleted: {reason}"
            self._finish(rec, JobState.failed, rec.job.reason)
            if rec.task is not None:
                rec.task.cancel()

    def _record(self, job_id: str) -> JobRecord:
        rec = self.ledger.get(job_id)
        if rec is None:
            raise JobNotFoundError(
                f"no job {job_id!r} (finished jobs are kept "
                f"{self.config.job_retention_seconds:g} s, the latest "
                f"{self.config.max_finished_jobs} at most)"
            )
        return rec

    def get(self, job_id: str) -> Job:
        return self._record(job_id).job

    def command_text(self, job_id: str) -> str:
        """The job's command as its submitter wrote it."""
        return self._record(job_id).command_text

    async def wait(self, job_id: str, timeout: float) -> Job:
        rec = self._record(job_id)
        try:
            await asyncio.wait_for(rec.done.wait(), timeout)
        except asyncio.TimeoutError:
            raise WaitTimeoutError(
                f"job {job_id} still {rec.job.state.value} after {timeout:g} s; it keeps running, wait again later"
            ) from None
        return rec.job

    async def shutdown(self) -> None:
        tasks = self.ledger.running_tasks()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
