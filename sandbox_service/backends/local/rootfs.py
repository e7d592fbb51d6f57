"""On-disk layout of the local backend's state directory and the agent copy (snapshots: local/snapshots.py).

    <state>/agent/<hash>/sandbox_service/agent/*.py   stdlib-only agent files, copied once per version
                                                       and bind-mounted read-only into each sandbox
    <state>/s/<id>/record.json                         SandboxRecord: what stop() needs after a crash
    <state>/s/<id>/{upper,work,merged}                 overlay layers (upper holds /workspace too)
    <state>/s/<id>/{a.sock,secret,boot.json,agent.log} agent socket, secret, boot config, log
    <state>/snapshots, <state>/layers                  snapshots and their overlay layers (local/snapshots.py)

Short names keep Unix socket paths under the 107-byte limit.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sandbox_service.backends.fstree import remove_or_quarantine, remove_tree
from sandbox_service.errors import BackendUnavailableError, InvalidRequestError
from sandbox_service.models import NetworkPolicy, Resources

AGENT_FILES = (
    "__init__.py",
    "__main__.py",
    "beneath.py",
    "boot.py",
    "execs.py",
    "files.py",
    "protocol.py",
    "proctree.py",
    "seccomp.py",
    "server.py",
    "streams.py",
    "zygote.py",
)
MAX_SOCKET_PATH = 107


class SandboxRecord(BaseModel):
    """Persistent facts about one local sandbox (record.json)."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="Sandbox id.")
    image: str | None = Field(description="Lower layer directory (None = host root).")
    workdir: str = Field(description="Default working directory inside the sandbox.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment for every command.")
    resources: Resources = Field(description="Limits applied to the sandbox's cgroups.")
    network: NetworkPolicy = Field(description="Current network policy.")
    net_index: int | None = Field(
        None,
        description="Machine-wide slot for the veth name and allowlist address "
        "(taken when an allowlist is first applied).",
    )
    uid_slot: int | None = Field(
        None,
        description="Slot of the sandbox's host id range in the machine-wide pool "
        "(LocalBackendConfig.userns_pool_size); None without a user namespace.",
    )
    layers: list[str] = Field(
        default_factory=list,
        description="Snapshot layers mounted beneath the upper, top first (<state>/layers; local/snapshots.py).",
    )
    isolation: str = Field(description="'namespaces' or 'none' (unisolated).")
    host_pid: int | None = Field(None, description="Host pid of the sandbox's PID 1 (the agent).")
    launcher_pid: int | None = Field(None, description="Host pid of the unshare process holding the namespaces.")
    service_pid: int = Field(description="Pid of the service process that created it.")
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))


class SandboxDir:
    def __init__(self, state_dir: Path, sandbox_id: str):
        self.root = state_dir / "s" / sandbox_id
        self.quarantine = state_dir / "quarantine"
        self.disk = self.root / "disk"  # the size-limited tmpfs holding upper and work (isolated mode)
        self.upper = self.disk / "upper"
        self.scratch = self.disk / "scratch"  # /tmp, /run, /dev/shm of the running agent (boot._mount_scratch)
        self.work = self.disk / "work"
        self.merged = self.root / "merged"
        self.socket = self.root / "a.sock"
        self.secret = self.root / "secret"
        self.boot = self.root / "boot.json"
        self.log = self.root / "agent.log"
        self.record_path = self.root / "record.json"
        self.workspace = self.root / "workspace"  # unisolated mode only
        if len(str(self.socket)) > MAX_SOCKET_PATH:
            raise InvalidRequestError(
                f"state dir {state_dir} is too deep: the agent socket path {self.socket} "
                f"exceeds {MAX_SOCKET_PATH} bytes; use a shorter state_dir"
            )

    def create(self, secret: str) -> None:
        self.root.mkdir(parents=True, exist_ok=False, mode=0o700)
        for d in (self.disk, self.merged):
            d.mkdir()
        self.secret.touch(mode=0o600)
        self.secret.write_text(secret)

    def make_layers(self) -> None:
        """Overlay upper and work dirs (after the disk tmpfs is mounted on `disk`, if it is)."""
        for d in (self.upper, self.work, self.scratch):
            d.mkdir(exist_ok=True)

    def reset_layers(self) -> None:
        """Empty overlay work dir and mountpoint (after the sandbox's mount namespace is gone)."""
        for d in (self.work, self.scratch):
            remove_tree(d)
            d.mkdir(exist_ok=True)
        self.merged.mkdir(exist_ok=True)

    def save(self, record: SandboxRecord) -> None:
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(record.model_dump_json())
        tmp.replace(self.record_path)

    def load(self) -> SandboxRecord | None:
        try:
            return SandboxRecord.model_validate_json(self.record_path.read_text())
        except (OSError, ValueError):
            return None

    def remove(self) -> str | None:
        """Remove the sandbox's files (any depth or size); None, or where they were quarantined."""
        return remove_or_quarantine(self.root, self.quarantine)


def install_agent(state_dir: Path) -> Path:
    """Copy the stdlib-only agent files into the state dir once per version; returns the dir for sys.path."""
    src = Path(__file__).resolve().parents[2] / "agent"
    digest = hashlib.sha256()
    for name in AGENT_FILES:
        digest.update(name.encode() + (src / name).read_bytes())
    dest = state_dir / "agent" / digest.hexdigest()[:16]
    if not (dest / "ok").exists():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        pkg = tmp / "sandbox_service" / "agent"
        pkg.mkdir(parents=True)
        (tmp / "sandbox_service" / "__init__.py").write_text('"""Agent-only copy of sandbox_service."""\n')
        for name in AGENT_FILES:
            shutil.copy2(src / name, pkg / name)
        import compileall

        compileall.compile_dir(str(tmp), quiet=1)  # the sandbox mount is read-only: no pyc writes there
        (tmp / "ok").touch()
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest


def copy_tree(src: Path, dest: Path) -> None:
    """cp -a (keeps overlay whiteouts, xattrs, ownership); reflinks where the filesystem has them."""
    proc = subprocess.run(["cp", "-a", "--reflink=auto", f"{src}/.", str(dest)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BackendUnavailableError(f"copying {src} to {dest} failed: {proc.stderr.strip()}")
