"""Configuration of the local backend, and the check that this machine can isolate sandboxes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandbox_service.backends.local_cgroups import detect_version
from sandbox_service.errors import IsolationUnavailableError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Credentials and control-plane state found on hosts like this one; paths that do not exist are skipped.
DEFAULT_MASKS = [
    "/root/.ssh", "/root/.gnupg", "/root/.aws", "/root/.azure", "/root/.kube", "/root/.docker",
    "/root/.config/gcloud", "/root/.config/gh", "/root/.config/chromium", "/root/.netrc", "/root/.git-credentials",
    "/root/.pypirc", "/root/.npmrc", "/root/.m2/settings.xml", "/root/.cargo/credentials",
    "/root/.cargo/credentials.toml", "/root/.huggingface", "/root/.cache/huggingface/token", "/root/.claude",
    "/root/.bash_history", "/work/.library", "/mnt/sandboxing", "/var/lib/orchard", "/var/run/secrets",
    "/run/secrets", "/etc/orchard",
]


class LocalBackendConfig(BaseModel):
    """Settings of the local (namespaces) backend."""

    model_config = ConfigDict(extra="forbid")
    state_dir: Path = Field(Path("/var/lib/orchard"), description="Sandbox layers, sockets, records, snapshots.")
    isolation: Literal["namespaces", "none"] = Field(
        "namespaces", description="'none' runs agents as plain subprocesses (explicit operator choice only).")
    cgroup_parent: str | None = Field(
        None, description="cgroup directory (per controller) holding sandbox groups; default "
        "'orchard-<hash of state_dir>', so services with different state dirs never share one.")
    mask_paths: list[str] = Field(default_factory=lambda: list(DEFAULT_MASKS),
                                  description="Host paths hidden inside sandboxes (empty read-only mounts).")
    extra_ro_binds: list[str] = Field(default_factory=list,
                                      description="Host mounts outside the root filesystem to show read-only.")
    prepend_service_python_to_path: bool = Field(
        True, description="Prefix PATH with the service interpreter's bin dir (image=None only).")
    agent_python: str | None = Field(None, description="Interpreter for the agent (default: the host's base python).")
    boot_timeout_seconds: float = Field(15.0, gt=0, description="Give up on a sandbox whose agent is not up by then.")
    tmp_size_mb: int = Field(1024, ge=1, description="Size of each sandbox's private /tmp tmpfs.")
    allowlist_subnet: str = Field("10.213.0.0/16", description="Addresses for sandboxes in allowlist mode.")
    fast_start: bool = Field(True, description="Fork sandboxes from a pre-imported agent (zygote) instead of "
                             "starting an interpreter per sandbox (saves ~30-100 ms each).")
    net_index_dir: Path = Field(Path("/run/orchard/net-slots"),
                                description="Machine-wide allocation of veth names/addresses (one file per slot).")

    @classmethod
    def from_env(cls, **overrides) -> "LocalBackendConfig":
        """ORCHARD_STATE_DIR, ORCHARD_UNISOLATED=1 override the defaults."""
        values: dict = {}
        if os.environ.get("ORCHARD_STATE_DIR"):
            values["state_dir"] = Path(os.environ["ORCHARD_STATE_DIR"])
        if os.environ.get("ORCHARD_UNISOLATED") == "1":
            values["isolation"] = "none"
        return cls(**{**values, **overrides})


def check_isolation() -> None:
    """Raise IsolationUnavailableError saying what is missing for namespaced sandboxes."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the service is not root (namespaces, mounts and cgroups need root)")
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        problems.append("util-linux `unshare`/`nsenter` are not installed")
    if shutil.which("ip") is None:
        problems.append("iproute2 `ip` is not installed")
    try:
        if "overlay" not in Path("/proc/filesystems").read_text():
            problems.append("the kernel has no overlay filesystem")
    except OSError:
        problems.append("/proc is not mounted")
    for ns in ("mnt", "pid", "net", "uts", "ipc"):
        if not Path(f"/proc/self/ns/{ns}").exists():
            problems.append(f"the kernel lacks {ns} namespaces")
    try:
        detect_version()
    except IsolationUnavailableError as exc:
        problems.append(str(exc))
    if problems:
        raise IsolationUnavailableError(
            "local sandboxes cannot be isolated: " + "; ".join(problems)
            + ". Fix that, or start the service with ORCHARD_UNISOLATED=1 (LocalBackendConfig(isolation='none')) "
            "to run commands without isolation at your own risk.")
