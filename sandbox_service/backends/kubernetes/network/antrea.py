"""Per-sandbox Antrea NetworkPolicy for allowlists (`host_policy="antrea-fqdn"`): host names stay names.

An Antrea-native, namespaced NetworkPolicy (`crd.antrea.io/v1beta1`, Antrea >= 1.13; FQDN rules since
1.3) with the hosts as `fqdn` egress peers. The Antrea agent reads the DNS answers its pods receive and
opens the addresses they hold for the names the policy allows, honouring their TTLs: the allowlist
follows CDN-hosted names and the service resolves nothing. Unlike Cilium there is no DNS proxy to route
through; the pod only has to be allowed to reach the cluster DNS, which the policy allows (kube-dns pods
and `dns_cidrs`, for NodeLocal DNSCache). Antrea's `*.example.com` matches any depth of subdomain.

Rules are evaluated in order and Antrea-native policies come before every Kubernetes NetworkPolicy
(an Allow here is final), so the body is self-contained: the metadata endpoint is dropped first (even
when an allowed name resolves to it), then the CIDRs, names and DNS are allowed, and a last rule drops
the rest, as Antrea's documentation advises for FQDN rules. Egress only: ingress still comes from the
shared NetworkPolicy. Each rule is named (Antrea wants rule names unique within a policy).
"""

from __future__ import annotations

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

GROUP, VERSION, PLURAL, KIND = "crd.antrea.io", "v1beta1", "networkpolicies", "NetworkPolicy"
# Within the default `application` tier; one policy per pod, so the value only orders it against the
# cluster's own policies there (lower runs first; Antrea takes 1 to 10000).
PRIORITY = 5.0


def build_antrea_policy(
    name: str,
    sandbox_id: str,
    spec: SandboxCreate,
    config: KubernetesBackendConfig,
    policy: NetworkPolicy,
    owner: k8s.V1OwnerReference | None = None,
) -> dict[str, Any]:
    """The egress an allowlist opens, as an Antrea NetworkPolicy body."""
    cidrs = sorted(set(opened_cidrs(checked_cidrs(policy.allow_cidrs), config.node_cidrs)))
    hosts = [host for host, _ in checked_hosts(policy.allow_hosts, underscore=False, cni="Antrea")]
    egress: list[dict[str, Any]] = [
        {"name": "drop-metadata", "action": "Drop", "to": [{"ipBlock": {"cidr": c}} for c in METADATA_CIDRS]}
    ]
    if config.node_cidrs:  # the nodes' own addresses: only those named one by one, never through a wider CIDR
        if named := named_node_addresses(cidrs, config.node_cidrs):
            egress.append(
                {"name": "allow-named-nodes", "action": "Allow", "to": [{"ipBlock": {"cidr": c}} for c in named]}
            )
        egress.append(
            {"name": "drop-nodes", "action": "Drop", "to": [{"ipBlock": {"cidr": c}} for c in config.node_cidrs]}
        )
    if cidrs:
        egress.append({"name": "allow-cidrs", "action": "Allow", "to": [{"ipBlock": {"cidr": c}} for c in cidrs]})
    if hosts:
        egress.append({"name": "allow-hosts", "action": "Allow", "to": [{"fqdn": host} for host in hosts]})
        dns_pods = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.dns_namespace}},
            "podSelector": {"matchLabels": dict(config.dns_selector)},
        }
        egress.append(
            {
                "name": "allow-dns",
                "action": "Allow",
                "to": [dns_pods] + [{"ipBlock": {"cidr": c}} for c in config.dns_cidrs],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        )
    egress.append({"name": "drop-rest", "action": "Drop"})  # no `to`: every destination
    return custom_object(
        f"{GROUP}/{VERSION}",
        KIND,
        name,
        sandbox_id,
        spec,
        config,
        owner,
        {
            "priority": PRIORITY,
            "appliedTo": [{"podSelector": {"matchLabels": sandbox_labels(sandbox_id, config)}}],
            "egress": egress,
        },
    )
