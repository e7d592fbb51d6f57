"""Create / get / list / wait / delete of real sandboxes through the REST API."""

from __future__ import annotations

import uuid

import pytest

from sandbox_service.errors import BackendUnavailableError, InvalidRequestError, SandboxNotReadyError
from sandbox_service.models import Resources, SandboxCreate, SandboxInfo, SandboxState


def test_create_is_async_then_ready_listed_and_deleted(sandbox_client, labels):
    sb = sandbox_client.create(SandboxCreate(labels=labels, resources=Resources(memory_mb=256, cpu=0.5)), wait=False)
    assert sb.info.state is SandboxState.pending  # the POST answers before the sandbox exists
    info = sb.wait_ready(timeout=60)
    assert info.state is SandboxState.ready and info.ready_at is not None
    assert info.resources.memory_mb == 256 and info.resources.cpu == 0.5
    assert info.backend == "local" and info.attempts == 1

    assert [i.id for i in sandbox_client.list(labels)] == [sb.id]
    assert sb.id not in [i.id for i in sandbox_client.list({"test": "some-other-label"})]
    assert sb.exec("echo alive").stdout == "alive\n"

    sb.delete()
    after = sandbox_client.get(sb.id)
    assert after.state is SandboxState.deleted
    assert sandbox_client.list(labels) == []  # deleted sandboxes drop out of the default list
    sb.delete()  # idempotent
    with pytest.raises(SandboxNotReadyError, match="deleted"):
        sb.exec("true")


def test_list_filters_by_every_label_and_by_state(sandbox_client, labels):
    with (
        sandbox_client.create(SandboxCreate(labels=labels | {"role": "a"})) as a,
        sandbox_client.create(SandboxCreate(labels=labels | {"role": "b"})) as b,
    ):
        assert {i.id for i in sandbox_client.list(labels)} == {a.id, b.id}
        assert [i.id for i in sandbox_client.list(labels | {"role": "b"})] == [b.id]
        b.delete()
        response = sandbox_client.request(
            "GET", "/v1/sandboxes", params=[("label", f"test={labels['test']}"), ("state", "deleted")]
        )
        assert [SandboxInfo.model_validate(x).id for x in response.json()] == [b.id]


def test_create_is_idempotent_by_request_id(sandbox_client, labels):
    spec = SandboxCreate(labels=labels, request_id=uuid.uuid4().hex)
    first = sandbox_client.request("POST", "/v1/sandboxes", json=spec.model_dump(mode="json")).json()
    again = sandbox_client.request("POST", "/v1/sandboxes", json=spec.model_dump(mode="json")).json()
    assert first["id"] == again["id"]
    assert len(sandbox_client.list(labels)) == 1
    sandbox_client.attach(first["id"]).delete()


def test_wait_endpoint_returns_the_settled_state(sandbox_client, labels):
    sb = sandbox_client.create(SandboxCreate(labels=labels), wait=False)
    try:
        body = sandbox_client.request("GET", f"/v1/sandboxes/{sb.id}/wait", params={"timeout": 60}).json()
        assert body["state"] == "ready"
    finally:
        sb.delete()


@pytest.mark.parametrize("image", ["/", "/usr", "/tmp/../etc", "../root", "a/../../etc", "~/x", "./x", ".", ".."])
def test_an_image_is_a_name_and_host_paths_are_a_400(sandbox_service, sandbox_client, labels, image):
    """`image="/"` made the host root the sandbox's lower layer (the project's sources readable), on the
    native API and (any absolute directory) on the published one."""
    with pytest.raises(InvalidRequestError, match="not an image name"):
        sandbox_client.create(SandboxCreate(labels=labels, image=image))
    import httpx

    published = httpx.post(
        sandbox_service.url + "/published/sandboxes",
        json={"image": image},
        timeout=60,
        headers={"X-API-Key": sandbox_service.token},
    )
    assert published.status_code == 400 and "not an image name" in published.text, published.text
    assert sandbox_client.list(labels) == []


def test_a_sandbox_that_cannot_start_fails_with_its_reason(sandbox_client, labels):
    with pytest.raises(BackendUnavailableError, match="failed"):
        sandbox_client.create(SandboxCreate(labels=labels, image="nonexistent-image"), wait_timeout=60)
    failed = sandbox_client.request(
        "GET", "/v1/sandboxes", params=[("label", f"test={labels['test']}"), ("state", "deleted")]
    ).json()
    # The client deletes a sandbox it gave up on; the record keeps the failure's reason.
    assert len(failed) == 1 and "nonexistent" in (failed[0]["error"] or "")
