"""Who spent the CPU: an embedded service's process tree split into the service, its helpers, the agent
zygote, the sandboxes' agents and their commands (for profiles and benchmarks, never for decisions).

    service = EmbeddedService(); service.start()
    meter = TreeCpu(service.pid)                # right after start, before the first sandbox
    before = meter.sample()
    ...                                         # work through the service
    spent = meter.sample() - before             # CpuSample: seconds per column
    service.stop(); meter.close()

Sources, each as exact as the kernel keeps it:

- the whole tree: a cgroup v1 `cpuacct` group (or a cgroup v2 group's `cpu.stat`) the service is moved into
  before it starts anything; every process it forks stays there (sandboxes join their own memory, cpu,
  pids and freezer groups, never cpuacct), so its usage counts the service, every helper it ran (`ip`,
  `nsenter`, `cp`), the zygote, every agent and every command, live or gone, in nanoseconds;
- the service's own threads and its reaped children (`ip`, `nsenter`, `cp`, ...): /proc/<pid>/stat;
- the zygote's own work (a fork per sandbox), from its /proc/<pid>/stat;
- agents (PID 1 of each sandbox, children of the zygote, which is their subreaper) and their reaped
  commands, from each live agent's /proc/<pid>/stat (read at every sample; an agent's share after its last
  sample, its exit, lands in `sandbox_other`);
- `sandboxes` = the tree less the service, its helpers and the zygote (agents, commands and the kernel
  work charged to them: namespaces, mounts, cgroup moves);
- kernel threads (`kernel`: every child of kthreadd, e.g. the workqueues that tear down network
  namespaces and free mounts after a sandbox is gone): the whole machine's, so only meaningful on an idle one;
- the calling process (`client`, rusage, less the meter's own sampling) and the machine (`/proc/stat`, every
  CPU's busy time: other sessions included, so only meaningful on an idle machine).

/proc/<pid>/stat counts in clock ticks (10 ms): sum deltas over many episodes before reading a split.
Root is needed to make the cgroup (without it, `tree` and `sandboxes` are left None).
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class CpuSample:
    """CPU-seconds per column (a difference of two samples is what was spent in between)."""

    client: float = 0.0  # the calling process (all its threads)
    service: float = 0.0  # the service's own threads
    service_children: float = 0.0  # helpers the service ran and reaped (ip, nsenter, cp, ...)
    zygote: float = 0.0  # the agent fork server's own work
    agents: float = 0.0  # the sandboxes' PID 1 (the agent), as last seen alive
    commands: float = 0.0  # what the agents ran and reaped, as last seen alive
    sandboxes: float | None = None  # the tree less service, helpers and zygote (agents, commands, their exit)
    tree: float | None = None  # the service's whole process tree (cgroup)
    kernel: float = 0.0  # kernel threads, machine-wide (namespace teardown and other deferred work)
    machine: float = 0.0  # every CPU's busy time (other sessions too)

    def __sub__(self, other: "CpuSample") -> "CpuSample":
        def minus(a, b):
            return None if a is None or b is None else a - b

        return CpuSample(
            **{f.name: minus(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)}
        )

    def __add__(self, other: "CpuSample") -> "CpuSample":
        def plus(a, b):
            return None if a is None or b is None else a + b

        return CpuSample(
            **{f.name: plus(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)}
        )

    @property
    def ours(self) -> float | None:
        """The client and the service's whole tree: everything the work cost on this machine."""
        return None if self.tree is None else self.client + self.tree


def _stat(pid: int) -> tuple[float, float] | None:
    """(own, reaped children) CPU-seconds of `pid`, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / _TICK, (cutime + cstime) / _TICK


def _children(pid: int) -> list[int]:
    """Children of every thread of `pid` (each thread has its own list: the service forks from workers)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            found += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            pass
    return found


def machine_busy_seconds() -> float:
    """Busy CPU-seconds of the whole machine since boot (every CPU; all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / _TICK


def client_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def kernel_thread_seconds() -> float:
    """CPU-seconds of every kernel thread (kthreadd's children) since each started."""
    total = 0.0
    for pid in _children(2):
        got = _stat(pid)
        if got is not None:
            total += got[0]
    return total


class TreeCpu:
    """CPU of the process tree under `service_pid` (see the module docstring). Move the service in right
    after it starts (before its first sandbox); `close()` removes the accounting group once it is empty."""

    def __init__(self, service_pid: int, name: str | None = None):
        self.service_pid = service_pid
        self.group = self._make_group(name or f"orchard-cpu-{os.getpid()}-{service_pid}")
        if self.group is not None:
            (self.group / "cgroup.procs").write_text(str(service_pid))
        self._last: dict[int, tuple[float, float]] = {}  # agent pid -> (own, reaped) when last seen
        self._overhead = 0.0  # this process's CPU spent sampling (left out of `client`)

    @staticmethod
    def _make_group(name: str) -> Path | None:
        v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        parent = CGROUP_ROOT if v2 else CGROUP_ROOT / "cpuacct"
        if not (parent / "cgroup.procs").exists():
            return None
        try:
            (parent / name).mkdir()
        except PermissionError:
            return None
        return parent / name

    def _tree_seconds(self) -> float | None:
        if self.group is None:
            return None
        usage = self.group / "cpuacct.usage"
        if usage.exists():
            return int(usage.read_text()) / 1e9
        for line in (self.group / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        return None

    def _zygote(self) -> int | None:
        """The agent zygote: the service's child whose argv[0] is `orchard-agent` (local/zygote.py)."""
        for pid in _children(self.service_pid):
            try:
                comm = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
            except OSError:
                continue
            if comm == b"orchard-agent":
                return pid
        return None

    def sample(self) -> CpuSample:
        started = time.thread_time()
        tree = self._tree_seconds()
        s = CpuSample(machine=machine_busy_seconds(), tree=tree, kernel=kernel_thread_seconds())
        own = _stat(self.service_pid)
        if own is not None:
            s.service, s.service_children = own
        zygote = self._zygote()
        live: dict[int, tuple[float, float]] = {}
        if zygote is not None:
            z = _stat(zygote)
            if z is not None:
                s.zygote = z[0]
            for pid in _children(zygote):
                got = _stat(pid)
                if got is not None:
                    live[pid] = got
        for pid, got in live.items():
            self._last[pid] = got
        s.agents = sum(a for a, _ in self._last.values())
        s.commands = sum(c for _, c in self._last.values())
        if tree is not None:
            s.sandboxes = tree - s.service - s.service_children - s.zygote
        self._overhead += time.thread_time() - started
        s.client = client_seconds() - self._overhead
        return s

    def close(self, timeout: float = 10.0) -> None:
        """Remove the accounting group (the service and its zygote must have exited: waits for them)."""
        if self.group is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.group.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
