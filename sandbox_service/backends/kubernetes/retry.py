"""Calls to the Kubernetes API with retries: backoff with full jitter on 409 conflicts, 429 and 5xx
(a `Retry-After` header wins), then a typed error that says what failed and what to do.

A 409 `AlreadyExists` is not retried: it means a create already happened (a retried request whose
first answer was lost), and the caller reads the object back instead.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field
from urllib3.exceptions import HTTPError as Urllib3Error

from sandbox_service.errors import BackendUnavailableError, InvalidRequestError, SandboxServiceError
from sandbox_service.models import InfraErrorKind

log = logging.getLogger("sandbox_service.kubernetes")
T = TypeVar("T")

RETRYABLE_STATUS = {409, 429, 500, 502, 503, 504}


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempts: int = Field(6, ge=1, description="Attempts in all, the first included.")
    base_seconds: float = Field(0.2, gt=0, description="First backoff; doubles per attempt.")
    max_seconds: float = Field(10.0, gt=0, description="Cap on one backoff (and on a Retry-After we obey).")
    read_deadline_seconds: float = Field(
        60.0,
        gt=0,
        description="Reads (GET/LIST) retry until this deadline rather than for `attempts`: "
        "giving up on a read of a healthy pod under throttling would abort the sandbox.",
    )


def api_reason(err: ApiException) -> tuple[str, str]:
    """(reason, message) of a Kubernetes `Status` error body; falls back to the HTTP reason."""
    try:
        body = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    return str(body.get("reason") or err.reason or ""), str(body.get("message") or err.reason or "")


def is_already_exists(err: BaseException) -> bool:
    return isinstance(err, ApiException) and err.status == 409 and api_reason(err)[0] == "AlreadyExists"


def is_not_found(err: BaseException) -> bool:
    return isinstance(err, ApiException) and err.status == 404


def _retry_after(err: ApiException) -> float | None:
    value = (err.headers or {}).get("Retry-After") if err.headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from the API server; fall back to our own backoff


def _unavailable(message: str) -> BackendUnavailableError:
    return BackendUnavailableError(message, infra_error=InfraErrorKind.UNAVAILABLE)


def translate(err: ApiException, what: str) -> SandboxServiceError:
    """A non-retryable API error as the service's typed error, with the API server's own words."""
    reason, message = api_reason(err)
    if err.status == 403 and "exceeded quota" in message:
        return _unavailable(
            f"{what}: namespace quota exhausted ({message}); retry once sandboxes are freed, "
            "or raise the ResourceQuota."
        )
    if err.status in (401, 403):
        return SandboxServiceError(
            f"{what}: the API server refused the service ({err.status} {reason}: {message}). Check the "
            "service account's Role (manifests/base/rbac.yaml) and the backend's namespace."
        )
    if err.status in (400, 422):
        return InvalidRequestError(f"{what}: the API server rejected the object ({reason}: {message}).")
    return SandboxServiceError(f"{what}: Kubernetes API error {err.status} {reason}: {message}")


def call(
    what: str,
    fn: Callable[..., T],
    *args: Any,
    policy: RetryPolicy,
    retry_conflicts: bool = True,
    passthrough: Callable[[ApiException], bool] = lambda e: False,
    sleep: Callable[[float], None] = time.sleep,
    limiter: Callable[[], Any] = lambda: None,
    read: bool = False,
    clock: Callable[[], float] = time.monotonic,
    **kwargs: Any,
) -> T:
    """Run one API call. `passthrough(err)` errors go back to the caller unchanged (e.g. a 404 that
    means "already gone"); retryable ones are retried; the rest become typed service errors.
    `limiter()` runs before every attempt (the shared token bucket). A `read` is retried until
    `policy.read_deadline_seconds` have passed, a write for `policy.attempts` attempts."""
    last = ""
    deadline = clock() + policy.read_deadline_seconds
    attempt = 0
    while True:
        attempt += 1
        limiter()
        try:
            return fn(*args, **kwargs)
        except ApiException as err:
            if passthrough(err) or is_already_exists(err):
                raise
            retryable = err.status in RETRYABLE_STATUS and (retry_conflicts or err.status != 409)
            if not retryable:
                raise translate(err, what) from err
            reason, message = api_reason(err)
            last = f"{err.status} {reason}: {message}"
            wait = _retry_after(err)
        except (Urllib3Error, ConnectionError, TimeoutError) as err:
            last, wait = f"{type(err).__name__}: {err}", None
        if wait is None:
            wait = random.uniform(0, min(policy.max_seconds, policy.base_seconds * 2 ** min(attempt - 1, 20)))
        wait = min(wait, policy.max_seconds)
        if (clock() + wait >= deadline) if read else (attempt >= policy.attempts):
            break
        log.info("kubernetes %s failed (%s); retry %d in %.2fs", what, last, attempt, wait)
        sleep(wait)
    budget = f"for {policy.read_deadline_seconds:g} s" if read else f"after {policy.attempts} attempts"
    raise _unavailable(
        f"{what}: the Kubernetes API kept failing {budget} ({attempt} attempts, last: {last}); "
        "the service retries the create later."
    )
