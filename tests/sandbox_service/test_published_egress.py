"""`block_network: false` on the published API: the public internet, only where the operator turned it on;
private ranges and the cloud metadata endpoints stay unreachable. Resources are echoed as given."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from sandbox_service.compat.egress import DENIED_EGRESS_CIDRS, public_egress_cidrs
from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService

# errno of a connect to each address, from inside the sandbox (101: ENETUNREACH, no route at all).
PROBE = """
import errno, socket, sys
for host in sys.argv[1:]:
    s = socket.socket(); s.settimeout(1)
    try:
        s.connect((host, 80)); print(host, 0)
    except OSError as e:
        print(host, e.errno if e.errno is not None else 'timeout')
"""


def test_public_egress_is_every_ipv4_address_but_the_denied_ranges():
    public = [ipaddress.ip_network(c) for c in public_egress_cidrs()]
    denied = [ipaddress.ip_network(c) for c in DENIED_EGRESS_CIDRS]
    assert not any(p.overlaps(d) for p in public for d in denied)
    assert sum(n.num_addresses for n in public + denied) == 2**32  # together: the whole space, no overlap
    for address in ("169.254.169.254", "100.100.100.200", "10.0.0.1", "172.20.0.1", "192.168.1.1", "127.0.0.1"):
        assert not any(ipaddress.ip_address(address) in p for p in public), address
    for address in ("8.8.8.8", "1.1.1.1", "140.82.112.3"):
        assert any(ipaddress.ip_address(address) in p for p in public), address


@pytest.fixture(scope="module")
def open_api():
    with (
        EmbeddedService(ServiceConfig(token="unused", published_unrestricted_egress=True)) as service,
        httpx.Client(base_url=service.url + "/published", timeout=60, headers={"X-API-Key": service.token}) as api,
    ):
        yield api


def test_unrestricted_egress_routes_public_addresses_only_and_echoes_the_request(open_api):
    created = open_api.post(
        "/sandboxes", json={"image": "python:3.11-slim", "block_network": False, "cpu": "1", "memory": "1Gi"}
    )
    assert created.status_code == 200, created.text
    body = created.json()
    assert (body["block_network"], body["cpu"], body["memory"]) == (False, "1", "1Gi")  # as given, not 1024Mi
    sandbox_id = body["sandbox_id"]
    try:
        info = open_api.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60}).json()
        assert info["ready"] and (info["block_network"], info["memory"]) == (False, "1Gi")
        hosts = ["10.1.2.3", "169.254.169.254", "192.168.0.1", "100.100.100.200", "8.8.8.8"]
        probe = open_api.post(
            f"/sandboxes/{sandbox_id}/exec",
            json={"command": ["python3", "-c", PROBE, *hosts], "wait": True, "timeout_seconds": 30},
        ).json()
        assert probe["exit_code"] == 0, probe
        errnos = dict(line.split() for line in probe["stdout"].splitlines())
        for private in hosts[:-1]:  # no route at all: refused inside the sandbox, before any packet leaves
            assert errnos[private] == "101", errnos
        assert errnos["8.8.8.8"] != "101", errnos  # routed out (this host does not NAT it further)
    finally:
        assert open_api.delete(f"/sandboxes/{sandbox_id}").status_code == 200


def test_block_network_true_stays_without_any_network(open_api):
    created = open_api.post("/sandboxes", json={"image": "python:3.11-slim"}).json()
    try:
        open_api.get(f"/sandboxes/{created['sandbox_id']}/wait", params={"timeout": 60})
        probe = open_api.post(
            f"/sandboxes/{created['sandbox_id']}/exec",
            json={"command": ["python3", "-c", PROBE, "8.8.8.8"], "wait": True, "timeout_seconds": 30},
        ).json()
        assert probe["stdout"].split() == ["8.8.8.8", "101"] and created["block_network"] is True
    finally:
        open_api.delete(f"/sandboxes/{created['sandbox_id']}")
