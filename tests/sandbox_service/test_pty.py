"""Interactive PTY over WebSocket (`/v1/sandboxes/{id}/exec/pty`)."""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect


def _ws_url(service, sandbox_id: str, query: str = "") -> str:
    return service.url.replace("http://", "ws://") + f"/v1/sandboxes/{sandbox_id}/exec/pty{query}"


def _read_until(ws, needle: str, timeout: float = 10.0) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        frame = ws.recv(timeout=max(0.05, deadline - time.monotonic()))
        seen += frame.decode(errors="replace") if isinstance(frame, bytes) else frame
    return seen


def test_pty_shell_with_input_resize_and_exit(sandbox_service, module_sandbox):
    headers = {"Authorization": f"Bearer {sandbox_service.token}"}
    with connect(
        _ws_url(sandbox_service, module_sandbox.id, "?command=/bin/sh&rows=24&cols=80"), additional_headers=headers
    ) as ws:
        ws.send("echo pty-$((6*7))\n")  # text frames are typed input
        assert "pty-42" in _read_until(ws, "pty-42")
        ws.send(json.dumps({"type": "resize", "rows": 33, "cols": 101}))
        ws.send(b"stty size\n")  # binary frames too
        assert "33 101" in _read_until(ws, "33 101")
        ws.send("tty\n")
        assert "/dev/pts/" in _read_until(ws, "/dev/pts/")
        ws.send("exit\n")
        assert '"exit"' in _read_until(ws, '{"type": "exit"}')
        with pytest.raises(ConnectionClosed):
            while True:
                ws.recv(timeout=10)
        assert ws.close_code == 1000


def test_pty_accepts_the_token_as_a_query_parameter_and_refuses_a_wrong_one(sandbox_service, module_sandbox):
    with connect(_ws_url(sandbox_service, module_sandbox.id, f"?token={sandbox_service.token}")) as ws:
        ws.send("echo q-ok\n")
        assert "q-ok" in _read_until(ws, "q-ok")
    with connect(_ws_url(sandbox_service, module_sandbox.id, "?token=wrong")) as ws:
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 4401


def test_pty_on_an_unknown_sandbox_closes_with_404(sandbox_service):
    with connect(_ws_url(sandbox_service, "sb-nope", f"?token={sandbox_service.token}")) as ws:
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 4404


# --- The relay both PTY routes share (sandbox_service/server/pty.py) -----------------------------
class _Closes:
    def __init__(self, name: str, log: list, fails: bool = False):
        self.name, self.log, self.fails = name, log, fails

    async def close(self, code: int | None = None) -> None:
        self.log.append((self.name, code))
        if self.fails:
            raise RuntimeError(f"{self.name} failed to close")


def test_a_pty_session_releases_its_call_and_closes_in_order_even_when_steps_fail():
    import asyncio
    from types import SimpleNamespace

    from sandbox_service.server.pty import pty_session

    log: list = []
    rec = SimpleNamespace(active_calls=0)

    async def cleanup() -> None:
        log.append(("cleanup", rec.active_calls))

    async def session_body() -> None:
        async with pty_session(rec, _Closes("session", log, fails=True), _Closes("socket", log), cleanup):
            assert rec.active_calls == 1
            raise ConnectionError("client gone")

    with pytest.raises(ConnectionError):
        asyncio.run(session_body())
    assert rec.active_calls == 0
    assert log == [("session", None), ("cleanup", 0), ("socket", 1000)]


def test_the_relay_ends_with_either_pump_and_tells_when_the_client_left_first():
    import asyncio

    from sandbox_service.server.pty import relay

    async def scenario(client_leaves: bool) -> list:
        events: list = []
        out_may_end = asyncio.Event()

        async def pump_out() -> None:
            await (out_may_end.wait() if client_leaves else asyncio.sleep(0))
            events.append("out ended")

        async def pump_in() -> None:
            if client_leaves:
                return
            await asyncio.sleep(3600)  # cancelled once the output ended

        async def client_gone(out_task: asyncio.Task) -> None:
            events.append("client gone")
            out_may_end.set()
            await out_task

        await asyncio.wait_for(relay(pump_out(), pump_in(), client_gone), 10)
        return events

    assert asyncio.run(scenario(client_leaves=False)) == ["out ended"]
    assert asyncio.run(scenario(client_leaves=True)) == ["client gone", "out ended"]


@pytest.mark.parametrize("command", ["sh -c 'unbalanced", "echo \\"])
def test_a_command_that_is_not_shell_syntax_closes_with_4400(sandbox_service, module_sandbox, command):
    """shlex.split raised out of the route (an unhandled exception, the socket dropped without a reason)."""
    from urllib.parse import quote

    url = _ws_url(sandbox_service, module_sandbox.id, f"?command={quote(command)}")
    with connect(url, additional_headers={"Authorization": f"Bearer {sandbox_service.token}"}) as ws:
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 4400 and "shell syntax" in ws.close_reason, (ws.close_code, ws.close_reason)
