"""Per-sandbox CiliumNetworkPolicy for allowlists (`host_policy="cilium-fqdn"`): host names stay names.

A standard NetworkPolicy holds addresses only, so `resolve` turns allowed hosts into the addresses they
had when the policy was applied; CDN-hosted hosts move on. Cilium's `toFQDNs` instead lets its DNS proxy
learn the addresses the sandbox's own lookups return, so the allowlist follows the names. That only works
when the pod's DNS goes through Cilium's proxy, hence the DNS rule (`rules.dns`) to the cluster DNS pods.
Cilium's `*.example.com` matches one label (`a.example.com`, not `a.b.example.com`).

Egress only, like the per-sandbox NetworkPolicy it replaces: ingress and the default deny come from the
shared NetworkPolicy (`build_shared_network_policy`); Cilium enforces both kinds together. Lifecycle and
RBAC as every FQDN policy (kubernetes_fqdn): create/get/delete, no update.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.network.fqdn import checked_hosts, custom_object, sandbox_labels
from sandbox_service.backends.kubernetes.objects import METADATA_CIDRS, checked_cidrs, opened_cidrs, reserved_excepts
from sandbox_service.models import NetworkPolicy, SandboxCreate

GROUP, VERSION, PLURAL, KIND = "cilium.io", "v2", "ciliumnetworkpolicies", "CiliumNetworkPolicy"


def fqdn_selectors(hosts: list[str]) -> list[dict[str, str]]:
    """`toFQDNs` entries: `matchName` per host, `matchPattern` for a `*.example.com` wildcard."""
    return [{"matchPattern" if wildcard else "matchName": host} for host, wildcard in checked_hosts(hosts)]


def build_cilium_policy(
    name: str,
    sandbox_id: str,
    spec: SandboxCreate,
    config: KubernetesBackendConfig,
    policy: NetworkPolicy,
    owner: k8s.V1OwnerReference | None = None,
) -> dict[str, Any]:
    """The egress an allowlist opens, as a CiliumNetworkPolicy body: CIDRs (metadata endpoint, nodes excepted),
    host names as `toFQDNs`, DNS to the cluster DNS through Cilium's DNS proxy, and the metadata endpoint
    denied outright (`egressDeny`, Cilium >= 1.9)."""
    cidrs = opened_cidrs(checked_cidrs(policy.allow_cidrs), config.node_cidrs)
    fqdns = fqdn_selectors(policy.allow_hosts)
    egress: list[dict[str, Any]] = []
    if cidrs:
        egress.append(
            {
                "toCIDRSet": [
                    {"cidr": c, **({"except": ex} if (ex := reserved_excepts(c, config.node_cidrs)) else {})}
                    for c in sorted(set(cidrs))
                ]
            }
        )
    if fqdns:
        egress.append({"toFQDNs": fqdns})
        # Without a DNS rule the proxy never sees the lookups and `toFQDNs` matches nothing. `*` lets the
        # sandbox look anything up; only connections to the allowed names' answers are opened.
        dns_peer = {
            "matchLabels": {
                "k8s:io.kubernetes.pod.namespace": config.dns_namespace,
                **{f"k8s:{k}": v for k, v in config.dns_selector.items()},
            }
        }
        egress.append(
            {
                "toEndpoints": [dns_peer],
                "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}], "rules": {"dns": [{"matchPattern": "*"}]}}],
            }
        )
    # A deny wins over every allow in Cilium, so an allowed name that resolves to the metadata endpoint
    # (toFQDNs opens whatever the answer holds) still cannot reach it.
    deny = [{"toCIDRSet": [{"cidr": c} for c in METADATA_CIDRS]}]
    return custom_object(
        f"{GROUP}/{VERSION}",
        KIND,
        name,
        sandbox_id,
        spec,
        config,
        owner,
        {"endpointSelector": {"matchLabels": sandbox_labels(sandbox_id, config)}, "egress": egress, "egressDeny": deny},
    )
