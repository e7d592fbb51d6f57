"""What an allowlist may name, for every backend: the CIDRs checked, and the endpoints no allowlist opens."""

from __future__ import annotations

import functools
import ipaddress

from sandbox_service.errors import InvalidRequestError

# Cloud metadata and node credential endpoints, never reachable from a sandbox (they hand out the node's or the
# workload's cloud credentials): the one list every policy builder (the local backend's host filter; on
# Kubernetes the NetworkPolicy excepts, Cilium, Antrea, Calico) and the allowlist check use.
METADATA_CIDRS = (
    "169.254.169.254/32",  # the instance metadata service (AWS, GCP, Azure, OpenStack, ...)
    "169.254.169.252/32",  # GKE Workload Identity metadata server (GKE Dataplane V2)
    "169.254.170.23/32",  # EKS Pod Identity agent
    "fd00:ec2::254/128",  # AWS instance metadata, IPv6
    "fd00:ec2::23/128",  # EKS Pod Identity agent, IPv6
)

# (version, first, last) of each, computed once: an allowlist may hold a hundred CIDRs.
_METADATA = tuple(
    (n.version, int(n.network_address), int(n.broadcast_address)) for n in map(ipaddress.ip_network, METADATA_CIDRS)
)


def checked_cidrs(allow_cidrs: list[str]) -> list[str]:
    """The allowlist's CIDRs, normalised; a malformed one or the cloud metadata endpoint is refused."""
    return list(_checked(tuple(allow_cidrs)))


@functools.lru_cache(maxsize=256)
def _checked(allow_cidrs: tuple[str, ...]) -> tuple[str, ...]:
    """checked_cidrs, once per list: every create with a policy would parse the same hundred CIDRs again (the
    published API's unrestricted egress: 116). A refused list raises each time (exceptions are not cached)."""
    cidrs: list[str] = []
    for cidr in allow_cidrs:
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError as err:
            raise InvalidRequestError(f"allow_cidrs entry {cidr!r} is not a CIDR ({err}); use e.g. 10.0.0.0/8.")
        first, last = int(network.network_address), int(network.broadcast_address)
        if any(network.version == version and low <= first and last <= high for version, low, high in _METADATA):
            raise InvalidRequestError(
                f"allow_cidrs entry {cidr!r} is a cloud metadata endpoint, which "
                "sandboxes never reach (it hands out the node's credentials)."
            )
        cidrs.append(str(network))
    return tuple(cidrs)
