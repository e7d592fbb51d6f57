"""Configuration of the local backend, and the check that this machine can isolate sandboxes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox_service.backends.local.ceilings import PTY_MAX_LIMIT
from sandbox_service.backends.local.cgroups import detect_version
from sandbox_service.errors import IsolationUnavailableError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Credentials and control-plane state found on hosts like this one; paths that do not exist are skipped.
DEFAULT_MASKS = [
    "/root/.ssh",
    "/root/.gnupg",
    "/root/.aws",
    "/root/.azure",
    "/root/.kube",
    "/root/.docker",
    "/root/.config/gcloud",
    "/root/.config/gh",
    "/root/.config/chromium",
    "/root/.netrc",
    "/root/.git-credentials",
    "/root/.pypirc",
    "/root/.npmrc",
    "/root/.m2/settings.xml",
    "/root/.cargo/credentials",
    "/root/.cargo/credentials.toml",
    "/root/.huggingface",
    "/root/.cache/huggingface/token",
    "/root/.claude",
    "/root/.bash_history",
    "/work/.library",
    "/mnt/sandboxing",
    "/var/lib/orchard",
    "/var/run/secrets",
    "/run/secrets",
    "/etc/orchard",
]
# The host directories a sandbox without an image sees, read-only (nothing else of the host is in its
# root; /etc is a sanitised copy, see local/root.py). Paths that do not exist are skipped.
DEFAULT_ROOT_ALLOWLIST = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/root/.cache/ms-playwright"]


class LocalBackendConfig(BaseModel):
    """Settings of the local (namespaces) backend."""

    model_config = ConfigDict(extra="forbid")
    state_dir: Path = Field(Path("/var/lib/orchard"), description="Sandbox layers, sockets, records, snapshots.")
    isolation: Literal["namespaces", "none"] = Field(
        "namespaces", description="'none' runs agents as plain subprocesses (explicit operator choice only)."
    )
    runtime: Literal["namespaces", "gvisor"] = Field(
        "namespaces",
        description="'namespaces': the agent builds the sandbox from Linux namespaces, a user "
        "namespace and seccomp (fast); 'gvisor': each sandbox runs under gVisor's user-space kernel (runsc; "
        "stronger, slower, see local/gvisor.py). Env ORCHARD_RUNTIME.",
    )
    gvisor_platform: Literal["ptrace", "kvm", "systrap"] = Field("ptrace", description="runsc --platform.")
    cgroup_parent: str | None = Field(
        None,
        description="cgroup directory (per controller) holding sandbox groups; default "
        "'orchard-<hash of state_dir>', so services with different state dirs never share one.",
    )
    mask_paths: list[str] = Field(
        default_factory=lambda: list(DEFAULT_MASKS),
        description="Host paths hidden inside sandboxes (empty read-only mounts).",
    )
    extra_ro_binds: list[str] = Field(
        default_factory=list, description="More host paths to show read-only (any sandbox, image or not)."
    )
    root_allowlist: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ROOT_ALLOWLIST),
        description="Host paths shown read-only in a sandbox without an image; the rest of its root is an empty "
        "skeleton plus a sanitised copy of /etc (world-readable files only).",
    )
    prepend_service_python_to_path: bool = Field(
        True,
        description="Show the service's virtualenv and its base interpreter read-only and prefix PATH with "
        "the venv's bin dir (image=None only), so `python`/`pytest` in a sandbox are the service's.",
    )
    seccomp: bool = Field(
        True, description="Install the seccomp filter of agent/seccomp.py on every sandbox process (needs libseccomp2)."
    )
    userns: bool = Field(
        True,
        description="Run each sandbox in a user namespace: its uid/gid 0..userns_size-1 "
        "are unprivileged host ids of a range of its own (see agent/boot.py enter_userns).",
    )
    userns_base: int = Field(
        1_000_000_000,
        ge=1,
        description="First host uid/gid of the id pool: the sandbox "
        "holding slot n is base + n * userns_size.. (no host user may own ids in the pool).",
    )
    userns_size: int = Field(65536, ge=1, description="Number of uids/gids mapped into each sandbox.")
    userns_pool_size: int = Field(
        4096,
        ge=1,
        description="Id ranges in the pool, one per running sandbox, returned on delete. A sandbox's "
        "root is a host uid no other sandbox has, so per-user kernel counters (inotify instances, RLIMIT_NPROC, "
        "message queue bytes) and its delegated cgroup never span sandboxes; creates beyond it are refused (503).",
    )
    userns_slot_dir: Path = Field(
        Path("/run/orchard/uid-slots"),
        description="Machine-wide allocation of id ranges (one file per slot), shared by every service on this host.",
    )
    snapshot_max_layers: int = Field(
        16,
        ge=1,
        le=48,
        description="Snapshots are read-only overlay layers a fork or restore mounts (nothing copied); a "
        "snapshot of a sandbox running on layers keeps them beneath its own, and a chain deeper than this is "
        "folded into one layer when saved (local/snapshots.py). The mount option string caps it (one page).",
    )
    disk_inodes_per_mb: int = Field(256, ge=1, description="Inode limit of the writable layer per MiB of disk_mb.")
    agent_python: str | None = Field(None, description="Interpreter for the agent (default: the host's base python).")
    boot_timeout_seconds: float = Field(15.0, gt=0, description="Give up on a sandbox whose agent is not up by then.")
    memory_headroom_mb: int = Field(
        64,
        ge=1,
        description="Memory a sandbox's files can never take: its disk tmpfs (upper layer, /tmp, /run, "
        "/dev/shm in one pool) is at most memory_mb minus this (or half of memory_mb), see LocalBackend.disk_size_mb.",
    )
    allowlist_subnet: str = Field("10.213.0.0/16", description="Addresses for sandboxes in allowlist mode.")
    image_dir: Path | None = Field(
        None,
        description="Directory of built roots: SandboxCreate(image='NAME') is <image_dir>/NAME (e.g. "
        "scripts/build-debian-root.sh <image_dir>/bookworm). Images are names, never host paths. Default "
        "<state_dir>/images; env ORCHARD_IMAGE_DIR.",
    )
    fast_start: bool = Field(
        True,
        description="Fork sandboxes from a pre-imported agent (zygote) instead of "
        "starting an interpreter per sandbox (saves ~30-100 ms each).",
    )
    pty_max: int = Field(
        64,
        ge=1,
        le=4096,
        description="Ptys a sandbox may hold at once (its devpts `max=`): every sandbox takes "
        "them from one machine-wide pool, which the backend sizes to userns_pool_size * pty_max "
        "(local/ceilings.py).",
    )
    raise_kernel_ceilings: bool = Field(
        True,
        description="At start, raise the machine-wide kernel ceilings one sandbox could otherwise reach "
        "(kernel.pty.max, kernel.pid_max, kernel.threads-max, fs.file-max; never lowered) so each sandbox's own "
        "cap binds first: see local/ceilings.py and docs/concepts/threat-model.md.",
    )
    net_index_dir: Path = Field(
        Path("/run/orchard/net-slots"),
        description="Machine-wide allocation of veth names/addresses (one file per slot).",
    )

    @model_validator(mode="after")
    def _pool_fits(self) -> "LocalBackendConfig":
        if self.userns_base + self.userns_pool_size * self.userns_size > 2**32 - 1:
            raise ValueError("userns_base + userns_pool_size * userns_size exceeds the uid space (2**32 - 1)")
        if self.userns_pool_size * self.pty_max > PTY_MAX_LIMIT // 2:
            raise ValueError(
                f"userns_pool_size * pty_max ({self.userns_pool_size * self.pty_max}) is over the ptys "
                f"the kernel can share out ({PTY_MAX_LIMIT} in all, part of it the host's); lower one"
            )
        return self

    @classmethod
    def from_env(cls, **overrides) -> "LocalBackendConfig":
        """ORCHARD_STATE_DIR, ORCHARD_UNISOLATED=1, ORCHARD_RUNTIME, ORCHARD_IMAGE_DIR override the defaults."""
        values: dict = {}
        if os.environ.get("ORCHARD_STATE_DIR"):
            values["state_dir"] = Path(os.environ["ORCHARD_STATE_DIR"])
        if os.environ.get("ORCHARD_UNISOLATED") == "1":
            values["isolation"] = "none"
        if os.environ.get("ORCHARD_IMAGE_DIR"):
            values["image_dir"] = Path(os.environ["ORCHARD_IMAGE_DIR"])
        if os.environ.get("ORCHARD_RUNTIME"):
            values["runtime"] = os.environ["ORCHARD_RUNTIME"]
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
            "local sandboxes cannot be isolated: "
            + "; ".join(problems)
            + ". Fix that, or start the service with ORCHARD_UNISOLATED=1 (LocalBackendConfig(isolation='none')) "
            "to run commands without isolation at your own risk."
        )
