"""Snapshots of Kubernetes sandboxes, taken through the agent: a gzipped tar of the sandbox's workdir,
kept on the service's disk, restored by emptying the workdir and extracting the tar.

What a snapshot holds: the workdir only (`SandboxCreate.workdir`, /workspace by default). Changes
elsewhere in the container's filesystem (packages installed under /usr, files in /tmp) are not
carried; a container filesystem cannot be captured from outside the node without a privileged
helper. A pod whose agent is gone (an OOM kill ends the whole container) cannot be snapshotted.
Snapshots are keyed by id, not by sandbox: any sandbox can be restored from (or forked off) any.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sandbox_service.agent_link.base import AgentClientBase
from sandbox_service.backends.base import AgentEndpoint
from sandbox_service.errors import BackendUnavailableError, SandboxServiceError, SnapshotNotFoundError
from sandbox_service.models import ExecRequest

AgentFactory = Callable[[AgentEndpoint], AgentClientBase]

# Empties a directory with the injected interpreter: the task image may have no shell at all.
_WIPE = (
    "import os, shutil, sys\n"
    "for n in os.listdir(sys.argv[1]):\n"
    "    p = os.path.join(sys.argv[1], n)\n"
    "    shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)\n"
)


def run_coroutine(factory: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run an agent coroutine from a backend method (they run in worker threads without a loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # called from a loop: keep it unblocked
        return pool.submit(lambda: asyncio.run(factory())).result()


class AgentSnapshots:
    def __init__(self, directory: Path, agent_factory: AgentFactory, *, python: str, ready_timeout: float):
        self.directory = directory
        self.agent_factory = agent_factory
        self.python = python  # the injected interpreter inside the pod
        self.ready_timeout = ready_timeout
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, snapshot_id: str) -> Path:
        if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
            raise SnapshotNotFoundError(f"invalid snapshot id {snapshot_id!r}")
        return self.directory / f"{snapshot_id}.tar.gz"

    def save(self, endpoint: AgentEndpoint, workdir: str, snapshot_id: str) -> int:
        path = self.path(snapshot_id)

        async def fetch() -> bytes:
            agent = self.agent_factory(endpoint)
            try:
                return await agent.get_archive(workdir)
            finally:
                await agent.close()

        data = run_coroutine(fetch)
        tmp = path.with_suffix(".partial")
        tmp.write_bytes(data)
        tmp.replace(path)  # a crash mid-write never leaves a truncated snapshot under the real name
        return len(data)

    def restore(self, endpoint: AgentEndpoint, workdir: str, snapshot_id: str) -> None:
        path = self.path(snapshot_id)
        if not path.exists():
            raise SnapshotNotFoundError(f"snapshot {snapshot_id!r} is not stored at {path}")
        data = path.read_bytes()
        wipe = ExecRequest(command=[self.python, "-I", "-c", _WIPE, workdir], timeout_seconds=120)

        async def push() -> None:
            agent = self.agent_factory(endpoint)
            try:
                await self._await_agent(agent, snapshot_id)  # restore may run right after start()
                result = await agent.exec(wipe, workdir="/", env={}, max_output_bytes=65536)
                if not result.ok:
                    raise SandboxServiceError(
                        f"emptying {workdir} before restore failed: {result.stderr or result.message}"
                    )
                await agent.put_archive(workdir, data)
            finally:
                await agent.close()

        run_coroutine(push)

    async def _await_agent(self, agent: AgentClientBase, snapshot_id: str) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            try:
                await agent.ping(timeout=1.0)
                return
            except Exception as err:  # noqa: BLE001 - not answering yet is expected
                if time.monotonic() >= deadline:
                    raise BackendUnavailableError(
                        f"agent did not answer within {self.ready_timeout:g} s to restore {snapshot_id}: {err}"
                    ) from err
                await asyncio.sleep(0.1)

    def delete(self, snapshot_id: str) -> None:
        self.path(snapshot_id).unlink(missing_ok=True)
