"""The one client of an OpenAI-compatible endpoint (vLLM, SGLang, any hosted API): the endpoint policy, the credit
judge and the preflight check all talk through it.

It holds the connection (httpx, explicit connect and read timeouts), the bearer key read from an environment
variable (never a config value), and the retry policy of `/chat/completions`: transport errors, 408, 409, 429
and 5xx are retried on the project's one schedule (`sandbox_service.retry.Backoff`, Retry-After honoured up to
its cap); any other status is the request's fault and raised at once. The errors say which it was.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx

from sandbox_service.retry import Backoff

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class PolicyError(RuntimeError):
    """The endpoint could not produce a completion (the provider's failure, not the agent's)."""


class PolicyHTTPError(PolicyError):
    """The endpoint refused the request (a 4xx other than 408/409/429): fix the request or the key."""

    def __init__(self, status_code: int, message: str):
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code


class PolicyUnavailableError(PolicyError):
    """The endpoint kept failing (429/5xx/connection errors/timeouts) after every retry."""


class PolicyResponseError(PolicyError):
    """The endpoint answered 200 with a body that is not JSON."""


class ChatEndpoint:
    """An OpenAI-compatible API root (`base_url`, e.g. http://host:8000/v1) with its key, timeouts and retries."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key_env: str | None = None,
        timeout_seconds: float = 120.0,
        connect_timeout_seconds: float | None = None,
        max_retries: int = 3,
        backoff: Backoff | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.max_retries = max_retries
        self.backoff = backoff or Backoff(first=0.5, cap=20.0)
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env) if api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        timeout = httpx.Timeout(timeout_seconds, connect=connect_timeout_seconds or timeout_seconds)
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

    def request(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> httpx.Response:
        """One call, no retry (raises httpx's errors): for checks that judge each answer themselves."""
        if timeout is not None:
            kwargs["timeout"] = timeout
        return self._http.request(method, path, **kwargs)

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /chat/completions with retries; the response's JSON (raises a `PolicyError`)."""
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            retry_after = None
            try:
                response = self._http.post("/chat/completions", json=body)
            except (httpx.TimeoutException, httpx.TransportError) as err:
                last = f"{type(err).__name__}: {err}"
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except json.JSONDecodeError:
                        raise PolicyResponseError(f"endpoint returned non-JSON: {response.text[:300]}") from None
                message = response.text[:500]
                if response.status_code not in RETRY_STATUS:
                    raise PolicyHTTPError(response.status_code, message)
                last = f"HTTP {response.status_code}: {message}"
                retry_after = response.headers.get("retry-after")
            if attempt < self.max_retries:
                time.sleep(self.backoff.delay(attempt, retry_after))
        raise PolicyUnavailableError(f"{self.base_url} failed {self.max_retries + 1} times; last error: {last}")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ChatEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
