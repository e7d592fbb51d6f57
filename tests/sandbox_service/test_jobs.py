"""Async exec jobs: queued -> running -> succeeded|failed, waits, disconnects, deleted sandboxes."""

from __future__ import annotations

import time

import pytest

from sandbox_service.errors import JobNotFoundError, WaitTimeoutError
from sandbox_service.models import JobState, SandboxCreate


def test_job_runs_in_the_background_and_is_waited_on(module_sandbox, sandbox_client):
    job = module_sandbox.exec_async("sleep 0.5; echo done; exit 3")
    assert job.state in (JobState.queued, JobState.running) and job.result is None
    finished = sandbox_client.wait_job(job.id, timeout=30)
    assert finished.state is JobState.succeeded  # it ran to completion; the exit code is the command's
    assert finished.result.exit_code == 3 and finished.result.stdout == "done\n"
    assert finished.finished_at is not None
    assert sandbox_client.get_job(job.id).state is JobState.succeeded


def test_wait_timeout_is_408_and_the_job_keeps_running(module_sandbox, sandbox_client):
    job = module_sandbox.exec_async("sleep 1.5; echo late")
    with pytest.raises(WaitTimeoutError) as info:
        sandbox_client.wait_job(job.id, timeout=0.2)
    assert info.value.status_code == 408
    assert sandbox_client.get_job(job.id).state is JobState.running
    assert sandbox_client.wait_job(job.id, timeout=30).result.stdout == "late\n"


def test_job_survives_the_client_that_submitted_it(sandbox_service, module_sandbox):
    with sandbox_service.client() as first:
        sb = first.attach(module_sandbox.id)
        job = sb.exec_async("sleep 1; echo survived > /workspace/survivor.txt; echo ok")
    # `first` is closed: its connections are gone while the job is still running.
    time.sleep(0.2)
    with sandbox_service.client() as second:
        assert second.get_job(job.id).state is JobState.running
        finished = second.wait_job(job.id, timeout=30)
    assert finished.state is JobState.succeeded and finished.result.stdout == "ok\n"
    assert module_sandbox.read_text("/workspace/survivor.txt") == "survived\n"


def test_jobs_of_a_deleted_sandbox_end_failed_with_a_reason(sandbox_client, labels):
    sb = sandbox_client.create(SandboxCreate(labels=labels))
    job = sb.exec_async("sleep 60")
    sb.delete()
    finished = sandbox_client.wait_job(job.id, timeout=10)
    assert finished.state is JobState.failed
    assert "deleted" in finished.reason and sb.id in finished.reason


def test_unknown_job_is_404(sandbox_client):
    with pytest.raises(JobNotFoundError):
        sandbox_client.get_job("job-doesnotexist")
