"""Compatibility surfaces: other systems' wire APIs served by the same sandbox service."""

from __future__ import annotations

from fastapi import FastAPI

from sandbox_service.server.auth import TokenAuth
from sandbox_service.compat.published import PREFIX as PUBLISHED_PREFIX
from sandbox_service.compat.published import published_router
from sandbox_service.compat.published_pty import published_pty_router
from sandbox_service.config import ServiceConfig
from sandbox_service.jobs import JobManager

__all__ = ["PUBLISHED_PREFIX", "mount_published_api"]
from sandbox_service.operations import SandboxOperations
from sandbox_service.service import SandboxManager


def mount_published_api(
    app: FastAPI,
    config: ServiceConfig,
    auth: TokenAuth,
    manager: SandboxManager,
    ops: SandboxOperations,
    jobs: JobManager,
) -> None:
    """Serve the published environment API under `PUBLISHED_PREFIX` (it checks `X-API-Key` itself, so the
    service middleware must leave that prefix open)."""
    router, state = published_router(config, auth, manager, ops, jobs)
    app.include_router(router)
    app.include_router(published_pty_router(state, ops, auth))
