"""The one map from `KubernetesBackendConfig.host_policy` to the per-sandbox FQDN policy it creates.

`resolve` (the default) is not here: its policy is a standard NetworkPolicy with resolved addresses
(kubernetes_objects.build_network_policy). Every other value names a CNI's own policy resource, built
by its module and sent through the CustomObjectsApi; kubernetes_network asks this map, never the value itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes.network import antrea as kubernetes_antrea
from sandbox_service.backends.kubernetes.network import calico as kubernetes_calico
from sandbox_service.backends.kubernetes.network import cilium as kubernetes_cilium
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig


@dataclass(frozen=True)
class FqdnPolicyType:
    kind: str  # how the backend tags the object in its (kind, name) lists, e.g. for Cleanup
    group: str
    version: str
    plural: str
    build: Callable[..., dict[str, Any]]  # (name, sandbox_id, spec, config, policy, owner=None) -> body
    needs: str  # what the cluster must run, for the error when it does not


FQDN_POLICY_TYPES: dict[str, FqdnPolicyType] = {
    "cilium-fqdn": FqdnPolicyType(
        "ciliumnetworkpolicy",
        kubernetes_cilium.GROUP,
        kubernetes_cilium.VERSION,
        kubernetes_cilium.PLURAL,
        kubernetes_cilium.build_cilium_policy,
        "Cilium (the cilium.io/v2 CiliumNetworkPolicy CRD)",
    ),
    "antrea-fqdn": FqdnPolicyType(
        "antreanetworkpolicy",
        kubernetes_antrea.GROUP,
        kubernetes_antrea.VERSION,
        kubernetes_antrea.PLURAL,
        kubernetes_antrea.build_antrea_policy,
        "Antrea >= 1.13 with Antrea-native policies (crd.antrea.io/v1beta1)",
    ),
    "calico-dns": FqdnPolicyType(
        "caliconetworkpolicy",
        kubernetes_calico.GROUP,
        kubernetes_calico.VERSION,
        kubernetes_calico.PLURAL,
        kubernetes_calico.build_calico_policy,
        "Calico Enterprise or Calico Cloud (Calico Open Source has no DNS policy)",
    ),
}


def fqdn_policy_type(config: KubernetesBackendConfig) -> FqdnPolicyType | None:
    """The FQDN policy this configuration creates per allowlist sandbox; None: a resolved NetworkPolicy."""
    return FQDN_POLICY_TYPES.get(config.host_policy)


class FqdnPolicies:
    """The CustomObjectsApi calls for one such resource, shaped like the typed clients' (ns, body) / (name, ns)."""

    def __init__(self, custom: k8s.CustomObjectsApi, kind: FqdnPolicyType):
        self.custom, self.kind = custom, kind
        self._path = (kind.group, kind.version)

    def create(self, namespace: str, body: dict, **kwargs: Any) -> dict:
        return self.custom.create_namespaced_custom_object(*self._path, namespace, self.kind.plural, body, **kwargs)

    def read(self, name: str, namespace: str, **kwargs: Any) -> dict:
        return self.custom.get_namespaced_custom_object(*self._path, namespace, self.kind.plural, name, **kwargs)

    def delete(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self.custom.delete_namespaced_custom_object(*self._path, namespace, self.kind.plural, name, **kwargs)
