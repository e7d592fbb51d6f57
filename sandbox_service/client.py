"""Sync and async Python clients of the sandbox service.

Every call has an explicit timeout; errors come back as the server's typed exceptions
(`sandbox_service.errors`). `Sandbox`/`AsyncSandbox` handles are context managers that delete the
sandbox on exit, so a crashed caller does not leak one (the heartbeat reaper is the second line).
Each sandbox operation is written once (`_SandboxOps`, a generator of HTTP calls); `Sandbox` sends
them with the blocking client and `AsyncSandbox` awaits them, so the two faces cannot drift.
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
from typing import Any, Callable, Generator, NamedTuple

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
    raise error_from_body(response.status_code, code, message, float(retry_after) if retry_after else None,
                          infra_error)


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


def _face(run: Callable[..., Any], op: Callable[..., Any]) -> Callable[..., Any]:
    """`run` presented as `op` (name, doc, signature), returning what the generator returns."""
    functools.update_wrapper(run, op)
    ret = str(op.__annotations__.get("return", "Any")).rsplit(",", 1)[-1].rstrip("]").strip()
    run.__annotations__ = {**op.__annotations__, "return": ret}
    run.__signature__ = inspect.signature(op).replace(return_annotation=ret)  # type: ignore[attr-defined]
    return run


def _sync(op: Callable[..., Generator[_Call, httpx.Response, Any]]) -> Callable[..., Any]:
    """The blocking face of an operation: sends each request with `SandboxClient.request`."""

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        gen = op(self, *args, **kwargs)
        try:
            call = next(gen)
            while True:
                try:
                    response = self.client.request(call.method, call.url, **call.kwargs)
                except BaseException as err:  # the operation decides (delete ignores a 404; a cancelled
                    call = gen.throw(err)       # create still deletes its sandbox)
                else:
                    call = gen.send(response)
        except StopIteration as stop:
            return stop.value

    return _face(run, op)


def _async(op: Callable[..., Generator[_Call, httpx.Response, Any]]) -> Callable[..., Any]:
    """The awaitable face of the same operation: sends each request with `AsyncSandboxClient.request`."""

    async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
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


class _SandboxOps:
    """Every operation on one sandbox, written once as a generator of HTTP calls (no I/O here).

    `Sandbox` and `AsyncSandbox` are this class with each operation wrapped by `_sync` / `_async`,
    so the two faces have the same methods and can never drift (`_FACES` lists them).
    """

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

    def refresh(self) -> Generator[_Call, httpx.Response, SandboxInfo]:
        return self._set_info((yield _call("GET", self._path())))

    def wait_ready(self, timeout: float = 120.0) -> Generator[_Call, httpx.Response, SandboxInfo]:
        """Until ready; raises the failure as `BackendUnavailableError` / `WaitTimeoutError`."""
        self._set_info((yield _call("GET", self._path("/wait"), params={"timeout": timeout}, timeout=timeout + 10.0)))
        if self.info.state is not SandboxState.ready:
            raise BackendUnavailableError(f"sandbox {self.id} is {self.info.state.value}: {self.info.error}")
        return self.info

    def delete(self) -> Generator[_Call, httpx.Response, None]:
        try:
            yield _call("DELETE", self._path())
        except SandboxServiceError as err:
            if err.status_code != 404:  # already gone is what we wanted
                raise

    def exec(self, command: list[str] | str, *, cwd: str | None = None, env: dict[str, str] | None = None,
             timeout: float = 60.0, stdin: str | None = None,
             max_output_bytes: int | None = None) -> Generator[_Call, httpx.Response, ExecResult]:
        req = ExecRequest(command=command, cwd=cwd, env=env or {}, timeout_seconds=timeout, stdin=stdin,
                          max_output_bytes=max_output_bytes, wait=True, verification=self.verification)
        # Exec is not idempotent, so transport errors are not retried here; 503 (saturation) is.
        # JSON is written and parsed by pydantic-core directly (no dict round trip): the exec hot path.
        # `lane`: the blocking face sends it on its keep-alive lane (sandbox_service/keepalive.py).
        response = yield _call("POST", self._exec_target(), content=req.model_dump_json().encode(),
                               headers=_JSON_HEADERS, timeout=timeout + 30.0, lane=True)
        return ExecResult.model_validate_json(response.content)

    def exec_async(self, command: list[str] | str, *, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout: float = 60.0, stdin: str | None = None) -> Generator[_Call, httpx.Response, Job]:
        """Start a command as a job (poll with the client's `wait_job`)."""
        req = ExecRequest(command=command, cwd=cwd, env=env or {}, timeout_seconds=timeout, stdin=stdin, wait=False,
                          verification=self.verification)
        return Job.model_validate((yield _call("POST", self._path("/exec"), json=req.model_dump(mode="json"))).json())

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> Generator[_Call, httpx.Response, None]:
        params: dict[str, Any] = {"path": path, **({"mode": oct(mode)} if mode is not None else {})}
        yield _call("PUT", self._path("/files"), params=params, content=data.encode() if isinstance(data, str) else data)

    def read_file(self, path: str) -> Generator[_Call, httpx.Response, bytes]:
        return (yield _call("GET", self._path("/files"), params={"path": path})).content

    def read_text(self, path: str) -> Generator[_Call, httpx.Response, str]:
        return (yield from _SandboxOps.read_file(self, path)).decode("utf-8", errors="replace")

    def list_files(self, path: str = ".") -> Generator[_Call, httpx.Response, list[FileEntry]]:
        response = yield _call("GET", self._path("/files/list"), params={"path": path})
        return [FileEntry.model_validate(x) for x in response.json()]

    def upload_dir(self, local_dir: str | Path, path: str) -> Generator[_Call, httpx.Response, None]:
        """Upload a local directory (as a tar) so that its contents land under `path`."""
        yield from _SandboxOps.upload_archive(self, _tar_directory(local_dir), path)

    def upload_archive(self, archive: bytes, path: str) -> Generator[_Call, httpx.Response, None]:
        """Extract a (gzipped) tar, e.g. one `download_dir` returned, so that its contents land under `path`."""
        yield _call("PUT", self._path("/files/archive"), params={"path": path}, content=archive, timeout=120.0)

    def download_dir(self, path: str) -> Generator[_Call, httpx.Response, bytes]:
        """A gzipped tar of `path` inside the sandbox."""
        return (yield _call("GET", self._path("/files/archive"), params={"path": path}, timeout=120.0)).content

    def apply_patch(self, patch: str, *, cwd: str | None = None,
                    strip: int = 1) -> Generator[_Call, httpx.Response, PatchResult]:
        req = PatchRequest(patch=patch, cwd=cwd, strip=strip)
        response = yield _call("POST", self._path("/apply_patch"), json=req.model_dump(mode="json"))
        return PatchResult.model_validate(response.json())

    def set_network_policy(self, policy: NetworkPolicy) -> Generator[_Call, httpx.Response, SandboxInfo]:
        return self._set_info((yield _call("PUT", self._path("/network-policy"), json=policy.model_dump(mode="json"))))

    def heartbeat(self) -> Generator[_Call, httpx.Response, None]:
        yield _call("POST", self._path("/heartbeat"))

    def snapshot(self) -> Generator[_Call, httpx.Response, SnapshotInfo]:
        return SnapshotInfo.model_validate((yield _call("POST", self._path("/snapshots"), timeout=120.0)).json())

    def restore(self, snapshot_id: str) -> Generator[_Call, httpx.Response, SandboxInfo]:
        """Reset this sandbox's filesystem to a snapshot (of this or another sandbox)."""
        return self._set_info((yield _call("POST", self._path("/restore"), json={"snapshot_id": snapshot_id},
                                           timeout=120.0)))

    def expose_port(self, port: int) -> Generator[_Call, httpx.Response, PortExposure]:
        return PortExposure.model_validate((yield _call("POST", self._path("/ports"), json={"port": port})).json())

    def unexpose_port(self, port: int) -> Generator[_Call, httpx.Response, None]:
        yield _call("DELETE", self._path(f"/ports/{port}"))


class _ClientOps:
    """Every service-level operation, written once like `_SandboxOps`; the clients wrap them."""

    _handle: type  # Sandbox or AsyncSandbox

    @property
    def client(self) -> Any:  # the faces send through `self.client.request`
        return self

    def healthz(self) -> Generator[_Call, httpx.Response, dict]:
        return (yield _call("GET", "/healthz")).json()

    def metrics(self) -> Generator[_Call, httpx.Response, str]:
        return (yield _call("GET", "/metrics")).text

    def create(self, spec: SandboxCreate | None = None, *, wait: bool = True,
               wait_timeout: float = 120.0) -> Generator[_Call, httpx.Response, Any]:
        """A new sandbox handle (`Sandbox` or `AsyncSandbox`), ready unless `wait=False`."""
        spec = spec or SandboxCreate()
        if spec.request_id is None:  # idempotent retries of the POST itself
            spec = spec.model_copy(update={"request_id": uuid.uuid4().hex})
        info = SandboxInfo.model_validate((yield _call("POST", "/v1/sandboxes", json=spec.model_dump(mode="json"))).json())
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

    def attach(self, sandbox_id: str) -> Generator[_Call, httpx.Response, Any]:
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


_CLIENT_FACES = [name for name, value in vars(_ClientOps).items()
                 if not name.startswith("_") and callable(value) and name != "client"]


class SandboxClient(_ClientOps):
    """Synchronous client. `SandboxClient(url, token).create(SandboxCreate(...))` returns a `Sandbox`."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                 transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self._token, self._timeout, self._transport = token, timeout, transport
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport,
                                  verify=_tls_context())
        self._lane = KeepAliveLane.for_client(self.base_url, headers, transport)

    def clone(self) -> "SandboxClient":
        """A client of its own to the same service with the same credentials: for what outlives the caller's
        client (closing either leaves the other open)."""
        return SandboxClient(self.base_url, self._token, timeout=self._timeout, transport=self._transport)

    # -- plumbing -------------------------------------------------------------------------------
    def request(self, method: str, path: str | httpx.URL, *, timeout: float | None = None, retry: bool = True,
                lane: bool = False, **kwargs: Any) -> httpx.Response:
        """One HTTP call; 503s and connection errors are retried with backoff when `retry`. `lane`: a POST of
        `content` to an absolute URL that may go on the keep-alive lane instead of httpx (the exec hot path)."""
        attempts = _RETRY_ATTEMPTS if retry else 1
        on_lane = lane and self._lane is not None
        for attempt in range(attempts):
            try:
                if on_lane:
                    response = self._lane.post(path, kwargs["content"], kwargs.get("headers") or {},
                                               timeout or self._http.timeout.read)
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


class AsyncSandboxClient(_ClientOps):
    """Asynchronous face of `SandboxClient` (the same operations, awaitable)."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                 transport: httpx.AsyncBaseTransport | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport,
                                       verify=_tls_context())

    async def request(self, method: str, path: str | httpx.URL, *, timeout: float | None = None, retry: bool = True,
                      lane: bool = False, **kwargs: Any) -> httpx.Response:
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


# The operations (generators of HTTP calls) get a sync and an async face; plain methods (`verifying`) stay.
_FACES = [name for name, value in vars(_SandboxOps).items()
          if not name.startswith("_") and inspect.isgeneratorfunction(value)]


class Sandbox(_SandboxOps):
    """A handle on one sandbox. Use as a context manager to delete it on exit."""

    client: SandboxClient

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()


class AsyncSandbox(_SandboxOps):
    """Async handle on one sandbox (`async with` deletes it on exit): the same operations, awaitable."""

    client: AsyncSandboxClient

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete()


for _name in _FACES:
    setattr(Sandbox, _name, _sync(getattr(_SandboxOps, _name)))
    setattr(AsyncSandbox, _name, _async(getattr(_SandboxOps, _name)))
for _name in _CLIENT_FACES:
    setattr(SandboxClient, _name, _sync(getattr(_ClientOps, _name)))
    setattr(AsyncSandboxClient, _name, _async(getattr(_ClientOps, _name)))
SandboxClient._handle, AsyncSandboxClient._handle = Sandbox, AsyncSandbox
