"""Wire models of the sandbox service: every request and response that crosses the REST boundary.

The same models are used by the server (`api.py`), the Python clients (`client.py`) and the
backends, so a field means one thing everywhere.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SandboxState(str, enum.Enum):
    pending = "pending"
    ready = "ready"
    failed = "failed"
    deleted = "deleted"


class InfraErrorKind(str, enum.Enum):
    """Why the infrastructure (not the command) failed. Rewards never count these as policy failures."""

    OOM_KILLED = "OOM_KILLED"  # only for verification runs; a policy command's OOM is command_failed/oom
    TIMEOUT = "TIMEOUT"  # the service or agent did not answer in time (not the command's own timeout)
    AGENT_LOST = "AGENT_LOST"
    SANDBOX_CRASHED = "SANDBOX_CRASHED"
    SANDBOX_DELETED = "SANDBOX_DELETED"
    IMAGE_PULL_FAILED = "IMAGE_PULL_FAILED"
    UNAVAILABLE = "UNAVAILABLE"  # backend could not place/create the sandbox (retryable)


class Resources(_Model):
    cpu: float = Field(1.0, gt=0, description="CPU cores (cgroup quota locally, limits in Kubernetes).")
    memory_mb: int = Field(1024, ge=16, description="Memory limit in MiB; exceeding it is an OOM kill.")
    pids: int = Field(
        512,
        ge=8,
        description="Maximum number of processes and threads of the commands (fork-bomb guard); on local cgroup v1 "
        "hosts the agent threads that started commands count too (one per connection, typically 1-4).",
    )
    disk_mb: int = Field(2048, ge=16, description="Writable-layer size hint in MiB.")


class EscalationPolicy(_Model):
    """Resource escalation: a sandbox killed for memory is recreated with more memory, up to a cap."""

    enabled: bool = Field(True, description="Recreate OOM-killed sandboxes with a higher memory limit.")
    factor: float = Field(2.0, gt=1.0, description="Memory multiplier per escalation level.")
    max_memory_mb: int = Field(8192, ge=16, description="Never escalate beyond this memory limit.")


class NetworkPolicy(_Model):
    """Egress policy of a sandbox. The default is no network at all (not even loopback services of the host)."""

    mode: Literal["none", "loopback", "allowlist"] = Field(
        "none", description="none: no interface; loopback: lo only; allowlist: lo plus the hosts/CIDRs below."
    )
    allow_hosts: list[str] = Field(default_factory=list, description="Host names allowed in allowlist mode.")
    allow_cidrs: list[str] = Field(default_factory=list, description="CIDRs allowed in allowlist mode.")


class SandboxCreate(_Model):
    image: str | None = Field(
        None,
        description="Local backend: a root directory to overlay (None = the host root, read-only). "
        "Kubernetes backend: a container image reference.",
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Free-form labels, used to filter lists.")
    resources: Resources = Field(default_factory=Resources)
    escalation: EscalationPolicy = Field(default_factory=EscalationPolicy)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    env: dict[str, str] = Field(default_factory=dict, description="Environment for every exec in the sandbox.")
    workdir: str = Field("/workspace", description="Default working directory (created if missing).")
    heartbeat_ttl_seconds: float = Field(
        180.0, gt=0, description="Reaped when no heartbeat (or any call) arrives for this long."
    )
    ttl_seconds: float = Field(7200.0, gt=0, description="Hard lifetime cap, whatever the heartbeats.")
    from_snapshot: str | None = Field(None, description="Start from this snapshot's filesystem (fork).")
    request_id: str | None = Field(
        None, description="Idempotency key: a retried create with the same id returns the same sandbox."
    )


class EscalationEvent(_Model):
    at: datetime
    reason: InfraErrorKind
    from_memory_mb: int
    to_memory_mb: int


class SandboxInfo(_Model):
    id: str
    state: SandboxState
    image: str | None = None
    backend: str
    labels: dict[str, str] = Field(default_factory=dict)
    resources: Resources
    network: NetworkPolicy
    created_at: datetime
    ready_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    error: str | None = Field(None, description="Why the sandbox failed (state=failed).")
    infra_error: InfraErrorKind | None = None
    attempts: int = Field(1, description="Creation attempts (retries on transient failures).")
    escalations: list[EscalationEvent] = Field(default_factory=list)


class ExecRequest(_Model):
    command: list[str] | str = Field(description="argv list (no shell) or a shell string run by /bin/sh -c.")
    cwd: str | None = Field(None, description="Working directory inside the sandbox (default: its workdir).")
    env: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float = Field(60.0, gt=0, le=86400, description="Killed with its whole process tree after this.")
    stdin: str | None = Field(None, description="Text fed to the command's standard input.")
    max_output_bytes: int | None = Field(
        None, ge=0, description="Cap for stdout and stderr each (default: the service's configured cap)."
    )
    wait: bool = Field(True, description="False: return a Job at once and run in the background.")
    verification: bool = Field(
        False,
        description="A verification run the harness starts (hidden tests), not a policy's command: its "
        "own OOM is then an infrastructure error and escalates memory. The harness never sets it on tool calls.",
    )


class ExecOutcome(str, enum.Enum):
    ok = "ok"  # exit code 0
    command_failed = "command_failed"  # non-zero exit: the command's (the policy's) failure
    command_timeout = "command_timeout"  # the command exceeded its own timeout: the policy's failure
    infrastructure_error = "infrastructure_error"  # see infra_error: never the policy's fault


class ExecResult(_Model):
    exit_code: int | None = Field(description="Exit status; negative = killed by that signal; None = never ran.")
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_seconds: float = 0.0
    outcome: ExecOutcome
    infra_error: InfraErrorKind | None = None
    reason: Literal["oom"] | None = Field(
        None,
        description="Why a command failed when its exit code alone does not say: `oom` = killed by the "
        "kernel at the sandbox's memory limit (the command's outcome, counted against the policy).",
    )
    message: str | None = Field(None, description="Human-readable detail for timeouts and infra errors.")

    @property
    def ok(self) -> bool:
        return self.outcome is ExecOutcome.ok

    @property
    def is_infra_error(self) -> bool:
        return self.outcome is ExecOutcome.infrastructure_error


class JobState(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"  # ran to completion (whatever its exit code)
    failed = "failed"  # could not run to completion (sandbox deleted, infra error)


class Job(_Model):
    id: str
    sandbox_id: str
    state: JobState
    created_at: datetime
    finished_at: datetime | None = None
    result: ExecResult | None = None
    reason: str | None = None


class FileEntry(_Model):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    modified_at: datetime


class PatchRequest(_Model):
    patch: str = Field(description="A unified diff (as produced by git diff or diff -u).")
    cwd: str | None = Field(None, description="Directory the patch paths are relative to (default: workdir).")
    strip: int = Field(1, ge=0, description="Leading path components to strip (patch -p).")


class PatchResult(_Model):
    applied: bool
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""


class SnapshotInfo(_Model):
    id: str
    sandbox_id: str
    created_at: datetime
    size_bytes: int


class PortExposure(_Model):
    port: int
    url: str = Field(description="Service URL that proxies to the port; the token in it is the credential.")
    token: str


class ErrorBody(_Model):
    code: str = Field(description="Machine-readable error code, e.g. sandbox_not_found.")
    message: str = Field(description="What was wrong and what to do.")
