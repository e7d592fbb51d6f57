"""Creation retries with backoff on transient backend failures (an in-process service on a flaky backend)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

from sandbox_service.server.app import create_app
from sandbox_service.backends.base import SandboxBackend
from sandbox_service.backends.local.backend import LocalBackend, LocalBackendConfig
from sandbox_service.client import SandboxClient
from sandbox_service.config import ServiceConfig
from sandbox_service.errors import BackendUnavailableError
from sandbox_service.tools.leaks import find_leaks
from sandbox_service.models import InfraErrorKind, SandboxCreate, SandboxState


class FlakyBackend(SandboxBackend):
    """The real local backend, except that `start` fails transiently for sandboxes labelled `fail=N`."""

    name = "local"

    def __init__(self, inner: LocalBackend):
        self.inner = inner
        self.failures: dict[str, int] = {}

    def start(self, sandbox_id, spec, resources, secret):
        wanted = int(spec.labels.get("fail", "0"))
        seen = self.failures.get(sandbox_id, 0)
        if seen < wanted:
            self.failures[sandbox_id] = seen + 1
            raise BackendUnavailableError(f"node busy (simulated failure {seen + 1} of {wanted})")
        return self.inner.start(sandbox_id, spec, resources, secret)

    def status(self, sandbox_id):
        return self.inner.status(sandbox_id)

    def stop(self, sandbox_id):
        self.inner.stop(sandbox_id)

    def apply_network_policy(self, sandbox_id, policy):
        self.inner.apply_network_policy(sandbox_id, policy)

    def snapshot(self, sandbox_id, snapshot_id):
        return self.inner.snapshot(sandbox_id, snapshot_id)

    def restore(self, sandbox_id, snapshot_id):
        self.inner.restore(sandbox_id, snapshot_id)

    def delete_snapshot(self, snapshot_id):
        self.inner.delete_snapshot(snapshot_id)

    def list_orphans(self):
        return self.inner.list_orphans()

    def close(self):
        self.inner.close()


@pytest.fixture(scope="module")
def flaky_client(tmp_path_factory):
    state = tmp_path_factory.mktemp("flaky")
    config = ServiceConfig(token="flaky-token", state_dir=state, create_attempts=3, create_backoff_seconds=0.02)
    app = create_app(config, FlakyBackend(LocalBackend(LocalBackendConfig(state_dir=state / "local"))))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "in-process service did not start"
        time.sleep(0.02)
    with SandboxClient(f"http://127.0.0.1:{sock.getsockname()[1]}", "flaky-token") as client:
        yield client
    server.should_exit = True
    thread.join(30)
    assert find_leaks(state) == []


def test_transient_failures_are_retried(flaky_client):
    with flaky_client.create(SandboxCreate(labels={"fail": "2"})) as sb:
        assert sb.info.state is SandboxState.ready and sb.info.attempts == 3
        assert sb.exec("echo third time lucky").stdout == "third time lucky\n"


def test_failures_beyond_the_attempts_fail_the_sandbox_with_the_reason(flaky_client):
    sb = flaky_client.create(SandboxCreate(labels={"fail": "5"}), wait=False)
    info = flaky_client.request("GET", f"/v1/sandboxes/{sb.id}/wait", params={"timeout": 30}).json()
    assert info["state"] == "failed" and info["attempts"] == 3
    assert info["infra_error"] == InfraErrorKind.UNAVAILABLE.value and "node busy" in info["error"]
    with pytest.raises(BackendUnavailableError):
        sb.wait_ready(timeout=5)
    sb.delete()
