"""What the sync and the async client share: building requests and reading answers.

Each operation is built here as a :class:`RequestSpec` (no I/O), sent by the
client's own transport loop (``_client.py`` or ``_async_client.py``), and its
answer decoded here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import httpx

from ._errors import error_from_response
from ._models import BulkActionName, ExtractionRequest, FieldSpec, JobFilter, PageImage, Priority
from ._retry import RetryPolicy

__all__ = ["RequestSpec", "BaseClient", "FileInput", "ListFilters"]

logger = logging.getLogger("docstream")

__version__ = "0.1.0"
USER_AGENT = f"docstream-python/{__version__}"
DEFAULT_BASE_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 30.0

FileInput = str | os.PathLike[str] | bytes | IO[bytes]
"""A file to upload: a path, its bytes, or a binary file object open for reading."""

ListFilters = dict[str, str]

CORRECTIONS_PAGE = 1000
"""The most corrections ``GET /v1/extractions/{id}/corrections`` answers at once."""


def new_idempotency_key() -> str:
    """A fresh ``Idempotency-Key``: 32 random hex digits."""
    return uuid.uuid4().hex


@dataclasses.dataclass
class RequestSpec:
    """One HTTP request, ready to be sent (and sent again, byte for byte, on a retry)."""

    method: str
    path: str
    params: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    json: Any = None
    content: bytes | None = None
    files: dict[str, tuple[str | None, bytes, str]] | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    # Repeating it after a lost answer is harmless (idempotent, or keyed).
    repeatable: bool = False
    # Statuses that are success for this request, besides 2xx.
    ok: tuple[int, ...] = ()

    def build(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The :class:`httpx.Request` (built anew for each try)."""
        return http.build_request(
            self.method,
            self.path,
            params=tuple(self.params) or None,
            json=self.json,
            content=self.content,
            files=self.files,
            headers=self.headers,
        )


def _read_file(file: FileInput) -> tuple[bytes, str | None]:
    """The bytes of ``file`` and its name, if it has one."""
    if isinstance(file, (bytes, bytearray, memoryview)):
        return bytes(file), None
    if isinstance(file, (str, os.PathLike)):
        path = Path(file)
        return path.read_bytes(), path.name
    name = getattr(file, "name", None)
    data = file.read()
    return data, (os.path.basename(name) if isinstance(name, str) else None)


def _text(value: str | datetime | bool | int | Sequence[str]) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a naive datetime is ambiguous: give it a timezone")
        return value.isoformat()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    return ",".join(value)


def filter_params(
    *,
    status: str | Sequence[str] | None = None,
    bbox_status: str | Sequence[str] | None = None,
    extractor: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    error_prefix: str | None = None,
    needs_review: bool | None = None,
    submitted_after: str | datetime | None = None,
    submitted_before: str | datetime | None = None,
    finished_after: str | datetime | None = None,
    finished_before: str | datetime | None = None,
) -> list[tuple[str, str]]:
    """The list's filters as query parameters (``metadata`` as ``metadata.KEY=VALUE``)."""
    params: list[tuple[str, str]] = []
    named: dict[str, Any] = {
        "status": status,
        "bbox_status": bbox_status,
        "extractor": extractor,
        "idempotency_key": idempotency_key,
        "error_prefix": error_prefix,
        "needs_review": needs_review,
        "submitted_after": submitted_after,
        "submitted_before": submitted_before,
        "finished_after": finished_after,
        "finished_before": finished_before,
    }
    for name, value in named.items():
        if value is not None:
            params.append((name, _text(value)))
    for key, value in (metadata or {}).items():
        params.append((f"metadata.{key}", value if isinstance(value, str) else json.dumps(value)))
    return params


def filter_object(params: list[tuple[str, str]]) -> JobFilter:
    """The list's query parameters as a bulk action's ``filter`` object."""
    out: dict[str, Any] = {}
    metadata: dict[str, str] = {}
    for name, value in params:
        if name.startswith("metadata."):
            metadata[name[len("metadata.") :]] = value
        elif name == "needs_review":
            out[name] = value == "true"
        else:
            out[name] = value
    if metadata:
        out["metadata"] = metadata
    return out  # type: ignore[return-value]


class BaseClient:
    """Settings and request builders shared by :class:`Client` and :class:`AsyncClient`."""

    base_url: str
    api_key: str
    retry_policy: RetryPolicy

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        retry_policy: RetryPolicy | None,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("DOCSTREAM_API_KEY")
        if not key:
            raise ValueError("no API key: pass api_key= or set DOCSTREAM_API_KEY")
        self.api_key = key
        self.base_url = (base_url or os.environ.get("DOCSTREAM_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.retry_policy = retry_policy if retry_policy is not None else RetryPolicy()

    def _default_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "User-Agent": USER_AGENT}

    # ---------------------------------------------------------------- builders

    def _submit_spec(
        self,
        request: ExtractionRequest | Mapping[str, Any] | None,
        *,
        document: Mapping[str, Any] | None,
        file: FileInput | None,
        file_id: str | None,
        url: str | None,
        text: str | None,
        fields: Sequence[FieldSpec | Mapping[str, Any]] | None,
        metadata: Any,
        priority: Priority | None,
        extractor: str | None,
        webhook_url: str | None,
        min_confidence: float | None,
        idempotency_key: str | None,
        filename: str | None,
        content_type: str | None,
    ) -> RequestSpec:
        body: dict[str, Any] = dict(request or {})
        sources = {
            "document": document,
            "file": file,
            "file_id": file_id,
            "url": url,
            "text": text,
        }
        given = [name for name, value in sources.items() if value is not None]
        if "document" in body:
            given.append("request['document']")
        if len(given) != 1:
            raise ValueError(
                "give exactly one document: request['document'], document=, file=, "
                f"file_id=, url= or text= (got {', '.join(given) or 'none'})"
            )
        if document is not None:
            body["document"] = dict(document)
        elif file_id is not None:
            body["document"] = {"object": file_id}
        elif url is not None:
            body["document"] = {"url": url}
        elif text is not None:
            body["document"] = {"text": text}
        extras: dict[str, Any] = {
            "fields": [dict(f) for f in fields] if fields is not None else None,
            "metadata": metadata,
            "priority": priority,
            "extractor": extractor,
            "webhook_url": webhook_url,
            "min_confidence": min_confidence,
        }
        body.update({k: v for k, v in extras.items() if v is not None})
        if "fields" not in body:
            raise ValueError("a request needs fields: pass fields= or request['fields']")
        key = idempotency_key or new_idempotency_key()
        headers = {"Idempotency-Key": key}
        if file is None:
            return RequestSpec("POST", "/v1/extractions", json=body, headers=headers, repeatable=True)
        data, name = _read_file(file)
        parts: dict[str, tuple[str | None, bytes, str]] = {
            "request": (None, json.dumps(body).encode(), "application/json"),
            "file": (filename or name or "document", data, content_type or "application/octet-stream"),
        }
        return RequestSpec("POST", "/v1/extractions", files=parts, headers=headers, repeatable=True)

    def _upload_spec(self, file: FileInput, content_type: str | None) -> RequestSpec:
        data, _ = _read_file(file)
        return RequestSpec(
            "POST",
            "/v1/files",
            content=data,
            headers={"Content-Type": content_type or "application/octet-stream"},
            # The same bytes are the same file: a repeat changes nothing.
            repeatable=True,
        )

    @staticmethod
    def _job_path(job_id: str, suffix: str = "") -> str:
        return f"/v1/extractions/{quote(job_id, safe='')}{suffix}"

    def _correct_spec(self, job_id: str, field: str, value: str | None, reviewer: str | None) -> RequestSpec:
        if value is not None and not isinstance(value, str):
            raise TypeError(f"a corrected value is text, or None (got {type(value).__name__})")
        body: dict[str, Any] = {"value": value}
        if reviewer is not None:
            body["reviewer"] = reviewer
        # Not keyed: a repeat after a lost answer would store a second
        # correction, so only refusals that did nothing (429, 503) are repeated.
        path = self._job_path(job_id, f"/fields/{quote(field, safe='')}/corrections")
        return RequestSpec("POST", path, json=body)

    def _corrections_spec(self, job_id: str, after: int, limit: int) -> RequestSpec:
        params = [("after", str(int(after))), ("limit", str(int(limit)))]
        return RequestSpec("GET", self._job_path(job_id, "/corrections"), params=params, repeatable=True)

    def _page_spec(self, job_id: str, page: int) -> RequestSpec:
        return RequestSpec("GET", self._job_path(job_id, f"/pages/{int(page)}"), repeatable=True)

    def _list_spec(
        self,
        filters: list[tuple[str, str]],
        *,
        limit: int | None,
        order: Literal["desc", "asc"] | None,
        include_result: bool,
        cursor: str | None,
    ) -> RequestSpec:
        params = list(filters)
        if limit is not None:
            params.append(("limit", str(limit)))
        if order is not None:
            params.append(("order", order))
        if include_result:
            params.append(("include", "result"))
        if cursor is not None:
            params.append(("cursor", cursor))
        return RequestSpec("GET", "/v1/extractions", params=params, repeatable=True)

    def _bulk_spec(
        self,
        action: BulkActionName,
        ids: Sequence[str] | None,
        filter: JobFilter | Mapping[str, Any] | None,
        idempotency_key: str | None,
    ) -> RequestSpec:
        if (ids is None) == (filter is None):
            raise ValueError("give exactly one of ids= and filter=")
        body: dict[str, Any] = {"action": action}
        if ids is not None:
            body["ids"] = list(ids)
        else:
            body["filter"] = dict(filter or {})
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        return RequestSpec("POST", "/v1/extractions/actions", json=body, headers=headers, repeatable=True)

    def _export_url(
        self,
        group: str,
        *,
        from_: Literal["latest", "earliest"] | None,
        status: str | Sequence[str] | None,
        transition: str | Sequence[str] | None,
        strategy: Literal["block", "drop_oldest", "drop_new"] | None,
    ) -> str:
        params: list[tuple[str, str]] = [("group", group)]
        if from_ is not None:
            params.append(("from", from_))
        if status is not None:
            params.append(("status", _text(status)))
        if transition is not None:
            params.append(("transition", _text(transition)))
        if strategy is not None:
            params.append(("strategy", strategy))
        parts = urlsplit(self.base_url)
        scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
        path = parts.path.rstrip("/") + "/v1/export"
        return urlunsplit((scheme, parts.netloc, path, urlencode(params), ""))


def page_image_of(response: httpx.Response) -> PageImage:
    """The page image an answer of ``GET /v1/extractions/{id}/pages/{page}`` carries."""
    kind = response.headers.get("content-type", "application/octet-stream")
    return PageImage(content=response.content, content_type=kind.split(";", 1)[0].strip().lower())


def check(response: httpx.Response, spec: RequestSpec) -> httpx.Response:
    """``response`` if it is a success, else its :class:`APIError` raised."""
    if response.is_success or response.status_code in spec.ok:
        return response
    raise error_from_response(response)
