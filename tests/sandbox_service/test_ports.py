"""Service-port exposure: a server inside the sandbox reached through a tokenized service URL."""

from __future__ import annotations

import json

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
                           "body": self.rfile.read(n).decode(), "x": self.headers.get("accept-language")}).encode()
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


def test_expose_relay_and_revoke(sandbox, wait_for_port):
    sandbox.write_file("/workspace/server.py", _SERVER)
    server_job = sandbox.exec_async(["python3", "/workspace/server.py"], timeout=300)
    wait_for_port(sandbox, 8123)

    exposure = sandbox.expose_port(8123)
    assert exposure.port == 8123 and exposure.token in exposure.url
    # The URL alone is the credential: no bearer header here.
    got = httpx.get(exposure.url + "some/page?q=1", headers={"accept-language": "hdr"}, timeout=10)
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


_BIG = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        size = int(self.path.strip("/"))
        self.send_response(200)
        self.send_header("content-length", str(size))
        self.end_headers()
        for _ in range(size >> 20):
            self.wfile.write(b"x" * (1 << 20))
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8126), H).serve_forever()
"""


def test_relayed_bodies_are_capped_502_for_a_response_413_for_a_request(sandbox_service, sandbox, wait_for_port):
    """The relay read a whole response body into the agent and then the service, with no cap."""
    from sandbox_service.config import ServiceConfig

    cap = ServiceConfig().max_port_body_bytes
    sandbox.write_file("/workspace/big.py", _BIG)
    sandbox.exec_async(["python3", "/workspace/big.py"], timeout=300)
    wait_for_port(sandbox, 8126)
    url = sandbox.expose_port(8126).url
    small = httpx.get(url + str(1 << 20), timeout=60)
    assert small.status_code == 200 and len(small.content) == 1 << 20
    big = httpx.get(url + str(cap + (4 << 20)), timeout=120)
    assert big.status_code == 502 and "max_port_body_bytes" in big.text, big.text[:200]
    too_much = httpx.post(url + "x", content=b"y" * (cap + 1), timeout=120)
    assert too_much.status_code == 413 and too_much.json()["code"] == "request_too_large", too_much.text[:200]


_HEADERS_ECHO = """
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "headers": dict(self.headers.items())}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8127), H).serve_forever()
"""


def test_the_relay_forwards_no_credential_any_of_our_servers_accepts(sandbox_service, sandbox, wait_for_port):
    """The relay dropped Authorization, Cookie and Proxy-Authorization but forwarded every other header:
    `X-API-Key`, which `/published` accepts as the service's token and the published SDK sends on every
    request of its session, reached the sandbox's server. Now only an allowlist of headers is relayed, and
    never one that carries the service's token."""
    sandbox.write_file("/workspace/echo.py", _HEADERS_ECHO)
    sandbox.exec_async(["python3", "/workspace/echo.py"], timeout=300)
    wait_for_port(sandbox, 8127)
    url = sandbox.expose_port(8127).url
    token = sandbox_service.token
    credentials = {
        "X-API-Key": token,  # /published's key
        "Authorization": f"Bearer {token}",  # the native API's, and the OpenEnv server's (its own token)
        "Cookie": f"session={token}",
        "Proxy-Authorization": f"Basic {token}",
        "X-Orchard-Token": token,  # any other name: not on the allowlist
        "Accept-Language": f"en;q=0.9, {token}",  # an allowlisted name carrying the token
        "Sec-WebSocket-Protocol": token,  # the published PTY's way of sending the key
    }
    got = httpx.get(
        url + "page", headers={**credentials, "User-Agent": "relay-test", "Accept": "text/html"}, timeout=10
    )
    assert got.status_code == 200, got.text
    seen = {k.lower(): v for k, v in got.json()["headers"].items()}
    assert token not in json.dumps(seen), f"the service's token reached the sandbox: {seen}"
    assert not set(seen) & {k.lower() for k in credentials}, seen
    assert seen.get("user-agent") == "relay-test" and seen.get("accept") == "text/html", seen  # apps still work
    in_query = httpx.get(url + f"page?next=1&token={token}", timeout=10)
    assert in_query.status_code == 400 and token not in in_query.text, in_query.text  # never relayed
