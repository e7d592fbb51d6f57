"""Fixtures of the sandbox-service tests (the session-wide service itself is in tests/conftest.py)."""

from __future__ import annotations

import uuid

import pytest

from sandbox_service.models import SandboxCreate


@pytest.fixture
def labels() -> dict[str, str]:
    """Labels unique to one test, so list filters only ever see that test's sandboxes."""
    return {"test": uuid.uuid4().hex[:12]}


@pytest.fixture
def sandbox(sandbox_client, labels):
    """A fresh ready sandbox, deleted after the test."""
    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        yield sb


@pytest.fixture(scope="module")
def module_sandbox(sandbox_client):
    """One ready sandbox shared by a module's read-mostly tests."""
    with sandbox_client.create(SandboxCreate(labels={"test": "module"})) as sb:
        yield sb
