"""One flat exception hierarchy shared by server and client.

The server turns a `SandboxServiceError` into `{code, message}` JSON with its HTTP status; the client
re-raises the same type from that body, so callers catch e.g. `SandboxNotFoundError` on both sides.
An error that is the infrastructure's carries its kind in `infra_error` (an `InfraErrorKind` value),
set where the error is raised, never inferred later from the message.
"""

from __future__ import annotations


class SandboxServiceError(Exception):
    status_code: int = 500
    code: str = "internal_error"
    retryable: bool = False
    infra_error: str | None = None  # an InfraErrorKind value when the infrastructure failed

    def __init__(self, message: str, *, retry_after: float | None = None, infra_error: str | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        if infra_error is not None:
            self.infra_error = str(getattr(infra_error, "value", infra_error))


class InvalidRequestError(SandboxServiceError, ValueError):
    status_code = 400
    code = "invalid_request"


class PathOutsideSandboxError(InvalidRequestError):
    code = "path_outside_sandbox"


class RequestTooLargeError(InvalidRequestError):
    status_code = 413
    code = "request_too_large"


class UnauthorizedError(SandboxServiceError, PermissionError):
    status_code = 401
    code = "unauthorized"


class NotFoundError(SandboxServiceError, LookupError):
    status_code = 404
    code = "not_found"


class SandboxNotFoundError(NotFoundError):
    code = "sandbox_not_found"


class JobNotFoundError(NotFoundError):
    code = "job_not_found"


class SnapshotNotFoundError(NotFoundError):
    code = "snapshot_not_found"


class FileNotFoundInSandboxError(NotFoundError, FileNotFoundError):
    code = "file_not_found"


class WaitTimeoutError(SandboxServiceError, TimeoutError):
    status_code = 408
    code = "wait_timeout"


class ConflictError(SandboxServiceError):
    status_code = 409
    code = "conflict"


class SandboxNotReadyError(ConflictError):
    code = "sandbox_not_ready"


class ValidationFailedError(SandboxServiceError, ValueError):
    status_code = 422
    code = "validation_error"


class ServiceUnavailableError(SandboxServiceError):
    status_code = 503
    code = "unavailable"
    retryable = True


class CapacityExceededError(ServiceUnavailableError):
    code = "capacity_exceeded"


class BackendUnavailableError(ServiceUnavailableError):
    code = "backend_unavailable"


class IsolationUnavailableError(SandboxServiceError, RuntimeError):
    """Namespaces or cgroups are missing and the operator did not ask for unisolated mode."""

    status_code = 500
    code = "isolation_unavailable"


def refuse_unpassable(env: dict[str, str], *texts: str | None) -> None:
    """A NUL byte cannot reach execve (argv, env) or a path, nor can an env name holding '=': such requests
    are the caller's mistake (400), never a backend failure to retry."""
    for name in env:
        if not name or "=" in name or "\0" in name:
            raise InvalidRequestError(f"env name {name[:40]!r} must be non-empty, without '=' or NUL bytes")
    for text in (*env.values(), *texts):
        if text is not None and "\0" in text:
            raise InvalidRequestError(f"a NUL byte (\\0) cannot be passed to a command or path: {text[:40]!r}")


_BY_CODE: dict[str, type[SandboxServiceError]] = {}


def _register(cls: type[SandboxServiceError]) -> None:
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(SandboxServiceError)


def error_from_body(
    status_code: int, code: str, message: str, retry_after: float | None = None, infra_error: str | None = None
) -> SandboxServiceError:
    """Rebuild the server's exception on the client side (unknown codes fall back by status)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = {
            400: InvalidRequestError,
            401: UnauthorizedError,
            404: NotFoundError,
            408: WaitTimeoutError,
            409: ConflictError,
            422: ValidationFailedError,
            503: ServiceUnavailableError,
        }.get(status_code, SandboxServiceError)
    return cls(message, retry_after=retry_after, infra_error=infra_error)
