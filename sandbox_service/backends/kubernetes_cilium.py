"""Per-sandbox CiliumNetworkPolicy for allowlists (`host_policy="cilium-fqdn"`): host names stay names.

A standard NetworkPolicy holds addresses only, so `resolve` turns allowed hosts into the addresses they
had when the policy was applied; CDN-hosted hosts move on. Cilium's `toFQDNs` instead lets its DNS proxy
learn the addresses the sandbox's own lookups return, so the allowlist follows the names. That only works
when the pod's DNS goes through Cilium's proxy, hence the DNS rule (`rules.dns`) to the cluster DNS pods.

Egress only, like the per-sandbox NetworkPolicy it replaces: ingress and the default deny come from the
shared NetworkPolicy (`build_shared_network_policy`); Cilium enforces both kinds together. Created after
the pod with an ownerReference to it (the garbage collector deletes it with the pod), deleted by name.
The Role grants create/get/delete only: a changed allowlist deletes and recreates the policy (the moment
between the two denies, which is the safe direction) rather than needing `update`.
"""

from __future__ import annotations

import re
from typing import Any

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes_config import INSTANCE_LABEL, SANDBOX_ID_LABEL, KubernetesBackendConfig
from sandbox_service.backends.kubernetes_objects import (
    checked_cidrs,
    label_value,
    metadata_excepts,
    object_meta,
    to_dict,
)
from sandbox_service.errors import InvalidRequestError
from sandbox_service.models import NetworkPolicy, SandboxCreate

GROUP, VERSION, PLURAL, KIND = "cilium.io", "v2", "ciliumnetworkpolicies", "CiliumNetworkPolicy"
# The patterns of Cilium's CRD (toFQDNs matchName / matchPattern, maxLength 255): refused here with a
# message rather than by the API server's 422.
_MATCH_NAME = re.compile(r"^([-a-zA-Z0-9_]+[.]?)+$")
_MATCH_PATTERN = re.compile(r"^([-a-zA-Z0-9_*]+[.]?)+$")


def fqdn_selectors(hosts: list[str]) -> list[dict[str, str]]:
    """`toFQDNs` entries: `matchName` per host, `matchPattern` for a `*.example.com` wildcard (any subdomain)."""
    selectors = []
    for host in hosts:
        wildcard = host.startswith("*.")
        if len(host) > 255 or not (_MATCH_PATTERN if wildcard else _MATCH_NAME).match(host) or (
                wildcard and "*" in host[2:]):
            raise InvalidRequestError(f"allow_hosts entry {host!r} is not a host name (letters, digits, '-', '_' "
                                      "and dots; a wildcard only as a leading '*.', e.g. *.pythonhosted.org).")
        selectors.append({"matchPattern" if wildcard else "matchName": host.lower()})
    return selectors


def build_cilium_policy(name: str, sandbox_id: str, spec: SandboxCreate, config: KubernetesBackendConfig,
                        policy: NetworkPolicy, owner: k8s.V1OwnerReference | None = None) -> dict[str, Any]:
    """The egress an allowlist opens, as a CiliumNetworkPolicy body: CIDRs (metadata endpoint excepted),
    host names as `toFQDNs`, and DNS to the cluster DNS through Cilium's DNS proxy."""
    cidrs = checked_cidrs(policy.allow_cidrs)
    fqdns = fqdn_selectors(policy.allow_hosts)
    egress: list[dict[str, Any]] = []
    if cidrs:
        egress.append({"toCIDRSet": [{"cidr": c, **({"except": ex} if (ex := metadata_excepts(c)) else {})}
                                     for c in sorted(set(cidrs))]})
    if fqdns:
        egress.append({"toFQDNs": fqdns})
        # Without a DNS rule the proxy never sees the lookups and `toFQDNs` matches nothing. `*` lets the
        # sandbox look anything up; only connections to the allowed names' answers are opened.
        dns_peer = {"matchLabels": {"k8s:io.kubernetes.pod.namespace": config.dns_namespace,
                                    **{f"k8s:{k}": v for k, v in config.dns_selector.items()}}}
        egress.append({"toEndpoints": [dns_peer],
                       "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}],
                                    "rules": {"dns": [{"matchPattern": "*"}]}}]})
    meta = to_dict(object_meta(name, sandbox_id, config, spec, owner=owner))
    selector = {"matchLabels": {SANDBOX_ID_LABEL: label_value(sandbox_id), INSTANCE_LABEL: config.instance}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": meta,
            "spec": {"endpointSelector": selector, "egress": egress}}


class CiliumPolicies:
    """The CustomObjectsApi calls for this one resource, shaped like the typed clients' (ns, body) / (name, ns)."""

    def __init__(self, custom: k8s.CustomObjectsApi):
        self.custom = custom

    def create(self, namespace: str, body: dict, **kwargs: Any) -> dict:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, **kwargs)

    def read(self, name: str, namespace: str, **kwargs: Any) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, **kwargs)

    def delete(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, **kwargs)


def is_cilium(config: KubernetesBackendConfig) -> bool:
    return config.host_policy == "cilium-fqdn"

