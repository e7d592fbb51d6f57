"""Wire models of the published environment API (`orchard_env/docs/api.md` of microsoft/Orchard).

Field names, types and defaults follow that reference so its SDK and training examples work unchanged
against our service; `outcome` and `infra_error` on jobs are our additions (extra keys, which its SDK
ignores) so a caller can still tell a command's failure from the infrastructure's.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandbox_service.errors import InvalidRequestError

_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSandbox(_In):
    image: str = Field(
        description="Container image (Kubernetes backend: pulled by reference). Local backend: "
        "the built root of that name in the image directory; a name it has not "
        "built runs on the default root; host paths are refused (400)."
    )
    block_network: bool = Field(
        True,
        description="False: unrestricted egress, offered only where the operator "
        "set published_unrestricted_egress (the public internet; "
        "private and metadata addresses stay unreachable).",
    )
    sandbox_id: str | None = Field(None, description="Custom id (DNS label: lowercase, digits, '-').")
    cpu: str | None = Field(None, description="CPU cores, e.g. '4' or '2000m'.")
    memory: str | None = Field(None, description="Memory, e.g. '16Gi', '512Mi', '1G'.")
    timeout: int | None = Field(None, gt=0, description="Seconds the sandbox may take to become ready.")

    @field_validator("sandbox_id")
    @classmethod
    def _dns_label(cls, value: str | None) -> str | None:
        if value is not None and not _ID.fullmatch(value):
            raise ValueError("sandbox_id must be a DNS label: 1-63 lowercase letters, digits or '-'")
        return value


class ExecCommand(_In):
    command: str | list[str] = Field(description="A bash command string, or an argv list (no shell).")
    timeout_seconds: int | None = Field(None, gt=0, le=86400, description="Kill the command after this (300).")
    cwd: str | None = Field(None, description="Working directory (default: the sandbox's /workspace).")
    env: dict[str, str] | None = None
    login_shell: bool = Field(False, description="bash -lc instead of bash -c for string commands.")
    wait: bool = Field(False, description="Block until the job ends and return the whole job object.")


class ApplyPatch(_In):
    patch: str = Field(description="Unified diff, paths relative to /workspace with one leading component.")
    timeout_seconds: int = Field(
        30, gt=0, description="Accepted for compatibility; patches run under the service's own 120 s cap."
    )


class UploadFile(_In):
    path: str = Field(description="Destination anywhere in the sandbox (absolute, or relative to /workspace).")
    content: str = Field(description="Base64 file content.")


class JobView(BaseModel):
    job_id: str
    sandbox_id: str
    command: str
    status: Literal["queued", "running", "succeeded", "failed"]
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    created_at: float
    started_at: float | None = None
    completed_at: float | None = None
    error: str | None = None
    outcome: str | None = Field(None, description="Ours: ok | command_failed | command_timeout | infrastructure_error.")
    infra_error: str | None = Field(None, description="Ours: the infrastructure failure kind, if any.")


class FileInfo(BaseModel):
    name: str
    type: Literal["file", "directory"]
    size: int
    modified: str | None = None


def parse_cpu(value: str | None) -> float | None:
    """'4' -> 4.0, '2000m' -> 2.0 (Kubernetes quantity notation)."""
    if value is None:
        return None
    try:
        cores = float(value[:-1]) / 1000 if value.endswith("m") else float(value)
    except ValueError:
        raise InvalidRequestError(f"cpu {value!r} is not a quantity like '4' or '2000m'") from None
    if cores <= 0:
        raise InvalidRequestError(f"cpu {value!r} must be positive")
    return cores


_MEMORY_UNITS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "": 1,
}


def parse_memory_mb(value: str | None) -> int | None:
    """'16Gi' -> 16384, '1G' -> 953 (MiB, rounded down; Kubernetes quantity notation)."""
    if value is None:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T|)", value.strip())
    if match is None:
        raise InvalidRequestError(f"memory {value!r} is not a quantity like '16Gi' or '512Mi'")
    mb = int(float(match.group(1)) * _MEMORY_UNITS[match.group(2)] // 2**20)
    if mb < 16:
        raise InvalidRequestError(f"memory {value!r} is below the 16 MiB minimum")
    return mb


def format_cpu(cores: float) -> str:
    return f"{cores:g}" if cores >= 1 else f"{round(cores * 1000)}m"
