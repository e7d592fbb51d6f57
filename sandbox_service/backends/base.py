"""The backend contract: *where* a sandbox lives. Exec and file calls never go through a backend;
they go to the in-sandbox agent at the `AgentEndpoint` the backend returns, so callers never know
which backend they have.
"""

from __future__ import annotations

import abc
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandbox_service.models import InfraErrorKind, NetworkPolicy, Resources, SandboxCreate


class AgentEndpoint(BaseModel):
    """How the control plane reaches a sandbox's agent. Every request carries `secret`."""

    model_config = ConfigDict(extra="forbid")
    transport: Literal["unix", "tcp"]
    address: str = Field(description="Unix socket path, or host:port (a pod IP in Kubernetes).")
    secret: str = Field(description="Per-sandbox shared secret; the agent refuses requests without it.")
    tls: bool = Field(False, description="True where traffic crosses a network (Kubernetes).")
    ca_cert_pem: str | None = Field(None, description="CA the agent's certificate is signed by (tls only).")
    boot_secret: str | None = Field(
        None,
        description="The key a fresh agent starts with when it is not `secret` (Kubernetes: the only key in "
        "the pod's files, which the workload can read): the service re-keys the agent to "
        "`secret` as soon as it answers, before anything else uses it (runtime.take_over).",
    )


class BackendStatus(BaseModel):
    """What the backend knows about a running sandbox, independent of its agent."""

    model_config = ConfigDict(extra="forbid")
    alive: bool
    infra_error: InfraErrorKind | None = None
    message: str | None = None


class AdoptedSandbox(BaseModel):
    """A sandbox an earlier run of the service started and this one takes over (`SandboxBackend.adopt`)."""

    model_config = ConfigDict(extra="forbid")
    sandbox_id: str
    spec: SandboxCreate = Field(description="As created (env included); from_snapshot dropped.")
    resources: Resources = Field(description="What it runs with now (an escalation raises the memory).")
    secret: str = Field(description="The agent's shared secret.")
    endpoint: AgentEndpoint
    created_at: datetime = Field(description="When its current incarnation started: the hard TTL counts from it.")


class SandboxBackend(abc.ABC):
    """A place to run sandboxes. Implementations: `local.LocalBackend`, `kubernetes.KubernetesBackend`."""

    name: str

    @abc.abstractmethod
    def start(self, sandbox_id: str, spec: SandboxCreate, resources: Resources, secret: str) -> AgentEndpoint:
        """Create the sandbox and start its agent; return where the agent listens.

        May block (it runs in a worker thread). Raises `BackendUnavailableError` for transient failures
        (retried with backoff by the service) and other `SandboxServiceError`s for permanent ones.
        Readiness is decided by the service: the sandbox is `ready` only once the agent answers.
        """

    def check_image(self, image: str) -> None:
        """Raise `InvalidRequestError` (400) for an image this backend can never run, e.g. a host path on the
        local backend; called when a create is accepted, before anything starts. Default: any image."""

    def knows_image(self, image: str) -> bool:
        """Whether `image` names something this backend has (the local backend's built roots); backends
        that pull images by reference know them all."""
        return True

    @abc.abstractmethod
    def status(self, sandbox_id: str) -> BackendStatus:
        """Is it alive; if not, why (OOM_KILLED, SANDBOX_CRASHED, IMAGE_PULL_FAILED, ...)."""

    def status_after_agent_loss(self, sandbox_id: str) -> BackendStatus:
        """`status()` once the agent stopped answering. A backend whose status lags the sandbox's death
        (a kubelet reports an OOM kill seconds later) waits here until the status is final."""
        return self.status(sandbox_id)

    @abc.abstractmethod
    def stop(self, sandbox_id: str) -> None:
        """Delete the sandbox and free everything it holds. Idempotent."""

    @abc.abstractmethod
    def apply_network_policy(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Enforce the egress policy (namespaces/iptables locally, a NetworkPolicy in Kubernetes)."""

    @abc.abstractmethod
    def snapshot(self, sandbox_id: str, snapshot_id: str) -> int:
        """Save the sandbox's writable filesystem under `snapshot_id`; return its size in bytes."""

    @abc.abstractmethod
    def restore(self, sandbox_id: str, snapshot_id: str) -> None:
        """Replace the sandbox's writable filesystem with a snapshot's (processes may be restarted)."""

    @abc.abstractmethod
    def delete_snapshot(self, snapshot_id: str) -> None:
        """Free a snapshot. Idempotent."""

    def health(self) -> str | None:
        """Can the backend create sandboxes now? None if so, else why not (one line). Cheap and bounded:
        `/healthz` (the readiness probe) calls it every few seconds. Default: nothing outside the process."""
        return None

    @property
    def keeps_sandboxes_on_shutdown(self) -> bool:
        """True where the next start adopts running sandboxes (`adopt`): shutdown then leaves ready ones."""
        return False

    def adopt(self) -> list[AdoptedSandbox]:
        """At start, before listening: the running sandboxes an earlier run left that this one can keep
        serving. `list_orphans` then names only what could not be adopted."""
        return []

    def list_orphans(self) -> list[str]:
        """Sandbox ids the backend holds that the service does not know (for cleanup at start)."""
        return []

    def clear_stale_snapshots(self) -> list[str]:
        """At start: remove snapshots an earlier service instance left (its registry died with it)."""
        return []

    def close(self) -> None:
        """Release backend-wide resources at service shutdown."""
