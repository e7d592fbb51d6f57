"""Fork server for fast sandbox starts: the agent, already imported, forked into fresh namespaces.

Starting a Python interpreter and importing the agent costs 30-100 ms per sandbox (most of a
sandbox's start-up). The local backend therefore runs one zygote per state dir on the host:

    python -I -S -c <launch> --zygote SOCKET_PATH

It imports every agent module once, then for each request (one JSON line {"argv": [...], "log": path}
on a new connection) forks a child that `unshare`s mount, uts, ipc, net and pid namespaces, makes
mounts private and forks again: the grandchild is PID 1 of the new pid namespace and runs the agent's
`main(argv)` exactly as `unshare ... python -m sandbox_service.agent --boot ...` would, writing its
ready line to the request connection. The zygote is a child subreaper, so it reaps sandboxes that
exit; it stays single-threaded (safe to fork) and exits when its parent (the service) goes away.

Stdlib only; runs on the host (not in a sandbox) from the same agent copy the sandboxes mount.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import sys
from collections.abc import Callable

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWUSER = 0x40000000, 0x20000000, 0x10000000
MS_REC, MS_PRIVATE = 16384, 1 << 18
PR_SET_CHILD_SUBREAPER = 36


def _reap(*_):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _child(conn: socket.socket, request: dict, agent_main: Callable[[list[str]], int]) -> None:
    """Runs in the forked child; never returns."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        os.setsid()
        flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWPID
        if libc.unshare(flags) != 0:
            raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
        if libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) != 0:
            raise OSError(ctypes.get_errno(), f"make mounts private: {os.strerror(ctypes.get_errno())}")
        # This process also makes the sandbox's user namespace (boot.enter_userns): it unshares one after
        # forking the agent, and the agent, still host root, writes its maps and later joins it. No extra
        # fork, and the wait is hidden behind the agent's own boot. It does so as the sandbox's own host
        # uid (`userns_owner`): the kernel charges per-user counters of everything in a namespace (inotify
        # instances, message queues) to its owner too, so a namespace root made would share them.
        from sandbox_service.agent import boot

        unshared_r, unshared_w = os.pipe()
        done_r, done_w = os.pipe()
        peer = os.getpid()
        if os.fork() != 0:
            os.close(unshared_r)
            os.close(done_w)
            if request.get("userns_owner") is not None:
                boot.become(request["userns_owner"])
            os.write(unshared_w, b"1" if libc.unshare(CLONE_NEWUSER) == 0 else b"0")
            os.read(done_r, 1)  # EOF once the agent holds the namespace (or is gone)
            os._exit(0)  # the grandchild, PID 1 of the new namespace, is adopted by the zygote
        os.close(unshared_w)
        os.close(done_r)
        boot.USERNS_PEER.update(pid=peer, unshared_fd=unshared_r, done_fd=done_w)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the agent's reaper thread owns its children
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        ready = os.dup(conn.fileno())
        conn.close()
        rc = agent_main([*request["argv"], "--ready-fd", str(ready)])
    except BaseException as exc:  # report and die: nothing may return into the zygote's loop
        try:
            conn.sendall((json.dumps({"ok": False, "message": f"zygote child: {exc!r}"}) + "\n").encode())
        except OSError:
            pass
        os._exit(1)
    os._exit(rc or 0)


def serve(path: str, agent_main: Callable[[list[str]], int], preload: Callable[[], None]) -> int:
    """Fork `agent_main` (the agent's `main`, from `__main__.py`, which starts the zygote) for each request;
    `preload` imports what the agent would import lazily, before any fork."""
    from sandbox_service.agent import boot, execs, files, proctree, server, streams  # noqa: F401

    preload()
    from sandbox_service.agent import seccomp

    try:
        seccomp.prepare()  # once, before forking: each sandbox only loads the compiled filter
    except seccomp.SeccompError:
        pass  # reported by the sandboxes whose boot config asks for the filter
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGCHLD, _reap)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    listener.bind(path)
    os.umask(old)
    listener.listen(256)
    parent = os.getppid()
    print(json.dumps({"ok": True, "pid": os.getpid()}), flush=True)
    while True:
        if os.getppid() != parent:  # the service died: sandboxes live on, found later as orphans
            return 0
        if not select.select([listener], [], [], 1.0)[0]:
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        try:
            conn.settimeout(5)
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buf += chunk
            request = json.loads(buf)
            if os.fork() == 0:
                listener.close()
                _child(conn, request, agent_main)
        except (OSError, ValueError) as exc:
            try:
                conn.sendall((json.dumps({"ok": False, "message": f"zygote: {exc!r}"}) + "\n").encode())
            except OSError:
                pass
        finally:
            conn.close()
