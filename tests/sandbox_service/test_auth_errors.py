"""Auth, the JSON error bodies of every failure class, saturation (503), and credential hygiene."""

from __future__ import annotations

import time

import httpx
import pytest

from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService
from sandbox_service.errors import CapacityExceededError, SandboxNotReadyError, WaitTimeoutError
from sandbox_service.models import JobState, SandboxCreate


def _body(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"code", "message"} and body["message"]
    return body


def test_every_route_needs_the_token_except_healthz(sandbox_service):
    http = httpx.Client(base_url=sandbox_service.url)
    assert http.get("/healthz").json()["status"] == "ok"
    for method, path in [
        ("GET", "/v1/sandboxes"),
        ("POST", "/v1/sandboxes"),
        ("GET", "/metrics"),
        ("GET", "/v1/sandboxes/sb-x"),
        ("POST", "/v1/sandboxes/sb-x/exec"),
        ("GET", "/v1/jobs/job-x"),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": sandbox_service.token}):
            response = http.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, headers)
            assert _body(response)["code"] == "unauthorized"
            assert sandbox_service.token not in response.text


def test_error_bodies(sandbox_service, sandbox_client):
    auth = {"Authorization": f"Bearer {sandbox_service.token}"}
    url = sandbox_service.url
    unknown = httpx.get(url + "/v1/sandboxes/sb-unknown", headers=auth)
    assert unknown.status_code == 404 and _body(unknown)["code"] == "sandbox_not_found"
    no_route = httpx.get(url + "/v1/nothing-here", headers=auth)
    assert no_route.status_code == 404 and _body(no_route)["code"] == "not_found"
    for bad in ({"resources": {"memory_mb": "lots"}}, {"unknown_field": 1}, {"labels": "not-a-dict"}):
        invalid = httpx.post(url + "/v1/sandboxes", json=bad, headers=auth)
        assert invalid.status_code == 422 and _body(invalid)["code"] == "validation_error"
    not_json = httpx.post(url + "/v1/sandboxes", content=b"{", headers=auth | {"content-type": "application/json"})
    assert not_json.status_code == 422 and _body(not_json)["code"] == "validation_error"
    bad_label = httpx.get(url + "/v1/sandboxes", params={"label": "no-equals-sign"}, headers=auth)
    assert bad_label.status_code == 400 and _body(bad_label)["code"] == "invalid_request"
    bad_exec = httpx.post(
        url + "/v1/sandboxes/sb-unknown/exec", json={"command": "true", "timeout_seconds": -1}, headers=auth
    )
    assert bad_exec.status_code == 422


def test_exec_on_a_deleted_sandbox_is_409(sandbox_client, labels):
    sb = sandbox_client.create(SandboxCreate(labels=labels))
    sb.delete()
    with pytest.raises(SandboxNotReadyError) as info:
        sb.exec("true")
    assert info.value.status_code == 409


@pytest.fixture(scope="module")
def tight_service():
    """A second service with tiny caps, to reach saturation without load."""
    config = ServiceConfig(
        token="unused",
        max_concurrent_execs=1,
        max_concurrent_creates=1,
        max_sandboxes=4,
        retry_after_seconds=2,
        reaper_interval_seconds=0.5,
        max_request_bytes=65536,
    )
    with EmbeddedService(config) as service:
        yield service


def test_saturated_execs_get_503_with_retry_after(tight_service):
    with tight_service.client() as client, client.create() as sb:
        job = sb.exec_async("sleep 2")
        deadline = time.monotonic() + 10
        while client.get_job(job.id).state is not JobState.running:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        response = httpx.post(
            f"{tight_service.url}/v1/sandboxes/{sb.id}/exec",
            json={"command": "true"},
            headers={"Authorization": f"Bearer {tight_service.token}"},
        )
        assert response.status_code == 503 and response.headers["retry-after"] == "2"
        assert _body(response)["code"] == "capacity_exceeded"
        # Async jobs queue behind the cap instead of being refused.
        queued = sb.exec_async("echo queued")
        assert client.get_job(queued.id).state is JobState.queued
        assert client.wait_job(queued.id, timeout=30).result.stdout == "queued\n"
        assert 'orchard_rejected_total{cap="execs"} 1.0' in client.metrics()


def test_creates_beyond_the_cap_get_503_and_queued_ones_are_pending(tight_service):
    with tight_service.client() as client:
        sandboxes = [client.create(wait=False) for _ in range(4)]
        try:
            # One create runs at a time (max_concurrent_creates=1): the last is still queued, not ready.
            with pytest.raises(SandboxNotReadyError):
                sandboxes[-1].exec("true", timeout=5)
            with pytest.raises(WaitTimeoutError) as info:
                sandboxes[-1].wait_ready(timeout=0.01)
            assert info.value.status_code == 408
            response = httpx.post(
                f"{tight_service.url}/v1/sandboxes", json={}, headers={"Authorization": f"Bearer {tight_service.token}"}
            )
            assert response.status_code == 503 and _body(response)["code"] == "capacity_exceeded"
            assert response.headers["retry-after"] == "2"
            with pytest.raises(CapacityExceededError):
                client.request("POST", "/v1/sandboxes", json={}, retry=False)
            for sb in sandboxes:
                assert sb.wait_ready(timeout=60).state.value == "ready"
        finally:
            for sb in sandboxes:
                sb.delete()
        # Deleted sandboxes' records stay a while (tombstones) but hold no place under the cap.
        with client.create() as sb:
            assert sb.exec("true").ok


def test_sandboxes_get_no_credentials(sandbox_service, module_sandbox):
    env = module_sandbox.exec("env").stdout
    assert sandbox_service.token not in env
    assert "ORCHARD_" not in env and "KUBERNETES_SERVICE" not in env
    # The service's token file and state directory are not readable from inside.
    token_file = sandbox_service.log_path.parent / "token"
    probe = module_sandbox.exec(
        f"cat {token_file} 2>&1; ls {sandbox_service.state_dir} 2>&1; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'"
    )
    assert sandbox_service.token not in probe.stdout
    assert not module_sandbox.exec("ls /var/run/secrets/kubernetes.io 2>/dev/null").stdout


def test_oversized_uploads_are_413(tight_service):
    auth = {"Authorization": f"Bearer {tight_service.token}"}
    with tight_service.client() as client, client.create() as sb:
        url = f"{tight_service.url}/v1/sandboxes/{sb.id}/files"
        declared = httpx.put(url, params={"path": "big"}, content=b"x" * 100_000, headers=auth)
        assert declared.status_code == 413 and _body(declared)["code"] == "request_too_large"
        streamed = httpx.put(url, params={"path": "big"}, content=iter([b"x" * 40_000] * 3), headers=auth)
        assert streamed.status_code == 413 and _body(streamed)["code"] == "request_too_large"
        sb.write_file("small", b"x" * 60_000)  # under the limit
        assert len(sb.read_file("small")) == 60_000


def test_the_direct_exec_path_answers_like_the_route(tight_service):
    """Exec bodies are served by the middleware's direct path; what it cannot validate goes to FastAPI."""
    auth = {"Authorization": f"Bearer {tight_service.token}"}
    with tight_service.client() as client, client.create() as sb:
        url = f"{tight_service.url}/v1/sandboxes/{sb.id}/exec"
        ok = httpx.post(url, json={"command": ["true"]}, headers=auth)
        assert ok.status_code == 200 and ok.json()["outcome"] == "ok"
        queued = httpx.post(url, json={"command": ["true"], "wait": False}, headers=auth)
        assert queued.status_code == 202 and queued.json()["state"] in {"queued", "running", "succeeded"}
        for bad in ({"command": 5}, {"command": ["true"], "no_such_field": 1}):
            invalid = httpx.post(url, json=bad, headers=auth)
            assert invalid.status_code == 422 and _body(invalid)["code"] == "validation_error"
        not_json = httpx.post(url, content=b"{not json", headers={**auth, "Content-Type": "application/json"})
        assert not_json.status_code == 422 and _body(not_json)["code"] == "validation_error"
        unknown = httpx.post(f"{tight_service.url}/v1/sandboxes/sb-nope/exec", json={"command": ["true"]}, headers=auth)
        assert unknown.status_code == 404 and _body(unknown)["code"] == "sandbox_not_found"
        streamed = httpx.post(
            url,
            content=iter([b'{"command": "' + b"x" * 40_000] * 3),
            headers={**auth, "Content-Type": "application/json"},
        )
        assert streamed.status_code == 413 and _body(streamed)["code"] == "request_too_large"


def test_credentials_in_urls_never_reach_the_service_log(caplog):
    """uvicorn logs each WebSocket's full URL at INFO: a PTY's `?token=` / published `?api_key=` (and an
    exposed port's token, in its path) went to the service log in clear."""
    import logging

    from sandbox_service.server.auth import redact_secrets_in_logs

    redact_secrets_in_logs()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "uvicorn.access")]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:  # uvicorn's own logging config may have turned propagation off
        lg.addHandler(caplog.handler)
        lg.setLevel(logging.INFO)
    try:
        loggers[0].info(
            '%s - "WebSocket %s" [accepted]',
            "127.0.0.1:40000",
            "/published/sandboxes/sb-1/pty?api_key=s3cret-key&rows=24",
        )
        loggers[0].info('%s - "WebSocket %s" 403', "127.0.0.1:40001", "/v1/sandboxes/sb-1/exec/pty?token=s3cret-token")
        loggers[1].info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:40002", "GET", "/v1/ports/s3cret-port/index.html", "1.1", 200
        )
    finally:
        for lg, (level, propagate) in zip(loggers, saved):
            lg.removeHandler(caplog.handler)
            lg.setLevel(level)
            lg.propagate = propagate
    text = caplog.text
    assert "s3cret" not in text and "api_key=***" in text and "token=***" in text and "/v1/ports/***" in text, text
