"""The async client against the real service: the same behaviour as the sync one, concurrently."""

from __future__ import annotations

import asyncio
import io
import tarfile

from sandbox_service.errors import PathOutsideSandboxError
from sandbox_service.models import JobState, SandboxCreate, SandboxState


def test_async_client_end_to_end(sandbox_service, labels, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("from a tar\n")

    async def scenario() -> None:
        async with sandbox_service.async_client() as client:
            assert (await client.healthz())["status"] == "ok"
            async with await client.create(SandboxCreate(labels=labels)) as sb:
                assert sb.info.state is SandboxState.ready
                results = await asyncio.gather(*(sb.exec(f"echo {i}") for i in range(8)))
                assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
                await sb.write_file("/workspace/x.txt", b"async bytes")
                assert await sb.read_file("/workspace/x.txt") == b"async bytes"
                await sb.upload_dir(tmp_path / "src", "/workspace/up")
                assert (await sb.exec("cat /workspace/up/a.txt")).stdout == "from a tar\n"
                try:
                    await sb.read_file("../../etc/passwd")
                    raise AssertionError("traversal was not refused")
                except PathOutsideSandboxError:
                    pass
                patch = "--- a/x.txt\n+++ b/x.txt\n@@ -1 +1 @@\n-async bytes\n\\ No newline at end of file\n+patched\n"
                assert (await sb.apply_patch(patch, cwd="/workspace")).applied
                assert await sb.read_file("/workspace/x.txt") == b"patched\n"
                snap = await sb.snapshot()
                await sb.write_file("/workspace/x.txt", b"changed")
                await sb.restore(snap.id)
                assert await sb.read_file("/workspace/x.txt") == b"patched\n"
                await sb.heartbeat()
                job = (
                    await client.request(
                        "POST", f"/v1/sandboxes/{sb.id}/exec", json={"command": "echo job", "wait": False}
                    )
                ).json()
                done = await client.wait_job(job["id"], timeout=30)
                assert done.state is JobState.succeeded and done.result.stdout == "job\n"
                assert [i.id for i in await client.list(labels)] == [sb.id]
            assert (await client.get(sb.id)).state is SandboxState.deleted
            await client.request("DELETE", f"/v1/snapshots/{snap.id}")

    asyncio.run(scenario())


def test_sync_download_is_a_valid_gzip_tar(module_sandbox):
    module_sandbox.write_file("/workspace/dl/one.txt", "1")
    with tarfile.open(fileobj=io.BytesIO(module_sandbox.download_dir("/workspace/dl")), mode="r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("one.txt"))
        assert tar.extractfile(member).read() == b"1"
