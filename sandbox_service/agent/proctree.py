"""Finding and killing all processes of one command (see execs.py for the strategy).

`CgroupTracker` holds the agent's fds to its pids cgroup (per-exec child groups) and memory OOM
counter; `kill_tree` seals a command's exec cgroup against forks (pids.max 0: the tree stops growing, a
fork bomb included) and SIGKILLs its members until it is empty; without a per-thread cgroup (v2, none)
it also walks the session, descendants and every process carrying its ORCHARD_EXEC_ID. Stdlib only: this module is
copied into every sandbox.
"""

from __future__ import annotations

import os
import signal
import threading
import time


class CgroupTracker:
    """Per-exec child cgroups under the sandbox's pids cgroup (held as a directory fd).

    On cgroup v1 a thread of the agent that starts a command lives in that command's exec cgroup, so the
    command is born there, and stays there afterwards: its next command reuses the same group when it is
    free, and no thread moves. Moving a thread between v1 cgroups takes the kernel's
    cgroup_threadgroup_rwsem for writing, which after an idle spell (~50 ms without moves) first waits
    out an RCU grace period: 8-16 ms on the first exec after every pause, i.e. on every tool call of an
    agent that thinks between calls. Idle agent threads in a group fork nothing (only command starts
    fork), and `pids` never lists the agent."""

    def __init__(self, pids_dir_fd: int | None, oom_control_fd: int | None) -> None:
        self.dir_fd = pids_dir_fd
        self.oom_fd = oom_control_fd
        self._counter = 0
        self._lock = threading.Lock()
        self._stale: list[str] = []
        self._free: list[str] = []
        # The exec group the calling thread lives in (v1). Thread-local, not by thread id: a new thread
        # that reuses a dead one's id lives in the agent's own group.
        self._resident = threading.local()
        self.v1 = pids_dir_fd is not None and _exists_at("tasks", pids_dir_fd)
        # True when the agent could not get oom_score_adj -1000: commands get +1000 instead.
        self.raise_oom_score = False

    @property
    def enabled(self) -> bool:
        return self.dir_fd is not None

    def command_group(self) -> str | None:
        """An empty exec cgroup for the command the calling thread is about to start (None: none to use).
        On v1 the thread lives in it from here on: the group it already lives in when that one is free,
        else a recycled or new one it moves into (v2 moves the child instead: `adopt`)."""
        if self.dir_fd is None:
            return None
        mine = getattr(self._resident, "group", None)
        with self._lock:
            if mine is not None and mine in self._free:
                self._free.remove(mine)
                return mine
            name = self._recycled()
            if name is None:
                self._counter += 1
                name = f"x{self._counter}"
                try:
                    os.mkdir(name, dir_fd=self.dir_fd)
                except FileExistsError:
                    pass
                except OSError:
                    return None
        if self.v1:
            if not self._enter(name):
                # The thread stays where it was: no group to account the command to. Without one it is
                # started and killed as where there are no cgroups (its session, descendants, exec id).
                self.release(name)
                return None
            self._resident.group = name
        return name

    def _recycled(self) -> str | None:
        """A released group found empty (cheaper than mkdir+rmdir per exec); call with the lock held."""
        if self._free:
            # Found empty at release: nothing is born into an empty exec cgroup (the agent's threads that
            # live in one fork only to start a command they took the group for), so no second look.
            return self._free.pop()
        for name in self._stale:
            if not self.pids(name):
                self._stale.remove(name)
                self.seal(name, False)  # a group killed while it still had members stayed sealed
                return name
        return None

    def _enter(self, name: str) -> bool:
        """Move the calling thread into exec group `name` (v1)."""
        return _write_at(f"{name}/tasks", str(threading.get_native_id()), self.dir_fd)

    def adopt(self, name: str | None, pid: int) -> None:
        """cgroup v2 (no per-thread moves): move the child right after spawn (a small race)."""
        if name is not None and not self.v1:
            _write_at(f"{name}/cgroup.procs", str(pid), self.dir_fd)

    def pids(self, name: str) -> list[int]:
        """The processes in exec cgroup `name`, never the agent (whose threads may live there)."""
        try:
            fd = os.open(f"{name}/cgroup.procs", os.O_RDONLY, dir_fd=self.dir_fd)
        except OSError:
            return []
        try:
            data = os.read(fd, 1 << 20)
        finally:
            os.close(fd)
        me = os.getpid()
        return [pid for pid in map(int, data.split()) if pid != me]

    def seal(self, name: str, sealed: bool = True) -> bool:
        """Stop (or allow again) every fork in the exec cgroup `name` (pids.max 0 / max): a tree that cannot
        grow is killed in one or two passes, however fast it forked (a fork bomb)."""
        return _write_at(f"{name}/pids.max", "0" if sealed else "max", self.dir_fd)

    def kill_group(self, name: str, timeout: float = 3.0) -> bool:
        """Seal the exec cgroup and SIGKILL its members until it is empty (True) or `timeout` passed."""
        sealed = self.seal(name)
        deadline = time.monotonic() + timeout
        try:
            while True:
                pids = self.pids(name)
                if not pids:
                    return True
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.001)
        finally:
            if sealed and not self.pids(name):
                self.seal(name, False)

    def release(self, name: str | None) -> None:
        """Return an exec cgroup; one still holding background processes is reused once they exit."""
        if name is None:
            return
        with self._lock:
            (self._stale if self.pids(name) else self._free).append(name)

    def oom_kills(self) -> int:
        """The memory cgroup's OOM-kill counter (v1 memory.oom_control / v2 memory.events)."""
        if self.oom_fd is None:
            return 0
        try:
            return oom_kill_count(os.pread(self.oom_fd, 4096, 0).decode())
        except OSError:
            return 0


def _exists_at(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def _write_at(name: str, value: str, dir_fd: int | None) -> bool:
    try:
        fd = os.open(name, os.O_WRONLY, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        os.write(fd, value.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def mark_oom_victim(pid: int) -> None:
    """Make `pid` (and what it forks later) the OOM killer's first choice over the agent."""
    try:  # raw fd calls: open()'s text layer adds four syscalls per exec (fstat, ioctl, 2x lseek)
        fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, b"1000")
    except OSError:
        pass
    finally:
        os.close(fd)


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, sid) for every visible process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[3]))
    return table


EXEC_ID_VAR = "ORCHARD_EXEC_ID"
_exec_ids = iter(range(1, 1 << 62))


def new_exec_id() -> str:
    return f"{os.getpid()}-{next(_exec_ids)}"


def _carrying(table: dict, marker: bytes) -> set[int]:
    found = set()
    for pid in table:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in b"\0" + f.read():
                    found.add(pid)
        except OSError:
            pass
    return found


def kill_tree(root_pid: int, tracker: CgroupTracker, group: str | None, exec_id: str | None = None) -> None:
    """SIGKILL the command, its session, its descendants, everything in its exec cgroup and (without
    a cgroup) every process carrying its ORCHARD_EXEC_ID."""
    if group is not None and tracker.v1 and tracker.kill_group(group):
        # cgroup v1: the command was born inside its group and nothing leaves it, so the sealed group's
        # members are the whole tree; no /proc walk, which a tree that keeps growing would outrun.
        return
    me = os.getpid()
    marker = f"\0{EXEC_ID_VAR}={exec_id}\0".encode() if exec_id else None
    for _ in range(100):
        victims = set(tracker.pids(group)) if group else set()
        table = _proc_table()
        if marker is not None:
            victims |= _carrying(table, marker)
        children: dict[int, list[int]] = {}
        for pid, (ppid, sid) in table.items():
            children.setdefault(ppid, []).append(pid)
            if sid == root_pid:
                victims.add(pid)
        stack = [root_pid] if root_pid in table else []
        while stack:
            pid = stack.pop()
            victims.add(pid)
            stack.extend(children.get(pid, ()))
        victims.discard(me)
        victims.discard(1)
        alive = [p for p in victims if p in table and _is_alive(p)]
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.002)


def _is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def oom_kill_count(text: str) -> int:
    """The `oom_kill` counter of a memory.oom_control (v1) or memory.events (v2) file's text."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0
