"""The NetworkPolicies of one service instance's sandboxes.

One shared deny-all NetworkPolicy per instance (ingress only from the service pods to the agent port)
exists before any pod, so no pod ever runs unprotected and mode `none` costs no per-sandbox object.
An allowlist adds one per-sandbox policy that only opens egress: a standard NetworkPolicy with the
hosts resolved at apply time (`host_policy="resolve"`), or a CNI's FQDN policy with the names kept as
names (kubernetes_host_policy). It is created after the pod, owned by it, and deleted with it. NetworkPolicy is
enforced only by a CNI that implements it, and cannot stop a pod's processes from using its loopback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sandbox_service.backends.kubernetes.api import KubernetesApi
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.network.host_policy import FqdnPolicies, fqdn_policy_type
from sandbox_service.backends.kubernetes.objects import (
    allowlist_cidrs,
    build_network_policy,
    build_shared_network_policy,
    owner_reference,
)
from sandbox_service.backends.kubernetes.retry import is_not_found
from sandbox_service.errors import BackendUnavailableError, SandboxNotFoundError, SandboxServiceError
from sandbox_service.models import NetworkPolicy, SandboxCreate


class SandboxNetwork:
    def __init__(
        self,
        api: KubernetesApi,
        config: KubernetesBackendConfig,
        resolver_kw: dict[str, Any],
        delete_named: Callable[[list[tuple[str, str]]], None],
    ):
        self.api, self.config, self._resolver_kw, self._delete_named = api, config, resolver_kw, delete_named
        self.fqdn_type = fqdn_policy_type(config)  # None: allowlists get a resolved NetworkPolicy
        self.fqdn = FqdnPolicies(api.custom, self.fqdn_type) if self.fqdn_type else None
        self._shared = False  # the instance's deny-all policy is known to exist

    @property
    def kind(self) -> str:
        """The kind of a sandbox's own policy, as the backend lists its objects for deletion by name."""
        return self.fqdn_type.kind if self.fqdn_type else "networkpolicy"

    def fqdn_deletes(self) -> dict[str, Callable[..., Any]] | None:
        """The delete call of the FQDN policy kind, for Cleanup (None: resolved NetworkPolicies only)."""
        return {self.fqdn_type.kind: self.fqdn.delete} if self.fqdn else None

    def check(self, pod_name: str, sandbox_id: str, spec: SandboxCreate) -> list[str]:
        """Validate the spec's policy before anything exists; the resolved CIDRs it opens (FQDN policies:
        none, names stay names and nothing is resolved)."""
        if self.fqdn_type:
            self.fqdn_type.build(pod_name, sandbox_id, spec, self.config, spec.network)
            return []
        return allowlist_cidrs(spec.network, **self._resolver_kw)

    def ensure_shared(self) -> None:
        """Create the instance's deny-all policy once (it outlives sandboxes and service restarts)."""
        if self._shared:
            return
        net = self.api.net
        self.api.create(
            "shared networkpolicy",
            net.create_namespaced_network_policy,
            net.read_namespaced_network_policy,
            build_shared_network_policy(self.config),
        )
        self._shared = True

    def create(
        self, pod_name: str, sandbox_id: str, spec: SandboxCreate, cidrs: list[str], owner: k8s.V1OwnerReference
    ) -> None:
        """The allowlist sandbox's own policy, owned by its pod (`check` has validated it)."""
        if self.fqdn_type:
            self._create_fqdn(
                self.fqdn_type.build(pod_name, sandbox_id, spec, self.config, spec.network, owner=owner), spec.network
            )
        else:
            net = self.api.net
            self.api.create(
                "networkpolicy",
                net.create_namespaced_network_policy,
                net.read_namespaced_network_policy,
                build_network_policy(pod_name, sandbox_id, spec, self.config, spec.network, cidrs, owner=owner),
            )

    def apply(
        self,
        sandbox_id: str,
        policy: NetworkPolicy,
        find_pod: Callable[[str], k8s.V1Pod | None],
        mark_policy: Callable[[], None],
    ) -> None:
        """Make the sandbox's own policy say `policy`; `mark_policy()` runs once a per-sandbox policy may exist."""
        if self.fqdn_type:
            return self._apply_fqdn(sandbox_id, policy, find_pod, mark_policy)
        cfg, ns, net = self.config, self.config.namespace, self.api.net
        cidrs = allowlist_cidrs(policy, **self._resolver_kw)
        pod = _pod(sandbox_id, find_pod)
        name = pod.metadata.name
        if policy.mode != "allowlist":  # the shared policy denies all egress: drop the sandbox's own
            try:
                self.api.call(
                    "delete networkpolicy", net.delete_namespaced_network_policy, name, ns, passthrough=is_not_found
                )
            except ApiException as err:
                if not is_not_found(err):
                    raise
            return
        mark_policy()
        spec = SandboxCreate(image=pod.spec.containers[0].image, network=policy)
        desired = build_network_policy(name, sandbox_id, spec, cfg, policy, cidrs, owner=owner_reference(pod))
        for attempt in range(cfg.retry_attempts):
            try:
                current = self.api.call(
                    "read networkpolicy", net.read_namespaced_network_policy, name, ns, passthrough=is_not_found
                )
            except ApiException:
                self.api.create(
                    "networkpolicy", net.create_namespaced_network_policy, net.read_namespaced_network_policy, desired
                )
                return
            current.spec = desired.spec  # keep its metadata: labels, owner, resourceVersion
            try:
                self.api.call(
                    "replace networkpolicy",
                    net.replace_namespaced_network_policy,
                    name,
                    ns,
                    current,
                    retry_conflicts=False,
                    passthrough=lambda e: e.status == 409,
                )
                return
            except ApiException:  # 409: someone changed it since our read; read again
                self.api.sleep(min(cfg.retry_max_seconds, cfg.retry_base_seconds * 2**attempt))
        raise BackendUnavailableError(f"networkpolicy {name}: kept conflicting after {cfg.retry_attempts} attempts")

    def _apply_fqdn(
        self,
        sandbox_id: str,
        policy: NetworkPolicy,
        find_pod: Callable[[str], k8s.V1Pod | None],
        mark_policy: Callable[[], None],
    ) -> None:
        """Delete the sandbox's FQDN policy and create the new one (kubernetes_fqdn: no `update` right;
        between the two calls the shared policy denies all egress, the safe direction)."""
        pod = _pod(sandbox_id, find_pod)
        name, fqdn = pod.metadata.name, self.fqdn_type
        spec = SandboxCreate(image=pod.spec.containers[0].image, network=policy)
        desired = (
            fqdn.build(name, sandbox_id, spec, self.config, policy, owner=owner_reference(pod))
            if policy.mode == "allowlist"
            else None
        )  # built first: a bad allowlist changes nothing
        self._delete_named([(fqdn.kind, name)])
        if desired is not None:
            mark_policy()
            self._create_fqdn(desired, policy)

    def _create_fqdn(self, body: dict[str, Any], policy: NetworkPolicy) -> None:
        """Create an FQDN policy and check that the API server kept the host names: a server without the
        field they go in (Calico Open Source has no `domains`; an old CRD) prunes it, which would leave
        an Allow rule with no destination, open to everything. Such a policy is deleted at once."""
        fqdn = self.fqdn_type
        stored = self.api.create(fqdn.kind, self.fqdn.create, self.fqdn.read, body)
        kept = json.dumps((stored or {}).get("spec")).lower()
        if missing := [host for host in policy.allow_hosts if json.dumps(host.lower()) not in kept]:
            name = body["metadata"]["name"]
            self._delete_named([(fqdn.kind, name)])
            raise SandboxServiceError(
                f"{fqdn.kind} {name}: the API server stored it without the allowed hosts {missing} (it does not "
                f"know the field they go in, so the policy would open more than the allowlist), and it was "
                f"deleted. host_policy={self.config.host_policy} needs {fqdn.needs}; on another CNI use "
                "host_policy=resolve (docs/operations/kubernetes.md: the per-CNI table)."
            )


def _pod(sandbox_id: str, find_pod: Callable[[str], k8s.V1Pod | None]) -> k8s.V1Pod:
    pod = find_pod(sandbox_id)
    if pod is None:
        raise SandboxNotFoundError(f"no pod for sandbox {sandbox_id!r}; it was deleted or never started")
    return pod
