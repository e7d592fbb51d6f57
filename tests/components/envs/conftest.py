"""Fixtures of the environment-adapter tests: a real OpenEnv server (uvicorn on loopback) per recipe."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_env(config, max_concurrent_envs: int = 32):
    """An OpenEnv server for `config` in a thread; yields (base_url, shared)."""
    import uvicorn

    from components.envs.openenv_env import TOKEN_ENV, create_env_app

    token = secrets.token_urlsafe(16)
    app, shared = create_env_app(config, token=token, max_concurrent_envs=max_concurrent_envs)
    os.environ[TOKEN_ENV] = token  # what RecipeEnvClient sends
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "OpenEnv server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", shared
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        shared.close()
        os.environ.pop(TOKEN_ENV, None)


@pytest.fixture
def env_server():
    return serve_env
