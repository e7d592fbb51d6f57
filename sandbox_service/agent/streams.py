"""The agent's streaming features: an interactive PTY and the HTTP relay to sandbox ports.

PTY: after the `pty_open` response the connection carries frames both ways until the shell exits:
client -> agent ``{"t": "in"}`` + bytes, ``{"t": "resize", "rows", "cols"}``, ``{"t": "close"}``;
agent -> client ``{"t": "out"}`` + bytes, then a final ``{"t": "exit", "code"}``.

HTTP relay: the agent (inside the sandbox's network namespace) opens the connection to
127.0.0.1:port, so exposed ports work the same in every backend and need no host networking.

Stdlib only: this module is copied into every sandbox.
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import termios
import threading

from sandbox_service.agent import protocol


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _make_controlling_tty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def run_pty(sock, reaper, tracker, header: dict, env: dict[str, str], cwd: str) -> None:
    argv = header.get("argv") or ["/bin/sh"]
    master, slave = os.openpty()
    _set_size(master, int(header.get("rows", 24)), int(header.get("cols", 80)))
    send_lock = threading.Lock()
    group = tracker.command_group()  # the shell counts against the commands' pids limit, not the agent's
    try:
        with reaper.lock:
            # preexec_fn (fork, not vfork) only here: the shell needs the PTY as controlling terminal.
            proc = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_make_controlling_tty,
            )
            cell = reaper.register(proc.pid)
    except OSError as exc:
        tracker.release(group)
        os.close(master)
        os.close(slave)
        protocol.send_frame(
            sock, {"ok": False, "code": "invalid_request", "message": f"cannot start {argv[0]!r} on a PTY: {exc}"}
        )
        return
    tracker.adopt(group, proc.pid)
    os.close(slave)
    protocol.send_frame(sock, {"ok": True, "pid": proc.pid})

    def pump_out() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once every holder of the slave side closed it: the shell is gone
                chunk = b""
            if not chunk:
                break
            with send_lock:
                try:
                    protocol.send_frame(sock, {"t": "out"}, chunk)
                except OSError:
                    break
        cell[0].wait()
        proc.returncode = cell[1]
        with send_lock:
            try:
                protocol.send_frame(sock, {"t": "exit", "code": cell[1]})
            except OSError:
                pass

    pump = threading.Thread(target=pump_out, name="pty-out", daemon=True)
    out: threading.Thread | None = pump
    try:
        # Born in the shell's exec group (this thread lives there): it fails only when the shell's
        # processes have used up the commands' pids limit; the session then ends as if closed.
        pump.start()
    except RuntimeError:
        out = None
    try:
        while out is not None and out.is_alive():
            frame = protocol.recv_frame(sock)
            if frame is None:
                break
            msg, payload = frame
            kind = msg.get("t")
            if kind == "in":
                view = memoryview(payload)
                while view:
                    view = view[os.write(master, view) :]
            elif kind == "resize":
                _set_size(master, int(msg["rows"]), int(msg["cols"]))
            elif kind == "close":
                break
    except (OSError, protocol.ProtocolError):
        pass
    finally:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, 9)
            except OSError:
                pass
        if out is not None:
            out.join(5.0)
        os.close(master)
        tracker.release(group)


def http_relay(header: dict, body: bytes) -> tuple[dict, bytes]:
    import http.client

    port = int(header["port"])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=float(header.get("timeout", 60.0)))
    try:
        headers = {k: v for k, v in (header.get("headers") or {}).items() if k.lower() != "host"}
        headers["Host"] = f"127.0.0.1:{port}"
        conn.request(header.get("method", "GET"), header.get("path", "/") or "/", body=body or None, headers=headers)
        resp = conn.getresponse()
        cap = int(header.get("max_body", 32 << 20))
        chunks, size = [], 0
        while chunk := resp.read(min(1 << 16, cap + 1 - size)):  # never more than cap + 1 bytes in memory
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                why = f"the sandbox's response on port {port} is over {cap} bytes (max_port_body_bytes); not relayed"
                return {"ok": True, "status": 502, "headers": {"content-type": "text/plain"}}, why.encode()
        return {"ok": True, "status": resp.status, "headers": dict(resp.getheaders())}, b"".join(chunks)
    except OSError as exc:
        why = (
            f"nothing answered on port {port} inside the sandbox ({exc.strerror or exc}); is the server "
            "running, and is the sandbox's network mode loopback or allowlist (mode none has no lo)?"
        )
        return {"ok": True, "status": 502, "headers": {"content-type": "text/plain"}}, why.encode()
    finally:
        conn.close()
