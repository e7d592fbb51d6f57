"""cgroup limits for local sandboxes: memory, cpu, pids (+ freezer for consistent snapshots).

cgroup v1 (controllers mounted at /sys/fs/cgroup/<controller>, as on this machine) is the tested
path; pure cgroup v2 (a `cgroup.controllers` file at the mount root) is supported with the
equivalent files (memory.max, cpu.max, pids.max, cgroup.freeze, cgroup.kill) but not exercised here.
Each sandbox gets `<root>/<parent>/<sandbox_id>` in every hierarchy; the agent makes per-exec child
groups below its pids group, which `remove()` deletes bottom-up.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time
from pathlib import Path

from sandbox_service.agent.proctree import oom_kill_count
from sandbox_service.errors import IsolationUnavailableError
from sandbox_service.models import Resources
from sandbox_service.retry import Backoff

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "cpu", "pids", "freezer")
CFS_PERIOD_US = 100_000
# Processes/threads the agent may use on top of the workload's pids limit: commands live in the
# `w` child group limited to Resources.pids, so a fork bomb can never take the agent's last pids.
AGENT_PIDS_RESERVE = 64
WORK_GROUP = "w"
# Between freeze-kill-thaw rounds of `kill_all`: 2 ms at first, doubling to 50 ms.
_KILL_ROUNDS = Backoff(first=0.002, cap=0.05)


def detect_version(root: Path = CGROUP_ROOT) -> int:
    """1 or 2; raises IsolationUnavailableError if neither usable layout is mounted."""
    if (root / "cgroup.controllers").exists():
        wanted = {"memory", "cpu", "pids"}
        have = set((root / "cgroup.controllers").read_text().split())
        if not wanted <= have:
            raise IsolationUnavailableError(f"cgroup v2 at {root} lacks controllers {sorted(wanted - have)}")
        return 2
    missing = [c for c in ("memory", "cpu", "pids") if not (root / c / "cgroup.procs").exists()]
    if missing:
        raise IsolationUnavailableError(
            f"cgroup controllers {missing} are not mounted under {root} (neither v1 nor v2 layout found); "
            "mount them, or start the service unisolated (ORCHARD_UNISOLATED=1) at your own risk"
        )
    return 1


class SandboxCgroups:
    """The cgroup directories of one sandbox (paths only; safe to rebuild from an id after a crash)."""

    def __init__(self, sandbox_id: str, parent: str = "orchard", root: Path = CGROUP_ROOT, version: int | None = None):
        self.version = version or detect_version(root)
        self.root = root
        if self.version == 1:
            self.dirs = {c: Path(f"{root}/{c}/{parent}/{sandbox_id}") for c in _mounted_v1(root)}
        else:
            d = root / parent / sandbox_id
            self.dirs = {c: d for c in V1_CONTROLLERS}

    # -- paths the agent needs at boot ---------------------------------------------------------
    def procs_files(self) -> list[str]:
        if self.version == 2:  # v2 allows processes only in leaves: the agent gets its own
            return [str(self.pids_dir / "cgroup.procs")]
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    @property
    def pids_dir(self) -> Path:
        """The agent's own pids group."""
        return self.dirs["pids"] if self.version == 1 else self.dirs["pids"] / "agent"

    @property
    def work_pids_dir(self) -> Path:
        """Where the agent puts commands (per-exec groups below it)."""
        return self.dirs["pids"] / WORK_GROUP

    @property
    def oom_counter(self) -> Path:
        return self.dirs["memory"] / ("memory.oom_control" if self.version == 1 else "memory.events")

    # -- lifecycle -----------------------------------------------------------------------------
    def create(self, res: Resources) -> None:
        if self.version == 2:
            parent = next(iter(self.dirs.values())).parent
            parent.mkdir(exist_ok=True)
            _write(parent / "cgroup.subtree_control", "+memory +cpu +pids")
        for d in set(self.dirs.values()):
            d.mkdir(parents=True, exist_ok=True)
        mem = res.memory_mb * 1024 * 1024
        # The `w` child (commands) counts pids.max; the rest of the top group is the agent's reserve.
        if self.version == 1:
            m = self.dirs["memory"]
            _write(m / "memory.limit_in_bytes", str(mem))
            if (m / "memory.memsw.limit_in_bytes").exists():
                _write(m / "memory.memsw.limit_in_bytes", str(mem))  # no swapping past the limit either
            if (m / "memory.kmem.tcp.limit_in_bytes").exists():
                # v1 charges socket buffers to a cgroup only once it has a TCP limit: without one, a 128 MiB
                # sandbox queued 1 GiB on its own loopback, all of it from the machine-wide net.ipv4.tcp_mem
                # that every TCP socket of the host (the service's too) draws from. v2 always charges them.
                _write(m / "memory.kmem.tcp.limit_in_bytes", str(mem))
            _write(self.dirs["cpu"] / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(self.dirs["cpu"] / "cpu.cfs_quota_us", str(int(res.cpu * CFS_PERIOD_US)))
            _write(self.dirs["pids"] / "pids.max", str(res.pids + AGENT_PIDS_RESERVE))
            self.work_pids_dir.mkdir(exist_ok=True)
            _write(self.work_pids_dir / "pids.max", str(res.pids))
        else:
            d = self.dirs["memory"]
            _write(d / "memory.max", str(mem))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            _write(d / "cpu.max", f"{int(res.cpu * CFS_PERIOD_US)} {CFS_PERIOD_US}")
            _write(d / "pids.max", str(res.pids + AGENT_PIDS_RESERVE))
            _write(d / "cgroup.subtree_control", "+memory +cpu +pids")
            self.pids_dir.mkdir(exist_ok=True)
            self.work_pids_dir.mkdir(exist_ok=True)
            _write(self.work_pids_dir / "pids.max", str(res.pids))
            _write(self.work_pids_dir / "cgroup.subtree_control", "+pids")

    def delegate(self, uid: int) -> None:
        """Let host uid `uid` (the sandbox's root, see LocalBackendConfig.userns) make per-exec groups under
        the commands' pids group and move its own threads between them and the agent's group: the
        directory and its process lists change owner, the limit files stay root's (as systemd delegates)."""
        paths = [self.work_pids_dir, self.work_pids_dir / "cgroup.procs", self.pids_dir / "cgroup.procs"]
        if self.version == 1:
            paths += [self.work_pids_dir / "tasks", self.pids_dir / "tasks"]
        else:  # moves need write access to the common ancestor's cgroup.procs
            paths += [self.dirs["pids"] / "cgroup.procs", self.work_pids_dir / "cgroup.subtree_control"]
        for path in paths:
            os.chown(path, uid, uid)

    def limits(self) -> dict[str, int]:
        """Limits as applied (for tests and status)."""
        if self.version == 1:
            return {
                "memory_bytes": int(_read(self.dirs["memory"] / "memory.limit_in_bytes")),
                "cpu_quota_us": int(_read(self.dirs["cpu"] / "cpu.cfs_quota_us")),
                "pids_max": int(_read(self.work_pids_dir / "pids.max")),
            }
        d = self.dirs["memory"]
        return {
            "memory_bytes": int(_read(d / "memory.max")),
            "cpu_quota_us": int(_read(d / "cpu.max").split()[0]),
            "pids_max": int(_read(self.work_pids_dir / "pids.max")),
        }

    def oom_kills(self) -> int:
        try:
            return oom_kill_count(_read(self.oom_counter))
        except OSError:
            return 0

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self._all_dirs(self.dirs["pids"]):
            try:
                out.update(int(x) for x in _read(f"{d}/cgroup.procs").split())
            except OSError:
                pass
        return sorted(out)

    def freeze(self, frozen: bool) -> None:
        if self.version == 1 and "freezer" in self.dirs and self.dirs["freezer"].exists():
            _write(self.dirs["freezer"] / "freezer.state", "FROZEN" if frozen else "THAWED")
        elif self.version == 2 and (self.dirs["pids"] / "cgroup.freeze").exists():
            _write(self.dirs["pids"] / "cgroup.freeze", "1" if frozen else "0")

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL everything in the sandbox: freeze first so nothing forks while it is being killed
        (a fork bomb), signal every task, thaw so the signals land, repeat until the group is empty. An
        empty group is left alone (no freeze and thaw)."""
        deadline = time.monotonic() + timeout
        if not self.pids():
            return
        for attempt in itertools.count():
            if time.monotonic() >= deadline:
                return
            try:
                self.freeze(True)
            except OSError:
                pass
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.freeze(False)
            except OSError:
                pass
            if not pids:
                return
            # What was signalled is dying; a process the kernel is tearing down needs time, not more rounds.
            time.sleep(_KILL_ROUNDS.delay(attempt))

    def remove(self, timeout: float = 5.0) -> None:
        """Delete every directory (children first). Idempotent; retries while tasks are exiting."""
        deadline = time.monotonic() + timeout
        for top in set(self.dirs.values()):
            for d in reversed(self._all_dirs(top)):
                while True:
                    try:
                        os.rmdir(d)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.005)

    def exists(self) -> bool:
        return any(d.exists() for d in self.dirs.values())

    @staticmethod
    def _all_dirs(top: Path) -> list[str]:
        """`top` and every group below it, parents before children (empty when `top` is gone)."""
        found: list[str] = []
        todo = [str(top)]
        while todo:
            path = todo.pop()
            try:
                with os.scandir(path) as entries:
                    todo.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
            except (FileNotFoundError, NotADirectoryError):
                continue
            found.append(path)
        return found


@functools.lru_cache(maxsize=8)
def _mounted_v1(root: Path) -> tuple[str, ...]:
    """The v1 controllers of V1_CONTROLLERS mounted under `root` (looked up once per root)."""
    return tuple(c for c in V1_CONTROLLERS if (root / c).is_dir())


def _write(path: Path | str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: Path | str) -> str:
    with open(path) as f:
        return f.read()
