"""Bearer-token auth for every route except `/healthz` (and exposed-port URLs, whose token is in the path).

Comparison is constant-time so a caller cannot learn the token byte by byte from response timing.
WebSocket clients may send the token as an `Authorization` header or, where a browser cannot set
headers, as a `token` query parameter.
"""

from __future__ import annotations

import hmac
import json

from starlette.requests import HTTPConnection

from sandbox_service.errors import UnauthorizedError

_MESSAGE = ("missing or wrong API token: send 'Authorization: Bearer <token>' "
            "(the token is in ORCHARD_TOKEN, ORCHARD_TOKEN_FILE, or <state_dir>/token)")


class TokenAuth:
    def __init__(self, token: str):
        if not token:
            raise ValueError("the service needs a non-empty API token")
        self._token = token.encode()

    def check(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self._token)

    def require(self, conn: HTTPConnection) -> None:
        """Raise 401 unless the request (or WebSocket handshake) carries the token."""
        header = conn.headers.get("authorization")
        presented = None
        if header is not None:
            scheme, _, value = header.partition(" ")
            if scheme.lower() == "bearer":
                presented = value.strip()
        elif conn.scope["type"] == "websocket":
            presented = conn.query_params.get("token")
        if not self.check(presented):
            raise UnauthorizedError(_MESSAGE)


class AuthMiddleware:
    """ASGI middleware: 401 for HTTP requests without the token, except on `open_prefixes`.

    A middleware rather than a FastAPI dependency: dependency resolution costs a noticeable share
    of a millisecond per request, and every exec pays it. WebSockets pass through (the PTY route
    checks the token itself, after accepting, so that a refusal can carry a close code)."""

    def __init__(self, app, auth: TokenAuth, open_paths: tuple[str, ...], open_prefixes: tuple[str, ...]):
        self.app = app
        self.auth = auth
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.open_paths or scope["path"].startswith(
                self.open_prefixes):
            await self.app(scope, receive, send)
            return
        presented = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    presented = token.strip()
                break
        if not self.auth.check(presented):
            body = json.dumps({"code": UnauthorizedError.code, "message": _MESSAGE}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
