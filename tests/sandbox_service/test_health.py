"""`/healthz` checks the backend for real: the readiness probe fails while the Kubernetes API does
not answer, and says why; `/livez` (liveness) does not, so an API outage never restarts the service."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from kubernetes import client as k8s

from sandbox_service.server.app import create_app
from sandbox_service.backends.base import SandboxBackend
from sandbox_service.backends.kubernetes.api import KubernetesApi
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.decode import FastApiClient
from sandbox_service.backends.kubernetes.testing.fake import FakeKubernetesAPI
from sandbox_service.config import ServiceConfig


class Backend(SandboxBackend):
    """A backend whose only behaviour is its health."""

    name = "stub"

    def __init__(self, problem: str | None):
        self.problem = problem

    def health(self):
        return self.problem

    def start(self, *a):
        raise NotImplementedError

    status = stop = apply_network_policy = snapshot = restore = delete_snapshot = start


def _get(backend: SandboxBackend, path: str, tmp_path) -> httpx.Response:
    app = create_app(ServiceConfig(token="t", state_dir=tmp_path), backend)

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as client:
            return await client.get(path)

    return asyncio.run(get())


def test_healthz_is_503_with_the_reason_when_the_backend_cannot_create(tmp_path):
    down = _get(Backend("the Kubernetes API is unreachable (MaxRetryError: ...)"), "/healthz", tmp_path)
    assert down.status_code == 503
    body = down.json()
    assert body["status"] == "unavailable" and body["code"] == "backend_unavailable"
    assert body["message"].startswith("the Kubernetes API is unreachable")
    up = _get(Backend(None), "/healthz", tmp_path)
    assert up.status_code == 200 and up.json()["status"] == "ok" and "code" not in up.json()
    # liveness: the process answers, whatever the backend says (and no token needed, as for /healthz)
    assert _get(Backend("down"), "/livez", tmp_path).json() == {"status": "ok"}


@pytest.fixture
def fake():
    api = FakeKubernetesAPI()
    yield api
    api.close()


def _api(host: str) -> KubernetesApi:
    config = KubernetesBackendConfig(namespace="orchard-sandboxes")
    return KubernetesApi(config, FastApiClient(k8s.Configuration(host=host)))


def test_the_kubernetes_backend_is_healthy_when_its_namespace_lists(fake):
    api = _api(fake.url)
    assert api.health() is None
    (request,) = fake.sent("GET", "pods")
    assert request["query"]["limit"] == ["1"]  # one pod at most: cheap every few seconds
    fake.fail("GET", "pods", 403, "Forbidden")
    assert api.health() == "the Kubernetes API answered 403 Forbidden listing pods in orchard-sandboxes"


def test_an_unreachable_kubernetes_api_is_unhealthy_in_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    problem = _api(f"http://127.0.0.1:{port}").health()
    assert problem.startswith("the Kubernetes API is unreachable") and "\n" not in problem
