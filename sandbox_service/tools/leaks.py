"""Find what a stopped service left behind under its state directory: processes, mounts, cgroups, network.

Used by `EmbeddedService` on exit, by the test suite's final check and by the stress benchmark. A
process counts as leaked when its command line, environment, working directory or root names the state
directory (every sandbox process does: its root, agent socket and scratch space live there; the agent
and its zygote carry it in their environment only, so that no host path is on their command line); a mount
when its mount point does; a cgroup when it is named after one of the service's sandbox ids; a machine-wide
slot (network or uid range) when its owner is a sandbox dir under the state directory, and a sandbox link or
egress filter when its slot is such a one or free (nothing but a leak holds a filter without its slot).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def leaked_processes(state_dir: Path) -> list[str]:
    root = str(Path(state_dir).resolve())
    me = os.getpid()
    found: list[str] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace").strip()
            try:
                environ = (entry / "environ").read_bytes().decode(errors="replace")
            except OSError:
                environ = ""
            links = []
            for name in ("cwd", "root"):
                try:
                    links.append(os.readlink(entry / name))
                except OSError:
                    pass
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if root in cmdline or root in environ or any(_under(link, root) for link in links):
            found.append(f"process {entry.name}: {cmdline[:160]}")
    return found


def leaked_mounts(state_dir: Path) -> list[str]:
    root = str(Path(state_dir).resolve())
    found: list[str] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            mount_point = fields[4].replace("\\040", " ")
            if _under(mount_point, root):
                found.append(f"mount {mount_point}")
    return found


def leaked_cgroups(sandbox_ids: set[str]) -> list[str]:
    """cgroup directories named after one of `sandbox_ids` (backends name sandbox groups by id)."""
    found: list[str] = []
    if not sandbox_ids or not _CGROUP_ROOT.is_dir():
        return found
    for dirpath, dirnames, _ in os.walk(_CGROUP_ROOT):
        found += [f"cgroup {os.path.join(dirpath, name)}" for name in dirnames if name in sandbox_ids]
        if dirpath.count("/") > 6:  # sandboxes sit a few levels down; do not crawl the whole tree
            dirnames.clear()
    return found


def leaked_network(state_dir: Path) -> list[str]:
    """Slots, links and egress filters of the local backend (default slot directories) left by this state dir."""
    from sandbox_service.backends.local import egress as local_egress
    from sandbox_service.backends.local.config import LocalBackendConfig
    from sandbox_service.backends.local.network import veth_index

    root = str(Path(state_dir).resolve())
    defaults = LocalBackendConfig()
    found, ours = [], set()
    for kind, directory in (
        ("allowlist network slot", defaults.net_index_dir),
        ("sandbox id range slot", defaults.userns_slot_dir),
    ):
        for slot in Path(directory).iterdir() if Path(directory).is_dir() else ():
            try:
                owner = slot.read_text()
            except OSError:
                continue
            if _under(owner, root):
                found.append(f"{kind} {slot.name} ({owner})")
                if kind.startswith("allowlist"):
                    ours.add(int(slot.name))
    free = lambda index: not (Path(defaults.net_index_dir) / str(index)).exists()  # noqa: E731
    found += [f"veth {name}" for _, name in socket.if_nameindex() if veth_index(name) in ours]
    found += [
        f"egress filter {link}"
        for link in local_egress.filtered_links()
        if veth_index(link) in ours or free(veth_index(link))
    ]
    return found


def find_leaks(state_dir: Path, sandbox_ids: set[str] | None = None, *, grace_seconds: float = 5.0) -> list[str]:
    """What is left now; waits up to `grace_seconds` for processes that are being killed to finish dying
    (a SIGKILLed sandbox can take a moment to exit once its cgroup was told to)."""
    deadline = time.monotonic() + grace_seconds
    while True:
        found = (
            leaked_processes(state_dir)
            + leaked_mounts(state_dir)
            + leaked_cgroups(sandbox_ids or set())
            + leaked_network(state_dir)
        )
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)
