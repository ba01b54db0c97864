"""Typed exceptions. The class comes from the HTTP status, and for a few code
families (missing files, a sandbox that is not running) from the error code."""
from __future__ import annotations

import json
from typing import Any

__all__ = [
    "EmberboxError",
    "ConfigurationError",
    "APIConnectionError",
    "APIError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "FileNotFoundInSandboxError",
    "ConflictError",
    "SandboxNotRunningError",
    "InvalidRequestError",
    "RateLimitError",
    "ServiceUnavailableError",
    "CommandError",
    "SandboxStartError",
    "error_from_response",
    "error_from_payload",
]


class EmberboxError(Exception):
    """Base class of every error this package raises."""

    code: str = "error"


class ConfigurationError(EmberboxError, ValueError):
    """No API URL or key could be found, or one of them is malformed."""

    code = "configuration"


class APIConnectionError(EmberboxError):
    """The server could not be reached (after retries), or a stream was cut for good."""

    code = "connection_failed"


class APIError(EmberboxError):
    """An error answer from the API: `{"error": {code, status, message, hint, ...}}`."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "request_failed",
        status: int = 0,
        hint: str = "",
        details: dict[str, Any] | None = None,
        request_id: str = "",
        retry_after_ms: int | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.hint = hint
        self.details = details or {}
        self.request_id = request_id
        self.retry_after_ms = retry_after_ms
        self.retryable = retryable

    def __str__(self) -> str:
        s = f"{self.code} ({self.status}): {self.message}" if self.status else f"{self.code}: {self.message}"
        if self.hint:
            s += f" Hint: {self.hint}"
        if self.request_id:
            s += f" [request {self.request_id}]"
        return s


class AuthenticationError(APIError):
    """401: the API key is missing, unknown or revoked."""


class PermissionDeniedError(APIError):
    """403: the key may not do this (or the guest user may not touch that path)."""


class NotFoundError(APIError):
    """404: no such sandbox, process, route or file."""


class FileNotFoundInSandboxError(NotFoundError):
    """404 `file_not_found`: the path does not exist in the sandbox."""


class ConflictError(APIError):
    """409: the request does not fit the resource's state (e.g. `is_a_directory`, `name_taken`)."""


class SandboxNotRunningError(ConflictError):
    """409 `not_running` / `sandbox_stopped` / ...: the sandbox cannot run this now."""


class InvalidRequestError(APIError):
    """400, 413, 422: the request itself is wrong (bad field, too large, reused idempotency key)."""


class RateLimitError(APIError):
    """429: too many requests; retried automatically before it reaches you."""


class ServiceUnavailableError(APIError):
    """5xx: the server failed or is busy."""


class SandboxStartError(EmberboxError):
    """The sandbox did not reach `running`."""

    code = "start_failed"

    def __init__(self, message: str, info: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.info = info or {}


class CommandError(EmberboxError):
    """`exec(..., check=True)` and the command failed or timed out."""

    code = "command_failed"

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


_NOT_RUNNING_CODES = frozenset(
    {"not_running", "sandbox_stopped", "sandbox_not_ready", "sandbox_paused", "sandbox_deleted"}
)

_BY_CODE: dict[str, type[APIError]] = {
    "file_not_found": FileNotFoundInSandboxError,
    "unauthorized": AuthenticationError,
    "forbidden": PermissionDeniedError,
    "permission_denied": PermissionDeniedError,
    "rate_limited": RateLimitError,
    "invalid_request": InvalidRequestError,
    "idempotency_key_reused": InvalidRequestError,
    "not_found": NotFoundError,
    "route_not_found": NotFoundError,
    **{c: SandboxNotRunningError for c in _NOT_RUNNING_CODES},
}


def _class_for(status: int, code: str) -> type[APIError]:
    if status == 404 and code == "file_not_found":
        return FileNotFoundInSandboxError
    if status == 409 and code in _NOT_RUNNING_CODES:
        return SandboxNotRunningError
    if status == 401:
        return AuthenticationError
    if status == 403:
        return PermissionDeniedError
    if status == 404:
        return NotFoundError
    if status == 409:
        return ConflictError
    if status in (400, 413, 422):
        return InvalidRequestError
    if status == 429:
        return RateLimitError
    if status >= 500:
        return ServiceUnavailableError
    # No usable status (e.g. an `error` event inside a stream): fall back to the code.
    return _BY_CODE.get(code, APIError)


def error_from_payload(payload: Any, status: int = 0, *, default_message: str = "") -> APIError:
    """Builds the typed error for an error object (the value of the `error` key) or a whole body."""
    err: dict[str, Any] = {}
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, dict):
            err = inner
    if not status:
        try:
            status = int(err.get("status") or 0)
        except (TypeError, ValueError):
            status = 0
    code = str(err.get("code") or "request_failed")
    message = str(err.get("message") or default_message or f"HTTP {status}")
    retry_after = err.get("retryAfterMs")
    retryable = err.get("retryable")
    cls = _class_for(status, code)
    return cls(
        message,
        code=code,
        status=status,
        hint=str(err.get("hint") or ""),
        details=err.get("details") if isinstance(err.get("details"), dict) else None,
        request_id=str(err.get("requestId") or ""),
        retry_after_ms=int(retry_after) if isinstance(retry_after, (int, float)) else None,
        retryable=retryable if isinstance(retryable, bool) else None,
    )


def error_from_response(status: int, body: bytes, request_id: str = "") -> APIError:
    """Builds the typed error for a non-2xx answer; a body that is not JSON becomes the message."""
    try:
        payload = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        err = error_from_payload(payload, status)
    else:
        text = body.decode("utf-8", errors="replace").strip()[:500]
        err = error_from_payload({}, status, default_message=text or f"HTTP {status}")
    if request_id and not err.request_id:
        err.request_id = request_id
    return err
