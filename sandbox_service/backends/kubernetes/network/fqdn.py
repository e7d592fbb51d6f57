"""What the FQDN egress policies of every CNI share (kubernetes_cilium, kubernetes_antrea, kubernetes_calico).

An allowlist's host names go to the CNI as names: the CNI learns the addresses from the sandbox's own DNS
answers, so the allowlist follows CDN-hosted names, and the service resolves nothing. Each such policy
is one object per allowlist sandbox, created after the pod with an ownerReference to it (the garbage
collector deletes it with the pod; stop() deletes it by name), never listed, never updated: a changed
allowlist deletes and recreates it. The pieces below are the parts that do not depend on the CNI.
"""

from __future__ import annotations

import re
from typing import Any

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes.config import INSTANCE_LABEL, SANDBOX_ID_LABEL, KubernetesBackendConfig
from sandbox_service.backends.kubernetes.objects import label_value, object_meta, to_dict
from sandbox_service.errors import InvalidRequestError
from sandbox_service.models import SandboxCreate

# A host name as Cilium's CRD takes it (toFQDNs matchName / matchPattern, maxLength 255); a wildcard
# only as a leading `*.` (what every CNI here takes: Calico Enterprise refuses `*` inside a label).
_NAME = re.compile(r"^([-a-zA-Z0-9_]+[.]?)+$")


def checked_hosts(hosts: list[str], *, underscore: bool = True, cni: str = "") -> list[tuple[str, bool]]:
    """(host, is a `*.example.com` wildcard) per allowlist host, lowercased; a malformed one is refused
    here with a message rather than by the API server's 422 or the CNI's admission webhook.
    `underscore=False`: the CNI's validation takes letters, digits, '-' and dots only (Antrea's)."""
    checked = []
    for host in hosts:
        wildcard = host.startswith("*.")
        name = host[2:] if wildcard else host
        if len(host) > 255 or not _NAME.match(name):
            raise InvalidRequestError(
                f"allow_hosts entry {host!r} is not a host name (letters, digits, '-', '_' "
                "and dots; a wildcard only as a leading '*.', e.g. *.pythonhosted.org)."
            )
        if "_" in host and not underscore:
            raise InvalidRequestError(
                f"allow_hosts entry {host!r} has a '_', which {cni} refuses in a domain "
                "name (letters, digits, '-' and dots only)."
            )
        checked.append((host.lower(), wildcard))
    return checked


def sandbox_labels(sandbox_id: str, config: KubernetesBackendConfig) -> dict[str, str]:
    """The labels that pick out this sandbox's pod (and no warm or other instance's pod)."""
    return {SANDBOX_ID_LABEL: label_value(sandbox_id), INSTANCE_LABEL: config.instance}


def custom_object(
    api_version: str,
    kind: str,
    name: str,
    sandbox_id: str,
    spec: SandboxCreate,
    config: KubernetesBackendConfig,
    owner: k8s.V1OwnerReference | None,
    body: dict[str, Any],
) -> dict[str, Any]:
    """A custom resource body with the sandbox's usual metadata (labels, annotations, owner)."""
    meta = to_dict(object_meta(name, sandbox_id, config, spec, owner=owner))
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": body}
