"""What is checked before the first stage runs, so that a run fails in seconds and in one line, not minutes in.

Checks that need no I/O are validators of the configs themselves, so `orchard config show` refuses them too
(a teacher or judge without its endpoint settings: `DistillConfig`, `TeacherConfig`, `EvalConfig`,
`CreditConfig`; imported tasks without a teacher that can solve them: `PipelineConfig`). This module holds
the one that needs the network: every OpenAI-compatible endpoint the config names answers one cheap request
(`GET <base_url>/models`, no retries) and serves the model the config asks for. The local runner calls
`preflight` before it starts anything, the cluster's start step before it opens the MLflow parent run.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import httpx

from pipelines.config import PipelineConfig


class PreflightError(ValueError):
    """A setting that cannot work, found before any stage ran: the message says what to change."""


class Endpoint(NamedTuple):
    where: str  # the config field, e.g. "distill.openai"
    base_url: str
    model: str
    api_key_env: str | None


def endpoints(config: PipelineConfig) -> list[Endpoint]:
    """Every endpoint some stage of this run will call."""
    found: list[tuple[str, object]] = []
    if config.distill.teacher == "openai":
        found.append(("distill.openai", config.distill.openai))
    for name in ("evaluate_teacher", "evaluate"):
        section = getattr(config, name)
        if section.policy == "openai":
            found.append((f"{name}.endpoint", section.endpoint))
    if config.credit.estimator == "judge":
        found.append(("credit.judge", config.credit.judge))
    elif config.credit.monte_carlo.teacher is not None and config.credit.monte_carlo.teacher.kind == "openai":
        found.append(("credit.monte_carlo.teacher.endpoint", config.credit.monte_carlo.teacher.endpoint))
    return [Endpoint(where, s.base_url, s.model, s.api_key_env) for where, s in found]


def check_endpoint(endpoint: Endpoint, timeout: float = 10.0) -> None:
    """One `GET /models`: the endpoint answers, takes the key and serves the model (raises PreflightError)."""
    where, url = endpoint.where, endpoint.base_url.rstrip("/")
    headers = {}
    if endpoint.api_key_env and os.environ.get(endpoint.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[endpoint.api_key_env]}"
    try:
        response = httpx.get(f"{url}/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as err:
        raise PreflightError(f"{where}: {url} does not answer ({type(err).__name__}: {err}); start the endpoint "
                             f"or fix {where}.base_url") from None
    if response.status_code in (401, 403):
        key = f"${endpoint.api_key_env}" if endpoint.api_key_env else "no key (api_key_env is None)"
        raise PreflightError(f"{where}: {url} refused the request ({response.status_code}) with {key}; put the "
                             f"endpoint's key in {where}.api_key_env's variable")
    if response.status_code == 404:  # an endpoint without the models list: it answered, that is all we can ask
        return
    if response.status_code >= 400:
        raise PreflightError(f"{where}: {url}/models answered {response.status_code} "
                             f"({response.text[:200]!r}); fix the endpoint or {where}.base_url")
    try:
        served = [m["id"] for m in response.json().get("data", [])]
    except (ValueError, TypeError, KeyError, AttributeError):
        return  # not an OpenAI models list: the endpoint answered
    if served and endpoint.model not in served:
        raise PreflightError(f"{where}: {url} serves {', '.join(served[:5])}, not {endpoint.model!r}; "
                             f"set {where}.model to one of them")


def preflight(config: PipelineConfig) -> None:
    """The network checks of a run's config (see the module docstring); raises PreflightError."""
    for endpoint in endpoints(config):
        check_endpoint(endpoint)
