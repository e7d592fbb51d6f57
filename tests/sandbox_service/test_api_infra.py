"""Infrastructure failures are attributed to the infrastructure, and nothing leaks when things go wrong:
a crashed sandbox, a frozen agent, a delete during creation, a service that died, a wrong agent secret."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from sandbox_service.agent_link.client import AgentClient
from sandbox_service.backends.base import AgentEndpoint
from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService
from sandbox_service.errors import SandboxNotReadyError, UnauthorizedError
from sandbox_service.models import ExecOutcome, InfraErrorKind, NetworkPolicy, SandboxCreate, SandboxState


def _sandbox_dir(service: EmbeddedService, sandbox_id: str):
    return service.state_dir / "local" / "s" / sandbox_id


def _agent_pid(service: EmbeddedService, sandbox_id: str) -> int:
    return json.loads((_sandbox_dir(service, sandbox_id) / "record.json").read_text())["host_pid"]


def test_a_crashed_sandbox_is_an_infra_error_and_is_marked_failed(sandbox_service, sandbox_client, labels):
    sb = sandbox_client.create(SandboxCreate(labels=labels))
    os.kill(_agent_pid(sandbox_service, sb.id), signal.SIGKILL)  # the sandbox dies under us
    result = sb.exec("echo never")
    assert result.outcome is ExecOutcome.infrastructure_error
    assert result.infra_error in (InfraErrorKind.SANDBOX_CRASHED, InfraErrorKind.AGENT_LOST)
    info = sandbox_client.get(sb.id)
    assert info.state is SandboxState.failed and info.infra_error is InfraErrorKind.SANDBOX_CRASHED
    with pytest.raises(SandboxNotReadyError):
        sb.exec("true")
    sb.delete()
    assert not _sandbox_dir(sandbox_service, sb.id).exists()


def test_delete_while_pending_leaves_nothing(sandbox_service, sandbox_client, labels):
    sandboxes = [sandbox_client.create(SandboxCreate(labels=labels), wait=False) for _ in range(3)]
    for sb in sandboxes:
        sb.delete()  # most are still pending: the create must not resurrect them afterwards
    time.sleep(0.5)
    for sb in sandboxes:
        assert sandbox_client.get(sb.id).state is SandboxState.deleted
        assert not _sandbox_dir(sandbox_service, sb.id).exists()


def test_the_agent_refuses_a_wrong_secret(sandbox_service, module_sandbox):
    socket_path = _sandbox_dir(sandbox_service, module_sandbox.id) / "a.sock"
    assert socket_path.exists()

    async def probe() -> None:
        client = AgentClient(AgentEndpoint(transport="unix", address=str(socket_path), secret="not-the-secret"))
        try:
            with pytest.raises(UnauthorizedError):
                await client.ping()
        finally:
            await client.close()

    asyncio.run(probe())


@pytest.fixture(scope="module")
def short_grace_service():
    with EmbeddedService(ServiceConfig(token="unused", exec_grace_seconds=1.0)) as service:
        yield service


def test_a_frozen_agent_is_a_service_side_timeout(short_grace_service):
    with short_grace_service.client() as client, client.create() as sb:
        pid = _agent_pid(short_grace_service, sb.id)
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            result = sb.exec("echo frozen", timeout=0.5)
            assert time.monotonic() - start < 10
            assert result.outcome is ExecOutcome.infrastructure_error and result.infra_error is InfraErrorKind.TIMEOUT
        finally:
            os.kill(pid, signal.SIGCONT)
        assert sb.exec("echo thawed").stdout == "thawed\n"


def test_orphans_of_a_crashed_service_are_removed_at_the_next_start(tmp_path):
    state_dir = tmp_path / "state"
    crashed = EmbeddedService(ServiceConfig(token="unused", state_dir=state_dir), check_leaks=False)
    crashed.start()
    with crashed.client() as client:
        sb = client.create(SandboxCreate(network=NetworkPolicy(mode="allowlist", allow_cidrs=["10.254.253.1/32"])))
    assert (state_dir / "local" / "s" / sb.id).exists()
    crashed._collect_ids()
    os.killpg(crashed._proc.pid, signal.SIGKILL)  # no graceful shutdown: the sandbox stays behind
    crashed._proc.wait()
    left = crashed.find_leaks()  # the leak check sees what was left
    assert any(item.startswith("process") for item in left), left
    assert any(item.startswith("cgroup") and sb.id in item for item in left), left
    for kind in ("veth", "egress filter", "allowlist network slot", "sandbox id range slot"):
        assert any(item.startswith(kind) for item in left), (kind, left)
    with EmbeddedService(ServiceConfig(token="unused", state_dir=state_dir)):
        deadline = time.monotonic() + 20  # reaped in the background, after the service listens
        while (state_dir / "local" / "s" / sb.id).exists():
            assert time.monotonic() < deadline, "the orphan was not removed"
            time.sleep(0.05)
    assert crashed.find_leaks() == []
    crashed.stop()
