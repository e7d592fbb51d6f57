"""Unrestricted egress for the published API's `block_network: false`, as an allowlist of the public internet.

The published system gives such sandboxes the whole network. Ours, when the operator turns it on
(`ServiceConfig.published_unrestricted_egress`, off by default), is every public IPv4 address and nothing
else: the private, loopback, link-local (the cloud metadata endpoints: node credentials), shared (CGNAT) and
reserved ranges below stay unreachable, so a sandbox still cannot reach the cluster, the node or its
neighbours. It is expressed as an ordinary allowlist policy, so each backend enforces it the way it
enforces any allowlist (local: an nftables filter on the host end of the sandbox's link, which also keeps
the host's own addresses closed, public ones included; Kubernetes: a NetworkPolicy, which also excepts the
metadata endpoints and `node_cidrs`). IPv6 stays off, as for every allowlist.

What it does not cover: the local backend does not NAT, so off-host addresses need a host that routes the
allowlist subnet (see backends/local/network.py).
"""

from __future__ import annotations

import functools
import ipaddress

from sandbox_service.models import NetworkPolicy

# Never reachable with unrestricted egress (IANA special-purpose IPv4 registry, RFC 6890 and successors).
DENIED_EGRESS_CIDRS = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private (RFC 1918)
    "100.64.0.0/10",  # shared address space, CGNAT (holds Alibaba's metadata endpoint 100.100.100.200)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local: the cloud metadata endpoints (169.254.169.254, ...)
    "172.16.0.0/12",  # private (RFC 1918)
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation (TEST-NET-1)
    "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
    "192.168.0.0/16",  # private (RFC 1918)
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation (TEST-NET-2)
    "203.0.113.0/24",  # documentation (TEST-NET-3)
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the limited broadcast address
)


@functools.cache
def public_egress_cidrs() -> tuple[str, ...]:
    """Every IPv4 address outside `DENIED_EGRESS_CIDRS`, as the fewest CIDRs (116 of them)."""
    allowed = [ipaddress.IPv4Network("0.0.0.0/0")]
    for denied in map(ipaddress.IPv4Network, DENIED_EGRESS_CIDRS):
        allowed = [
            part
            for net in allowed
            for part in (net.address_exclude(denied) if denied.subnet_of(net) else [net])
            if not part.subnet_of(denied)
        ]
    return tuple(str(net) for net in sorted(allowed))


def unrestricted_egress() -> NetworkPolicy:
    """The network policy of a published-API sandbox created with `block_network: false`."""
    return NetworkPolicy(mode="allowlist", allow_cidrs=list(public_egress_cidrs()))
