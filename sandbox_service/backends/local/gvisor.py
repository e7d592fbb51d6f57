"""runtime="gvisor" for the local backend: each sandbox is a gVisor sandbox (Debian's `runsc`).

gVisor puts a user-space kernel (the Sentry) between the sandbox and the host: the sandbox's system
calls are served by the Sentry, which itself runs under a tight seccomp filter with few host system
calls, so a Linux kernel bug reachable from the sandbox is (mostly) not reachable from the host. The
price is start-up and system-call latency (figures in docs/results-log.md).

How a sandbox starts: the backend writes an OCI bundle (config.json) per sandbox and runs
`runsc --root <sandbox dir>/runsc --network=none --host-uds=create --ignore-cgroups
 --overlay2=root:memory run --bundle ...` with the runsc process placed in the sandbox's memory
and cpu cgroups (so the Sentry and Gofer count against its limits). The root is the same allowlist
skeleton (or image) as the namespaces runtime, with gVisor's overlay keeping writes in the Sentry's
memory (the lower layer is never written). The same stdlib agent runs inside as PID 1 (the
host's base interpreter, bound read-only; with an image, the image's /usr/bin/python3) and binds its
Unix socket in a host directory bound into the sandbox (`--host-uds=create`), where the backend
connects to it.

Known gap of Debian bookworm's runsc (0.0~20221219): statx() with AT_NO_AUTOMOUNT answers EINVAL, so
coreutils `ls`/`stat`/`cp` of bookworm fail inside ("Invalid argument"); Python, pytest, git, sh work.
A current gVisor release does not have this bug.

What it does not do (yet): `disk_mb` (writes live in the sandbox's memory, bounded by memory_mb; a
file store on the size-limited disk tmpfs instead makes the Sentry die of SIGBUS when it fills up),
allowlist networking (refused; `none` and `loopback` both give loopback
only), snapshots/restore (refused), per-exec cgroups (the agent falls back to session/ancestry kills
as in Kubernetes pods), a pids cgroup (RLIMIT_NPROC inside instead). The agent shares gVisor's root
with the commands (it is not outside the sandbox as in the namespaces runtime): a command may read
the agent's secret, which opens nothing it could not already do.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from sandbox_service.errors import BackendUnavailableError, InvalidRequestError

IN_SANDBOX_SOCKET_DIR = "/.orchard/run"
IN_SANDBOX_SECRET = "/.orchard/secret"
IN_SANDBOX_AGENT = "/.orchard/agent"
_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]  # Docker's default set


def check() -> str:
    runsc = shutil.which("runsc")
    if runsc is None:
        raise BackendUnavailableError(
            "runtime 'gvisor' needs runsc: run scripts/install-system-deps.sh "
            "(Debian package runsc) or use runtime 'namespaces'"
        )
    return runsc


def spec(
    *,
    lower: str,
    binds: list[str],
    agent_dir: str,
    socket_dir: str,
    secret: str,
    python: str,
    agent_args: list[str],
    hostname: str,
    pids: int,
) -> dict:
    """The OCI runtime spec of one sandbox."""
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755"]},
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
        {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755"]},
        *({"destination": b, "type": "bind", "source": b, "options": ["rbind", "ro"]} for b in binds),
        {"destination": IN_SANDBOX_AGENT, "type": "bind", "source": agent_dir, "options": ["rbind", "ro"]},
        {"destination": IN_SANDBOX_SECRET, "type": "bind", "source": secret, "options": ["bind", "ro"]},
        {"destination": IN_SANDBOX_SOCKET_DIR, "type": "bind", "source": socket_dir, "options": ["rbind", "rw"]},
    ]
    launch = (
        f"import sys; sys.path.insert(0, {IN_SANDBOX_AGENT!r}); "
        "from sandbox_service.agent.__main__ import main; sys.exit(main())"
    )
    return {
        "ociVersion": "1.0.0",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "cwd": "/",
            "noNewPrivileges": True,
            "args": [python, "-I", "-S", "-c", launch, *agent_args],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
            "capabilities": {k: _CAPS for k in ("bounding", "effective", "permitted")},
            "rlimits": [
                {"type": "RLIMIT_NPROC", "hard": pids, "soft": pids},
                {"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536},
            ],
        },
        "root": {"path": lower, "readonly": False},  # writes land in --overlay2's file store, never in lower
        "hostname": hostname,
        "mounts": mounts,
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
    }


class GvisorRuntime:
    def __init__(self, platform: str = "ptrace"):
        self.runsc = check()
        self.platform = platform

    def _base(self, state: Path) -> list[str]:
        return [self.runsc, "--root", str(state), "--platform", self.platform]

    def launch(
        self,
        *,
        root: Path,
        container_id: str,
        oci: dict,
        cgroup_procs: list[str],
        log: Path,
        socket_path: Path,
        timeout: float,
    ) -> subprocess.Popen:
        """Start the sandbox; return the runsc process once the agent accepts connections."""
        bundle, state = root / "bundle", root / "runsc"
        bundle.mkdir(exist_ok=True)
        state.mkdir(exist_ok=True)
        (bundle / "config.json").write_text(json.dumps(oci))
        argv = [
            *self._base(state),
            "--network",
            "none",
            "--host-uds",
            "create",
            "--ignore-cgroups",
            "--overlay2",
            "root:memory",
            "run",
            "--bundle",
            str(bundle),
            container_id,
        ]
        # sh joins the cgroups, then becomes runsc: the Sentry and Gofer are born inside them.
        join = 'for p in $ORCHARD_CGROUP_PROCS; do echo $$ > "$p"; done; exec "$@"'
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["sh", "-c", join, "sh", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                cwd=str(root),
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ORCHARD_CGROUP_PROCS": " ".join(cgroup_procs)},
            )
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise BackendUnavailableError(f"runsc exited with {proc.returncode} during boot")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(str(socket_path))
                return proc
            except OSError:
                pass
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise BackendUnavailableError(f"gVisor sandbox agent did not come up within {timeout:g} s")
            time.sleep(0.002)

    def delete(self, root: Path, container_id: str) -> None:
        state = root / "runsc"
        if state.is_dir():
            subprocess.run([*self._base(state), "delete", "--force", container_id], capture_output=True, timeout=30)


def refuse(what: str) -> InvalidRequestError:
    return InvalidRequestError(f"{what} is not available with runtime 'gvisor'; use runtime 'namespaces'")
