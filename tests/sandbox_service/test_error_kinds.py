"""Errors carry their kind: `infra_error` is a field of the error types, set where raised, kept over HTTP."""

from __future__ import annotations

import json

import httpx
import pytest

from sandbox_service import errors
from sandbox_service.client import _raise_for_error
from sandbox_service.server.middleware import error_response
from sandbox_service.models import InfraErrorKind


def test_infra_error_is_a_declared_field_not_a_patched_attribute():
    assert "infra_error" in errors.SandboxServiceError.__dict__  # declared on the class
    assert errors.BackendUnavailableError("x").infra_error is None
    err = errors.BackendUnavailableError("pod failed", infra_error=InfraErrorKind.IMAGE_PULL_FAILED)
    assert err.infra_error == "IMAGE_PULL_FAILED"


def test_the_kind_survives_the_wire_and_the_client_reraises_it():
    response = error_response(503, "backend_unavailable", "sandbox died", 1.0, InfraErrorKind.AGENT_LOST.value)
    body = json.loads(response.body)
    assert body == {"code": "backend_unavailable", "message": "sandbox died", "infra_error": "AGENT_LOST"}
    reply = httpx.Response(503, json=body, headers={"retry-after": "1"})
    with pytest.raises(errors.BackendUnavailableError) as caught:
        _raise_for_error(reply)
    assert caught.value.infra_error == "AGENT_LOST" and caught.value.retry_after == 1.0
    plain = httpx.Response(404, json={"code": "sandbox_not_found", "message": "no such sandbox"})
    with pytest.raises(errors.SandboxNotFoundError) as caught:
        _raise_for_error(plain)
    assert caught.value.infra_error is None  # a policy/caller error has no infrastructure kind
