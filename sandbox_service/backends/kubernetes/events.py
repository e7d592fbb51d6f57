"""Failures that only Events tell: a pod whose network sandbox cannot be created (the node's CNI ran
out of pod IPs), whose volumes cannot be mounted, or that no node group can ever take stays `Pending`
with no reason in its status. Without reading Events, a create holds its slot until the start timeout.

One watch of Warning events about pods per backend (the `PodCache` machinery with a field selector,
`type=Warning,involvedObject.kind=Pod`), indexed by pod name; not one watch per pod (the `involvedObject.name`
field selector), which at a thousand concurrent creates would be a thousand watches on the API server.
A new event for a pod wakes that pod's waiter at once.

Classification (`assess_events`), per reason:
- final at once (not retryable): the node has no runtime for the pod's RuntimeClass; with
  `autoscaled_nodes=False`, `FailedScheduling` where the scheduler says no node could ever take the pod
  (every node "Preemption is not helpful": node selector, affinity, taints; not a shortage of
  resources, which frees up). With a node autoscaler that may add a fitting node (pools scaled to
  zero), that waits like any unschedulable pod. (The autoscaler's own verdict, `NotTriggerScaleUp`, is a
  Normal event: watching every Normal event would multiply the watch's traffic by about five.)
- transient, final once it lasted its grace from the first sighting (retryable: the service makes a
  new pod, possibly on another node): `FailedCreatePodSandBox`, `FailedMount`, `FailedAttachVolume`,
  `NetworkNotReady` (grace `event_error_grace_seconds`), `FailedScheduling` (`unschedulable_timeout_seconds`).
An event stops counting once the pod got past its stage: sandbox and mount errors once the pod has an
IP (its sandbox exists, so its volumes are mounted), scheduling errors once it is bound to a node. So an
early FailedMount (a Secret not yet synced to the node) never fails a pod whose image then takes
minutes to pull.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes.status import PodAssessment
from sandbox_service.backends.kubernetes.watch import PodCache
from sandbox_service.models import InfraErrorKind

EVENT_SELECTOR = "type=Warning,involvedObject.kind=Pod"
_BEFORE_SANDBOX = {"FailedCreatePodSandBox", "FailedMount", "FailedAttachVolume", "NetworkNotReady"}
_SCHEDULING = {"FailedScheduling"}
# "0/5 nodes are available: ... preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling."
_UNRESOLVABLE = re.compile(r"preemption: 0/(\d+) nodes are available: (\d+) Preemption is not helpful")
# A runtime the node does not have: recreating the pod on the same kind of node cannot help.
_FINAL_SANDBOX_WORDS = ("no runtime for", "runtimehandler", "runtime handler", "runtimeclass")


class EventCache(PodCache):
    """Warning events about pods in `namespace`, by the pod's name; `on_event(pod_name)` on each change."""

    def __init__(self, core: k8s.CoreV1Api, namespace: str, *, on_event: Callable[[str], None], **kwargs: Any):
        self._by_pod: dict[str, dict[str, dict]] = {}  # pod name -> event name -> event
        self._on_event = on_event
        super().__init__(
            core,
            namespace,
            EVENT_SELECTOR,
            list_fn=core.list_namespaced_event,
            selector_kind="field_selector",
            **kwargs,
        )

    def for_pod(self, pod_name: str) -> list[dict]:
        with self._cond:
            return list(self._by_pod.get(pod_name, {}).values())

    def forget(self, pod_name: str) -> None:
        """Drop a deleted pod's events (the API server expires them after an hour; we need not wait)."""
        with self._cond:
            self._by_pod.pop(pod_name, None)

    def _relist(self) -> str:
        rv = super()._relist()
        with self._cond:
            self._by_pod = {}
            for event in self._pods.values():
                self._index(event)
        for pod_name in list(self._by_pod):
            self._on_event(pod_name)
        return rv

    def _index(self, event: dict) -> None:
        pod_name = (event.get("involvedObject") or {}).get("name")
        if pod_name:
            self._by_pod.setdefault(pod_name, {})[event["metadata"]["name"]] = event

    def _apply(self, kind: str, obj: dict) -> None:
        super()._apply(kind, obj)
        pod_name = (obj.get("involvedObject") or {}).get("name")
        with self._cond:
            if kind == "DELETED":
                self._by_pod.get(pod_name, {}).pop(obj["metadata"]["name"], None)
            else:
                self._index(obj)
        if pod_name and kind != "DELETED":
            self._on_event(pod_name)


def _failed(message: str, retryable: bool) -> PodAssessment:
    return PodAssessment(state="failed", infra_error=InfraErrorKind.UNAVAILABLE, message=message, retryable=retryable)


def assess_events(
    pod: k8s.V1Pod,
    events: list[dict],
    now: datetime,
    errors_since: dict[str, datetime],
    *,
    grace: float,
    scheduling_grace: float,
    autoscaled_nodes: bool = True,
) -> PodAssessment | None:
    """The failure the pod's Warning events show (see the module docstring), or None to keep waiting.
    `errors_since` holds when each reason was first seen (the caller keeps it across readings)."""
    has_ip = bool(pod.status and pod.status.pod_ip)
    bound = bool(pod.spec and pod.spec.node_name)
    for event in sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
        reason, message = event.get("reason") or "", event.get("message") or ""
        text = f"{reason}: {message} (x{event.get('count') or 1})"
        if reason in _BEFORE_SANDBOX and not has_ip:
            if reason == "FailedCreatePodSandBox" and any(w in message.lower() for w in _FINAL_SANDBOX_WORDS):
                return _failed(
                    f"The node cannot run the sandbox pod's runtime ({text}); check "
                    "ORCHARD_K8S_RUNTIME_CLASS_NAME and the nodes' container runtime.",
                    retryable=False,
                )
            limit = grace
        elif reason in _SCHEDULING and not bound:
            unresolvable = _UNRESOLVABLE.search(message)
            if not autoscaled_nodes and unresolvable and unresolvable[1] == unresolvable[2]:
                return _failed(
                    f"No node can ever take the sandbox pod ({text}); check ORCHARD_K8S_NODE_SELECTOR, "
                    "ORCHARD_K8S_TOLERATIONS and the nodes' labels and taints.",
                    retryable=False,
                )
            limit = scheduling_grace
        else:
            continue
        first = errors_since.setdefault(f"event/{reason}", now)
        if (now - first).total_seconds() >= limit:
            return _failed(f"The sandbox pod did not start for {limit:g} s: {text}.", retryable=True)
    return None
