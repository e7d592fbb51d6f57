"""How stages reach the sandbox service (passed as a parameter between pipeline steps)."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from sandbox_service.client import AsyncSandboxClient, SandboxClient


class SandboxConnection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(
        default_factory=lambda: os.environ.get("ORCHARD_SANDBOX_URL", "http://127.0.0.1:8765"),
        description="Base URL of the sandbox service.",
    )
    token: str | None = Field(
        default_factory=lambda: os.environ.get("ORCHARD_SANDBOX_TOKEN"),
        description="Bearer token (in Kubernetes: from a Secret, never a param).",
    )
    timeout_seconds: float = Field(60.0, gt=0, description="Default HTTP timeout per call.")

    def client(self) -> SandboxClient:
        return SandboxClient(self.url, self.token, timeout=self.timeout_seconds)

    def async_client(self) -> AsyncSandboxClient:
        return AsyncSandboxClient(self.url, self.token, timeout=self.timeout_seconds)
