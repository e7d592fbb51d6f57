"""What the control plane can ask of a sandbox's agent. `agent_link/client.py` implements it over the
agent's wire protocol; the service (`service.py`) only ever uses this interface.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from typing import Literal

from sandbox_service.models import ExecRequest, ExecResult, FileEntry

# Where a file path is confined: the workspace (every native route), or the sandbox's whole root (the
# published API, as the reference allows; refused by an unisolated agent, whose root is the host's).
FileScope = Literal["workspace", "root"]


class PtySession(abc.ABC):
    """An interactive terminal inside the sandbox."""

    @abc.abstractmethod
    async def read(self) -> bytes:
        """Next chunk of terminal output; b'' when the shell exited."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def resize(self, rows: int, cols: int) -> None: ...

    async def rekey(self, new_secret: str) -> None:
        """Make the agent accept `new_secret` only (authenticated with the current one). Only the
        Kubernetes warm pool uses it; clients that cannot re-key say so."""
        raise NotImplementedError(f"{type(self).__name__} cannot re-key an agent")

    @abc.abstractmethod
    async def close(self) -> None: ...


class AgentClientBase(abc.ABC):
    """One connection target (an `AgentEndpoint`); safe for concurrent use from one event loop."""

    @abc.abstractmethod
    async def ping(self, timeout: float = 1.0) -> dict:
        """Answer from the agent (pid, version); raises on no answer. Readiness = a successful ping."""

    @abc.abstractmethod
    async def exec(
        self, request: ExecRequest, *, workdir: str, env: dict[str, str], max_output_bytes: int
    ) -> ExecResult:
        """Run a command; the agent kills its whole process tree on timeout. Raises
        `AgentUnreachableError` if the agent is gone (the service maps that to an infra error)."""

    @abc.abstractmethod
    async def read_file(self, path: str, *, scope: FileScope = "workspace") -> bytes: ...

    @abc.abstractmethod
    async def write_file(
        self, path: str, data: bytes, mode: int | None = None, *, scope: FileScope = "workspace"
    ) -> None: ...

    @abc.abstractmethod
    async def list_files(self, path: str, *, scope: FileScope = "workspace") -> list[FileEntry]: ...

    @abc.abstractmethod
    async def put_archive(self, path: str, tar_gz: bytes) -> None:
        """Extract a gzipped tar under `path` (members escaping `path` are refused)."""

    @abc.abstractmethod
    async def get_archive(self, path: str) -> bytes: ...

    @abc.abstractmethod
    async def upload(self, op: str, header: dict, size: int, chunks: AsyncIterator[bytes]) -> dict:
        """Stream a `size`-byte payload (`write_file` / `put_archive`) to the agent without holding it."""

    @abc.abstractmethod
    async def download(self, op: str, header: dict) -> tuple[int, AsyncIterator[bytes]]:
        """(size, chunks) of a `read_file` / `get_archive` answer, streamed from the agent."""

    @abc.abstractmethod
    async def open_pty(
        self,
        command: list[str],
        rows: int = 24,
        cols: int = 80,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> PtySession: ...

    @abc.abstractmethod
    async def http_request(
        self, port: int, method: str, path: str, headers: dict[str, str], body: bytes, max_body_bytes: int = 32 << 20
    ) -> tuple[int, dict[str, str], bytes]:
        """Relay one HTTP request to 127.0.0.1:port inside the sandbox (service-port exposure works
        the same in every backend because the agent, not the host, opens the connection). A response
        body over `max_body_bytes` is a 502 (the agent stops reading it there)."""

    async def rekey(self, new_secret: str) -> None:
        """Make the agent accept `new_secret` only (authenticated with the current one). Only the
        Kubernetes warm pool uses it; clients that cannot re-key say so."""
        raise NotImplementedError(f"{type(self).__name__} cannot re-key an agent")

    @abc.abstractmethod
    async def close(self) -> None: ...


class AgentUnreachableError(ConnectionError):
    """The agent did not answer (crashed, killed, sandbox gone)."""
