"""Project-wide fixtures.

`sandbox_service` (session scope): one real sandbox service (`EmbeddedService`) on a loopback port for
the whole run, started on first use. Use it as

    def test_x(sandbox_service):
        with sandbox_service.client() as client, client.create() as sandbox: ...

or pass `sandbox_service.connection()` to a stage config. After the suite, a final check fails the run
if any sandbox process, mount or cgroup of a service started by the tests is still there. After each test,
the process's warm rooms (SWE verification sandboxes kept while verifications keep coming) are deleted, so
a test that counts a service's sandboxes sees only its own.
"""

from __future__ import annotations

import pytest

from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService


@pytest.fixture(scope="session")
def sandbox_service():
    # A short reaper interval so TTL tests need not wait long; everything else is the production default.
    with EmbeddedService(ServiceConfig(token="unused", reaper_interval_seconds=0.5)) as service:
        yield service


@pytest.fixture(scope="session")
def sandbox_client(sandbox_service):
    """A `SandboxClient` on the session service."""
    with sandbox_service.client() as client:
        yield client


@pytest.fixture(autouse=True)
def _no_warm_room_across_tests():
    yield
    from components.recipes.swe.warm_rooms import shared

    shared().close()


@pytest.fixture(scope="session", autouse=True)
def _no_sandbox_left_behind():
    yield
    leaks = [leak for service in EmbeddedService.started for leak in service.find_leaks()]
    assert not leaks, "sandbox resources left after the suite:\n" + "\n".join(leaks)
