"""Service-port exposure: a port opened inside a sandbox (e.g. the GUI recipe's web app) reachable at
`/v1/ports/{token}/{path}` on the service.

The unguessable token in the URL is the credential (a browser in a harness cannot add a bearer
header), so the proxy route itself takes no API token; revoking the exposure (or deleting the
sandbox) makes the URL 404. Requests are relayed by the agent (`AgentClientBase.http_request`), which
opens the connection to 127.0.0.1:port inside the sandbox, so this works the same in every backend
and needs no egress: the sandbox only needs its loopback interface (network policy `loopback` or
`allowlist`; the default `none` has no interface at all, so exposing a port there is refused with 409).

Sandbox content is hostile and, unless `public_url` puts the proxy on a host of its own, is served on
the API's origin. So every relayed response is confined to an opaque origin and stripped of what could
reach the API's: `Content-Security-Policy: sandbox allow-scripts allow-forms allow-popups` (scripts run,
but never as the API's origin: no cookies, storage or credentialed same-origin requests), no
`Set-Cookie`, no `Access-Control-*` (no `Access-Control-Allow-Origin: *` for the API's origin), no
`Referrer-Policy` leaking the token, `X-Content-Type-Options: nosniff`.

Requests to the sandbox carry only the headers on an allowlist (`RELAYED_REQUEST_HEADERS`: content
negotiation, caching, ranges, the body's type, the user agent, fetch metadata), so no credential a client
sends to our servers reaches sandbox code: not `Authorization` (the native API's bearer token, and the
OpenEnv server's), not `X-API-Key` (which `/published` accepts as the service's token, and which the
published SDK sends on every request of its session), not cookies, not `Proxy-Authorization`, nor any
header an SDK may add tomorrow. A header whose value holds the service's token is dropped even when its
name is allowed, and a request whose path or query holds it is refused (400).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from urllib.parse import unquote_plus

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from sandbox_service.agent_link.base import AgentUnreachableError
from sandbox_service.server.auth import TokenAuth
from sandbox_service.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RequestTooLargeError,
    SandboxNotReadyError,
    ServiceUnavailableError,
)
from sandbox_service.models import PortExposure
from sandbox_service.service import SandboxManager

# The request headers relayed to the sandbox; every other one stays with the service (see the module doc).
RELAYED_REQUEST_HEADERS = frozenset(
    {
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "cache-control",
        "pragma",
        "content-type",
        "content-encoding",
        "content-language",
        "content-disposition",
        "if-match",
        "if-none-match",
        "if-modified-since",
        "if-unmodified-since",
        "if-range",
        "range",
        "origin",
        "user-agent",
        "x-requested-with",
        "dnt",
        "upgrade-insecure-requests",
        "sec-fetch-dest",
        "sec-fetch-mode",
        "sec-fetch-site",
        "sec-fetch-user",
    }
)
# Hop-by-hop headers (RFC 9110 7.6.1) and ones the relay recomputes.
_DROP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "authorization",
}
# Never relayed from the sandbox: what would act on (or open up) the service's origin.
_DROP_RESPONSE = _DROP | {
    "set-cookie",
    "set-cookie2",
    "content-security-policy",
    "referrer-policy",
    "x-content-type-options",
    "strict-transport-security",
    "clear-site-data",
    "service-worker-allowed",
}
CONFINEMENT_HEADERS = {
    "Content-Security-Policy": "sandbox allow-scripts allow-forms allow-popups",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def relayed_request_headers(headers: dict[str, str], auth: TokenAuth) -> dict[str, str]:
    """The caller's headers that reach the sandbox: allowlisted names whose value holds no service token."""
    return {k: v for k, v in headers.items() if k.lower() in RELAYED_REQUEST_HEADERS and not auth.carried_by(v)}


def confine_response_headers(headers: dict[str, str]) -> dict[str, str]:
    """The sandbox's response headers, made safe to serve on the service's origin (see the module doc)."""
    out = {
        k: v
        for k, v in headers.items()
        if k.lower() not in _DROP_RESPONSE and not k.lower().startswith("access-control-")
    }
    out.update(CONFINEMENT_HEADERS)
    return out


class PortRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: int = Field(ge=1, le=65535, description="TCP port inside the sandbox (on its loopback).")


@dataclass
class _Exposure:
    sandbox_id: str
    port: int
    token: str


class PortRegistry:
    def __init__(
        self, manager: SandboxManager, auth: TokenAuth, public_url: str | None, max_body_bytes: int = 32 << 20
    ):
        self.manager = manager
        self.auth = auth
        self.public_url = public_url
        self.max_body_bytes = max_body_bytes
        self._by_token: dict[str, _Exposure] = {}

    def expose(self, sandbox_id: str, port: int, base_url: str) -> PortExposure:
        rec = self.manager.ready(sandbox_id)
        if rec.info.network.mode == "none":
            raise ConflictError(
                f"sandbox {sandbox_id} has no network interface (policy 'none'), so nothing in it "
                'can listen on a port; PUT .../network-policy {"mode": "loopback"} first'
            )
        for exp in self._by_token.values():
            if exp.sandbox_id == sandbox_id and exp.port == port:
                token = exp.token
                break
        else:
            token = secrets.token_urlsafe(24)
            self._by_token[token] = _Exposure(sandbox_id, port, token)
        base = (self.public_url or base_url).rstrip("/")
        return PortExposure(port=port, url=f"{base}/v1/ports/{token}/", token=token)

    def revoke(self, sandbox_id: str, port: int) -> None:
        self.manager.record(sandbox_id)
        tokens = [t for t, e in self._by_token.items() if e.sandbox_id == sandbox_id and e.port == port]
        if not tokens:
            raise NotFoundError(f"port {port} of sandbox {sandbox_id} is not exposed")
        for token in tokens:
            del self._by_token[token]

    async def revoke_all(self, sandbox_id: str, reason: str) -> None:
        """`on_delete` hook."""
        for token in [t for t, e in self._by_token.items() if e.sandbox_id == sandbox_id]:
            del self._by_token[token]

    def lookup(self, token: str) -> _Exposure:
        exp = self._by_token.get(token)
        if exp is None:
            raise NotFoundError("unknown or revoked port URL; expose the port again with POST .../ports")
        return exp


async def _capped_body(request: Request, cap: int) -> bytes:
    """The request body, read as it streams in and refused (413) once it passes `cap`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise RequestTooLargeError(f"request body of {declared} bytes is over the relay's {cap} (max_port_body_bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise RequestTooLargeError(f"request body is over the relay's {cap} bytes (max_port_body_bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def proxy_router(registry: PortRegistry) -> APIRouter:
    router = APIRouter()

    @router.api_route(
        "/v1/ports/{token}/{path:path}",
        methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
        include_in_schema=False,
    )
    async def relay(token: str, path: str, request: Request) -> Response:
        exp = registry.lookup(token)
        rec = registry.manager.ready(exp.sandbox_id)
        target = "/" + path + (f"?{request.url.query}" if request.url.query else "")
        if registry.auth.carried_by(unquote_plus(target)):
            raise InvalidRequestError(
                "the port URL's path or query holds the service's API token, which is never "
                "relayed to sandbox code; take it out of the URL"
            )
        headers = relayed_request_headers(dict(request.headers.items()), registry.auth)
        body = await _capped_body(request, registry.max_body_bytes)
        agent = rec.agent
        if agent is None:  # ready() saw one; the sandbox stopped while the body was read
            raise SandboxNotReadyError(f"sandbox {exp.sandbox_id} is {rec.info.state.value}; its agent is gone")
        try:
            status, resp_headers, body = await agent.http_request(
                exp.port, request.method, target, headers, body, max_body_bytes=registry.max_body_bytes
            )
        except AgentUnreachableError as err:
            raise ServiceUnavailableError(f"agent of sandbox {exp.sandbox_id} did not answer: {err}") from err
        return Response(content=body, status_code=status, headers=confine_response_headers(resp_headers))

    return router
