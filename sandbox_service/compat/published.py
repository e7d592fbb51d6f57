"""The published environment API (microsoft/Orchard `orchard_env/docs/api.md`) over this service.

Mounted under `/published` on the same app, so the same sandboxes, jobs, limits and isolation serve both
APIs: a user of the published SDK switches by changing its base URL to `<our url>/published` and its key
to our token (sent as `X-API-Key`). Written from the reference document's routes, headers and bodies:

- auth: `X-API-Key` on every route except `GET /` and `GET /health`; missing 401, wrong 403 (constant-time
  compare against the service token; the service's bearer middleware lets this prefix through to us).
- errors: the reference's FastAPI shape `{"detail": ...}` (plus our machine-readable `code`); 404 unknown
  sandbox or job, 408 a server-side wait timed out, 503 transient overload (with `Retry-After`), 400 a
  sandbox that is not ready or a bad request.
- exec always becomes one of our jobs: `wait: false` answers `{job_id, status: queued}`; `wait: true`
  answers the whole job, or the job still `running` when the server-side wait (timeout + 30 s) ran out.
  Job status `succeeded` means exit code 0, as in the reference; our `outcome` says whose failure a
  `failed` job was (the command's, or `infrastructure_error`).

File paths may name anything inside the sandbox's own root, as in the reference (relative ones start at
`/workspace`): what a command in the sandbox reaches anyway, resolved beneath that root with no escape
(agent/server.py, scope "root"); the host's read-only directories stay read-only.

Where our security rules differ from the reference, ours win and the error says so: `block_network: false`
(unrestricted egress) is refused unless the operator turns on `published_unrestricted_egress` (then: the
public internet only, compat/egress.py); `cpu` and `memory` are echoed as given; images are honoured by name (the
Kubernetes backend pulls the
reference; the local backend runs the built root of that name in its image directory, a name it has
not built on the default root; host paths are refused with a 400).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from fastapi import APIRouter, Depends, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse

from sandbox_service.server.auth import TokenAuth
from sandbox_service.backends.base import SandboxBackend
from sandbox_service.compat.egress import unrestricted_egress
from sandbox_service.compat.published_models import (
    ApplyPatch,
    CreateSandbox,
    ExecCommand,
    FileInfo,
    JobView,
    UploadFile,
    format_cpu,
    parse_cpu,
    parse_memory_mb,
)
from sandbox_service.config import ServiceConfig
from sandbox_service.errors import (
    ConflictError,
    InvalidRequestError,
    SandboxNotFoundError,
    SandboxNotReadyError,
    SandboxServiceError,
    WaitTimeoutError,
)
from sandbox_service.jobs import JobManager
from sandbox_service.models import (
    ExecOutcome,
    ExecRequest,
    Job,
    JobState,
    NetworkPolicy,
    PatchRequest,
    Resources,
    SandboxCreate,
    SandboxState,
)
from sandbox_service.operations import SandboxOperations
from sandbox_service.service import SandboxManager

PREFIX = "/published"  # where the service mounts this API (`compat.mount_published_api`)
DEFAULT_EXEC_TIMEOUT = 300  # the reference's default when timeout_seconds is omitted
WAIT_GRACE = 30  # exec with wait: the server waits timeout + this before answering "running"


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _detail(status: int, code: str, message: str, retry_after: float | None = None) -> JSONResponse:
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
    return JSONResponse({"detail": message, "code": code}, status_code=status, headers=headers)


def _error_route(retry_after: float) -> type[APIRoute]:
    """Route class answering errors in the reference's shape (an exception handler would be app-wide)."""

    class PublishedRoute(APIRoute):
        def get_route_handler(self) -> Callable:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                try:
                    return await handler(request)
                except SandboxNotReadyError as err:  # the reference answers 400 for "not ready"
                    return _detail(400, err.code, err.message)
                except SandboxServiceError as err:
                    status = 400 if isinstance(err, ConflictError) else err.status_code
                    after = err.retry_after if err.retry_after is not None else (retry_after if status == 503 else None)
                    return _detail(status, err.code, err.message, after)
                except RequestValidationError as err:
                    return JSONResponse(
                        {"detail": jsonable_encoder(err.errors()), "code": "validation_error"}, status_code=422
                    )

            return guarded

    return PublishedRoute


@dataclass
class _Requested:
    """What the caller asked for at create time, echoed back as given (the reference's shape)."""

    image: str
    block_network: bool
    timeout: int
    cpu: str | None  # as written ("2000m" stays "2000m"); None: not given, our default is shown
    memory: str | None  # as written ("8Gi" stays "8Gi")


@dataclass
class PublishedState:
    """Custom sandbox ids and what was asked at create time: what the reference exposes that we do not store.

    (A job's command as submitted is kept by the job manager, with the job, and goes when the job does.)"""

    manager: SandboxManager
    jobs: JobManager
    aliases: dict[str, str] = field(default_factory=dict)  # custom id -> our id
    public: dict[str, str] = field(default_factory=dict)  # our id -> the id the caller knows
    requested: dict[str, _Requested] = field(default_factory=dict)

    def resolve(self, sandbox_id: str):
        """Our record for a caller's id; deleted sandboxes are 404, as in the reference."""
        rec = self.manager.record(self.aliases.get(sandbox_id, sandbox_id))
        if rec.info.state is SandboxState.deleted:
            raise SandboxNotFoundError(f"Sandbox {sandbox_id} not found (deleted)")
        return rec

    async def forget(self, our_id: str, _reason: str) -> None:
        """`on_delete` hook: drop the alias so the custom id can be reused."""
        public = self.public.pop(our_id, our_id)
        self.aliases.pop(public, None)
        self.requested.pop(our_id, None)


def _sandbox_view(state: PublishedState, config: ServiceConfig, rec) -> dict:
    info = rec.info
    asked = state.requested.get(info.id)
    status = {"pending": "pending", "ready": "ready", "failed": "failed"}.get(info.state.value, info.state.value)
    public_id = state.public.get(info.id, info.id)
    return {
        "sandbox_id": public_id,
        "namespace": config.backend,
        "image": asked.image if asked else (info.image or ""),
        "pod_name": public_id,
        "block_network": asked.block_network if asked else info.network.mode == "none",
        "cpu": (asked and asked.cpu) or format_cpu(info.resources.cpu),
        "memory": (asked and asked.memory) or f"{info.resources.memory_mb}Mi",
        "created_at": info.created_at.timestamp(),
        "ready": info.state is SandboxState.ready,
        "status": status,
        "status_message": info.error or "",
        "timeout": asked.timeout if asked else 3600,
    }


def _job_view(state: PublishedState, job: Job, command: str) -> JobView:
    result = job.result
    error = job.reason
    if job.state in (JobState.queued, JobState.running):
        status = job.state.value
    elif job.state is JobState.succeeded and result is not None and result.exit_code == 0:
        status = "succeeded"
    else:  # the reference's "failed" covers a non-zero exit as well as a job that could not run
        status = "failed"
        if result is not None and result.outcome is ExecOutcome.command_timeout:
            error = result.message or "command timed out"
    completed = _epoch(job.finished_at)
    started = None
    if result is not None and completed is not None:
        started = completed - result.duration_seconds
    return JobView(
        job_id=job.id,
        sandbox_id=state.public.get(job.sandbox_id, job.sandbox_id),
        command=command,
        status=status,
        stdout=result.stdout if result else "",
        stderr=result.stderr if result else "",
        exit_code=result.exit_code if result else None,
        created_at=job.created_at.timestamp(),
        started_at=started,
        completed_at=completed,
        error=error,
        outcome=result.outcome.value if result else None,
        infra_error=result.infra_error.value if result and result.infra_error else None,
    )


def _argv(req: ExecCommand) -> list[str]:
    if isinstance(req.command, list):
        if not req.command:
            raise InvalidRequestError("command must not be an empty list")
        return req.command
    return ["bash", "-lc" if req.login_shell else "-c", req.command]


def _image_for(backend: SandboxBackend, image: str) -> str | None:
    """The image to create: on the local backend a built root it knows by name; other names (registry
    references, which mean nothing there) give the default root. A host path is refused (400)."""
    backend.check_image(image)
    return image if backend.knows_image(image) else None


def key_checker(auth: TokenAuth) -> Callable:
    def require_key(request: Request) -> None:
        presented = request.headers.get("x-api-key")
        if presented is None:
            raise _AuthError(401, "Missing API key. Please provide X-API-Key header.")
        if not auth.check(presented):
            raise _AuthError(403, "Invalid API key")

    return require_key


class _AuthError(SandboxServiceError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status_code = status
        self.code = "unauthorized" if status == 401 else "forbidden"


def published_router(
    config: ServiceConfig, auth: TokenAuth, manager: SandboxManager, ops: SandboxOperations, jobs: JobManager
) -> tuple[APIRouter, PublishedState]:
    """Routes of the reference under `PREFIX`; the state is shared with the PTY route."""
    state = PublishedState(manager=manager, jobs=jobs)
    manager.on_delete.append(state.forget)
    route_class = _error_route(config.retry_after_seconds)
    r = APIRouter(prefix=PREFIX, route_class=route_class)
    authed = APIRouter(route_class=route_class, dependencies=[Depends(key_checker(auth))])

    @r.get("/")
    async def banner() -> dict:
        return {
            "service": "orchard sandbox service (published environment API)",
            "version": "0.1.0",
            "native_api": "/v1",
        }

    @r.get("/health")
    async def health() -> dict:
        return {"status": "healthy"}

    @authed.get("/resources")
    async def resources() -> dict:
        live = [
            rec for rec in manager.sandboxes.values() if rec.info.state in (SandboxState.pending, SandboxState.ready)
        ]
        return {
            "backend": config.backend,
            "sandboxes": {"live": len(live), "max": config.max_sandboxes},
            "cpu_requested": sum(rec.info.resources.cpu for rec in live),
            "memory_requested_mb": sum(rec.info.resources.memory_mb for rec in live),
            "max_concurrent_execs": config.max_concurrent_execs,
        }

    @authed.post("/sandboxes")
    async def create_sandbox(req: CreateSandbox) -> dict:
        if not req.block_network and not config.published_unrestricted_egress:
            raise InvalidRequestError(
                "block_network=false (unrestricted egress) is off on this service: its operator turns it on with "
                "the setting published_unrestricted_egress (ORCHARD_PUBLISHED_UNRESTRICTED_EGRESS=true; private "
                "and metadata addresses stay unreachable); or create with block_network=true and set an allowlist "
                "with PUT /v1/sandboxes/{id}/network-policy"
            )
        if req.sandbox_id is not None and (req.sandbox_id in state.aliases or req.sandbox_id in manager.sandboxes):
            raise ConflictError(f"sandbox_id {req.sandbox_id!r} is already in use; pick another")
        defaults = Resources()
        resources = Resources(
            cpu=parse_cpu(req.cpu) or defaults.cpu, memory_mb=parse_memory_mb(req.memory) or defaults.memory_mb
        )
        info = await manager.create(
            SandboxCreate(
                image=_image_for(manager.backend, req.image),
                resources=resources,
                network=NetworkPolicy(mode="none") if req.block_network else unrestricted_egress(),
                labels={"api": "published"},
            )
        )
        state.requested[info.id] = _Requested(req.image, req.block_network, req.timeout or 3600, req.cpu, req.memory)
        if req.sandbox_id is not None:
            state.aliases[req.sandbox_id] = info.id
            state.public[info.id] = req.sandbox_id
        view = _sandbox_view(state, config, manager.record(info.id, touch=False))
        return {
            k: view[k]
            for k in ("sandbox_id", "namespace", "image", "block_network", "cpu", "memory", "timeout", "status")
        }

    @authed.get("/sandboxes/{sandbox_id}")
    async def get_sandbox(sandbox_id: str) -> dict:
        return _sandbox_view(state, config, state.resolve(sandbox_id))

    @authed.get("/sandboxes/{sandbox_id}/wait")
    async def wait_sandbox(sandbox_id: str, timeout: float = 3600) -> dict:
        rec = state.resolve(sandbox_id)
        await manager.wait(rec.info.id, max(0.0, min(timeout, 3600.0)))  # 408 when it runs out
        return _sandbox_view(state, config, state.resolve(sandbox_id))

    @authed.delete("/sandboxes/{sandbox_id}")
    async def delete_sandbox(sandbox_id: str) -> dict:
        our_id = state.aliases.get(sandbox_id, sandbox_id)
        manager.record(our_id, touch=False)  # 404 for ids never seen
        await manager.delete(our_id)
        return {"status": "deleted", "sandbox_id": sandbox_id}

    @authed.post("/sandboxes/{sandbox_id}/heartbeat")
    async def heartbeat(sandbox_id: str) -> dict:
        state.resolve(sandbox_id)  # looking it up refreshes its liveness timer
        return {"status": "ok", "sandbox_id": sandbox_id}

    @authed.post("/sandboxes/{sandbox_id}/exec")
    async def exec_command(sandbox_id: str, req: ExecCommand) -> Response:
        rec = state.resolve(sandbox_id)
        timeout = req.timeout_seconds or DEFAULT_EXEC_TIMEOUT
        command = req.command if isinstance(req.command, str) else " ".join(req.command)
        job = jobs.submit(
            rec.info.id,
            ExecRequest(command=_argv(req), cwd=req.cwd, env=req.env or {}, timeout_seconds=timeout, wait=False),
            command_text=command,
        )
        if not req.wait:
            return JSONResponse({"job_id": job.id, "status": "queued"})
        try:
            job = await jobs.wait(job.id, timeout + WAIT_GRACE)
        except WaitTimeoutError:
            job = jobs.get(job.id)  # still running: the reference answers the job as it stands
        return Response(_job_view(state, job, command).model_dump_json(), media_type="application/json")

    @authed.get("/jobs/{job_id}")
    async def get_job(job_id: str) -> Response:
        return Response(
            _job_view(state, jobs.get(job_id), jobs.command_text(job_id)).model_dump_json(),
            media_type="application/json",
        )

    @authed.get("/jobs/{job_id}/wait")
    async def wait_job(job_id: str, timeout: float = 300) -> Response:
        command = jobs.command_text(job_id)  # before waiting: a finished job may be pruned meanwhile
        job = await jobs.wait(job_id, max(0.0, min(timeout, 3600.0)))  # 408 when it runs out
        return Response(_job_view(state, job, command).model_dump_json(), media_type="application/json")

    @authed.post("/sandboxes/{sandbox_id}/apply_patch")
    async def apply_patch(sandbox_id: str, req: ApplyPatch) -> dict:
        rec = state.resolve(sandbox_id)
        result = await ops.apply_patch(rec.info.id, PatchRequest(patch=req.patch))
        return {
            "success": result.applied,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "exit_code": result.exit_code,
            "error": None if result.applied else "patch did not apply",
        }

    @authed.post("/sandboxes/{sandbox_id}/files")
    async def upload_file(sandbox_id: str, req: UploadFile) -> dict:
        rec = state.resolve(sandbox_id)
        try:
            data = base64.b64decode(req.content, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequestError("content must be base64 (standard alphabet, padded)") from None
        await ops.write_file(rec.info.id, req.path, data, None, scope="root")
        return {"success": True, "path": req.path, "size": len(data)}

    @authed.get("/sandboxes/{sandbox_id}/files")
    async def download_file(sandbox_id: str, path: str) -> dict:
        rec = state.resolve(sandbox_id)
        data = await ops.read_file(rec.info.id, path, scope="root")
        return {"path": path, "content": base64.b64encode(data).decode("ascii"), "size": len(data)}

    @authed.get("/sandboxes/{sandbox_id}/files/list")
    async def list_files(sandbox_id: str, path: str = "/workspace") -> dict:
        rec = state.resolve(sandbox_id)
        entries = await ops.list_files(rec.info.id, path, scope="root")
        files = [
            FileInfo(
                name=e.name,
                type="directory" if e.type == "dir" else "file",
                size=e.size,
                modified=e.modified_at.replace(tzinfo=None).isoformat(timespec="seconds"),
            )
            for e in entries
        ]
        return {"path": path, "files": [f.model_dump() for f in files]}

    r.include_router(authed)
    return r, state


__all__ = ["PREFIX", "PublishedState", "published_router", "key_checker"]
