"""`AgentClient`: the control plane's async client for one sandbox agent (see agent/protocol.py).

    client = AgentClient(endpoint)              # AgentEndpoint from SandboxBackend.start()
    await client.ping()                         # readiness
    result = await client.exec(ExecRequest(command="pytest -q"), workdir="/workspace",
                               env=spec.env, max_output_bytes=1 << 20)
    await client.close()

- A small pool of connections (`pool_size` idle ones kept); concurrent calls each take their own.
  Stale pooled connections (the agent restarted, e.g. after a restore) are detected and replaced;
  idempotent ops are retried once on a fresh connection.
- Explicit timeouts: connect, per-op, and for exec the command's own timeout plus `exec_grace`.
- Errors: the agent's codes become `sandbox_service.errors` types (PathOutsideSandboxError,
  FileNotFoundInSandboxError, InvalidRequestError, ...); no answer -> `AgentUnreachableError`.
- OOM: an exec whose command was SIGKILLed while the sandbox's memory cgroup recorded an OOM kill
  ran out of the sandbox's own memory: the command's outcome (command_failed, reason `oom`), counted
  against the policy. Only a verification run (`ExecRequest.verification`, set by the harness) turns
  it into infrastructure_error/OOM_KILLED, which the service answers with resource escalation.
- TLS (endpoint.tls): verified against endpoint.ca_cert_pem; the agent's certificate must name
  `AGENT_TLS_SERVER_NAME` (pod IPs are not known when certificates are made; see agent_link/tls.py).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from datetime import datetime, timezone

from sandbox_service import errors
from sandbox_service.agent import protocol
from sandbox_service.agent_link.base import AgentClientBase, AgentUnreachableError, FileScope, PtySession
from sandbox_service.backends.base import AgentEndpoint
from sandbox_service.models import ExecOutcome, ExecRequest, ExecResult, FileEntry, InfraErrorKind

AGENT_TLS_SERVER_NAME = "orchard-agent"
_IDEMPOTENT = {"ping", "read_file", "write_file", "list_files", "get_archive", "put_archive"}
_ERRORS: dict[str, type[errors.SandboxServiceError]] = {
    "path_outside_sandbox": errors.PathOutsideSandboxError,
    "file_not_found": errors.FileNotFoundInSandboxError,
    "invalid_request": errors.InvalidRequestError,
    "spawn_failed": errors.InvalidRequestError,
    "too_large": errors.RequestTooLargeError,
}
STREAM_CHUNK = 1 << 20


class _Conn:
    __slots__ = ("reader", "writer", "fresh")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer, self.fresh = reader, writer, True

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class AgentClient(AgentClientBase):
    def __init__(
        self,
        endpoint: AgentEndpoint,
        *,
        pool_size: int = 8,
        connect_timeout: float = 5.0,
        op_timeout: float = 120.0,
        exec_grace: float = 15.0,
    ):
        self.endpoint = endpoint
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self.op_timeout = op_timeout
        self.exec_grace = exec_grace
        self._idle: list[_Conn] = []
        self._ssl: ssl.SSLContext | None = None
        if endpoint.tls:
            if not endpoint.ca_cert_pem:
                raise errors.InvalidRequestError("agent endpoint has tls=True but no ca_cert_pem to verify it")
            self._ssl = ssl.create_default_context(cadata=endpoint.ca_cert_pem)
        self._closed = False

    # -- connections ---------------------------------------------------------------------------
    async def _connect(self) -> _Conn:
        ep = self.endpoint
        try:
            if ep.transport == "unix":
                coro = asyncio.open_unix_connection(ep.address)
            else:
                host, _, port = ep.address.rpartition(":")
                coro = asyncio.open_connection(
                    host.strip("[]"),
                    int(port),
                    ssl=self._ssl,
                    server_hostname=AGENT_TLS_SERVER_NAME if self._ssl else None,
                )
            reader, writer = await asyncio.wait_for(coro, self.connect_timeout)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            raise AgentUnreachableError(f"cannot connect to the agent at {ep.transport}:{ep.address}: {exc!r}") from exc
        return _Conn(reader, writer)

    async def _acquire(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                conn.fresh = False
                return conn
            conn.close()
        return await self._connect()

    def _release(self, conn: _Conn) -> None:
        if not self._closed and len(self._idle) < self.pool_size and conn.usable():
            self._idle.append(conn)
        else:
            conn.close()

    async def _roundtrip(self, conn: _Conn, header: dict, payload: bytes, timeout: float) -> tuple[dict, bytes]:
        conn.writer.write(protocol.encode_head(header, len(payload)))
        if payload:
            conn.writer.write(payload)
        async with asyncio.timeout(timeout):  # cheaper than wait_for: no extra task per call
            await conn.writer.drain()
            prefix = await conn.reader.readexactly(protocol.PREFIX_SIZE)
            hlen, plen = protocol.decode_lengths(prefix)
            head = protocol.decode_header(await conn.reader.readexactly(hlen))
            body = await conn.reader.readexactly(plen) if plen else b""
        return head, body

    async def _call(
        self, op: str, header: dict | None = None, payload: bytes = b"", *, timeout: float | None = None
    ) -> tuple[dict, bytes]:
        if self._closed:
            raise AgentUnreachableError("agent client is closed")
        req = {"op": op, "secret": self.endpoint.secret, **(header or {})}
        timeout = self.op_timeout if timeout is None else timeout
        for attempt in (0, 1):
            conn = await self._acquire()
            try:
                resp, body = await self._roundtrip(conn, req, payload, timeout)
            except asyncio.CancelledError:
                # Cancelled mid-call (service-side timeout, job cancel): the reply may still arrive
                # later, so the connection cannot go back to the pool; it must not stay open either.
                conn.close()
                raise
            except asyncio.TimeoutError as exc:
                conn.close()
                raise AgentUnreachableError(f"agent did not answer {op!r} within {timeout:.1f} s") from exc
            except (OSError, asyncio.IncompleteReadError, protocol.ProtocolError) as exc:
                conn.close()
                # A reused connection may have died with an old agent; a fresh one gets one more try.
                if attempt == 0 and not conn.fresh and (op in _IDEMPOTENT or _before_reply(exc)):
                    continue
                raise AgentUnreachableError(f"lost the connection to the agent during {op!r}: {exc!r}") from exc
            self._release(conn)
            _raise_for(resp)
            return resp, body
        raise AssertionError("unreachable")

    # -- ops -----------------------------------------------------------------------------------
    async def ping(self, timeout: float = 1.0) -> dict:
        resp, _ = await self._call("ping", timeout=timeout)
        return resp

    async def exec(
        self, request: ExecRequest, *, workdir: str, env: dict[str, str], max_output_bytes: int
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", request.command] if isinstance(request.command, str) else list(request.command)
        if not argv:
            raise errors.InvalidRequestError("command is empty")
        cap = request.max_output_bytes if request.max_output_bytes is not None else max_output_bytes
        cwd = request.cwd or workdir
        header = {
            "argv": argv,
            "cwd": cwd,
            "env": {**env, **request.env},
            "timeout": request.timeout_seconds,
            "max_output": cap,
        }
        stdin = request.stdin.encode() if request.stdin else b""
        started = time.monotonic()
        try:
            resp, body = await self._call("exec", header, stdin, timeout=request.timeout_seconds + self.exec_grace)
        except errors.InvalidRequestError as exc:
            if "could not start the command" in exc.message:  # pids/memory exhausted by the workload
                return ExecResult(
                    exit_code=None,
                    outcome=ExecOutcome.command_failed,
                    message=exc.message,
                    duration_seconds=time.monotonic() - started,
                )
            raise
        return _exec_result(resp, body, request.timeout_seconds, request.verification)

    async def read_file(self, path: str, *, scope: FileScope = "workspace") -> bytes:
        _, body = await self._call("read_file", {"path": path, "scope": scope})
        return body

    async def write_file(
        self, path: str, data: bytes, mode: int | None = None, *, scope: FileScope = "workspace"
    ) -> None:
        await self._call("write_file", {"path": path, "mode": mode, "scope": scope}, data)

    async def list_files(self, path: str, *, scope: FileScope = "workspace") -> list[FileEntry]:
        resp, _ = await self._call("list_files", {"path": path, "scope": scope})
        return [
            FileEntry(
                name=e["name"],
                path=e["path"],
                type=e["type"],
                size=e["size"],
                modified_at=datetime.fromtimestamp(e["mtime"], tz=timezone.utc),
            )
            for e in resp["entries"]
        ]

    async def put_archive(self, path: str, tar_gz: bytes) -> None:
        await self._call("put_archive", {"path": path}, tar_gz)

    async def get_archive(self, path: str) -> bytes:
        _, body = await self._call("get_archive", {"path": path})
        return body

    async def upload(self, op: str, header: dict, size: int, chunks) -> dict:
        """A large payload streamed on a fresh connection of its own (a consumed stream cannot be retried
        on a stale pooled one). Memory: one chunk plus the transport's write buffer."""
        conn = await self._connect()
        req = {"op": op, "secret": self.endpoint.secret, **header}
        try:
            conn.writer.write(protocol.encode_head(req, size))
            sent = 0
            async for chunk in chunks:
                sent += len(chunk)
                if sent > size:
                    raise errors.InvalidRequestError(f"upload longer than its declared {size} bytes")
                conn.writer.write(chunk)
                await conn.writer.drain()
            if sent != size:
                raise errors.InvalidRequestError(f"upload ended after {sent} of its declared {size} bytes")
            async with asyncio.timeout(self.op_timeout):
                prefix = await conn.reader.readexactly(protocol.PREFIX_SIZE)
                hlen, plen = protocol.decode_lengths(prefix)
                resp = protocol.decode_header(await conn.reader.readexactly(hlen))
                if plen:
                    await conn.reader.readexactly(plen)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, protocol.ProtocolError)):
                raise AgentUnreachableError(f"lost the connection to the agent during {op!r}: {exc!r}") from exc
            raise
        self._release(conn)
        _raise_for(resp)
        return resp

    async def download(self, op: str, header: dict):
        """Send the request, read the answer's header; the payload is then read chunk by chunk by the
        returned iterator, which gives the connection back once it has read all of it."""
        for attempt in (0, 1):
            conn = await self._acquire()
            req = {"op": op, "secret": self.endpoint.secret, **header}
            try:
                conn.writer.write(protocol.encode_head(req, 0))
                async with asyncio.timeout(self.op_timeout):
                    await conn.writer.drain()
                    prefix = await conn.reader.readexactly(protocol.PREFIX_SIZE)
                    hlen, plen = protocol.decode_lengths(prefix)
                    resp = protocol.decode_header(await conn.reader.readexactly(hlen))
            except BaseException as exc:
                conn.close()
                if isinstance(exc, (OSError, asyncio.IncompleteReadError, protocol.ProtocolError)):
                    if attempt == 0 and not conn.fresh:
                        continue
                    raise AgentUnreachableError(f"lost the connection to the agent during {op!r}: {exc!r}") from exc
                if isinstance(exc, asyncio.TimeoutError):
                    raise AgentUnreachableError(f"agent did not answer {op!r} within {self.op_timeout:.1f} s") from exc
                raise
            if not resp.get("ok"):
                if plen:
                    await conn.reader.readexactly(plen)
                self._release(conn)
                _raise_for(resp)
            return plen, self._stream(conn, plen)
        raise AssertionError("unreachable")

    async def _stream(self, conn: _Conn, left: int):
        try:
            while left:
                chunk = await conn.reader.read(min(left, STREAM_CHUNK))
                if not chunk:
                    raise AgentUnreachableError("the agent closed the connection in the middle of a download")
                left -= len(chunk)
                yield chunk
        except BaseException:
            conn.close()  # the reader gave up (or the agent went away): the rest is still on the wire
            raise
        self._release(conn)

    async def http_request(
        self, port: int, method: str, path: str, headers: dict[str, str], body: bytes, max_body_bytes: int = 32 << 20
    ) -> tuple[int, dict[str, str], bytes]:
        resp, data = await self._call(
            "http", {"port": port, "method": method, "path": path, "headers": headers, "max_body": max_body_bytes}, body
        )
        return resp["status"], resp["headers"], data

    async def open_pty(
        self,
        command: list[str],
        rows: int = 24,
        cols: int = 80,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> PtySession:
        conn = await self._connect()  # a PTY owns its connection; it never returns to the pool
        req = {
            "op": "pty_open",
            "secret": self.endpoint.secret,
            "argv": list(command) or ["/bin/sh"],
            "rows": rows,
            "cols": cols,
            "env": env or {},
            "cwd": cwd,
        }
        try:
            resp, _ = await self._roundtrip(conn, req, b"", self.op_timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            conn.close()
            raise AgentUnreachableError(f"cannot open a PTY: {exc!r}") from exc
        if not resp.get("ok"):
            conn.close()
            raise (errors.UnauthorizedError if resp.get("code") == "unauthorized" else errors.InvalidRequestError)(
                resp.get("message", "pty refused")
            )
        return AgentPty(conn)

    async def rekey(self, new_secret: str) -> None:
        await self._call("rekey", {"new_secret": new_secret})
        self.endpoint = self.endpoint.model_copy(update={"secret": new_secret})  # later calls use the new key

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _raise_for(resp: dict) -> None:
    """Re-raise an agent's error answer as the matching `sandbox_service.errors` type."""
    if resp.get("ok"):
        return
    code = resp.get("code", "internal_error")
    message = resp.get("message", "agent error")
    if code == "unauthorized":
        raise errors.UnauthorizedError(f"agent refused the request: {message}")
    cls = _ERRORS.get(code)
    raise cls(message) if cls else errors.error_from_body(500, code, message)


def _before_reply(exc: BaseException) -> bool:
    """The connection was dead before the agent could have read the request."""
    return isinstance(exc, (BrokenPipeError, ConnectionResetError)) or (
        isinstance(exc, asyncio.IncompleteReadError) and not exc.partial
    )


def _exec_result(resp: dict, body: bytes, timeout: float, verification: bool = False) -> ExecResult:
    n = resp["stdout_len"]
    stdout = body[:n].decode("utf-8", "replace")
    stderr = body[n:].decode("utf-8", "replace")
    code = resp["exit_code"]
    common = dict(
        exit_code=code,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=resp["stdout_truncated"],
        stderr_truncated=resp["stderr_truncated"],
        duration_seconds=resp["duration"],
    )
    if resp.get("oom_killed"):
        if verification:  # the verifier's environment must fit: the infrastructure's, escalated
            return ExecResult(
                **common,
                outcome=ExecOutcome.infrastructure_error,
                infra_error=InfraErrorKind.OOM_KILLED,
                message="the verification run was killed by the kernel OOM killer at the "
                "sandbox's memory limit; retry with more memory (resource escalation)",
            )
        return ExecResult(
            **common,
            outcome=ExecOutcome.command_failed,
            reason="oom",
            message="the command ran out of the sandbox's memory and was killed by the kernel "
            "OOM killer (the command's own outcome; the sandbox is still usable)",
        )
    if resp.get("timed_out"):
        return ExecResult(
            **common,
            outcome=ExecOutcome.command_timeout,
            message=f"command exceeded its {timeout:g} s timeout; it was killed with its whole process tree",
        )
    return ExecResult(**common, outcome=ExecOutcome.ok if code == 0 else ExecOutcome.command_failed)


class AgentPty(PtySession):
    """A PTY stream on its own connection (frames as described in streams.py)."""

    def __init__(self, conn: _Conn):
        self._conn = conn
        self.exit_code: int | None = None
        self._done = False

    async def read(self) -> bytes:
        while not self._done:
            try:
                prefix = await self._conn.reader.readexactly(protocol.PREFIX_SIZE)
                hlen, plen = protocol.decode_lengths(prefix)
                head = protocol.decode_header(await self._conn.reader.readexactly(hlen))
                body = await self._conn.reader.readexactly(plen) if plen else b""
            except (OSError, asyncio.IncompleteReadError):
                self._done = True
                break
            if head.get("t") == "out":
                return body
            if head.get("t") == "exit":
                self.exit_code = head.get("code")
                self._done = True
        return b""

    async def _send(self, header: dict, payload: bytes = b"") -> None:
        if self._done:
            return
        try:
            self._conn.writer.write(protocol.encode_head(header, len(payload)) + payload)
            await self._conn.writer.drain()
        except OSError as exc:
            raise AgentUnreachableError(f"PTY connection lost: {exc!r}") from exc

    async def write(self, data: bytes) -> None:
        await self._send({"t": "in"}, data)

    async def resize(self, rows: int, cols: int) -> None:
        await self._send({"t": "resize", "rows": rows, "cols": cols})

    async def close(self) -> None:
        try:
            await self._send({"t": "close"})
        except AgentUnreachableError:
            pass
        self._done = True
        self._conn.close()
