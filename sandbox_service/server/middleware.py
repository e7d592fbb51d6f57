"""The service's single pure-ASGI middleware (auth, metrics, body limit) and its direct exec path.

FastAPI wraps every request in ~20 nested ASGI layers; for `POST .../exec`, the call the stages make
most, that stack cost more CPU than the service's own work, so exec bodies that validate are served
here directly (same body, status and error JSON as the route) and anything else falls through to the app.
"""

from __future__ import annotations

import logging
import re
import time

from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse

from sandbox_service.server.auth import UNAUTHORIZED_BODY, TokenAuth, bearer_from_headers
from sandbox_service.config import ServiceConfig
from sandbox_service.errors import RequestTooLargeError, SandboxServiceError
from sandbox_service.jobs import JobManager
from sandbox_service.metrics import ServiceMetrics
from sandbox_service.models import ExecRequest
from sandbox_service.operations import SandboxOperations

log = logging.getLogger("sandbox_service")


def error_response(
    status: int, code: str, message: str, retry_after: float | None = None, infra_error: str | None = None
) -> JSONResponse:
    """The service's one error shape: JSON {code, message[, infra_error]}, with Retry-After on 503s."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
    body = {"code": code, "message": message, **({"infra_error": infra_error} if infra_error else {})}
    return JSONResponse(body, status_code=status, headers=headers)


_EXEC_PATH = re.compile(r"/v1/sandboxes/([^/]+)/exec")
_EXEC_TEMPLATE = "/v1/sandboxes/{sandbox_id}/exec"


class ServiceMiddleware:
    """The service's one middleware: bearer auth, request metrics by route template, the JSON 413
    body limit, and a direct path for `POST /v1/sandboxes/{id}/exec`.

    One pure-ASGI layer instead of three, with no per-request wrapper objects on the common path:
    the exec hot path otherwise crosses ~20 nested ASGI layers and send wrappers, which cost the
    service more CPU per `true` than the route itself. The direct exec path answers exactly what
    the route would (same body, status and error JSON); any body it cannot validate is replayed
    into the full app, so FastAPI's own 422 wording stays the single source of validation errors.
    WebSockets pass through (the PTY route checks the token itself, to close with a code)."""

    def __init__(
        self,
        app,
        *,
        auth: TokenAuth,
        metrics: ServiceMetrics,
        limit: int,
        config: ServiceConfig,
        ops: SandboxOperations,
        jobs: JobManager,
        open_paths: tuple[str, ...],
        open_prefixes: tuple[str, ...],
    ):
        self.app, self.auth, self.metrics, self.limit, self.config = app, auth, metrics, limit, config
        self.ops, self.jobs, self.open_paths, self.open_prefixes = ops, jobs, open_paths, open_prefixes
        self.too_large = (
            f"request body over the {limit}-byte limit (max_request_bytes); upload large trees as several archives"
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        path, method, headers = scope["path"], scope["method"], scope["headers"]
        status = 500
        template = None

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if (
                path not in self.open_paths
                and not path.startswith(self.open_prefixes)
                and not self.auth.check(bearer_from_headers(headers))
            ):
                status = 401
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})
                return
            content_type = b""
            for key, value in headers:
                if key == b"content-length" and value.isdigit() and int(value) > self.limit:
                    await error_response(413, RequestTooLargeError.code, self.too_large)(scope, receive, send_status)
                    return
                if key == b"content-type":
                    content_type = value
            if method == "POST" and content_type.startswith(b"application/json"):
                match = _EXEC_PATH.fullmatch(path)
                if match is not None:
                    template = _EXEC_TEMPLATE
                    status = await self._exec(match.group(1), scope, receive, send, send_status) or status
                    return
            seen = 0

            async def counted():
                nonlocal seen
                msg = await receive()
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise RequestTooLargeError(self.too_large)  # surfaces in the route, answered as JSON
                return msg

            await self.app(scope, counted, send_status)
        finally:
            if template is None:
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
            self.metrics.observe_request(template, method, status, time.perf_counter() - start)

    async def _exec(self, sandbox_id: str, scope, receive, send, send_status) -> int:
        """`POST .../exec` without the router; returns the status sent (0: handed to the full app)."""
        chunks = []
        seen = 0
        more = True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # client went away before the body was complete
                return 499
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await error_response(413, RequestTooLargeError.code, self.too_large)(scope, receive, send)
                return 413
            chunks.append(chunk)
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        try:
            req = ExecRequest.model_validate_json(body)
        except ValidationError:
            replayed = False

            async def replay():
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, send_status)
            return 0
        model: BaseModel  # an ExecResult, or the Job of a background exec
        try:
            if req.wait:
                code, model = 200, await self.ops.exec(sandbox_id, req)
            else:
                code, model = 202, self.jobs.submit(sandbox_id, req)
        except SandboxServiceError as err:
            retry_after = err.retry_after
            if retry_after is None and err.status_code == 503:
                retry_after = self.config.retry_after_seconds
            await error_response(err.status_code, err.code, err.message, retry_after, err.infra_error)(
                scope, receive, send
            )
            return err.status_code
        except Exception as err:  # noqa: BLE001 - answered like the app's catch-all handler
            log.exception("unhandled error")
            await error_response(
                500, "internal_error", f"{type(err).__name__}: {err} (a bug in the service; see its log)"
            )(scope, receive, send)
            return 500
        payload = model.model_dump_json().encode()
        await send(
            {
                "type": "http.response.start",
                "status": code,
                "headers": [(b"content-length", str(len(payload)).encode()), (b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        return code
