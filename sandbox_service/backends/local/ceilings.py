"""Machine-wide kernel ceilings, raised at start so that each sandbox's own cap is what binds.

A few kernel counters are one pool for the whole machine whatever the namespaces and uid ranges: every
sandbox draws from them, and so do the host and the service. Each sandbox has a cap of its own on what it
draws (see the inventory in docs/concepts/threat-model.md); these are the pools whose kernel ceiling can sit
below what one sandbox, or the pool of sandboxes at their caps, may hold:

- kernel.pty.max: every devpts instance but the host's takes ptys from pty.max minus pty.reserve (the
  reserve is the host's). A sandbox's instance holds at most `pty_max`; at most `userns_pool_size`
  sandboxes run at once (their id ranges), so the shared part must hold pool * pty_max.
- kernel.pid_max and kernel.threads-max: every thread of every sandbox holds a pid of the host's
  namespace. One sandbox is capped by its pids cgroup (Resources.pids), but a policy fork-bombing in a few
  dozen sandboxes at once filled the 32768 pids of a default kernel, and then nothing on the machine could
  fork (the service neither). Raised to the kernel's limit for 64-bit (4194304, what systemd sets); kernel
  stacks are charged to the sandbox's memory cgroup, so memory still bounds each one.
- fs.file-max: each open file is charged to its sandbox's memory cgroup (about 0.5 KiB with its fd), so
  a 2 GiB sandbox could hold more files than the default ceiling (10 % of RAM in KiB: ~2.5M on 24 GiB),
  and every other sandbox's open, pipe and socket then failed with ENFILE (root on the host is exempt).
  Raised to the kernel's maximum, as systemd does: memory is each sandbox's bound.

Only raised, never lowered, and written only when below (another service on the machine may have raised
them further). Where /proc/sys cannot be written the start fails and says how to opt out
(`LocalBackendConfig.raise_kernel_ceilings=False`, keeping the pools one sandbox can drain).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sandbox_service.errors import IsolationUnavailableError

log = logging.getLogger("sandbox_service")

_SYSCTL = Path("/proc/sys")
PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's PID_MAX_LIMIT on 64-bit
FILE_MAX_LIMIT = 2**63 - 1  # LONG_MAX, fs.file-max's own maximum
PTY_MAX_LIMIT = 1 << 20  # NR_UNIX98_PTY_MAX


def wanted(pool_size: int, pty_max: int, pty_reserve: int) -> dict[str, int]:
    """The least value each ceiling must have for `pool_size` sandboxes holding `pty_max` ptys each."""
    return {
        "kernel/pty/max": min(PTY_MAX_LIMIT, pty_reserve + pool_size * pty_max),
        "kernel/pid_max": PID_MAX_LIMIT,
        "kernel/threads-max": PID_MAX_LIMIT,
        "fs/file-max": FILE_MAX_LIMIT,
    }


def _read(name: str) -> int:
    return int((_SYSCTL / name).read_text().split()[0])


def raise_ceilings(pool_size: int, pty_max: int) -> dict[str, tuple[int, int]]:
    """Raise every ceiling below what `wanted` asks; returns {sysctl: (before, after)} of those changed."""
    changed = {}
    for name, value in wanted(pool_size, pty_max, _read("kernel/pty/reserve")).items():
        before = _read(name)
        if before >= value:
            continue
        try:
            (_SYSCTL / name).write_text(str(value))
        except OSError as exc:
            raise IsolationUnavailableError(
                f"cannot raise {name.replace('/', '.')} from {before} to {value} ({exc.strerror}): below it, one "
                "sandbox (or a policy in many at once) can drain a pool every sandbox and the host share. Run the "
                "service where /proc/sys is writable, raise it yourself, or set "
                "LocalBackendConfig(raise_kernel_ceilings=False) to accept that"
            ) from exc
        changed[name.replace("/", ".")] = (before, value)
    if changed:
        log.info("raised machine-wide kernel ceilings so each sandbox's own cap binds first: %s", changed)
    return changed
