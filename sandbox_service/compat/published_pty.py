"""The published API's PTY: `WS /published/sandboxes/{id}/exec/pty` (JSON text frames, base64 data).

client -> server: `init {cmd, env, cwd, rows, cols, login_shell}` first, then `stdin {data}`,
`signal {sig}`, `resize {rows, cols}`, `close`. server -> client: `ready {pid}`, `stdout {data}`,
`exit {code}` (negative: killed by that signal), `error {message}`. Auth: `?api_key=` or the
`Sec-WebSocket-Protocol: api_key.<key>` subprotocol; refusals close with 4401 / 4404 / 4409 / 4503.

Our agent's PTY gives a byte stream, not a pid or an exit status, so the command runs under a small
`/bin/sh` wrapper that writes its pid and exit status to files in the sandbox's /tmp; signals are sent
to that process group with an ordinary exec of `kill`. The wrapper files are removed when the session ends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import signal
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from sandbox_service.server.auth import TokenAuth
from sandbox_service.compat.published import PREFIX, PublishedState
from sandbox_service.errors import SandboxNotFoundError, SandboxNotReadyError, SandboxServiceError
from sandbox_service.models import ExecRequest
from sandbox_service.operations import SandboxOperations
from sandbox_service.server.pty import pty_session, relay

_WRAPPER = 'echo $$ > "$0.pid"; "$@"; echo $? > "$0.rc"'
_SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT, "HUP": signal.SIGHUP}


def _presented_key(ws: WebSocket) -> tuple[str | None, str | None]:
    """(key, subprotocol to echo) from the query or the api_key.<key> subprotocol."""
    key = ws.query_params.get("api_key")
    if key:
        return key, None
    for proto in ws.headers.get("sec-websocket-protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith("api_key."):
            return proto[len("api_key.") :], proto
    return None, None


def _close_code(err: SandboxServiceError) -> int:
    if isinstance(err, SandboxNotFoundError):
        return 4404
    if isinstance(err, SandboxNotReadyError):
        return 4409
    return 4503 if err.status_code == 503 else 4000 + err.status_code


def published_pty_router(state: PublishedState, ops: SandboxOperations, auth: TokenAuth) -> APIRouter:
    router = APIRouter()

    async def sh(sandbox_id: str, script: str, *args: str) -> str:
        result = await ops.exec(
            sandbox_id, ExecRequest(command=["/bin/sh", "-c", script, "sh", *args], timeout_seconds=10)
        )
        return result.stdout.strip() if result.ok else ""

    @router.websocket(PREFIX + "/sandboxes/{sandbox_id}/exec/pty")
    async def pty(ws: WebSocket, sandbox_id: str) -> None:
        key, subprotocol = _presented_key(ws)
        await ws.accept(subprotocol=subprotocol)  # accept first, so refusals arrive as close codes
        if not auth.check(key):
            await ws.close(code=4401, reason="missing or invalid api_key")
            return
        try:
            rec = state.resolve(sandbox_id)
            our_id = state.manager.ready(rec.info.id).info.id
            init = json.loads(await ws.receive_text())
            if not isinstance(init, dict) or init.get("type") != "init" or not init.get("cmd"):
                await ws.send_text(json.dumps({"type": "error", "message": "first frame must be init {cmd, ...}"}))
                await ws.close(code=4400)
                return
            cmd = [str(a) for a in init["cmd"]]
            if init.get("login_shell"):
                cmd = ["bash", "-l", "-c", 'exec "$@"', "bash", *cmd]
            marker = f"/tmp/.orchard-pty-{secrets.token_hex(8)}"
            session = await rec.agent.open_pty(
                ["/bin/sh", "-c", _WRAPPER, marker, *cmd],
                rows=int(init.get("rows") or 24),
                cols=int(init.get("cols") or 80),
                env={**rec.spec.env, **(init.get("env") or {})},
                cwd=init.get("cwd") or rec.spec.workdir,
            )
        except SandboxServiceError as err:
            await ws.close(code=_close_code(err), reason=f"{err.code}: {err.message}"[:120])
            return
        except (ValueError, WebSocketDisconnect):
            with contextlib.suppress(Exception):
                await ws.close(code=4400, reason="expected an init frame")
            return
        async with pty_session(rec, session, ws, cleanup=lambda: sh(our_id, 'rm -f "$1.pid" "$1.rc"', marker)):
            await run_session(ws, session, our_id, marker)

    async def run_session(ws: WebSocket, session: Any, our_id: str, marker: str) -> None:
        """After the init: report the wrapper's pid, then relay until the command exits or the client leaves."""
        written = None
        for _ in range(40):  # the wrapper writes its pid at once; a few ms in practice
            written = await sh(our_id, 'cat "$1.pid" 2>/dev/null', marker)
            if written:
                break
            await asyncio.sleep(0.05)
        pid = int(written) if written and written.isdigit() else None
        await ws.send_text(json.dumps({"type": "ready", "pid": pid}))
        killed_by: list[int] = []

        async def pump_out() -> None:
            while chunk := await session.read():
                await ws.send_text(json.dumps({"type": "stdout", "data": base64.b64encode(chunk).decode()}))
            rc = await sh(our_id, 'cat "$1.rc" 2>/dev/null', marker)
            code = int(rc) if rc.lstrip("-").isdigit() else (-killed_by[-1] if killed_by else -1)
            await ws.send_text(json.dumps({"type": "exit", "code": code}))

        async def send_signal(sig: signal.Signals) -> None:
            if pid is not None:
                killed_by.append(int(sig))
                await sh(our_id, 'kill -s "$1" -- "-$2" 2>/dev/null || kill -s "$1" "$2"', sig.name[3:], str(pid))

        async def pump_in() -> None:
            while True:
                frame = json.loads(await ws.receive_text())
                state.manager.record(our_id)  # interactive use counts as a heartbeat
                kind = frame.get("type")
                if kind == "stdin":
                    await session.write(base64.b64decode(frame.get("data", "")))
                elif kind == "resize":
                    await session.resize(int(frame["rows"]), int(frame["cols"]))
                elif kind == "signal":
                    await send_signal(_SIGNALS.get(str(frame.get("sig", "TERM")).upper(), signal.SIGTERM))
                elif kind == "close":
                    await send_signal(signal.SIGTERM)

        async def client_gone(out_task: asyncio.Task) -> None:  # gone or closed: end the process too
            await send_signal(signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(out_task, 5)

        await relay(pump_out(), pump_in(), client_gone)

    return router
