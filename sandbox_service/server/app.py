"""The REST service: `create_app(config, backend=None)` builds the FastAPI app.

Routes are the ones `sandbox_service/client.py` calls (that file is the contract). Every error is a
JSON `{code, message}` body with its status, FastAPI's own 404/405/422 included; 503s carry
`Retry-After`. Responses are serialised straight from the pydantic models (no second validation
pass), which keeps the exec hot path short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from sandbox_service.server import transfers
from sandbox_service.server.auth import TokenAuth
from sandbox_service.backends.base import SandboxBackend
from sandbox_service.compat import PUBLISHED_PREFIX, mount_published_api
from sandbox_service.config import ServiceConfig
from sandbox_service.errors import BackendUnavailableError, InvalidRequestError, SandboxServiceError
from sandbox_service.jobs import JobManager
from sandbox_service.server.middleware import ServiceMiddleware
from sandbox_service.server.middleware import error_response as _error
from sandbox_service.metrics import ServiceMetrics
from sandbox_service.models import (
    ExecRequest,
    FileEntry,
    NetworkPolicy,
    PatchRequest,
    SandboxCreate,
    SandboxInfo,
    SandboxState,
    SnapshotInfo,
)
from sandbox_service.operations import SandboxOperations
from sandbox_service.server.ports import PortRegistry, PortRequest, proxy_router
from sandbox_service.server.pty import pty_router
from sandbox_service.records import AgentFactory, default_agent_factory
from sandbox_service.service import SandboxManager

log = logging.getLogger("sandbox_service")

_infos = TypeAdapter(list[SandboxInfo])
_entries = TypeAdapter(list[FileEntry])
_snapshots = TypeAdapter(list[SnapshotInfo])


class RestoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    snapshot_id: str = Field(description="Snapshot (of this or another sandbox) to reset the filesystem to.")


def _json(model: BaseModel, status_code: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")


def make_backend(config: ServiceConfig) -> SandboxBackend:
    """The configured backend; heavy ones are imported only when chosen."""
    if config.backend == "local":
        from sandbox_service.backends.local.backend import LocalBackend, LocalBackendConfig

        return LocalBackend(
            LocalBackendConfig(
                state_dir=config.state_dir / "local",
                runtime=config.runtime,
                isolation="none" if config.unisolated else "namespaces",
            )
        )
    from sandbox_service.backends.kubernetes.backend import KubernetesBackend

    return KubernetesBackend.from_service_config(config)


def _install_error_handlers(app: FastAPI, config: ServiceConfig) -> None:
    @app.exception_handler(SandboxServiceError)
    async def service_error(_: Request, err: SandboxServiceError) -> JSONResponse:
        retry_after = err.retry_after
        if retry_after is None and err.status_code == 503:
            retry_after = config.retry_after_seconds
        return _error(err.status_code, err.code, err.message, retry_after, err.infra_error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
        parts = []
        for e in err.errors()[:10]:
            where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            parts.append(f"{where}: {e.get('msg')}")
        return _error(422, "validation_error", "invalid request: " + "; ".join(parts))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        message = str(err.detail)
        if err.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see /docs for the API"
        return _error(err.status_code, code, message)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error(500, "internal_error", f"{type(err).__name__}: {err} (a bug in the service; see its log)")


def _parse_labels(labels: list[str]) -> dict[str, str]:
    out = {}
    for item in labels:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidRequestError(f"label filter {item!r} must look like key=value")
        out[key] = value
    return out


def _parse_mode(mode: str | None) -> int | None:
    if mode is None:
        return None
    try:
        value = int(mode, 8) if not mode.startswith("0o") else int(mode, 0)
    except ValueError:
        raise InvalidRequestError(f"mode {mode!r} must be octal, e.g. 0o644 or 644") from None
    if not 0 <= value <= 0o7777:
        raise InvalidRequestError(f"mode {mode!r} is out of range")
    return value


def _v1_router(manager: SandboxManager, ops: SandboxOperations, jobs: JobManager, ports: PortRegistry) -> APIRouter:
    r = APIRouter(prefix="/v1")

    @r.post("/sandboxes", status_code=202)
    async def create_sandbox(spec: SandboxCreate) -> Response:
        return _json(await manager.create(spec), 202)

    @r.get("/sandboxes")
    async def list_sandboxes(
        label: list[str] = Query(default_factory=list), state: SandboxState | None = None
    ) -> Response:
        infos = manager.list(_parse_labels(label), state)
        return Response(_infos.dump_json(infos), media_type="application/json")

    @r.get("/sandboxes/{sandbox_id}")
    async def get_sandbox(sandbox_id: str) -> Response:
        return _json(manager.record(sandbox_id).info)

    @r.delete("/sandboxes/{sandbox_id}")
    async def delete_sandbox(sandbox_id: str) -> Response:
        return _json(await manager.delete(sandbox_id))

    @r.get("/sandboxes/{sandbox_id}/wait")
    async def wait_sandbox(sandbox_id: str, timeout: float = Query(60.0, ge=0, le=3600)) -> Response:
        return _json(await manager.wait(sandbox_id, timeout))

    @r.post("/sandboxes/{sandbox_id}/heartbeat")
    async def heartbeat(sandbox_id: str) -> Response:
        return _json(manager.record(sandbox_id).info)

    @r.post("/sandboxes/{sandbox_id}/exec")
    async def exec_command(sandbox_id: str, req: ExecRequest) -> Response:
        if not req.wait:
            return _json(jobs.submit(sandbox_id, req), 202)
        return _json(await ops.exec(sandbox_id, req))

    async def upload(sandbox_id: str, request: Request, op: str, header: dict) -> None:
        """Small bodies in one frame; large ones streamed (transfers.py): never whole in memory."""
        size = transfers.declared_length(request)
        if size is not None and size <= transfers.STREAM_MIN_BYTES:
            await ops.upload_small(sandbox_id, op, header, await request.body())
            return
        if size is None:
            size, chunks = await transfers.spooled(request)
        else:
            chunks = request.stream()
        await ops.upload(sandbox_id, op, header, size, chunks)

    @r.put("/sandboxes/{sandbox_id}/files")
    async def write_file(sandbox_id: str, request: Request, path: str, mode: str | None = None) -> Response:
        await upload(sandbox_id, request, "write_file", {"path": path, "mode": _parse_mode(mode)})
        return Response(status_code=204)

    @r.get("/sandboxes/{sandbox_id}/files")
    async def read_file(sandbox_id: str, path: str) -> Response:
        size, chunks = await ops.download(sandbox_id, "read_file", {"path": path})
        return transfers.stream_response(size, chunks, "application/octet-stream")

    @r.get("/sandboxes/{sandbox_id}/files/list")
    async def list_files(sandbox_id: str, path: str = ".") -> Response:
        entries = await ops.list_files(sandbox_id, path)
        return Response(_entries.dump_json(entries), media_type="application/json")

    @r.put("/sandboxes/{sandbox_id}/files/archive")
    async def put_archive(sandbox_id: str, request: Request, path: str) -> Response:
        await upload(sandbox_id, request, "put_archive", {"path": path})
        return Response(status_code=204)

    @r.get("/sandboxes/{sandbox_id}/files/archive")
    async def get_archive(sandbox_id: str, path: str) -> Response:
        size, chunks = await ops.download(sandbox_id, "get_archive", {"path": path})
        return transfers.stream_response(size, chunks, "application/gzip")

    @r.post("/sandboxes/{sandbox_id}/apply_patch")
    async def apply_patch(sandbox_id: str, req: PatchRequest) -> Response:
        return _json(await ops.apply_patch(sandbox_id, req))

    @r.put("/sandboxes/{sandbox_id}/network-policy")
    async def network_policy(sandbox_id: str, policy: NetworkPolicy) -> Response:
        return _json(await manager.set_network_policy(sandbox_id, policy))

    @r.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
    async def snapshot(sandbox_id: str) -> Response:
        return _json(await manager.snapshot(sandbox_id), 201)

    @r.post("/sandboxes/{sandbox_id}/restore")
    async def restore(sandbox_id: str, req: RestoreRequest) -> Response:
        return _json(await manager.restore(sandbox_id, req.snapshot_id))

    @r.get("/snapshots")
    async def list_snapshots() -> Response:
        return Response(_snapshots.dump_json(list(manager.snapshots.values())), media_type="application/json")

    @r.get("/snapshots/{snapshot_id}")
    async def get_snapshot(snapshot_id: str) -> Response:
        return _json(manager.get_snapshot(snapshot_id))

    @r.delete("/snapshots/{snapshot_id}", status_code=204)
    async def delete_snapshot(snapshot_id: str) -> Response:
        await manager.delete_snapshot(snapshot_id)
        return Response(status_code=204)

    @r.post("/sandboxes/{sandbox_id}/ports", status_code=201)
    async def expose_port(sandbox_id: str, req: PortRequest, request: Request) -> Response:
        return _json(ports.expose(sandbox_id, req.port, str(request.base_url)), 201)

    @r.delete("/sandboxes/{sandbox_id}/ports/{port}", status_code=204)
    async def unexpose_port(sandbox_id: str, port: int) -> Response:
        ports.revoke(sandbox_id, port)
        return Response(status_code=204)

    @r.get("/jobs/{job_id}")
    async def get_job(job_id: str) -> Response:
        return _json(jobs.get(job_id))

    @r.get("/jobs/{job_id}/wait")
    async def wait_job(job_id: str, timeout: float = Query(60.0, ge=0, le=3600)) -> Response:
        return _json(await jobs.wait(job_id, timeout))

    return r


def create_app(
    config: ServiceConfig | None = None,
    backend: SandboxBackend | None = None,
    *,
    agent_factory: AgentFactory = default_agent_factory,
) -> FastAPI:
    """The service as an ASGI app. `backend` defaults to the one `config.backend` names."""
    config = config or ServiceConfig()
    token, _ = config.resolve_token()
    auth = TokenAuth(token)
    metrics = ServiceMetrics()
    backend = backend or make_backend(config)
    manager = SandboxManager(config, backend, metrics, agent_factory)
    ops = SandboxOperations(config, manager, metrics)
    jobs = JobManager(config, ops, metrics)
    ports = PortRegistry(manager, auth, config.public_url, config.max_port_body_bytes)
    manager.on_delete += [jobs.fail_for_sandbox, ports.revoke_all]

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        await manager.start()
        try:
            yield
        finally:
            await jobs.shutdown()
            await manager.shutdown()

    app = FastAPI(title="orchard sandbox service", version="0.1.0", lifespan=lifespan)
    app.state.manager, app.state.ops, app.state.jobs, app.state.config = manager, ops, jobs, config
    _install_error_handlers(app, config)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Readiness: 200 when the backend can create sandboxes now (Kubernetes: its API answers), else 503
        with the reason. `/livez` (liveness) only says the process answers: an API outage is not a restart."""
        problem = await asyncio.to_thread(backend.health)
        live = sum(1 for r in manager.sandboxes.values() if r.info.state is not SandboxState.deleted)
        body = {
            "status": "unavailable" if problem else "ok",
            "backend": backend.name,
            "isolated": not config.unisolated,
            "sandboxes": live,
            "startup_cleanup": manager.startup_report,
        }
        if problem:  # also an error body (code, message): clients raise BackendUnavailableError
            body |= {"code": BackendUnavailableError.code, "message": problem}
        return JSONResponse(body, status_code=503 if problem else 200)

    @app.get("/livez")
    async def livez() -> dict:
        return {"status": "ok"}

    # Routers are included flat (not nested), which keeps route matching on the exec path short.
    app.include_router(_v1_router(manager, ops, jobs, ports))

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    app.include_router(proxy_router(ports))  # the token in the URL is the credential
    app.include_router(pty_router(manager, auth))  # checks the token itself (header or ?token=)
    mount_published_api(app, config, auth, manager, ops, jobs)  # checks X-API-Key itself
    # Open: /healthz, /livez, and exposed-port URLs (the unguessable token in their path is the credential).
    app.add_middleware(
        ServiceMiddleware,
        auth=auth,
        metrics=metrics,
        limit=config.max_request_bytes,
        config=config,
        ops=ops,
        jobs=jobs,
        open_paths=("/healthz", "/livez"),
        open_prefixes=("/v1/ports/", PUBLISHED_PREFIX + "/"),
    )
    return app


__all__ = ["create_app", "make_backend", "RestoreRequest", "ServiceMiddleware"]
