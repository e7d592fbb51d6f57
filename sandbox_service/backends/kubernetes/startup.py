"""Waiting for a new sandbox pod to run, on the backend's watches: no API call of its own.

start() returns once the sandbox container runs (image pulled, the agent starting) with the pod IP.
This waits longer than "has an IP" on purpose: pulling a multi-GB task image is the pod's start, and
the service's agent-readiness timeout is sized for the agent, not for a pull. Failures come from the
pod's status (kubernetes_status) and, while it is pending, from Warning events (kubernetes_events):
retryable ones as BackendUnavailableError (the service tries again), final ones as PodStartError.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes import client as k8s

from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.events import EventCache, assess_events
from sandbox_service.backends.kubernetes.status import PodAssessment
from sandbox_service.backends.kubernetes.watch import PodCache
from sandbox_service.errors import BackendUnavailableError, SandboxServiceError
from sandbox_service.models import InfraErrorKind


class PodStartError(SandboxServiceError):
    """The pod cannot come up and waiting will not help (bad image, crash on start)."""

    code = "sandbox_start_failed"

    def __init__(self, message: str, infra_error: InfraErrorKind):
        super().__init__(message)
        self.infra_error = infra_error  # the service records this kind on the failed sandbox


def wait_running(
    pod_name: str,
    events: EventCache,
    pods: PodCache,
    assess: Callable[[k8s.V1Pod, dict[str, datetime]], PodAssessment],
    clock: Callable[[], datetime],
    cfg: KubernetesBackendConfig,
) -> str:
    """Wait until the sandbox container runs; return the pod IP. `assess(pod, errors_since)` judges its status."""
    last: dict[str, Any] = {}
    errors_since: dict[str, datetime] = {}  # grace periods run from the first error seen, not from creation

    def settled(pod: k8s.V1Pod | None) -> PodAssessment | None:
        if pod is None:  # not in the watch yet (it lags the create), or gone since
            return (
                PodAssessment(
                    state="failed",
                    infra_error=InfraErrorKind.SANDBOX_DELETED,
                    message=f"pod {pod_name} was deleted while starting",
                )
                if last
                else None
            )
        seen = assess(pod, errors_since)
        if seen.state == "pending":  # failures only Events tell (no pod IPs left, a mount that fails)
            seen = (
                assess_events(
                    pod,
                    events.for_pod(pod_name),
                    clock(),
                    errors_since,
                    grace=cfg.event_error_grace_seconds,
                    scheduling_grace=cfg.unschedulable_timeout_seconds,
                    autoscaled_nodes=cfg.autoscaled_nodes,
                )
                or seen
            )
        last["pod"], last["seen"] = pod, seen
        return seen if seen.state != "pending" else None

    seen = pods.wait(pod_name, settled, cfg.start_timeout_seconds)
    if seen is None:
        pod, pending = last.get("pod"), last.get("seen")
        err = BackendUnavailableError(
            f"pod {pod_name} was not running after {cfg.start_timeout_seconds:g} s "
            f"(phase {pod.status.phase if pod is not None and pod.status else 'not seen'}"
            f"{': ' + pending.message if pending is not None and pending.message else ''}"
            f"{''.join('; ' + e.get('reason', '') + ': ' + e.get('message', '') for e in events.for_pod(pod_name))}"
            f"{'; pod watch: ' + pods.last_error if pods.last_error else ''})",
            infra_error=InfraErrorKind.TIMEOUT,
        )
        raise err
    if seen.state == "running" and seen.pod_ip:
        return seen.pod_ip
    assert seen.infra_error is not None
    if seen.retryable:
        raise BackendUnavailableError(seen.message or "sandbox pod failed", infra_error=seen.infra_error)
    raise PodStartError(seen.message or "sandbox pod failed", seen.infra_error)
