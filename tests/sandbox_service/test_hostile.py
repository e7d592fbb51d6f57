"""Attacks from inside real sandboxes against the real service (issue 13): each test is one attack class
that a policy under RL pressure could use to escape, read what it must not, or pass its own failures
off as the infrastructure's."""

from __future__ import annotations

import signal

from sandbox_service.models import ExecOutcome, SandboxCreate


def _agent_start_time(sb) -> str:
    return sb.exec("cut -d' ' -f22 /proc/1/stat").stdout.strip()


def test_agent_survives_every_signal_a_sandbox_process_can_send(sandbox_client, labels):
    """`kill -INT 1` used to end the agent, and the exec passed for SANDBOX_CRASHED (an infra error)."""
    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        born = _agent_start_time(sb)
        sigs = " ".join(str(int(s)) for s in sorted(signal.valid_signals()) if 0 < int(s) < 65)
        result = sb.exec(f"for s in {sigs}; do kill -$s 1 2>/dev/null; done; kill -INT 1; echo sent")
        assert result.outcome is ExecOutcome.ok and result.stdout == "sent\n", result
        after = sb.exec("echo alive")
        assert after.ok and after.stdout == "alive\n", after
        assert _agent_start_time(sb) == born  # the same agent, not a recreated sandbox
        assert sb.refresh().escalations == []
