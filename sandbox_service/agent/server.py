"""The agent server: accepts connections, checks the per-sandbox secret, dispatches ops.

One thread per connection (the control plane keeps a small pool of connections, so threads are
made per connection, not per request) with blocking sockets: this keeps the agent's start-up to the
stdlib's cheapest imports (asyncio alone costs ~60 ms to import, more than a whole sandbox boot)
and a request's path to a handful of syscalls. Ops (request header ``op``):

    ping                                   -> {pid, version, isolation, cgroup_tracking}
    exec   {argv, cwd, env, timeout, max_output} + stdin payload
                                           -> {exit_code, timed_out, oom_killed, stdout_len, ...}
                                              + payload stdout||stderr
    read_file {path, scope}                -> payload
    write_file {path, mode, scope} + payload
    list_files {path, scope}               -> {entries: [{name, path, type, size, mtime}]}
    put_archive {path} + tar.gz payload    -> {members}
    get_archive {path}                     -> tar.gz payload
    pty_open {argv, rows, cols, env, cwd}  -> the connection becomes a PTY stream (streams.py)
    http {port, method, path, headers} + body -> {status, headers} + body
    rekey {new_secret}                     -> {} ; from then on only new_secret is accepted (a warm
                                              pod handed to a sandbox gets that sandbox's key)

Every request must carry ``secret``; it is compared in constant time and a wrong one closes the
connection after an ``unauthorized`` answer. Stdlib only: this module is copied into every sandbox.

File ops are confined to the workspace; with ``scope: "root"`` (read_file, write_file, list_files) to the
sandbox's own root instead, with the same beneath-only resolution (no magic links, no escape): what any
command in the sandbox can reach anyway. An unisolated agent (its root is the host's) keeps that scope in the
workspace too, and says why when a path is outside.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

from sandbox_service.agent import beneath, execs, files, protocol, proctree, streams

try:  # the constant-time compare behind hmac.compare_digest, without loading OpenSSL at start-up
    import _operator

    compare_digest = _operator._compare_digest
except ImportError:  # pragma: no cover - other interpreters
    import hmac

    compare_digest = hmac.compare_digest

AGENT_VERSION = "1"
MAX_READ_BYTES = 256 * 1024 * 1024  # download limit when the request names none
# Uploads bigger than this are read from the socket as they are written (never whole in memory).
STREAM_MIN_BYTES = 1 << 20
_STREAMED_OPS = ("write_file", "put_archive")
UNISOLATED = ("unisolated", "none")  # agents whose "/" is the host's (the local backend's and a bare one's)


class AgentServer:
    def __init__(
        self,
        *,
        secret: str,
        workspace: str,
        workdir: str,
        base_env: dict[str, str],
        tracker: proctree.CgroupTracker,
        isolation: str,
        tls_context=None,
        workspace_alias: str | None = None,
    ) -> None:
        self.secret = secret.encode()
        self.workspace = workspace
        self.workdir = files.Confinement(workspace, workdir, workspace_alias).workdir
        self.base_env = base_env
        self.tracker = tracker
        self.isolation = isolation
        self.tls = tls_context
        self.reaper = execs.Reaper()
        self.conf = files.Confinement(workspace, workdir, workspace_alias)
        # The sandbox's own root, for scope "root"; where "/" is the host's, the workspace still.
        self.root_conf = (
            files.Confinement("/", self.workdir)
            if isolation not in UNISOLATED
            else files.Confinement(
                workspace,
                workdir,
                workspace_alias,
                note=" (this sandbox runs unisolated: its root is the host's, so file paths stay in the workspace)",
            )
        )

    def _scoped(self, header: dict) -> files.Confinement:
        scope = header.get("scope") or "workspace"
        if scope not in ("workspace", "root"):
            raise files.FileOpError("invalid_request", f"scope {scope!r} must be 'workspace' or 'root'")
        return self.conf if scope == "workspace" else self.root_conf

    # -- serving -------------------------------------------------------------------------------
    def serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except InterruptedError:
                continue
            except OSError as exc:
                # EMFILE/ENFILE/ENOBUFS under a fork bomb or fd exhaustion: keep serving.
                print(f"agent: accept failed: {exc}", file=sys.stderr, flush=True)
                threading.Event().wait(0.01)
                continue
            try:
                threading.Thread(target=self._serve_conn, args=(conn,), daemon=True).start()
            except RuntimeError:  # cannot create a thread (pids limit): refuse this connection only
                conn.close()

    def _serve_conn(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn.settimeout(10.0)  # a peer that never finishes the handshake must not hold a thread
                conn = self.tls.wrap_socket(conn, server_side=True)
                conn.settimeout(None)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                head = protocol.recv_head(conn)
                if head is None:
                    return
                header, payload_len = head
                op = header.get("op")
                payload: bytes | protocol.PayloadReader
                if op in _STREAMED_OPS and payload_len > STREAM_MIN_BYTES:
                    payload = protocol.PayloadReader(conn, payload_len)
                else:
                    payload = protocol.recv_payload(conn, payload_len)
                secret = header.get("secret")
                if not isinstance(secret, str) or not compare_digest(secret.encode(), self.secret):
                    protocol.send_frame(
                        conn, {"ok": False, "code": "unauthorized", "message": "wrong or missing agent secret"}
                    )
                    return
                if op == "pty_open":
                    env = execs.build_env(self.base_env, header.get("env"))
                    env.setdefault("TERM", "xterm-256color")
                    try:
                        cwd_fd = self._cwd(header.get("cwd"))
                    except (files.FileOpError, execs.SpawnError) as exc:
                        protocol.send_frame(conn, {"ok": False, "code": exc.code, "message": exc.message})
                        return
                    try:
                        streams.run_pty(conn, self.reaper, self.tracker, header, env, f"/proc/self/fd/{cwd_fd}")
                    finally:
                        os.close(cwd_fd)
                    return
                try:
                    resp, out = self._dispatch(op, header, payload)
                except (files.FileOpError, execs.SpawnError) as exc:
                    resp, out = {"ok": False, "code": exc.code, "message": exc.message}, b""
                except (KeyError, TypeError, ValueError) as exc:
                    resp, out = (
                        {"ok": False, "code": "invalid_request", "message": f"malformed {op!r} request: {exc!r}"},
                        b"",
                    )
                except Exception as exc:  # the agent must outlive any single bad request
                    resp, out = (
                        {"ok": False, "code": "internal_error", "message": f"agent error in {op!r}: {exc!r}"},
                        b"",
                    )
                if isinstance(payload, protocol.PayloadReader):
                    payload.drain()  # an op refused early: the rest of the upload is still on the wire
                try:
                    protocol.send_frame(conn, resp, out)
                finally:
                    if isinstance(out, protocol.FileBody):
                        out.close()
        except (OSError, protocol.ProtocolError):
            pass
        except Exception as exc:  # e.g. ssl errors from a bad client
            print(f"agent: connection error: {exc!r}", file=sys.stderr, flush=True)
        finally:
            try:
                conn.close()
            except OSError:
                pass

    # -- ops -----------------------------------------------------------------------------------
    def _cwd(self, cwd: str | None) -> int:
        """An O_PATH fd of the command's working directory (anywhere in the sandbox's own root), opened
        with no magic link: `/proc/<pid>/fd/N` would lead the agent's child (still privileged before exec)
        into the agent's own host-side fds. The child enters it as /proc/self/fd/<fd>, its own fd: the
        directory checked is the directory used."""
        path = self.workdir if not cwd else os.path.normpath(os.path.join(self.workdir, self.conf.unalias(cwd)))
        try:
            return beneath.open_dir_path(path)
        except beneath.EscapeError as exc:
            raise files.FileOpError(
                "path_outside_sandbox",
                f"working directory {cwd!r} goes through a magic "
                "link (/proc/<pid>/fd/..., /proc/<pid>/root, ...): refused",
            ) from exc
        except FileNotFoundError as exc:
            raise execs.SpawnError("file_not_found", f"working directory {cwd!r} does not exist") from exc
        except NotADirectoryError as exc:
            raise files.FileOpError("invalid_request", f"working directory {cwd!r} is not a directory") from exc

    def _dispatch(
        self, op, header: dict, payload: bytes | protocol.PayloadReader
    ) -> tuple[dict, bytes | protocol.FileBody]:
        if op == "ping":
            return {
                "ok": True,
                "pid": os.getpid(),
                "version": AGENT_VERSION,
                "isolation": self.isolation,
                "protocol": protocol.PROTOCOL_VERSION,
                "cgroup_tracking": self.tracker.enabled,
            }, b""
        if op == "exec":
            assert isinstance(payload, bytes)  # only write_file and put_archive stream their payload
            argv = header["argv"]
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise files.FileOpError("invalid_request", "argv must be a non-empty list of strings")
            cwd_fd = self._cwd(header.get("cwd"))
            try:
                result, out = execs.run_exec(
                    self.reaper,
                    self.tracker,
                    argv=argv,
                    cwd=f"/proc/self/fd/{cwd_fd}",
                    env=execs.build_env(self.base_env, header.get("env")),
                    stdin=payload,
                    timeout=float(header.get("timeout", 60.0)),
                    max_output=int(header.get("max_output", 1 << 20)),
                )
            finally:
                os.close(cwd_fd)
            result["ok"] = True
            return result, out
        if op == "read_file":
            f, size = files.open_file(self._scoped(header), header["path"], int(header.get("limit") or MAX_READ_BYTES))
            return {"ok": True}, protocol.FileBody(f, size)
        if op == "write_file":
            files.write_file(self._scoped(header), header["path"], payload, header.get("mode"))
            return {"ok": True}, b""
        if op == "list_files":
            return {"ok": True, "entries": files.list_dir(self._scoped(header), header["path"])}, b""
        if op == "put_archive":
            return {"ok": True, "members": files.put_archive(self.conf, header["path"], payload)}, b""
        if op == "get_archive":
            f, size = files.spool_archive(self.conf, header["path"], int(header.get("limit") or MAX_READ_BYTES))
            return {"ok": True}, protocol.FileBody(f, size)
        if op == "http":
            assert isinstance(payload, bytes)  # only write_file and put_archive stream their payload
            return streams.http_relay(header, payload)
        if op == "rekey":
            new = header["new_secret"]
            if not isinstance(new, str) or len(new) < 16:
                raise files.FileOpError("invalid_request", "new_secret must be a string of at least 16 characters")
            # One attribute store: every later request, on any connection, is checked against the new key.
            self.secret = new.encode()
            return {"ok": True}, b""
        raise files.FileOpError("invalid_request", f"unknown op {op!r}")
