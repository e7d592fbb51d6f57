"""Sync and async Python clients of the sandbox service.

Every call has an explicit timeout; errors come back as the server's typed exceptions
(`sandbox_service.errors`). `Sandbox`/`AsyncSandbox` handles are context managers that delete the
sandbox on exit, so a crashed caller does not leak one (the heartbeat reaper is the second line).
Each sandbox operation is written once (`_SandboxOps`, a generator of HTTP calls); `Sandbox` sends
them with the blocking client and `AsyncSandbox` awaits them, so the two faces cannot drift. Each face
names its operations in its class body (`exec = _sync(_SandboxOps.exec)`), so a type checker sees
`Sandbox.exec(...) -> ExecResult` and `AsyncSandbox.exec(...) -> Awaitable[ExecResult]` with the
operation's own parameters; a face missing an operation fails at import.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import io
import ssl
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Concatenate, Coroutine, Generator, Generic, NamedTuple, ParamSpec, TypeVar

import httpx

from sandbox_service.errors import (
    BackendUnavailableError,
    SandboxServiceError,
    ServiceUnavailableError,
    error_from_body,
)
from sandbox_service.keepalive import KeepAliveLane
from sandbox_service.retry import Backoff
from sandbox_service.models import (
    ExecRequest,
    ExecResult,
    FileEntry,
    Job,
    NetworkPolicy,
    PatchRequest,
    PatchResult,
    PortExposure,
    SandboxCreate,
    SandboxInfo,
    SandboxState,
    SnapshotInfo,
)

DEFAULT_TIMEOUT = 30.0
_RETRY_ATTEMPTS = 4
_JSON_HEADERS = {"content-type": "application/json"}


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process and shared by every client: building one
    loads the CA bundle, 37 ms of CPU here, which each `SandboxClient` paid again (a client per sandbox
    made that the service benchmark's bottleneck). Environment variables (SSL_CERT_FILE, ...) are read at
    the first client, as httpx reads them at each."""
    return httpx.create_ssl_context()


def _exec_url(base_url: str, sandbox_id: str) -> httpx.URL:
    # Absolute and parsed once per sandbox: httpx would otherwise parse and merge the path per call.
    return httpx.URL(f"{base_url}/v1/sandboxes/{sandbox_id}/exec")


def _raise_for_error(response: httpx.Response) -> None:
    if response.is_success:
        return
    infra_error = None
    try:
        body = response.json()
        code, message, infra_error = body["code"], body["message"], body.get("infra_error")
    except Exception:  # a proxy or crash page, not our JSON
        code, message = "http_error", f"HTTP {response.status_code}: {response.text[:500]}"
    retry_after = response.headers.get("retry-after")
    raise error_from_body(response.status_code, code, message, float(retry_after) if retry_after else None, infra_error)


def _tar_directory(local_dir: str | Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:  # loopback or LAN: speed over size
        tar.add(str(local_dir), arcname=".")
    return buf.getvalue()


_backoff = Backoff(first=0.05, cap=2.0).delay  # the project's one retry schedule (sandbox_service/retry.py)


class _Call(NamedTuple):
    """One HTTP request an operation needs; the sync or async face sends it and hands back the response."""

    method: str
    url: str | httpx.URL
    kwargs: dict[str, Any]


def _call(method: str, url: str | httpx.URL, **kwargs: Any) -> _Call:
    return _Call(method, url, kwargs)


P = ParamSpec("P")
R = TypeVar("R")
H = TypeVar("H", bound="_SandboxBase")  # the handle a client's operations return: Sandbox or AsyncSandbox


def _face(run: Callable[..., Any], op: Callable[..., Any]) -> Any:
    """`run` presented as `op` (name, doc, signature), returning what the generator returns."""
    functools.update_wrapper(run, op)
    ret = str(op.__annotations__.get("return", "Any")).rsplit(",", 1)[-1].rstrip("]").strip()
    run.__annotations__ = {**op.__annotations__, "return": ret}
    run.__signature__ = inspect.signature(op).replace(return_annotation=ret)  # type: ignore[attr-defined]
    return run


def _sync(op: Callable[Concatenate[Any, P], Generator[_Call, httpx.Response, R]]) -> Callable[Concatenate[Any, P], R]:
    """The blocking face of an operation: sends each request with `SandboxClient.request`."""

    def run(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        gen = op(self, *args, **kwargs)
        try:
            call = next(gen)
            while True:
                try:
                    response = self.client.request(call.method, call.url, **call.kwargs)
                except BaseException as err:  # the operation decides (delete ignores a 404; a cancelled
                    call = gen.throw(err)  # create still deletes its sandbox)
                else:
                    call = gen.send(response)
        except StopIteration as stop:
            return stop.value

    return _face(run, op)


def _async(
    op: Callable[Concatenate[Any, P], Generator[_Call, httpx.Response, R]],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """The awaitable face of the same operation: sends each request with `AsyncSandboxClient.request`."""

    async def run(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        gen = op(self, *args, **kwargs)
        try:
            call = next(gen)
            while True:
                try:
                    # The loop of `_sync` with `await`: a blocking and an awaiting driver cannot share it.
                    response = await self.client.request(call.method, call.url, **call.kwargs)
                except BaseException as err:
                    call = gen.throw(err)
                else:
                    call = gen.send(response)
        except StopIteration as stop:
            return stop.value

    return _face(run, op)


class _SandboxBase:
    """What both sandbox faces share besides the operations: the handle's state and plain helpers."""

    def __init__(self, client: Any, info: SandboxInfo):
        self.client = client
        self.info = info
        self.id = info.id
        self._exec_cache: tuple[str, httpx.URL] | None = None
        self.verification = False

    def verifying(self):
        """The same sandbox, for the harness's own verification runs: its execs carry
        `ExecRequest.verification`, so their OOM is the infrastructure's (escalated), not the policy's.
        Never hand this view to a policy's tools."""
        view = type(self)(self.client, self.info)
        view.verification = True
        return view

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{self.id}{suffix}"

    def _exec_target(self) -> httpx.URL:
        cached = self._exec_cache
        if cached is None or cached[0] != self.id:
            cached = self._exec_cache = (self.id, _exec_url(self.client.base_url, self.id))
        return cached[1]

    def _set_info(self, response: httpx.Response) -> SandboxInfo:
        self.info = SandboxInfo.model_validate(response.json())
        return self.info


class _SandboxOps(_SandboxBase):
    """Every operation on one sandbox, written once as a generator of HTTP calls (no I/O here).

    `Sandbox` and `AsyncSandbox` wrap each with `_sync` / `_async` (`_FACES` lists them; both faces must
    name every one). At run time `self` is the face's handle, never an instance of this class.
    """

    def refresh(self: _SandboxBase) -> Generator[_Call, httpx.Response, SandboxInfo]:
        return self._set_info((yield _call("GET", self._path())))

    def wait_ready(self: _SandboxBase, timeout: float = 120.0) -> Generator[_Call, httpx.Response, SandboxInfo]:
        """Until ready; raises the failure as `BackendUnavailableError` / `WaitTimeoutError`."""
        self._set_info((yield _call("GET", self._path("/wait"), params={"timeout": timeout}, timeout=timeout + 10.0)))
        if self.info.state is not SandboxState.ready:
            raise BackendUnavailableError(f"sandbox {self.id} is {self.info.state.value}: {self.info.error}")
        return self.info

    def delete(self: _SandboxBase) -> Generator[_Call, httpx.Response, None]:
        try:
            yield _call("DELETE", self._path())
        except SandboxServiceError as err:
            if err.status_code != 404:  # already gone is what we wanted
                raise

    def exec(
        self: _SandboxBase,
        command: list[str] | str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        stdin: str | None = None,
        max_output_bytes: int | None = None,
    ) -> Generator[_Call, httpx.Response, ExecResult]:
        req = ExecRequest(
            command=command,
            cwd=cwd,
            env=env or {},
            timeout_seconds=timeout,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            wait=True,
            verification=self.verification,
        )
        # Exec is not idempotent, so transport errors are not retried here; 503 (saturation) is.
        # JSON is written and parsed by pydantic-core directly (no dict round trip): the exec hot path.
        # `lane`: the blocking face sends it on its keep-alive lane (sandbox_service/keepalive.py).
        response = yield _call(
            "POST",
            self._exec_target(),
            content=req.model_dump_json().encode(),
            headers=_JSON_HEADERS,
            timeout=timeout + 30.0,
            lane=True,
        )
        return ExecResult.model_validate_json(response.content)

    def exec_async(
        self: _SandboxBase,
        command: list[str] | str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        stdin: str | None = None,
    ) -> Generator[_Call, httpx.Response, Job]:
        """Start a command as a job (poll with the client's `wait_job`)."""
        req = ExecRequest(
            command=command,
            cwd=cwd,
            env=env or {},
            timeout_seconds=timeout,
            stdin=stdin,
            wait=False,
            verification=self.verification,
        )
        return Job.model_validate((yield _call("POST", self._path("/exec"), json=req.model_dump(mode="json"))).json())

    def write_file(
        self: _SandboxBase, path: str, data: bytes | str, *, mode: int | None = None
    ) -> Generator[_Call, httpx.Response, None]:
        params: dict[str, Any] = {"path": path, **({"mode": oct(mode)} if mode is not None else {})}
        yield _call(
            "PUT", self._path("/files"), params=params, content=data.encode() if isinstance(data, str) else data
        )

    def read_file(self: _SandboxBase, path: str) -> Generator[_Call, httpx.Response, bytes]:
        return (yield _call("GET", self._path("/files"), params={"path": path})).content

    def read_text(self: _SandboxBase, path: str) -> Generator[_Call, httpx.Response, str]:
        return (yield from _SandboxOps.read_file(self, path)).decode("utf-8", errors="replace")

    def list_files(self: _SandboxBase, path: str = ".") -> Generator[_Call, httpx.Response, list[FileEntry]]:
        response = yield _call("GET", self._path("/files/list"), params={"path": path})
        return [FileEntry.model_validate(x) for x in response.json()]

    def upload_dir(self: _SandboxBase, local_dir: str | Path, path: str) -> Generator[_Call, httpx.Response, None]:
        """Upload a local directory (as a tar) so that its contents land under `path`."""
        yield from _SandboxOps.upload_archive(self, _tar_directory(local_dir), path)

    def upload_archive(self: _SandboxBase, archive: bytes, path: str) -> Generator[_Call, httpx.Response, None]:
        """Extract a (gzipped) tar, e.g. one `download_dir` returned, so that its contents land under `path`."""
        yield _call("PUT", self._path("/files/archive"), params={"path": path}, content=archive, timeout=120.0)

    def download_dir(self: _SandboxBase, path: str) -> Generator[_Call, httpx.Response, bytes]:
        """A gzipped tar of `path` inside the sandbox."""
        return (yield _call("GET", self._path("/files/archive"), params={"path": path}, timeout=120.0)).content

    def apply_patch(
        self: _SandboxBase, patch: str, *, cwd: str | None = None, strip: int = 1
    ) -> Generator[_Call, httpx.Response, PatchResult]:
        req = PatchRequest(patch=patch, cwd=cwd, strip=strip)
        response = yield _call("POST", self._path("/apply_patch"), json=req.model_dump(mode="json"))
        return PatchResult.model_validate(response.json())

    def set_network_policy(self: _SandboxBase, policy: NetworkPolicy) -> Generator[_Call, httpx.Response, SandboxInfo]:
        return self._set_info((yield _call("PUT", self._path("/network-policy"), json=policy.model_dump(mode="json"))))

    def heartbeat(self: _SandboxBase) -> Generator[_Call, httpx.Response, None]:
        yield _call("POST", self._path("/heartbeat"))

    def snapshot(self: _SandboxBase) -> Generator[_Call, httpx.Response, SnapshotInfo]:
        return SnapshotInfo.model_validate((yield _call("POST", self._path("/snapshots"), timeout=120.0)).json())

    def restore(self: _SandboxBase, snapshot_id: str) -> Generator[_Call, httpx.Response, SandboxInfo]:
        """Reset this sandbox's filesystem to a snapshot (of this or another sandbox)."""
        return self._set_info(
            (yield _call("POST", self._path("/restore"), json={"snapshot_id": snapshot_id}, timeout=120.0))
        )

    def expose_port(self: _SandboxBase, port: int) -> Generator[_Call, httpx.Response, PortExposure]:
        return PortExposure.model_validate((yield _call("POST", self._path("/ports"), json={"port": port})).json())

    def unexpose_port(self: _SandboxBase, port: int) -> Generator[_Call, httpx.Response, None]:
        yield _call("DELETE", self._path(f"/ports/{port}"))


# The operations (generators of HTTP calls) get a sync and an async face; plain methods (`verifying`) stay.
_FACES = [
    name for name, value in vars(_SandboxOps).items() if not name.startswith("_") and inspect.isgeneratorfunction(value)
]


class Sandbox(_SandboxBase):
    """A handle on one sandbox. Use as a context manager to delete it on exit."""

    client: SandboxClient

    refresh = _sync(_SandboxOps.refresh)
    wait_ready = _sync(_SandboxOps.wait_ready)
    delete = _sync(_SandboxOps.delete)
    exec = _sync(_SandboxOps.exec)
    exec_async = _sync(_SandboxOps.exec_async)
    write_file = _sync(_SandboxOps.write_file)
    read_file = _sync(_SandboxOps.read_file)
    read_text = _sync(_SandboxOps.read_text)
    list_files = _sync(_SandboxOps.list_files)
    upload_dir = _sync(_SandboxOps.upload_dir)
    upload_archive = _sync(_SandboxOps.upload_archive)
    download_dir = _sync(_SandboxOps.download_dir)
    apply_patch = _sync(_SandboxOps.apply_patch)
    set_network_policy = _sync(_SandboxOps.set_network_policy)
    heartbeat = _sync(_SandboxOps.heartbeat)
    snapshot = _sync(_SandboxOps.snapshot)
    restore = _sync(_SandboxOps.restore)
    expose_port = _sync(_SandboxOps.expose_port)
    unexpose_port = _sync(_SandboxOps.unexpose_port)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()


class AsyncSandbox(_SandboxBase):
    """Async handle on one sandbox (`async with` deletes it on exit): the same operations, awaitable."""

    client: AsyncSandboxClient

    refresh = _async(_SandboxOps.refresh)
    wait_ready = _async(_SandboxOps.wait_ready)
    delete = _async(_SandboxOps.delete)
    exec = _async(_SandboxOps.exec)
    exec_async = _async(_SandboxOps.exec_async)
    write_file = _async(_SandboxOps.write_file)
    read_file = _async(_SandboxOps.read_file)
    read_text = _async(_SandboxOps.read_text)
    list_files = _async(_SandboxOps.list_files)
    upload_dir = _async(_SandboxOps.upload_dir)
    upload_archive = _async(_SandboxOps.upload_archive)
    download_dir = _async(_SandboxOps.download_dir)
    apply_patch = _async(_SandboxOps.apply_patch)
    set_network_policy = _async(_SandboxOps.set_network_policy)
    heartbeat = _async(_SandboxOps.heartbeat)
    snapshot = _async(_SandboxOps.snapshot)
    restore = _async(_SandboxOps.restore)
    expose_port = _async(_SandboxOps.expose_port)
    unexpose_port = _async(_SandboxOps.unexpose_port)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete()


class _ClientBase:
    @property
    def client(self) -> Any:  # the faces send through `self.client.request`
        return self


class _ClientOps(_ClientBase, Generic[H]):
    """Every service-level operation, written once like `_SandboxOps`; the clients wrap them."""

    _handle: type[H]  # Sandbox or AsyncSandbox

    def healthz(self) -> Generator[_Call, httpx.Response, dict]:
        return (yield _call("GET", "/healthz")).json()

    def metrics(self) -> Generator[_Call, httpx.Response, str]:
        return (yield _call("GET", "/metrics")).text

    def create(
        self, spec: SandboxCreate | None = None, *, wait: bool = True, wait_timeout: float = 120.0
    ) -> Generator[_Call, httpx.Response, H]:
        """A new sandbox handle (`Sandbox` or `AsyncSandbox`), ready unless `wait=False`."""
        spec = spec or SandboxCreate()
        if spec.request_id is None:  # idempotent retries of the POST itself
            spec = spec.model_copy(update={"request_id": uuid.uuid4().hex})
        info = SandboxInfo.model_validate(
            (yield _call("POST", "/v1/sandboxes", json=spec.model_dump(mode="json"))).json()
        )
        sandbox = self._handle(self, info)
        if wait:
            try:
                yield from _SandboxOps.wait_ready(sandbox, timeout=wait_timeout)
            except BaseException:
                yield from _SandboxOps.delete(sandbox)  # never leak a sandbox whose creation we gave up on
                raise
        return sandbox

    def get(self, sandbox_id: str) -> Generator[_Call, httpx.Response, SandboxInfo]:
        return SandboxInfo.model_validate((yield _call("GET", f"/v1/sandboxes/{sandbox_id}")).json())

    def attach(self, sandbox_id: str) -> Generator[_Call, httpx.Response, H]:
        """A handle on an existing sandbox."""
        return self._handle(self, (yield from _ClientOps.get(self, sandbox_id)))

    def list(self, labels: dict[str, str] | None = None) -> Generator[_Call, httpx.Response, list[SandboxInfo]]:
        params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        return [SandboxInfo.model_validate(x) for x in (yield _call("GET", "/v1/sandboxes", params=params)).json()]

    def get_job(self, job_id: str) -> Generator[_Call, httpx.Response, Job]:
        return Job.model_validate((yield _call("GET", f"/v1/jobs/{job_id}")).json())

    def wait_job(self, job_id: str, timeout: float = 60.0) -> Generator[_Call, httpx.Response, Job]:
        """Wait server-side for a job; raises `WaitTimeoutError` (408) if it is still running."""
        response = yield _call("GET", f"/v1/jobs/{job_id}/wait", params={"timeout": timeout}, timeout=timeout + 10.0)
        return Job.model_validate(response.json())


_CLIENT_FACES = [
    name for name, value in vars(_ClientOps).items() if not name.startswith("_") and inspect.isgeneratorfunction(value)
]


class SandboxClient(_ClientBase):
    """Synchronous client. `SandboxClient(url, token).create(SandboxCreate(...))` returns a `Sandbox`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self._token, self._timeout, self._transport = token, timeout, transport
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport, verify=_tls_context()
        )
        self._lane = KeepAliveLane.for_client(self.base_url, headers, transport)

    def clone(self) -> "SandboxClient":
        """A client of its own to the same service with the same credentials: for what outlives the caller's
        client (closing either leaves the other open)."""
        return SandboxClient(self.base_url, self._token, timeout=self._timeout, transport=self._transport)

    # -- plumbing -------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str | httpx.URL,
        *,
        timeout: float | None = None,
        retry: bool = True,
        lane: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """One HTTP call; 503s and connection errors are retried with backoff when `retry`. `lane`: a POST of
        `content` to an absolute URL that may go on the keep-alive lane instead of httpx (the exec hot path)."""
        attempts = _RETRY_ATTEMPTS if retry else 1
        on_lane = self._lane if lane else None
        for attempt in range(attempts):
            try:
                if on_lane is not None:
                    url = path if isinstance(path, httpx.URL) else httpx.URL(path)  # the lane takes absolute URLs
                    response = on_lane.post(
                        url,
                        kwargs["content"],
                        kwargs.get("headers") or {},
                        timeout or self._http.timeout.read or DEFAULT_TIMEOUT,
                    )
                else:
                    response = self._http.request(method, path, timeout=timeout or self._http.timeout, **kwargs)
                _raise_for_error(response)
                return response
            except ServiceUnavailableError as err:
                if attempt == attempts - 1:
                    raise
                time.sleep(_backoff(attempt, err.retry_after))
            except (httpx.ConnectError, httpx.RemoteProtocolError) as err:
                if attempt == attempts - 1:
                    raise ServiceUnavailableError(f"sandbox service at {self.base_url} unreachable: {err}") from err
                time.sleep(_backoff(attempt, None))
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._lane is not None:
            self._lane.close()
        self._http.close()

    def __enter__(self) -> "SandboxClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the service-level operations, last: `list` would shadow the builtin in the annotations above
    _handle = Sandbox
    healthz = _sync(_ClientOps[Sandbox].healthz)
    metrics = _sync(_ClientOps[Sandbox].metrics)
    create = _sync(_ClientOps[Sandbox].create)
    get = _sync(_ClientOps[Sandbox].get)
    attach = _sync(_ClientOps[Sandbox].attach)
    list = _sync(_ClientOps[Sandbox].list)
    get_job = _sync(_ClientOps[Sandbox].get_job)
    wait_job = _sync(_ClientOps[Sandbox].wait_job)


class AsyncSandboxClient(_ClientBase):
    """Asynchronous face of `SandboxClient` (the same operations, awaitable)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport, verify=_tls_context()
        )

    async def request(
        self,
        method: str,
        path: str | httpx.URL,
        *,
        timeout: float | None = None,
        retry: bool = True,
        lane: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        # `lane` concerns the blocking client only (sandbox_service/keepalive.py): here httpx carries every call.
        attempts = _RETRY_ATTEMPTS if retry else 1
        for attempt in range(attempts):
            try:
                response = await self._http.request(method, path, timeout=timeout or self._http.timeout, **kwargs)
                _raise_for_error(response)
                return response
            except ServiceUnavailableError as err:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(_backoff(attempt, err.retry_after))
            except (httpx.ConnectError, httpx.RemoteProtocolError) as err:
                if attempt == attempts - 1:
                    raise ServiceUnavailableError(f"sandbox service at {self.base_url} unreachable: {err}") from err
                await asyncio.sleep(_backoff(attempt, None))
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncSandboxClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # the service-level operations, last: `list` would shadow the builtin in the annotations above
    _handle = AsyncSandbox
    healthz = _async(_ClientOps[AsyncSandbox].healthz)
    metrics = _async(_ClientOps[AsyncSandbox].metrics)
    create = _async(_ClientOps[AsyncSandbox].create)
    get = _async(_ClientOps[AsyncSandbox].get)
    attach = _async(_ClientOps[AsyncSandbox].attach)
    list = _async(_ClientOps[AsyncSandbox].list)
    get_job = _async(_ClientOps[AsyncSandbox].get_job)
    wait_job = _async(_ClientOps[AsyncSandbox].wait_job)


def _check_faces() -> None:
    """Both faces of each operation set exist: an operation added to `_SandboxOps`/`_ClientOps` and not named in a
    face's class body fails here, at import."""
    for ops, names, faces in (
        (_SandboxOps, _FACES, (Sandbox, AsyncSandbox)),
        (_ClientOps, _CLIENT_FACES, (SandboxClient, AsyncSandboxClient)),
    ):
        for face in faces:
            missing = [
                n for n in names if getattr(face, n, None) is None or getattr(face, n).__wrapped__ is not vars(ops)[n]
            ]
            if missing:
                raise TypeError(f"{face.__name__} lacks the face of {missing} ({ops.__name__}): name them in its body")


_check_faces()
