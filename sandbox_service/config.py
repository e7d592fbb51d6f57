"""Configuration of the sandbox service: one typed object, read from `ORCHARD_*` environment variables
(or a JSON file via `python -m sandbox_service serve --config`), validated at start.

Defaults follow the published system (400 concurrent execs, 50 concurrent creates, heartbeat 180 s,
hard TTL 2 h). The API token never comes from the command line (it would show in `ps`): it is read
from `ORCHARD_SANDBOX_TOKEN` (the same variable the clients and pipeline steps read; the old
`ORCHARD_TOKEN` still works, with a deprecation warning), from `ORCHARD_TOKEN_FILE`, or generated into
`<state_dir>/token` (mode 0600).
"""

from __future__ import annotations

import os
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


TOKEN_ENV = "ORCHARD_SANDBOX_TOKEN"  # one name for the service, its clients and the pipeline steps
DEPRECATED_TOKEN_ENV = "ORCHARD_TOKEN"


def _default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / "orchard-sandbox"


class ServiceConfig(BaseSettings):
    """Every knob of the sandbox service. Environment variables are `ORCHARD_<FIELD>` (upper case)."""

    model_config = SettingsConfigDict(
        env_prefix="ORCHARD_", extra="forbid", validate_default=True, populate_by_name=True
    )

    backend: Literal["local", "kubernetes"] = Field("local", description="Where sandboxes live.")
    unisolated: bool = Field(
        False,
        description="Local backend only: run sandboxes without namespaces/cgroups. Explicit opt-in for machines "
        "that lack them; never the default, because sandboxes then see the host.",
    )
    runtime: Literal["namespaces", "gvisor"] = Field(
        "namespaces",
        description="Local backend only: 'namespaces' (fast, shares the host kernel) or 'gvisor' "
        "(runsc's user-space kernel in between; slower, fewer features). See docs/concepts/threat-model.md.",
    )
    token: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices(TOKEN_ENV, "token"),
        description=f"Bearer token clients must send ({TOKEN_ENV}).",
    )
    token_file: Path | None = Field(None, description="File holding the bearer token (read when `token` is unset).")
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Service-private directory: sandbox roots, snapshots, generated token.",
    )
    host: str = Field("127.0.0.1", description="Listen address.")
    port: int = Field(8765, ge=0, le=65535, description="Listen port (0 = pick a free one).")
    public_url: str | None = Field(
        None, description="Base URL clients reach the service at (for exposed-port URLs); default: the request's."
    )

    max_output_bytes: int = Field(1_000_000, ge=0, description="Default cap on stdout and stderr of one exec, each.")
    max_request_bytes: int = Field(
        1 << 30,
        ge=1024,
        description="Largest request body (file or archive upload); "
        "bigger ones get 413. Uploads are streamed, so this bounds disk, not memory.",
    )
    max_download_bytes: int = Field(
        1 << 30, ge=1024, description="Largest file or archive download (streamed); bigger ones get 413."
    )
    max_port_body_bytes: int = Field(
        32 << 20,
        ge=1024,
        description="Largest request or response body relayed to an exposed port: a bigger "
        "request gets 413, a bigger response 502; neither the service nor the agent ever holds more than this.",
    )
    max_concurrent_execs: int = Field(400, ge=1, description="Execs running at once; more get 503 + Retry-After.")
    max_concurrent_creates: int = Field(50, ge=1, description="Backend creations running at once (others queue).")
    max_pending_creates: int = Field(1000, ge=1, description="Creates queued behind the create cap; more get 503.")
    max_sandboxes: int = Field(2000, ge=1, description="Live (pending or ready) sandboxes; more get 503.")
    max_queued_jobs: int = Field(10_000, ge=1, description="Async exec jobs waiting for an exec slot; more get 503.")
    retry_after_seconds: float = Field(1.0, gt=0, description="Retry-After sent with 503 responses.")
    backend_threads: int = Field(64, ge=1, description="Worker threads for blocking backend calls (start/stop/...).")

    heartbeat_ttl_seconds: float = Field(
        180.0, gt=0, description="Upper bound on a sandbox's heartbeat TTL (a spec asking for more gets this)."
    )
    max_ttl_seconds: float = Field(7200.0, gt=0, description="Upper bound on a sandbox's hard lifetime.")
    reaper_interval_seconds: float = Field(2.0, gt=0, description="How often the reaper looks for lapsed sandboxes.")
    tombstone_seconds: float = Field(600.0, ge=0, description="How long a deleted sandbox still answers GET.")
    job_retention_seconds: float = Field(3600.0, ge=0, description="How long a finished job stays queryable.")
    max_finished_jobs: int = Field(
        10_000,
        ge=0,
        description="Finished jobs kept queryable at most; past this the oldest go first (bounds "
        "memory however many commands the service runs).",
    )

    ready_timeout_seconds: float = Field(60.0, gt=0, description="Agent must answer a ping this soon after start.")
    adopt_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="After a restart, a sandbox the backend adopts must answer a ping this soon, "
        "else it is reaped (its agent runs already: a healthy one answers at once).",
    )
    create_attempts: int = Field(4, ge=1, description="Attempts per create on BackendUnavailableError.")
    create_backoff_seconds: float = Field(0.25, ge=0, description="First retry delay; doubles per attempt, jittered.")
    create_backoff_max_seconds: float = Field(8.0, ge=0, description="Cap on one retry delay.")
    create_jitter_seconds: float = Field(0.0, ge=0, description="Random delay before each creation (spreads bursts).")
    exec_grace_seconds: float = Field(
        15.0, gt=0, description="Service-side deadline = command timeout + this; past it the result is TIMEOUT."
    )

    published_unrestricted_egress: bool = Field(
        False,
        description="The published API's `block_network: false`: when true such sandboxes reach every "
        "public IPv4 address (private, loopback, link-local/cloud-metadata and reserved ranges stay unreachable; "
        "compat/egress.py); when false (the default) it is refused with 400.",
    )

    escalation_enabled: bool = Field(True, description="Global switch for OOM resource escalation.")
    escalation_max_memory_mb: int = Field(16384, ge=16, description="Global cap over every spec's escalation cap.")

    @model_validator(mode="before")
    @classmethod
    def _deprecated_token_env(cls, data: object) -> object:
        # populate_by_name also makes the settings source read ORCHARD_TOKEN (prefix + field name):
        # that value is the deprecated spelling; the new name wins when both are set.
        old, new = os.environ.get(DEPRECATED_TOKEN_ENV), os.environ.get(TOKEN_ENV)
        if not old or not isinstance(data, dict):
            return data
        given = next((data[k] for k in ("token", TOKEN_ENV, TOKEN_ENV.lower()) if data.get(k)), None)
        if given not in (None, old):
            return data  # set explicitly (argument or config file)
        if new:
            return {**{k: v for k, v in data.items() if k not in (TOKEN_ENV, TOKEN_ENV.lower())}, "token": new}
        warnings.warn(
            f"{DEPRECATED_TOKEN_ENV} is deprecated; set {TOKEN_ENV} (the name the clients read)",
            DeprecationWarning,
            stacklevel=2,
        )
        return {**data, "token": old}

    @model_validator(mode="after")
    def _check(self) -> "ServiceConfig":
        if self.unisolated and self.backend != "local":
            raise ValueError("unisolated=true only applies to backend='local'")
        return self

    def resolve_token(self) -> tuple[str, str]:
        """The token and where it came from; generates `<state_dir>/token` if none was given."""
        if self.token is not None and self.token.get_secret_value():
            return self.token.get_secret_value(), TOKEN_ENV
        if self.token_file is not None:
            value = self.token_file.read_text().strip()
            if not value:
                raise ValueError(f"token file {self.token_file} is empty; put the bearer token in it")
            return value, str(self.token_file)
        path = self.state_dir / "token"
        if path.exists() and path.read_text().strip():
            return path.read_text().strip(), str(path)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        value = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")
        return value, f"{path} (generated)"
