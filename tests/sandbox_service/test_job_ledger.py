"""The job ledger's retention and indexes: bounded by count and age, O(1) per job at any size."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from sandbox_service.jobs import JobLedger, JobRecord
from sandbox_service.models import ExecRequest, Job, JobState


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(job_id: str, sandbox_id: str = "sb-1") -> JobRecord:
    job = Job(id=job_id, sandbox_id=sandbox_id, state=JobState.queued, created_at=datetime.now(timezone.utc))
    return JobRecord(job=job, request=ExecRequest(command="true"), command_text="true")


def _run_to_end(ledger: JobLedger, rec: JobRecord, state: JobState = JobState.succeeded) -> None:
    ledger.set_state(rec, JobState.running)
    ledger.set_state(rec, state)
    ledger.finished(rec)


def test_count_bound_drops_the_oldest_finished_jobs_first():
    ledger = JobLedger(retention_seconds=3600, max_finished=3, clock=Clock())
    recs = [_record(f"job-{i}") for i in range(5)]
    for rec in recs:
        ledger.add(rec)
    for rec in recs:
        _run_to_end(ledger, rec)
    assert len(ledger) == 3
    assert [ledger.get(f"job-{i}") for i in range(5)] == [None, None, *recs[2:]]
    assert ledger.counts[JobState.succeeded] == 3 and ledger.counts[JobState.queued] == 0


def test_unfinished_jobs_are_never_dropped_by_the_count_bound():
    ledger = JobLedger(retention_seconds=3600, max_finished=1, clock=Clock())
    waiting = [_record(f"wait-{i}") for i in range(4)]
    for rec in waiting:
        ledger.add(rec)
    for i in range(3):
        rec = _record(f"done-{i}")
        ledger.add(rec)
        _run_to_end(ledger, rec)
    assert all(ledger.get(r.job.id) is r for r in waiting)
    assert ledger.get("done-2") is not None and ledger.get("done-1") is None
    assert len(ledger) == 5 and ledger.counts[JobState.queued] == 4


def test_age_bound_hides_an_expired_job_at_once_and_prunes_it_with_the_next():
    clock = Clock()
    ledger = JobLedger(retention_seconds=60, max_finished=100, clock=clock)
    old, new = _record("job-old"), _record("job-new")
    ledger.add(old)
    ledger.add(new)
    _run_to_end(ledger, old, JobState.failed)
    clock.now += 61
    assert ledger.get("job-old") is None  # expired: not served, even before anything prunes it
    assert len(ledger) == 2
    _run_to_end(ledger, new)  # finishing a job prunes the expired ones
    assert len(ledger) == 1 and ledger.get("job-new") is new
    assert ledger.counts[JobState.failed] == 0 and ledger.counts[JobState.succeeded] == 1


def test_unfinished_index_follows_each_sandbox():
    ledger = JobLedger(retention_seconds=3600, max_finished=100, clock=Clock())
    a1, a2, b1 = _record("a1", "sb-a"), _record("a2", "sb-a"), _record("b1", "sb-b")
    for rec in (a1, a2, b1):
        ledger.add(rec)
    _run_to_end(ledger, a1)
    assert ledger.unfinished_of("sb-a") == [a2]
    assert ledger.unfinished_of("sb-b") == [b1]
    assert ledger.unfinished_of("sb-none") == []
    _run_to_end(ledger, a2)
    assert ledger.unfinished_of("sb-a") == []


def test_each_operation_costs_the_same_with_a_hundred_thousand_jobs_kept():
    """A ledger holding 100,000 finished jobs still adds, finishes, prunes and finds one in microseconds.
    (The old bookkeeping scanned every job on each lookup: 1,000 operations here would take minutes.)"""
    clock = Clock()
    ledger = JobLedger(retention_seconds=3600, max_finished=100_000, clock=clock)
    for i in range(100_000):
        rec = _record(f"job-{i}", f"sb-{i % 1000}")
        ledger.add(rec)
        _run_to_end(ledger, rec)
    started = time.perf_counter()
    for i in range(1000):
        rec = _record(f"more-{i}", f"sb-{i % 1000}")
        ledger.add(rec)
        assert ledger.get(f"job-{50_000 + i}") is not None
        ledger.unfinished_of(f"sb-{i % 1000}")
        _run_to_end(ledger, rec)
    elapsed = time.perf_counter() - started
    assert len(ledger) == 100_000  # the count bound held: each finish dropped the oldest
    assert ledger.get("job-0") is None and ledger.get("more-999") is not None
    assert elapsed < 1.0, f"1,000 operations on a full ledger took {elapsed:.2f} s"
