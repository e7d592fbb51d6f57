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
            "(the token is in ORCHARD_SANDBOX_TOKEN, ORCHARD_TOKEN_FILE, or <state_dir>/token)")


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


def bearer_from_headers(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The bearer token in raw ASGI headers, or None (no header, or another scheme)."""
    for key, value in headers:
        if key == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


UNAUTHORIZED_BODY = json.dumps({"code": UnauthorizedError.code, "message": _MESSAGE}).encode()
