"""Service-side records of sandboxes (never on the wire; `SandboxInfo` is) and the agent factory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sandbox_service.agent_link.base import AgentClientBase
from sandbox_service.backends.base import AgentEndpoint
from sandbox_service.models import SandboxCreate, SandboxInfo, SandboxState

AgentFactory = Callable[[AgentEndpoint], AgentClientBase]
DeleteHook = Callable[[str, str], Awaitable[None]]


def now() -> datetime:
    return datetime.now(timezone.utc)


def default_agent_factory(endpoint: AgentEndpoint) -> AgentClientBase:
    from sandbox_service.agent_link.client import AgentClient  # lazy: importing the service must not need it

    return AgentClient(endpoint)


@dataclass(eq=False)
class SandboxRecord:
    """Service-side state of one sandbox. Never crosses the wire (`info` does)."""

    info: SandboxInfo
    spec: SandboxCreate
    secret: str
    heartbeat_ttl: float
    hard_ttl: float
    created_mono: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)
    endpoint: AgentEndpoint | None = None
    agent: AgentClientBase | None = None
    task: asyncio.Task | None = None
    queued: bool = True  # waiting for a create slot (safe to cancel: holds nothing yet)
    deleting: bool = False
    deleted_mono: float | None = None
    active_calls: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # start/stop/restore/escalate never overlap
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # set while ready, failed or deleted
    deleted: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def id(self) -> str:
        return self.info.id

    def set_state(self, state: SandboxState) -> None:
        self.info.state = state
        if state is SandboxState.pending:
            self.settled.clear()
        else:
            self.settled.set()
