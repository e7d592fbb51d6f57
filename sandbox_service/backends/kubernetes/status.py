"""What a sandbox pod's status means for the service: pending, running, or failed and why.

Pure functions of a `V1Pod`, so each mapping (OOMKilled, image pull errors, eviction, unschedulable,
node drain) is tested on the objects the API returns, without a cluster.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from kubernetes import client as k8s
from pydantic import BaseModel, ConfigDict

from sandbox_service.backends.kubernetes.objects import AGENT_CONTAINER, INJECTOR_CONTAINER
from sandbox_service.models import InfraErrorKind

_PULL_ERRORS = {"ErrImagePull", "ImagePullBackOff"}
# Never fixed by waiting: the reference itself is wrong, or the policy forbids pulling.
_PULL_ERRORS_PERMANENT = {"InvalidImageName", "ErrImageNeverPull"}
# A registry that throttles (429) or times out is worth another try, later or on another node.
_PULL_TRANSIENT_WORDS = (
    "429",
    "toomanyrequests",
    "too many requests",
    "rate limit",
    "timeout",
    "timed out",
    "deadline exceeded",
    "connection reset",
    "connection refused",
    "503",
    "502",
    "eof",
)
# containerd often recovers from these (a busy runtime, a Secret not yet synced to the node).
_CONTAINER_TRANSIENT = {
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "PreCreateHookError",
    "PreStartHookError",
}
_CRASH_WAITING = {"CrashLoopBackOff"}


class PodAssessment(BaseModel):
    """One reading of a pod. `retryable` failures are worth a new attempt (another node, later)."""

    model_config = ConfigDict(extra="forbid")
    state: Literal["pending", "running", "failed"]
    pod_ip: str | None = None
    infra_error: InfraErrorKind | None = None
    message: str | None = None
    retryable: bool = False


def _age_seconds(since: datetime | None, now: datetime) -> float:
    if since is None:
        return 0.0
    if since.tzinfo is None:
        since = since.replace(tzinfo=timezone.utc)
    return (now - since).total_seconds()


def _image_of(pod: k8s.V1Pod, container_name: str, fallback: str | None) -> str:
    for c in list(pod.spec.init_containers or []) + list(pod.spec.containers or []):
        if c.name == container_name:
            return c.image
    return fallback or "?"


def _failed(kind: InfraErrorKind, message: str, retryable: bool = False) -> PodAssessment:
    return PodAssessment(state="failed", infra_error=kind, message=message, retryable=retryable)


def _role(cs: k8s.V1ContainerStatus) -> str:
    return "agent injector" if cs.name == INJECTOR_CONTAINER else "sandbox"


def _check_oom(cs: k8s.V1ContainerStatus) -> PodAssessment | None:
    for state in (cs.state, cs.last_state):
        term = state.terminated if state else None
        if term is not None and term.reason == "OOMKilled":
            return _failed(
                InfraErrorKind.OOM_KILLED,
                f"The {_role(cs)} container exceeded its memory limit and was OOM-killed "
                f"(exit code {term.exit_code}); recreate it with more memory.",
            )
    return None


def _error_age(
    pod: k8s.V1Pod, cs: k8s.V1ContainerStatus, reason: str, now: datetime, errors_since: dict[str, datetime] | None
) -> float:
    """How long this error has lasted: from when it was first seen when the caller tracks that
    (`errors_since`), else from the pod's creation (an upper bound)."""
    if errors_since is None:
        return _age_seconds(pod.metadata.creation_timestamp, now)
    return _age_seconds(errors_since.setdefault(f"{cs.name}/{reason}", now), now)


def _check_container(
    pod: k8s.V1Pod,
    cs: k8s.V1ContainerStatus,
    now: datetime,
    image_pull_grace: float,
    container_error_grace: float,
    errors_since: dict[str, datetime] | None,
) -> PodAssessment | None:
    """A failure other than OOM visible in one container's status, or None."""
    role = _role(cs)
    waiting = cs.state.waiting if cs.state else None
    if waiting is not None and waiting.reason in _PULL_ERRORS | _PULL_ERRORS_PERMANENT:
        image = _image_of(pod, cs.name, cs.image)
        permanent = waiting.reason in _PULL_ERRORS_PERMANENT
        transient = not permanent and any(w in (waiting.message or "").lower() for w in _PULL_TRANSIENT_WORDS)
        if permanent or _error_age(pod, cs, "pull", now, errors_since) >= image_pull_grace:
            return _failed(
                InfraErrorKind.IMAGE_PULL_FAILED,
                f"Could not pull the {role} image {image!r} ({waiting.reason}: "
                f"{waiting.message or 'no detail'}). "
                + (
                    "The registry throttled or timed out; the service tries again."
                    if transient
                    else "Check the image name and tag, the registry's reachability from the nodes, "
                    "and imagePullSecrets."
                ),
                retryable=transient,
            )
        return None  # kubelet is still retrying; a registry hiccup may pass
    if waiting is not None and waiting.reason in _CONTAINER_TRANSIENT:
        if _error_age(pod, cs, waiting.reason, now, errors_since) >= container_error_grace:
            return _failed(
                InfraErrorKind.SANDBOX_CRASHED,
                f"The {role} container could not be created for {container_error_grace:g} s "
                f"({waiting.reason}: {waiting.message or 'no detail'}).",
                retryable=True,
            )
        return None  # the runtime retries; containerd often recovers
    if waiting is not None and waiting.reason in _CRASH_WAITING:
        return _failed(
            InfraErrorKind.SANDBOX_CRASHED,
            f"The {role} container could not start ({waiting.reason}: {waiting.message or 'no detail'}).",
        )
    term = cs.state.terminated if cs.state else None
    if term is not None and cs.name == AGENT_CONTAINER:
        return _failed(
            InfraErrorKind.SANDBOX_CRASHED,
            f"The sandbox agent exited (exit code {term.exit_code}, {term.reason or 'no reason'}"
            f"{': ' + term.message if term.message else ''}).",
        )
    if term is not None and cs.name == INJECTOR_CONTAINER and term.exit_code not in (0, None):
        return _failed(
            InfraErrorKind.SANDBOX_CRASHED,
            f"The agent injector failed (exit code {term.exit_code}): does image "
            f"{_image_of(pod, cs.name, cs.image)!r} hold the agent under /opt/orchard?",
        )
    return None


def _condition(pod: k8s.V1Pod, kind: str) -> k8s.V1PodCondition | None:
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == kind:
            return cond
    return None


def assess_pod(
    pod: k8s.V1Pod,
    now: datetime,
    *,
    unschedulable_timeout: float,
    image_pull_grace: float,
    container_error_grace: float = 60.0,
    errors_since: dict[str, datetime] | None = None,
) -> PodAssessment:
    """Map a pod to pending/running/failed with the infrastructure error that explains a failure.

    Transient errors (image pulls, container creation) fail only once they have lasted their grace
    period, counted from when `errors_since` (kept by the caller across readings) first saw them."""
    status = pod.status or k8s.V1PodStatus()
    if pod.metadata.deletion_timestamp is not None:
        return _failed(InfraErrorKind.SANDBOX_DELETED, "The sandbox pod is being deleted.")
    statuses = list(status.init_container_statuses or []) + list(status.container_statuses or [])
    # Order matters: OOM first (it drives escalation), then the pod-level reason (an eviction also
    # leaves terminated containers behind), then what single containers say.
    for cs in statuses:
        if (found := _check_oom(cs)) is not None:
            return found
    phase = status.phase or "Pending"
    if phase == "Failed" and status.reason == "Evicted":
        return _failed(
            InfraErrorKind.SANDBOX_CRASHED,
            f"The sandbox pod was evicted: {status.message or 'no detail'}",
            retryable=True,
        )
    if phase == "Failed" and status.reason == "DeadlineExceeded":
        return _failed(
            InfraErrorKind.SANDBOX_DELETED,
            "The sandbox reached its hard lifetime (ttl_seconds, the pod's activeDeadlineSeconds).",
        )
    for cs in statuses:
        if (found := _check_container(pod, cs, now, image_pull_grace, container_error_grace, errors_since)) is not None:
            return found
    if phase == "Failed":
        return _failed(
            InfraErrorKind.SANDBOX_CRASHED,
            f"The sandbox pod failed ({status.reason or 'no reason'}: {status.message or 'no detail'}).",
        )
    if phase == "Succeeded":
        return _failed(InfraErrorKind.SANDBOX_CRASHED, "The sandbox agent exited (pod phase Succeeded).")
    if phase == "Unknown":
        return _failed(
            InfraErrorKind.AGENT_LOST, "The sandbox's node stopped reporting (pod phase Unknown).", retryable=True
        )
    disruption = _condition(pod, "DisruptionTarget")
    if disruption is not None and disruption.status == "True":
        # A drained or preempted node: the pod still looks Running, but it is going away.
        return _failed(
            InfraErrorKind.SANDBOX_CRASHED,
            f"The sandbox pod is being disrupted ({disruption.reason}: {disruption.message or 'no detail'}).",
            retryable=True,
        )
    scheduled = _condition(pod, "PodScheduled")
    if (
        phase == "Pending"
        and scheduled is not None
        and scheduled.status == "False"
        and scheduled.reason == "Unschedulable"
    ):
        waited = _age_seconds(pod.metadata.creation_timestamp, now)
        if waited >= unschedulable_timeout:
            return _failed(
                InfraErrorKind.UNAVAILABLE,
                f"No node could take the sandbox for {waited:.0f} s: {scheduled.message or 'unschedulable'}.",
                retryable=True,
            )
        return PodAssessment(state="pending", message=scheduled.message)
    if phase == "Running" and status.pod_ip:
        return PodAssessment(state="running", pod_ip=status.pod_ip)
    return PodAssessment(state="pending", pod_ip=status.pod_ip)
