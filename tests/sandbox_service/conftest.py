"""Fixtures of the sandbox-service tests (the session-wide service itself is in tests/conftest.py)."""

from __future__ import annotations

import secrets
import socket
import subprocess
import threading
import time
import uuid

import pytest

from sandbox_service.models import SandboxCreate


@pytest.fixture
def labels() -> dict[str, str]:
    """Labels unique to one test, so list filters only ever see that test's sandboxes."""
    return {"test": uuid.uuid4().hex[:12]}


@pytest.fixture
def sandbox(sandbox_client, labels):
    """A fresh ready sandbox, deleted after the test."""
    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        yield sb


@pytest.fixture(scope="module")
def module_sandbox(sandbox_client):
    """One ready sandbox shared by a module's read-mostly tests."""
    with sandbox_client.create(SandboxCreate(labels={"test": "module"})) as sb:
        yield sb


@pytest.fixture
def wait_for_port():
    """`wait_for_port(sandbox, port)`: until something listens on 127.0.0.1:port inside the sandbox."""
    return _wait_for_port


def _wait_for_port(sandbox, port: int, timeout: float = 20.0) -> None:
    probe = f"python3 -I -S -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)\""
    deadline = time.monotonic() + timeout
    while sandbox.exec(probe, cwd="/").exit_code:
        assert time.monotonic() < deadline, f"the in-sandbox server on port {port} did not start"
        time.sleep(0.1)


@pytest.fixture
def host_addresses():
    """Two addresses on this host (a veth pair that stays in the host namespace): (allowed, denied)."""
    tag = secrets.token_hex(2)
    a, b = f"orct{tag}a", f"orct{tag}b"
    octet = secrets.randbelow(200) + 20
    allowed, denied = f"10.254.{octet}.1", f"10.254.{octet}.2"
    subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{allowed}/32", "dev", a], check=True)
        subprocess.run(["ip", "addr", "add", f"{denied}/32", "dev", b], check=True)
        subprocess.run(["ip", "link", "set", a, "up"], check=True)
        subprocess.run(["ip", "link", "set", b, "up"], check=True)
        yield allowed, denied
    finally:
        subprocess.run(["ip", "link", "del", a], check=False)


class HostServices:
    """A TCP and a UDP listener on 0.0.0.0 of the host's namespace: every address the host holds."""

    def __init__(self):
        self.tcp = socket.create_server(("0.0.0.0", 0), reuse_port=False)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("0.0.0.0", 0))
        self.ports = self.tcp.getsockname()[1], self.udp.getsockname()[1]
        threading.Thread(target=self._tcp, daemon=True).start()
        threading.Thread(target=self._udp, daemon=True).start()

    def _tcp(self):
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return
            conn.sendall(b"HOST-ONLY SERVICE hello")
            conn.close()

    def _udp(self):
        while True:
            try:
                _, peer = self.udp.recvfrom(100)
                self.udp.sendto(b"HOST-ONLY UDP hello", peer)
            except OSError:
                return

    def close(self):
        self.tcp.close()
        self.udp.close()


@pytest.fixture
def host_services():
    services = HostServices()
    yield services
    services.close()
