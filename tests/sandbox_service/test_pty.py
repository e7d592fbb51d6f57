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
    with connect(_ws_url(sandbox_service, module_sandbox.id, "?command=/bin/sh&rows=24&cols=80"),
                 additional_headers=headers) as ws:
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
