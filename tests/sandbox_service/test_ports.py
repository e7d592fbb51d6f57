"""Service-port exposure: a server inside the sandbox reached through a tokenized service URL."""

from __future__ import annotations

import time

import httpx
import pytest

from sandbox_service.errors import ConflictError
from sandbox_service.models import NetworkPolicy, SandboxCreate

_SERVER = """
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def _reply(self):
        n = int(self.headers.get("content-length") or 0)
        body = json.dumps({"method": self.command, "path": self.path,
                           "body": self.rfile.read(n).decode(), "x": self.headers.get("x-test")}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("content-type", "application/json")
        self.send_header("x-from-sandbox", "yes")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _reply
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8123), H).serve_forever()
"""


@pytest.fixture
def sandbox(sandbox_client, labels):
    # The default policy has no interface at all; an in-sandbox server needs loopback.
    with sandbox_client.create(SandboxCreate(labels=labels, network=NetworkPolicy(mode="loopback"))) as sb:
        yield sb


def test_expose_relay_and_revoke(sandbox):
    sandbox.write_file("/workspace/server.py", _SERVER)
    server_job = sandbox.exec_async(["python3", "/workspace/server.py"], timeout=300)
    deadline = time.monotonic() + 20
    while sandbox.exec("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8123), 1)\"").exit_code:
        assert time.monotonic() < deadline, "the in-sandbox server did not start"
        time.sleep(0.1)

    exposure = sandbox.expose_port(8123)
    assert exposure.port == 8123 and exposure.token in exposure.url
    # The URL alone is the credential: no bearer header here.
    got = httpx.get(exposure.url + "some/page?q=1", headers={"x-test": "hdr"}, timeout=10)
    assert got.status_code == 200 and got.headers["x-from-sandbox"] == "yes"
    assert got.json() == {"method": "GET", "path": "/some/page?q=1", "body": "", "x": "hdr"}
    posted = httpx.post(exposure.url + "api", content=b"payload", timeout=10)
    assert posted.status_code == 201 and posted.json()["body"] == "payload"
    assert sandbox.expose_port(8123).url == exposure.url  # exposing twice gives the same URL

    sandbox.unexpose_port(8123)
    gone = httpx.get(exposure.url, timeout=10)
    assert gone.status_code == 404 and gone.json()["code"] == "not_found"
    assert httpx.get(exposure.url.replace(exposure.token, "guessed-token"), timeout=10).status_code == 404
    assert sandbox.client.get_job(server_job.id).state.value == "running"


def test_a_sandbox_without_network_cannot_expose_and_deleting_revokes(sandbox_client, labels):
    sb = sandbox_client.create(SandboxCreate(labels=labels))
    with pytest.raises(ConflictError, match="loopback"):
        sb.expose_port(9000)
    sb.set_network_policy(NetworkPolicy(mode="loopback"))
    exposure = sb.expose_port(9000)
    sb.delete()
    assert httpx.get(exposure.url, timeout=10).status_code == 404
