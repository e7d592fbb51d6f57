"""Running commands inside the sandbox: spawn, capture capped output, kill whole process trees.

Process-tree kill, in order of strength:
1. Per-exec cgroup (isolated local sandboxes): the agent holds a directory fd to the sandbox's pids
   cgroup (opened at boot, before the cgroup filesystem disappeared from view), gives each command a
   child cgroup (recycled once empty) that the thread starting it lives in (cgroup v1 allows per-thread
   membership; `CgroupTracker.command_group`), so the command is born inside it: no window in which it
   could fork outside. Nothing in the sandbox can leave that cgroup (the sandbox has no cgroupfs and
   no CAP_SYS_ADMIN), so `setsid`, double forks and daemonising do not escape a timeout kill.
   On a timeout the group is sealed first (pids.max 0: no member can fork any more) and its members
   are SIGKILLed until it is empty; a fork bomb stops growing at once, so the kill ends within the
   command's own timeout (`command_timeout`), never the service's TIMEOUT. (Sealed, not frozen: the
   freezer hierarchy would need a second delegated cgroup fd at boot; sealing needs only the group
   the agent made, whose pids.max it owns.)
2. Always: each command starts a new session; on timeout its process group, its session and every
   descendant found by a /proc ancestry walk are SIGKILLed, repeatedly until none is left.
3. Without a cgroup (Kubernetes pods, unisolated mode), each command also carries
   ORCHARD_EXEC_ID=<id> in its environment, and processes still holding it are killed too: this
   catches double-forked daemons that left both the session and the ancestry (unless they scrub
   their environment).
As PID 1 of the sandbox's pid namespace the agent adopts orphans; a single reaper thread reaps every
child and hands exit statuses to the exec that spawned them.

Stdlib only: this module is copied into every sandbox.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import Any

from sandbox_service.agent.proctree import EXEC_ID_VAR, CgroupTracker, kill_tree, mark_oom_victim, new_exec_id

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# After the command exits, wait this long for stdout/stderr EOF: a background child that inherited
# the pipes (`server &`) would otherwise hold the exec open forever.
PIPE_GRACE_SECONDS = 0.1


class Reaper:
    """Reaps every child of the agent (its own and adopted orphans) from one thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._waiters: dict[int, list] = {}
        self._have_children = threading.Condition(threading.Lock())
        threading.Thread(target=self._run, name="reaper", daemon=True).start()

    def register(self, pid: int, notify_fd: int | None = None) -> list:
        """Call with `self.lock` held, right after spawning; returns a cell [event, status, notify_fd].

        When the child is reaped, its status is stored, the event set and a byte written to notify_fd
        (so a selector loop wakes up)."""
        cell = [threading.Event(), None, notify_fd]
        self._waiters[pid] = cell
        with self._have_children:
            self._have_children.notify()
        return cell

    def _run(self) -> None:
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                with self._have_children:
                    self._have_children.wait(0.5)  # orphans may be adopted at any time
                continue
            except InterruptedError:
                continue
            with self.lock:
                cell = self._waiters.pop(pid, None)
            if cell is not None:
                cell[1] = os.waitstatus_to_exitcode(status)
                cell[0].set()
                if cell[2] is not None:
                    try:
                        os.write(cell[2], b"x")
                    except OSError:
                        pass


_DEVNULL: list[int] = []


def _devnull() -> int:
    if not _DEVNULL:  # opened lazily: at import time the agent may not have pivoted into its root yet
        _DEVNULL.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    return _DEVNULL[0]


class SpawnError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def build_env(base_env: dict[str, str], env: dict[str, str] | None) -> dict[str, str]:
    merged = dict(base_env)
    merged.setdefault("PATH", DEFAULT_PATH)
    if env:
        merged.update({str(k): str(v) for k, v in env.items()})
    return merged


def run_exec(
    reaper: Reaper,
    tracker: CgroupTracker,
    *,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    stdin: bytes,
    timeout: float,
    max_output: int,
) -> tuple[dict[str, Any], bytes]:
    """Run one command to completion (or timeout); returns the exec response header + output."""
    group = tracker.command_group()  # on v1 this thread now lives in it: the command is born there
    exec_id = None
    if group is None:
        exec_id = new_exec_id()
        env = {**env, EXEC_ID_VAR: exec_id}
    oom_before = tracker.oom_kills()
    start = time.monotonic()
    with reaper.lock:
        try:
            # bufsize=0: raw pipe objects (the loop below reads the fds itself); a /dev/null fd
            # opened once instead of per exec. No preexec_fn, so subprocess spawns with vfork.
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                close_fds=True,
                start_new_session=True,
                bufsize=0,
                stdin=subprocess.PIPE if stdin else _devnull(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except FileNotFoundError as exc:
            missing = exc.filename or argv[0]
            if not os.path.isdir(cwd):
                raise SpawnError("file_not_found", f"working directory {cwd!r} does not exist") from exc
            return _spawn_failure(127, f"{missing}: command not found\n", start, group, tracker)
        except PermissionError:
            return _spawn_failure(126, f"{argv[0]}: permission denied\n", start, group, tracker)
        except OSError as exc:
            if exc.errno == errno.E2BIG:  # as a shell answers it: exit 126 and why on stderr
                return _spawn_failure(126, _too_long(argv, env), start, group, tracker)
            if exc.errno in (errno.EAGAIN, errno.ENOMEM):
                tracker.release(group)
                raise SpawnError(
                    "spawn_failed",
                    "could not start the command: "
                    f"{os.strerror(exc.errno)} (process or memory limit of the sandbox "
                    "reached?); the agent is still running",
                ) from exc
            raise SpawnError("spawn_failed", f"could not start the command: {exc}") from exc
        notify_r, notify_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        cell = reaper.register(proc.pid, notify_w)
    tracker.adopt(group, proc.pid)
    if tracker.raise_oom_score:
        mark_oom_victim(proc.pid)
    try:
        out, err, out_trunc, err_trunc, timed_out = _communicate(
            proc, cell, notify_r, stdin, timeout, max_output, tracker, group, exec_id
        )
    finally:
        os.close(notify_r)
        os.close(notify_w)
        proc.returncode = cell[1] if cell[1] is not None else -9  # keep Popen from reaping
        tracker.release(group)
    code = cell[1]
    # Killed by SIGKILL (-9, or 137 when a shell reports its child's death) while the memory cgroup
    # counted an OOM kill: the kernel's doing at the memory limit, not the command's.
    oom = not timed_out and code in (-signal.SIGKILL, 128 + signal.SIGKILL) and tracker.oom_kills() > oom_before
    return {
        "exit_code": code,
        "timed_out": timed_out,
        "oom_killed": oom,
        "stdout_len": len(out),
        "stdout_truncated": out_trunc,
        "stderr_truncated": err_trunc,
        "duration": time.monotonic() - start,
    }, out + err


MAX_ARG_BYTES = 131072  # Linux MAX_ARG_STRLEN: the longest single argument or environment string


def _too_long(argv: list[str], env: dict[str, str]) -> str:
    """What an E2BIG from exec means, in figures the caller can act on."""
    longest = max(len(a.encode(errors="surrogateescape")) for a in argv)
    total = sum(len(a.encode(errors="surrogateescape")) + 1 for a in argv)
    total += sum(len(k.encode()) + len(v.encode(errors="surrogateescape")) + 2 for k, v in env.items())
    return (
        f"{argv[0]}: Argument list too long: its longest argument is {longest} bytes and the command line "
        f"with its environment {total} bytes; Linux takes at most {MAX_ARG_BYTES} bytes in one argument "
        "and about 2 MB in all (pass long input on stdin or in a file)\n"
    )


def _spawn_failure(
    code: int, message: str, start: float, group: str | None, tracker: CgroupTracker
) -> tuple[dict[str, Any], bytes]:
    tracker.release(group)
    err = message.encode()
    return {
        "exit_code": code,
        "timed_out": False,
        "oom_killed": False,
        "stdout_len": 0,
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration": time.monotonic() - start,
    }, err


def _communicate(
    proc,
    cell,
    notify_fd: int,
    stdin: bytes,
    timeout: float,
    cap: int,
    tracker: CgroupTracker,
    group: str | None,
    exec_id: str | None,
):
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated = {fd: False for fd in bufs}
    sel = selectors.PollSelector()  # a handful of fds, once: poll needs no epoll fd of its own
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    sel.register(notify_fd, selectors.EVENT_READ)
    view = memoryview(stdin) if stdin else None
    if view is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
    deadline = time.monotonic() + timeout
    exited_at = None
    timed_out = False
    open_pipes = set(bufs)
    try:
        while open_pipes or exited_at is None:
            now = time.monotonic()
            if exited_at is not None and now - exited_at > PIPE_GRACE_SECONDS:
                break
            if not timed_out and now >= deadline:
                timed_out = True
                kill_tree(proc.pid, tracker, group, exec_id)
                deadline = now + 5.0
            elif timed_out and now >= deadline:
                break  # killed but still not reaped after 5 s: report the timeout anyway
            wait = (deadline if not timed_out else now + 0.05) - now
            if exited_at is not None:
                wait = min(wait, PIPE_GRACE_SECONDS)
            for key, _ in sel.select(max(wait, 0.0)):
                fd = key.fd
                if fd == notify_fd:
                    sel.unregister(notify_fd)
                    cell[0].wait()
                    exited_at = time.monotonic()
                elif view is not None and fd == proc.stdin.fileno():
                    try:
                        n = os.write(fd, view[:65536])
                    except (BrokenPipeError, BlockingIOError) as exc:
                        n = len(view) if isinstance(exc, BrokenPipeError) else 0
                    view = view[n:]
                    if not view:
                        sel.unregister(fd)
                        proc.stdin.close()
                        view = None
                else:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        open_pipes.discard(fd)
                        continue
                    buf = bufs[fd]
                    room = cap - len(buf)
                    if room > 0:
                        buf += chunk[:room]
                    if len(chunk) > room:
                        truncated[fd] = True  # keep draining so the writer never blocks
    finally:
        sel.close()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
    if exited_at is None:  # only reachable if the kill loop gave up; wait for the status anyway
        cell[0].wait(5.0)
    fds = list(bufs)
    return bytes(bufs[fds[0]]), bytes(bufs[fds[1]]), truncated[fds[0]], truncated[fds[1]], timed_out
