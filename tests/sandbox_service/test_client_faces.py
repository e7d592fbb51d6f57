"""`Sandbox` and `AsyncSandbox`: the same operations from one implementation, against the real service."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from sandbox_service.client import (
    AsyncSandbox,
    AsyncSandboxClient,
    Sandbox,
    SandboxClient,
    _ClientOps,
    _SandboxOps,
)


@pytest.mark.parametrize(
    ("ops", "sync_cls", "async_cls"),
    [(_SandboxOps, Sandbox, AsyncSandbox), (_ClientOps, SandboxClient, AsyncSandboxClient)],
)
def test_both_faces_have_every_operation_with_the_same_signature(ops, sync_cls, async_cls):
    # every operation (a generator of HTTP calls); plain helpers such as `verifying` need no I/O face
    names = [n for n, v in vars(ops).items() if not n.startswith("_") and inspect.isgeneratorfunction(v)]
    assert len(names) >= 8
    for name in names:
        sync, coro = getattr(sync_cls, name), getattr(async_cls, name)
        assert inspect.signature(sync) == inspect.signature(coro), name
        assert not inspect.iscoroutinefunction(sync) and inspect.iscoroutinefunction(coro), name
    assert inspect.signature(Sandbox.exec).return_annotation == "ExecResult"


def test_the_async_face_does_what_the_sync_face_does(sandbox_service, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("from a dir")

    def sync_run() -> tuple:
        with sandbox_service.client() as client, client.create() as sb:
            sb.write_file("x.txt", "hello", mode=0o600)
            sb.upload_dir(tmp_path / "d", "up")
            out = (
                sb.exec("cat x.txt up/a.txt").stdout,
                sb.read_text("x.txt"),
                sorted(e.name for e in sb.list_files(".")),
                len(sb.download_dir("up")) > 0,
            )
        return out

    async def async_run() -> tuple:
        from sandbox_service.client import AsyncSandboxClient

        async with AsyncSandboxClient(sandbox_service.url, sandbox_service.token) as client:
            async with await client.create() as sb:
                await sb.write_file("x.txt", "hello", mode=0o600)
                await sb.upload_dir(tmp_path / "d", "up")
                out = (
                    (await sb.exec("cat x.txt up/a.txt")).stdout,
                    await sb.read_text("x.txt"),
                    sorted(e.name for e in await sb.list_files(".")),
                    len(await sb.download_dir("up")) > 0,
                )
                await sb.delete()
                await sb.delete()  # a second delete is not an error (404 handled inside the one implementation)
        return out

    expected = ("hellofrom a dir", "hello", ["up", "x.txt"], True)
    assert sync_run() == expected
    assert asyncio.run(async_run()) == expected
