"""Per-sandbox Calico NetworkPolicy for allowlists (`host_policy="calico-dns"`): host names stay names.

A `projectcalico.org/v3` NetworkPolicy (namespaced; served by the Calico API server, or as CRDs by
newer Calico releases) with the hosts in `destination.domains`. Calico learns the addresses from the
DNS answers of its trusted DNS servers (Felix `dnsTrustedServers`, by default the kube-dns service's
endpoints: add NodeLocal DNSCache's address there when it is used) and opens them for the names the
policy allows; the service resolves nothing. `*.example.com` matches any depth of subdomain.

DNS policy (`domains`) is Calico Enterprise and Calico Cloud only: Calico Open Source has no `domains`
field in its v3 API (checked against projectcalico/calico's api/pkg/apis/projectcalico/v3 as of 2026-08),
so its API server or CRD schema drops the field, and the Allow rule left would match everything: the
backend checks the stored policy for the hosts and deletes it if they are gone (kubernetes_network). On
Calico Open Source use `resolve` (a standard NetworkPolicy, which Calico enforces) or an egress proxy.

Rules are evaluated in order and an Allow is final, so the body is self-contained: the metadata
endpoint is denied first (even when an allowed name resolves to it), then CIDRs, domains and DNS are
allowed, and a last rule denies the rest. Calico's `domains` must stand alone in an Allow rule's
destination, and one rule's `nets` must not mix IPv4 and IPv6: hence one rule per family. Egress only:
ingress still comes from the shared NetworkPolicy, which Calico enforces alongside (default tier).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.network.fqdn import checked_hosts, custom_object, sandbox_labels
from sandbox_service.backends.kubernetes.objects import (
    METADATA_CIDRS,
    checked_cidrs,
    named_node_addresses,
    opened_cidrs,
)
from sandbox_service.models import NetworkPolicy, SandboxCreate

GROUP, VERSION, PLURAL, KIND = "projectcalico.org", "v3", "networkpolicies", "NetworkPolicy"
# Lower orders run first; Kubernetes NetworkPolicies sit at 1000 in Calico's default tier.
ORDER = 100.0


def selector(labels: dict[str, str]) -> str:
    """A Calico selector expression for equality on every label (values are valid label values: no quotes)."""
    return " && ".join(f"{key} == '{value}'" for key, value in sorted(labels.items()))


def _by_family(cidrs: list[str] | tuple[str, ...]) -> list[list[str]]:
    """CIDRs split into an IPv4 and an IPv6 list (a Calico rule's `nets` holds one family), empty ones left out."""
    families = [[c for c in cidrs if ipaddress.ip_network(c).version == v] for v in (4, 6)]
    return [family for family in families if family]


def build_calico_policy(
    name: str,
    sandbox_id: str,
    spec: SandboxCreate,
    config: KubernetesBackendConfig,
    policy: NetworkPolicy,
    owner: k8s.V1OwnerReference | None = None,
) -> dict[str, Any]:
    """The egress an allowlist opens, as a Calico NetworkPolicy body."""
    cidrs = sorted(set(opened_cidrs(checked_cidrs(policy.allow_cidrs), config.node_cidrs)))
    hosts = [host for host, _ in checked_hosts(policy.allow_hosts)]
    egress: list[dict[str, Any]] = [
        {"action": "Deny", "destination": {"nets": nets}} for nets in _by_family(METADATA_CIDRS)
    ]
    # The nodes' own addresses: only those named one by one, never through a wider CIDR.
    egress += [
        {"action": "Allow", "destination": {"nets": nets}}
        for nets in _by_family(named_node_addresses(cidrs, config.node_cidrs))
    ]
    egress += [{"action": "Deny", "destination": {"nets": nets}} for nets in _by_family(config.node_cidrs)]
    egress += [{"action": "Allow", "destination": {"nets": nets}} for nets in _by_family(cidrs)]
    if hosts:
        egress.append({"action": "Allow", "destination": {"domains": hosts}})
        dns_pods = {
            "namespaceSelector": selector({"projectcalico.org/name": config.dns_namespace}),
            "selector": selector(config.dns_selector),
            "ports": [53],
        }
        for protocol in ("UDP", "TCP"):
            egress.append({"action": "Allow", "protocol": protocol, "destination": dns_pods})
            egress += [
                {"action": "Allow", "protocol": protocol, "destination": {"nets": nets, "ports": [53]}}
                for nets in _by_family(config.dns_cidrs)
            ]
    egress.append({"action": "Deny"})
    return custom_object(
        f"{GROUP}/{VERSION}",
        KIND,
        name,
        sandbox_id,
        spec,
        config,
        owner,
        {
            "order": ORDER,
            "selector": selector(sandbox_labels(sandbox_id, config)),
            "types": ["Egress"],
            "egress": egress,
        },
    )
