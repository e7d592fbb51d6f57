"""Lifecycle behaviour: heartbeat and hard-TTL reaping, OOM escalation, snapshots and forks, metrics."""

from __future__ import annotations

import time

from sandbox_service.models import (
    EscalationPolicy,
    ExecOutcome,
    InfraErrorKind,
    Resources,
    SandboxCreate,
    SandboxState,
)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} missing")


def _wait_gone(client, labels, timeout: float) -> float:
    """Seconds until no sandbox with `labels` is live. Listing does not count as a heartbeat."""
    start = time.monotonic()
    while client.list(labels):
        assert time.monotonic() - start < timeout, "not reaped in time"
        time.sleep(0.1)
    return time.monotonic() - start


def test_heartbeat_ttl_reaps_idle_sandboxes_but_not_busy_ones(sandbox_client, labels):
    idle = sandbox_client.create(SandboxCreate(labels=labels | {"kind": "idle"}, heartbeat_ttl_seconds=1.0))
    kept = sandbox_client.create(SandboxCreate(labels=labels | {"kind": "kept"}, heartbeat_ttl_seconds=1.0))
    busy = sandbox_client.create(SandboxCreate(labels=labels | {"kind": "busy"}, heartbeat_ttl_seconds=1.0))
    try:
        job = busy.exec_async("sleep 3; echo finished", timeout=30)  # a call in flight keeps it alive
        start = time.monotonic()
        while time.monotonic() - start < 2.5:
            kept.heartbeat()
            time.sleep(0.3)
        assert sandbox_client.get(idle.id).state is SandboxState.deleted
        assert "heartbeat" in sandbox_client.get(idle.id).error
        assert sandbox_client.get(kept.id).state is SandboxState.ready
        assert sandbox_client.wait_job(job.id, timeout=30).result.stdout == "finished\n"
        # Once idle again, the busy one is reaped too.
        _wait_gone(sandbox_client, labels | {"kind": "busy"}, timeout=10)
    finally:
        for sb in (idle, kept, busy):
            sb.delete()


def test_hard_ttl_reaps_even_with_heartbeats(sandbox_client, labels):
    sb = sandbox_client.create(SandboxCreate(labels=labels, ttl_seconds=1.5))
    start = time.monotonic()
    while sandbox_client.get(sb.id).state is SandboxState.ready:  # GETs are heartbeats
        assert time.monotonic() - start < 10
        time.sleep(0.2)
    info = sandbox_client.get(sb.id)
    assert info.state is SandboxState.deleted and "hard TTL" in info.error


def test_a_commands_oom_is_its_own_outcome_and_never_escalates(sandbox_client, labels):
    """The policy side of the attribution rule: running out of the sandbox's memory is the command's
    failure (counted against the policy), and buys the sandbox no memory."""
    spec = SandboxCreate(
        labels=labels, resources=Resources(memory_mb=64), escalation=EscalationPolicy(factor=4.0, max_memory_mb=512)
    )
    with sandbox_client.create(spec) as sb:
        result = sb.exec('python3 -c "b = bytearray(100 * 1024 * 1024)"', timeout=60)
        assert result.outcome is ExecOutcome.command_failed and result.reason == "oom", result
        assert result.infra_error is None and not result.is_infra_error
        info = sb.refresh()
        assert info.escalations == [] and info.resources.memory_mb == 64
        assert sb.exec("echo still usable").ok


def test_verification_oom_is_an_infra_error_and_escalates_memory(sandbox_client, labels):
    """The infrastructure side: a verification run the harness marks (`Sandbox.verifying()`) escalates."""
    spec = SandboxCreate(
        labels=labels, resources=Resources(memory_mb=64), escalation=EscalationPolicy(factor=4.0, max_memory_mb=512)
    )
    hog = 'python3 -c "b = bytearray(100 * 1024 * 1024); print(len(b))"'
    with sandbox_client.create(spec) as plain:
        sb = plain.verifying()
        sb.write_file("/workspace/keep.txt", "kept across the recreation")
        result = sb.exec(hog, timeout=60)
        assert result.outcome is ExecOutcome.infrastructure_error
        assert result.infra_error is InfraErrorKind.OOM_KILLED  # never counted as the policy's failure
        assert "256 MiB" in result.message
        info = sb.refresh()
        assert info.state is SandboxState.ready and info.id == sb.id
        assert info.resources.memory_mb == 256
        assert [(e.reason, e.from_memory_mb, e.to_memory_mb) for e in info.escalations] == [
            (InfraErrorKind.OOM_KILLED, 64, 256)
        ]
        assert sb.read_text("/workspace/keep.txt") == "kept across the recreation"
        again = sb.exec(hog, timeout=60)  # the retry fits in the escalated sandbox
        assert again.ok and again.stdout.strip() == str(100 * 1024 * 1024)
        assert _metric(sandbox_client.metrics(), "orchard_escalations_total") >= 1


def test_verification_oom_at_the_cap_is_reported_without_escalation(sandbox_client, labels):
    spec = SandboxCreate(
        labels=labels, resources=Resources(memory_mb=64), escalation=EscalationPolicy(max_memory_mb=64)
    )
    with sandbox_client.create(spec) as plain:
        sb = plain.verifying()
        result = sb.exec('python3 -c "b = bytearray(100 * 1024 * 1024)"', timeout=60)
        assert result.infra_error is InfraErrorKind.OOM_KILLED and "no escalation" in result.message
        info = sb.refresh()
        assert info.state is SandboxState.ready and info.escalations == [] and info.resources.memory_mb == 64
        assert sb.exec("echo still usable").ok


def test_snapshot_fork_and_restore(sandbox_client, labels):
    with sandbox_client.create(SandboxCreate(labels=labels)) as origin:
        origin.write_file("/workspace/state.txt", "v1")
        snap = origin.snapshot()
        assert snap.sandbox_id == origin.id and snap.size_bytes > 0
        origin.write_file("/workspace/state.txt", "v2")
        origin.write_file("/workspace/later.txt", "after the snapshot")
        with sandbox_client.create(SandboxCreate(labels=labels, from_snapshot=snap.id)) as fork:
            assert fork.read_text("/workspace/state.txt") == "v1"
            assert fork.exec("test -e /workspace/later.txt").exit_code == 1
            fork.write_file("/workspace/state.txt", "fork's own")
            assert origin.read_text("/workspace/state.txt") == "v2"  # forks do not share writes
        restored = origin.restore(snap.id)
        assert restored.state is SandboxState.ready
        assert origin.read_text("/workspace/state.txt") == "v1"
        assert origin.exec("cat /workspace/state.txt").stdout == "v1"
    sandbox_client.request("DELETE", f"/v1/snapshots/{snap.id}")


def test_metrics_report_requests_execs_and_states(sandbox_client, module_sandbox):
    module_sandbox.exec("true")
    text = sandbox_client.metrics()
    assert 'orchard_http_requests_total{method="POST",route="/v1/sandboxes/{sandbox_id}/exec",status="200"}' in text
    assert 'orchard_exec_seconds_bucket{le="0.005",outcome="ok"}' in text
    assert 'orchard_sandboxes{state="ready"}' in text
    assert 'orchard_sandbox_creates_total{result="ready"}' in text
