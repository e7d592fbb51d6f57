"""Interactive PTY over WebSocket: `/v1/sandboxes/{id}/exec/pty?command=...&rows=&cols=`.

Frames, both ways: binary frames carry raw terminal bytes; a text frame from the client is typed input,
unless it is a JSON object `{"type": "resize", "rows": R, "cols": C}`. When the shell exits the server
sends a text frame `{"type": "exit"}` and closes with 1000. Auth: the bearer header or `?token=`
(a wrong token closes the socket with 4401; other refusals with 4000 + their HTTP status).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from typing import Any, AsyncIterator, Awaitable, Callable, Coroutine

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from sandbox_service.server.auth import TokenAuth
from sandbox_service.errors import InvalidRequestError, SandboxServiceError
from sandbox_service.records import SandboxRecord
from sandbox_service.service import SandboxManager


def _control(text: str) -> dict | None:
    if not text.startswith("{"):
        return None
    try:
        msg = json.loads(text)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) and msg.get("type") == "resize" else None


@contextlib.asynccontextmanager
async def pty_session(
    rec: SandboxRecord, session: Any, websocket: WebSocket, cleanup: Callable[[], Awaitable[Any]] | None = None
) -> AsyncIterator[None]:
    """An open PTY session, counted as an active call of its sandbox. On leaving, whatever happened: the
    session is closed, `cleanup` awaited, then the socket closed with 1000 (each step even if one fails)."""
    rec.active_calls += 1
    try:
        yield
    finally:
        rec.active_calls -= 1
        with contextlib.suppress(Exception):
            await session.close()
        if cleanup is not None:
            with contextlib.suppress(Exception):
                await cleanup()
        with contextlib.suppress(Exception, WebSocketDisconnect):
            await websocket.close(code=1000)


async def relay(
    pump_out: Coroutine, pump_in: Coroutine, client_gone: Callable[[asyncio.Task], Awaitable[None]] | None = None
) -> None:
    """Run a PTY's two pumps until either ends, then cancel the other. `client_gone(out_task)` runs first
    when the input side ended (the client left) while the output still flows."""
    out_task, in_task = asyncio.create_task(pump_out), asyncio.create_task(pump_in)
    try:
        done, _ = await asyncio.wait({out_task, in_task}, return_when=asyncio.FIRST_COMPLETED)
        if client_gone is not None and in_task in done and not out_task.done():
            await client_gone(out_task)
    finally:
        for task in (out_task, in_task):
            task.cancel()
        await asyncio.gather(out_task, in_task, return_exceptions=True)


def pty_router(manager: SandboxManager, auth: TokenAuth) -> APIRouter:
    router = APIRouter()

    @router.websocket("/v1/sandboxes/{sandbox_id}/exec/pty")
    async def pty(
        websocket: WebSocket,
        sandbox_id: str,
        command: str = "/bin/sh",
        rows: int = 24,
        cols: int = 80,
        cwd: str | None = None,
    ) -> None:
        # Accept first, so that a refusal reaches the client as a close code (4000 + HTTP status) and a
        # reason, rather than a bare failed handshake.
        await websocket.accept()
        try:
            auth.require(websocket)
            rec = manager.ready(sandbox_id)
            agent = rec.agent
            assert agent is not None  # ready() refuses a record without one
            try:
                argv = shlex.split(command)
            except ValueError as exc:  # unbalanced quotes, a lone escape
                raise InvalidRequestError(f"command {command[:60]!r} is not valid shell syntax: {exc}") from None
            session = await agent.open_pty(
                argv, rows=rows, cols=cols, env=dict(rec.spec.env), cwd=cwd or rec.spec.workdir
            )
        except SandboxServiceError as err:
            await websocket.close(code=4000 + err.status_code, reason=f"{err.code}: {err.message}"[:120])
            return

        async def pump_out() -> None:
            while chunk := await session.read():
                await websocket.send_bytes(chunk)
            await websocket.send_text(json.dumps({"type": "exit"}))

        async def pump_in() -> None:
            while True:
                msg = await websocket.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                manager.record(sandbox_id)  # interactive use counts as a heartbeat
                if msg.get("bytes") is not None:
                    await session.write(msg["bytes"])
                elif msg.get("text") is not None:
                    ctl = _control(msg["text"])
                    if ctl is not None:
                        await session.resize(int(ctl.get("rows", rows)), int(ctl.get("cols", cols)))
                    else:
                        await session.write(msg["text"].encode())

        async with pty_session(rec, session, websocket):
            await relay(pump_out(), pump_in())

    return router
