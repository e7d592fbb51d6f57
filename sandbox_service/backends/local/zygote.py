"""Host side of the agent fork server (agent/zygote.py): start it once, ask it for sandboxes.

`Zygote.spawn(argv, log)` returns the agent's ready line ({"ok": true, "host_pid": N, ...}) like the
exec path (`unshare ... python -m sandbox_service.agent`) does, ~30-100 ms sooner per sandbox because
no interpreter starts and nothing is imported. The zygote is restarted if it died; `close()` stops it
(running sandboxes are not affected: they are separate processes in their own namespaces).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import threading
import time
from pathlib import Path

from sandbox_service.errors import BackendUnavailableError


class Zygote:
    def __init__(self, python: str, launch: str, socket_path: Path, log_path: Path, env: dict[str, str]):
        self.python, self.launch, self.path, self.log_path, self.env = python, launch, socket_path, log_path, env
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            with open(self.log_path, "ab") as log:
                # argv[0] is a name, not the interpreter's path: sandboxes forked from the zygote show its
                # command line as theirs, and it names no host path (the socket's is in the environment).
                proc = subprocess.Popen(
                    ["orchard-agent", "-I", "-S", "-c", self.launch, "--zygote"],
                    executable=self.python,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env={**self.env, "ORCHARD_ZYGOTE_SOCKET": str(self.path)},
                    start_new_session=True,
                )
            assert proc.stdout is not None  # stdout=PIPE
            line = _read_line(proc.stdout.fileno(), 30.0)
            proc.stdout.close()
            if not line.startswith(b'{"ok": true'):
                proc.kill()
                proc.wait()
                raise BackendUnavailableError(f"agent zygote did not start: {line!r}; see {self.log_path}")
            self._proc = proc

    def spawn(self, argv: list[str], log: Path, timeout: float, userns_owner: int | None = None) -> dict:
        """`userns_owner`: the host uid the sandbox's user namespace is created as (its own id range's first)."""
        for attempt in (0, 1):
            self._ensure()
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                    conn.connect(str(self.path))
                    conn.sendall(
                        (json.dumps({"argv": argv, "log": str(log), "userns_owner": userns_owner}) + "\n").encode()
                    )
                    line = _read_line(conn.fileno(), timeout)
            except (ConnectionRefusedError, FileNotFoundError):
                if attempt == 0:
                    self.close()
                    continue
                raise
            if not line:
                raise BackendUnavailableError("sandbox agent exited during boot")
            return json.loads(line)
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _read_line(fd: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise BackendUnavailableError(f"no answer within {timeout:g} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    return buf
