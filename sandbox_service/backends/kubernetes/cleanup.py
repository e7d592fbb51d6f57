"""Deleting a sandbox's Kubernetes objects, and finding those of sandboxes no process knows (orphans).

By name wherever the names are known: a label LIST is a whole-namespace read on API servers before
1.31, so listing per delete would cost the API server most at the worst moment (a restart with a
thousand orphans). The label path remains for a sandbox id nothing else is known about.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sandbox_service.backends.kubernetes.config import (
    SANDBOX_ID_ANNOTATION,
    SANDBOX_ID_LABEL,
    KubernetesBackendConfig,
)
from sandbox_service.backends.kubernetes.objects import instance_selector, sandbox_selector
from sandbox_service.backends.kubernetes.retry import is_not_found

Objects = set[tuple[str, str]]  # (kind, name): pod, secret, networkpolicy or an FQDN policy (kubernetes_host_policy)


class Cleanup:
    def __init__(
        self,
        core: k8s.CoreV1Api,
        net: k8s.NetworkingV1Api,
        config: KubernetesBackendConfig,
        call: Callable[..., Any],
        fqdn_deletes: dict[str, Callable[..., Any]] | None = None,
    ):
        self.config, self._call = config, call
        self._list = {
            "pod": core.list_namespaced_pod,
            "secret": core.list_namespaced_secret,
            "networkpolicy": net.list_namespaced_network_policy,
        }
        self._delete = {
            "pod": core.delete_namespaced_pod,
            "secret": core.delete_namespaced_secret,
            "networkpolicy": net.delete_namespaced_network_policy,
        }
        # FQDN policies (kind -> delete): by name only, never listed: each has an ownerReference to its pod
        # from the start (created after it), so the garbage collector takes those of orphaned pods along.
        self._delete.update(fqdn_deletes or {})

    def delete_named(self, objects: list[tuple[str, str]]) -> None:
        """Delete objects by (kind, name); gone already is fine. The pod goes first: garbage collection
        takes its dependents along, the other deletes cover a crash before their owner reference was set."""
        for kind, name in sorted(objects, key=lambda o: o[0] != "pod"):
            extra = {"grace_period_seconds": self.config.delete_grace_seconds} if kind == "pod" else {}
            try:
                self._call(
                    f"delete {kind}",
                    self._delete[kind],
                    name,
                    self.config.namespace,
                    passthrough=is_not_found,
                    propagation_policy="Background",
                    **extra,
                )
            except ApiException as err:
                if not is_not_found(err):
                    raise

    def delete_labelled(self, sandbox_id: str) -> None:
        """Delete every object labelled with this sandbox, every attempt's (idempotent)."""
        selector = sandbox_selector(sandbox_id, self.config)
        for kind, list_fn in self._list.items():
            items = self._call(f"list {kind}s", list_fn, self.config.namespace, label_selector=selector).items
            self.delete_named([(kind, obj.metadata.name) for obj in items])

    def list_all(self) -> dict[str, dict[str, list[Any]]]:
        """Every object of this replica on the cluster, by sandbox id and kind: one LIST per kind."""
        found: dict[str, dict[str, list[Any]]] = {}
        for kind, list_fn in self._list.items():
            for obj in self._call(
                f"list {kind}s", list_fn, self.config.namespace, label_selector=instance_selector(self.config)
            ).items:
                meta = obj.metadata
                sid = (meta.annotations or {}).get(SANDBOX_ID_ANNOTATION) or (meta.labels or {}).get(SANDBOX_ID_LABEL)
                if sid:  # the shared NetworkPolicy has none: it belongs to no sandbox
                    found.setdefault(sid, {}).setdefault(kind, []).append(obj)
        return found

    def find_all(self) -> dict[str, Objects]:
        """Every sandbox of this replica on the cluster and its objects' (kind, name)s."""
        return {sid: names(objects) for sid, objects in self.list_all().items()}


def names(objects: dict[str, list[Any]]) -> Objects:
    return {(kind, obj.metadata.name) for kind, items in objects.items() for obj in items}
