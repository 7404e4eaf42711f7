"""The exceptions the client raises.

Every answer of the server that is not a success becomes an :class:`APIError`
(a subclass per status code), carrying the server's machine-readable ``code``
and its ``message`` from the error body ``{"error": {"code", "message"}}``.
A request that got no answer at all raises :class:`APIConnectionError`.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = [
    "DocstreamError",
    "APIError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "RequestTimeoutError",
    "ConflictError",
    "GoneError",
    "PayloadTooLargeError",
    "UnsupportedMediaTypeError",
    "UnprocessableEntityError",
    "RateLimitError",
    "InternalServerError",
    "ServiceUnavailableError",
    "APIConnectionError",
    "APITimeoutError",
    "WaitTimeoutError",
    "ExportError",
    "ExportClosedError",
]


class DocstreamError(Exception):
    """The base of every exception this package raises."""


class APIError(DocstreamError):
    """The server answered with an error status.

    Attributes:
        status_code: The HTTP status, e.g. ``422``.
        code: The server's error code, e.g. ``"invalid_request"`` (``"unknown"``
            when the body was not the documented error body).
        message: The server's human-readable message.
        retry_after: The ``Retry-After`` header in seconds, when the server sent one.
        body: The decoded JSON body (or the text), for anything else it said.
        response: The raw :class:`httpx.Response`.
    """

    status_code: int
    code: str
    message: str
    retry_after: float | None
    body: Any
    response: httpx.Response | None

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        *,
        retry_after: float | None = None,
        body: Any = None,
        response: httpx.Response | None = None,
    ) -> None:
        super().__init__(f"{status_code} {code}: {message}")
        self.status_code = status_code
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.body = body
        self.response = response


class BadRequestError(APIError):
    """400: malformed JSON, a bad header, id or query parameter."""


class AuthenticationError(APIError):
    """401: the key is missing, malformed, unknown or revoked."""


class PermissionDeniedError(APIError):
    """403: the key lacks the route's scope."""


class NotFoundError(APIError):
    """404: no such job (or another tenant's)."""


class RequestTimeoutError(APIError):
    """408: an upload's body did not arrive in time."""


class ConflictError(APIError):
    """409: the job's state does not allow the action (e.g. cancelling a finished job)."""


class GoneError(APIError):
    """410: the job's content was erased."""


class PayloadTooLargeError(APIError):
    """413: the body is over the server's limit."""


class UnsupportedMediaTypeError(APIError):
    """415: the body's type is not accepted (or does not match its bytes)."""


class UnprocessableEntityError(APIError):
    """422: the request is not valid, or its ``Idempotency-Key`` names another request's job."""


class RateLimitError(APIError):
    """429: past a quota of the tenant; ``retry_after`` says when to try again."""


class InternalServerError(APIError):
    """500 or another 5xx that is not 503: a bug on the server's side."""


class ServiceUnavailableError(APIError):
    """503: overloaded, a dependency is away, or the server is draining for shutdown."""


class APIConnectionError(DocstreamError):
    """No answer: the connection failed or was lost before the answer came.

    When the request had been sent, the server may or may not have acted on it.
    """

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.__cause__ = cause


class APITimeoutError(APIConnectionError):
    """No answer within the client's timeout."""


class WaitTimeoutError(DocstreamError, TimeoutError):
    """:meth:`Client.wait` ran out of time before the job finished.

    ``job`` is the job as last read.
    """

    def __init__(self, message: str, job: Any) -> None:
        super().__init__(message)
        self.job = job


class ExportError(DocstreamError):
    """The export stream answered a frame of ours with ``{"error": {...}}``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ExportClosedError(DocstreamError):
    """The export stream was closed by the server and could not be reopened.

    ``close_code`` is the WebSocket close code (``1011`` forced, ``1008`` the key
    was revoked, ``1013`` try again later, ...), when there was one.
    """

    def __init__(self, message: str, close_code: int | None = None) -> None:
        super().__init__(message)
        self.close_code = close_code


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: RequestTimeoutError,
    409: ConflictError,
    410: GoneError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds (the server sends whole seconds; dates are ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_parts(
    status_code: int, body: Any, retry_after_header: str | None, response: httpx.Response | None
) -> APIError:
    """The exception for an error answer, from its status, body and ``Retry-After``."""
    code, message = "unknown", ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        detail = body["error"]
        code = str(detail.get("code", code))
        message = str(detail.get("message", ""))
    elif isinstance(body, str):
        message = body[:500]
    retry_after = parse_retry_after(retry_after_header)
    if retry_after is None and isinstance(body, dict) and isinstance(body.get("error"), dict):
        in_body = body["error"].get("retry_after_s")
        if isinstance(in_body, (int, float)):
            retry_after = float(in_body)
    cls = _BY_STATUS.get(status_code)
    if cls is None:
        cls = InternalServerError if status_code >= 500 else APIError
    return cls(
        status_code, code, message, retry_after=retry_after, body=body, response=response
    )


def error_from_response(response: httpx.Response) -> APIError:
    """The exception for an error answer (its body must have been read)."""
    body: Any
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return error_from_parts(
        response.status_code, body, response.headers.get("retry-after"), response
    )
