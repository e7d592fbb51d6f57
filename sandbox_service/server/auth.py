"""Bearer-token auth for every route except `/healthz` (and exposed-port URLs, whose token is in the path).

Comparison is constant-time so a caller cannot learn the token byte by byte from response timing.
WebSocket clients may send the token as an `Authorization` header or, where a browser cannot set
headers, as a `token` query parameter.
"""

from __future__ import annotations

import hmac
import json
import logging
import re

from starlette.requests import HTTPConnection

from sandbox_service.errors import UnauthorizedError

_MESSAGE = (
    "missing or wrong API token: send 'Authorization: Bearer <token>' "
    "(the token is in ORCHARD_SANDBOX_TOKEN, ORCHARD_TOKEN_FILE, or <state_dir>/token)"
)


class TokenAuth:
    def __init__(self, token: str):
        if not token:
            raise ValueError("the service needs a non-empty API token")
        self._token = token.encode()

    def check(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self._token)

    def carried_by(self, text: str) -> bool:
        """Whether the token occurs anywhere in `text` (a header value, a decoded URL): never relayed."""
        return self._token.decode() in text

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


_SECRET_QUERY = re.compile(r"(?i)\b(token|api_key|apikey|key|secret|password|access_token|auth)=[^&\s\"']*")
_PORT_URL = re.compile(r"/v1/ports/[^/\s\"'?]+")


def redact(text: str) -> str:
    """`text` with credentials in URLs masked: secret-looking query parameters and exposed-port tokens."""
    return _PORT_URL.sub("/v1/ports/***", _SECRET_QUERY.sub(r"\1=***", text))


class _RedactSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def redact_secrets_in_logs() -> None:
    """Mask credentials in what uvicorn logs (its WebSocket lines and access log carry the full URL, so a
    PTY's `?token=` / `?api_key=` went to the service log in clear). Call after uvicorn configured its
    logging (uvicorn.Config); idempotent."""
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactSecrets) for f in logger.filters):
            logger.addFilter(_RedactSecrets())


UNAUTHORIZED_BODY = json.dumps({"code": UnauthorizedError.code, "message": _MESSAGE}).encode()


class BearerAuthMiddleware:
    """Pure ASGI: every HTTP request and WebSocket handshake must carry `Authorization: Bearer <token>`,
    except the paths in `open_paths` (health checks). Refused: HTTP 401 with the JSON error shape; a
    WebSocket is closed before it is accepted (the handshake answers 403). For the project's other
    servers (the OpenEnv server); the sandbox service checks its token in its own middleware."""

    def __init__(self, app, auth: TokenAuth, open_paths: tuple[str, ...] = (), message: str = _MESSAGE):
        self.app, self.auth, self.open_paths = app, auth, open_paths
        self.body = json.dumps({"code": UnauthorizedError.code, "message": message}).encode()

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] in ("http", "websocket")
            and scope["path"] not in self.open_paths
            and not self.auth.check(bearer_from_headers(scope["headers"]))
        ):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 4401})
            else:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": self.body})
            return
        await self.app(scope, receive, send)
