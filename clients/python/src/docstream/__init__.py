"""Python client of docstream, the asynchronous document-extraction service.

::

    import docstream

    with docstream.Client("http://127.0.0.1:8080", api_key="dsk_...") as client:
        job = client.submit(file="invoice.pdf", fields=[{"name": "total", "type": "money", "anchor": "Total"}])
        done = client.wait(job.id, timeout=60)
        print(done.status, done.fields)

:class:`Client` is synchronous, :class:`AsyncClient` the same for asyncio.
Both log through the ``docstream`` logger and configure no handler.
The manual's page *Python client* (``docs/src/python.md``) has more.
"""

from ._async_client import AsyncClient
from ._base import USER_AGENT, __version__
from ._client import Client
from ._errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DocstreamError,
    ExportClosedError,
    ExportError,
    GoneError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    RequestTimeoutError,
    ServiceUnavailableError,
    UnprocessableEntityError,
    UnsupportedMediaTypeError,
    WaitTimeoutError,
)
from ._export import AsyncExportStream, ExportStream
from ._models import *  # noqa: F403
from ._models import __all__ as _models_all
from ._retry import RetryPolicy

__all__ = [
    "Client",
    "AsyncClient",
    "RetryPolicy",
    "ExportStream",
    "AsyncExportStream",
    "USER_AGENT",
    "__version__",
    "DocstreamError",
    "APIError",
    "APIConnectionError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "ExportClosedError",
    "ExportError",
    "GoneError",
    "InternalServerError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTimeoutError",
    "ServiceUnavailableError",
    "UnprocessableEntityError",
    "UnsupportedMediaTypeError",
    "WaitTimeoutError",
    *_models_all,
]
