"""The asyncio client."""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

import httpx

from ._base import (
    CORRECTIONS_PAGE,
    DEFAULT_TIMEOUT,
    BaseClient,
    FileInput,
    RequestSpec,
    filter_object,
    filter_params,
    page_image_of,
)
from ._errors import WaitTimeoutError
from ._export import AsyncExportStream
from ._models import (
    Accepted,
    BulkActionName,
    BulkOperation,
    BulkOutcome,
    Correction,
    DeadLetter,
    DeadLetterPage,
    Extraction,
    ExtractionPage,
    ExtractionRequest,
    FieldSpec,
    File,
    JobFilter,
    Me,
    PageImage,
    Priority,
    Replayed,
    TransitionLogEntry,
)
from ._retry import RetryPolicy, failed_try, wait_before_retry
from ._wait import is_done, next_poll

__all__ = ["AsyncClient"]



class AsyncClient(BaseClient):
    """An asyncio docstream client, with the same methods as :class:`Client` (awaited).

    Use it as a context manager so its connections are closed::

        async with docstream.AsyncClient("http://127.0.0.1:8080", api_key="dsk_...") as client:
            job = await client.submit(file="invoice.pdf", fields=[...])
            done = await client.wait(job.id, timeout=60)

    Args:
        base_url: The API's address (``DOCSTREAM_BASE_URL``, else ``http://127.0.0.1:8080``).
        api_key: A key of the tenant (``DOCSTREAM_API_KEY`` when not given).
        timeout: Seconds to wait for one answer (a :class:`httpx.Timeout` for finer control).
        retry_policy: How requests are repeated after a 503, a 429 or a lost answer;
            ``RetryPolicy(deadline=0)`` never repeats.
        http_client: An :class:`httpx.AsyncClient` of your own (its base URL and
            headers are left alone; the client does not close it).
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry_policy: RetryPolicy | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(api_key, base_url, retry_policy)
        self._timeout = timeout
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(base_url=self.base_url, timeout=timeout)
        self._headers = self._default_headers()

    # ------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Closes the client's connections (not those of an ``http_client`` passed in)."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ transport

    async def _send(self, spec: RequestSpec) -> httpx.Response:
        """Sends ``spec``, repeating it as the retry policy allows; the answer if a success."""
        spec.headers = {**self._headers, **spec.headers}
        if not self._owns_http:
            spec.path = self.base_url + spec.path
        what, key = f"{spec.method} {spec.path}", spec.headers.get("Idempotency-Key")
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            try:
                response = await self._http.send(spec.build(self._http))
            except httpx.TransportError as exc:
                failure = failed_try(exc, what, spec.repeatable)
            else:
                if response.is_success or response.status_code in spec.ok:
                    return response
                failure = failed_try(response, what, spec.repeatable)
            await asyncio.sleep(wait_before_retry(self.retry_policy, what, (attempt, started), failure, key))

    async def _json(self, spec: RequestSpec) -> Any:
        return (await self._send(spec)).json()

    # ------------------------------------------------------------ jobs

    async def submit(
        self,
        request: ExtractionRequest | Mapping[str, Any] | None = None,
        *,
        document: Mapping[str, Any] | None = None,
        file: FileInput | None = None,
        file_id: str | None = None,
        url: str | None = None,
        text: str | None = None,
        fields: Sequence[FieldSpec | Mapping[str, Any]] | None = None,
        metadata: Any = None,
        priority: Priority | None = None,
        extractor: str | None = None,
        webhook_url: str | None = None,
        min_confidence: float | None = None,
        idempotency_key: str | None = None,
        filename: str | None = None,
        content_type: str | None = None,
    ) -> Accepted:
        """Submits a job; its document comes from exactly one of the sources.

        * ``request``: the whole body of ``POST /v1/extractions`` as a dict,
          ``document`` included (the other keyword arguments add to it);
        * ``document=``: a document dict (``{"text": ...}`` or ``{"pages": [...]}``);
        * ``file=``: a path, bytes or a binary file object, sent as multipart
          (the server stores the file and the job names it);
        * ``file_id=``: a file uploaded before (:meth:`upload_file`);
        * ``url=``: a URL the server fetches (public hosts only);
        * ``text=``: plain text.

        The call carries an ``Idempotency-Key`` (a fresh random one unless
        ``idempotency_key`` is given), and a 503, a 429 or a lost answer is
        repeated with the same key until the retry policy's deadline, so a
        call makes at most one job. ``content_type`` is the file's declared
        type (``application/octet-stream`` by default: the server knows PDF,
        PNG, JPEG, TIFF and text by their bytes).

        Returns the job's id and status (``queued``). Raises
        :class:`UnprocessableEntityError` for an invalid request, or for a key
        already used with another request.
        """
        spec = self._submit_spec(
            request,
            document=document,
            file=file,
            file_id=file_id,
            url=url,
            text=text,
            fields=fields,
            metadata=metadata,
            priority=priority,
            extractor=extractor,
            webhook_url=webhook_url,
            min_confidence=min_confidence,
            idempotency_key=idempotency_key,
            filename=filename,
            content_type=content_type,
        )
        return Accepted.from_dict(await self._json(spec))

    async def get(self, job_id: str, *, include_request: bool = False) -> Extraction:
        """The job; with ``include_request`` its request as submitted too."""
        params = [("include", "request")] if include_request else []
        return Extraction.from_dict(
            await self._json(RequestSpec("GET", self._job_path(job_id), params=params, repeatable=True))
        )

    async def wait(
        self,
        job_id: str,
        timeout: float = 60.0,
        *,
        boxes: bool = False,
        poll_interval: float = 0.25,
    ) -> Extraction:
        """Polls the job until it is finished, and returns it.

        A job is finished once its status is ``succeeded``, ``failed`` or
        ``cancelled``; with ``boxes=True`` a succeeded job is waited for until
        its bbox refinement finished too (so :attr:`Extraction.boxes` is
        filled). Polls start at ``poll_interval`` seconds apart and grow to 2 s.

        Raises :class:`WaitTimeoutError` (a :class:`TimeoutError`) after
        ``timeout`` seconds; the job itself goes on.
        """
        deadline = time.monotonic() + timeout
        interval = poll_interval
        while True:
            job = await self.get(job_id)
            if is_done(job, boxes):
                return job
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeoutError(f"job {job_id} is still {job.status} after {timeout:g} s", job)
            await asyncio.sleep(min(interval, remaining))
            interval = next_poll(interval)

    async def list(
        self,
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
        order: Literal["desc", "asc"] | None = None,
        include_result: bool = False,
        page_size: int | None = None,
    ) -> AsyncIterator[Extraction]:
        """Every job that passes the filters (newest first, or ``order="asc"``).

        It follows ``next_cursor`` page by page, lazily, until the last page:
        no job is yielded twice, and none that existed when the walk began is
        skipped. ``metadata={"customer": "acme"}`` keeps the jobs whose top-level
        metadata has those values (compared as text). ``result`` is ``None`` on
        listed jobs unless ``include_result``.
        """
        filters = filter_params(
            status=status,
            bbox_status=bbox_status,
            extractor=extractor,
            metadata=metadata,
            idempotency_key=idempotency_key,
            error_prefix=error_prefix,
            needs_review=needs_review,
            submitted_after=submitted_after,
            submitted_before=submitted_before,
            finished_after=finished_after,
            finished_before=finished_before,
        )
        cursor: str | None = None
        while True:
            page = await self.list_page(filters, cursor=cursor, limit=page_size, order=order, include_result=include_result)
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def list_page(
        self,
        filters: Sequence[tuple[str, str]] = (),
        *,
        cursor: str | None = None,
        limit: int | None = None,
        order: Literal["desc", "asc"] | None = None,
        include_result: bool = False,
    ) -> ExtractionPage:
        """One page of ``GET /v1/extractions``; ``filters`` are raw query pairs."""
        spec = self._list_spec(builtins.list(filters), limit=limit, order=order, include_result=include_result, cursor=cursor)
        return ExtractionPage.from_dict(await self._json(spec))

    async def retry(self, job_id: str) -> Extraction:
        """Sends a failed job back to the queue with a fresh budget of attempts.

        Raises :class:`ConflictError` if the job has not failed.
        """
        return Extraction.from_dict(await self._json(RequestSpec("POST", self._job_path(job_id, "/retry"))))

    async def cancel(self, job_id: str) -> Extraction:
        """Cancels a queued job, or asks a running one to stop (at its holder's next heartbeat).

        Raises :class:`ConflictError` once the job finished.
        """
        return Extraction.from_dict(await self._json(RequestSpec("POST", self._job_path(job_id, "/cancel"))))

    async def delete(self, job_id: str) -> None:
        """Erases a finished job's content (scope ``delete``); it stays as a tombstone.

        Raises :class:`ConflictError` while the job is open.
        """
        await self._send(RequestSpec("DELETE", self._job_path(job_id), repeatable=True))

    async def transitions(self, job_id: str) -> builtins.list[TransitionLogEntry]:
        """The job's transition log, oldest first."""
        data = await self._json(RequestSpec("GET", self._job_path(job_id, "/transitions"), repeatable=True))
        return [TransitionLogEntry.from_dict(d) for d in data]

    async def document(self, job_id: str) -> dict[str, Any]:
        """The document the job was read from (a file's words and boxes, once read)."""
        result: dict[str, Any] = await self._json(
            RequestSpec("GET", self._job_path(job_id, "/document"), repeatable=True)
        )
        return result

    async def page_image(self, job_id: str, page: int = 0) -> PageImage:
        """Page ``page`` (from 0, as :attr:`GroundedField.page` counts) of the job's file, as an image.

        Returns the bytes and their media type: a PNG's own bytes
        (``image/png``), a JPEG's without its EXIF (``image/jpeg``), or a PDF
        page rendered to a PNG at 100 dpi or less (its boxes are in points:
        scale them by the image's width over the page's). The job needs to
        have been made from a file (``file=``, ``file_id=`` or ``url=``), in
        any status.

        A server already drawing as many pages as it may answers 503 with
        ``Retry-After``; the call is repeated as the retry policy says, like
        every read (the page drawn meanwhile is kept for the repeat).

        Raises :class:`NotFoundError` for a job whose document was sent as
        JSON or a page past the last, :class:`UnprocessableEntityError` for a
        TIFF (not drawn), :class:`GoneError` once the job was erased.
        """
        return page_image_of(await self._send(self._page_spec(job_id, page)))

    # ------------------------------------------------------------ review

    async def correct(self, job_id: str, field: str, value: str | None, *, reviewer: str | None = None) -> Correction:
        """Stores a reviewer's correction of ``field`` of a succeeded job (a key with the ``review`` scope).

        ``value`` is the right text, or ``None`` when the document does not
        hold the field; ``reviewer`` names the person (at most 200 bytes).
        The extracted value stays in the job's result as the extractor gave
        it: the correction is stored beside it, and a later correction of the
        same field supersedes it (:meth:`corrections`). A job leaves
        :meth:`review_queue` once every flagged value of it was corrected.

        The call carries no idempotency key, so an answer lost on the way is
        raised, not repeated (a repeat would store a second correction); a
        ``429`` (past the key's corrections a minute) or a ``503`` did
        nothing and is repeated after its ``Retry-After``.

        Raises :class:`ConflictError` when the job has not succeeded (or the
        field or the job has as many corrections as it may),
        :class:`UnprocessableEntityError` for a field the job's request did not
        name or a value too long, :class:`GoneError` once the job was erased,
        :class:`PermissionDeniedError` for a key without the ``review`` scope.
        """
        return Correction.from_dict(await self._json(self._correct_spec(job_id, field, value, reviewer)))

    async def corrections(
        self, job_id: str, *, after: int = 0, page_size: int | None = None
    ) -> builtins.list[Correction]:
        """Every correction of the job's values, oldest first, from after the one of id ``after``.

        It reads them page by page (``page_size`` at a time, 1000 by default).
        The last correction of a field is its value now::

            now = {c.field: c.value for c in client.corrections(job_id)}
        """
        limit = CORRECTIONS_PAGE if page_size is None else page_size
        found: builtins.list[Correction] = []
        while True:
            data = await self._json(self._corrections_spec(job_id, after, limit))
            page = [Correction.from_dict(d) for d in data]
            found.extend(page)
            if len(page) < limit:
                return found
            after = page[-1].id

    def review_queue(
        self,
        *,
        metadata: Mapping[str, Any] | None = None,
        extractor: str | None = None,
        submitted_after: str | datetime | None = None,
        submitted_before: str | datetime | None = None,
        finished_after: str | datetime | None = None,
        finished_before: str | datetime | None = None,
        order: Literal["desc", "asc"] | None = None,
        include_result: bool = True,
        page_size: int | None = None,
    ) -> AsyncIterator[Extraction]:
        """The jobs a reviewer has to look at: :meth:`list` with ``needs_review=True``.

        A job is in the queue while one of its grounded values is flagged
        ``needs_review`` (less sure than its request's ``min_confidence``) and
        no correction of that field was made since (:meth:`correct`). Jobs
        come newest first (``order="asc"``: oldest first), each with its
        result and boxes unless ``include_result=False``, so
        :attr:`Extraction.fields_to_review` names the flagged fields and
        :attr:`Extraction.boxes` where they are (:meth:`page_image` draws the
        page). The other filters narrow the queue as :meth:`list`'s do.
        """
        return self.list(
            needs_review=True,
            metadata=metadata,
            extractor=extractor,
            submitted_after=submitted_after,
            submitted_before=submitted_before,
            finished_after=finished_after,
            finished_before=finished_before,
            order=order,
            include_result=include_result,
            page_size=page_size,
        )

    # ------------------------------------------------------------ files

    async def upload_file(self, file: FileInput, *, content_type: str | None = None) -> File:
        """Uploads a file (PDF, PNG, JPEG, TIFF or text); its id is the SHA-256 of its bytes."""
        return File.from_dict(await self._json(self._upload_spec(file, content_type)))

    async def get_file(self, file_id: str) -> File:
        """An uploaded file's description."""
        return File.from_dict(
            await self._json(RequestSpec("GET", f"/v1/files/{file_id}", repeatable=True))
        )

    # ------------------------------------------------------------ bulk actions

    async def bulk(
        self,
        action: BulkActionName,
        *,
        ids: Sequence[str] | None = None,
        filter: JobFilter | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        wait: float | None = 60.0,
    ) -> BulkOperation:
        """Cancels or retries many jobs, named by ``ids`` or by a ``filter``.

        ``filter`` takes the list's filters as a dict (``{"status": "failed",
        "metadata": {"customer": "acme"}}``). The call carries an
        ``Idempotency-Key`` (fresh unless given), so a repeat is the same
        operation. With ``wait`` (seconds) it polls a running operation until it
        finished; ``None`` returns what the server answered first.
        The outcomes of the answer are its first page: :meth:`bulk_outcomes` walks them all.
        """
        op = BulkOperation.from_dict(await self._json(self._bulk_spec(action, ids, filter, idempotency_key)))
        if wait is None:
            return op
        deadline = time.monotonic() + wait
        interval = 0.25
        while op.state != "finished":
            if time.monotonic() >= deadline:
                raise WaitTimeoutError(f"bulk operation {op.id} still running after {wait:g} s", op)
            await asyncio.sleep(interval)
            interval = next_poll(interval)
            op = await self.get_bulk_operation(op.id)
        return op

    async def bulk_retry(self, *, ids: Sequence[str] | None = None, filter: JobFilter | Mapping[str, Any] | None = None,
                   idempotency_key: str | None = None, wait: float | None = 60.0) -> BulkOperation:
        """:meth:`bulk` with ``action="retry"``: failed jobs go back to the queue."""
        return await self.bulk("retry", ids=ids, filter=filter, idempotency_key=idempotency_key, wait=wait)

    async def bulk_cancel(self, *, ids: Sequence[str] | None = None, filter: JobFilter | Mapping[str, Any] | None = None,
                    idempotency_key: str | None = None, wait: float | None = 60.0) -> BulkOperation:
        """:meth:`bulk` with ``action="cancel"``."""
        return await self.bulk("cancel", ids=ids, filter=filter, idempotency_key=idempotency_key, wait=wait)

    async def get_bulk_operation(
        self,
        operation_id: str,
        *,
        outcome: Literal["done", "refused", "not_found"] | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> BulkOperation:
        """A bulk operation's counts and a page of its outcomes."""
        params = [(k, v) for k, v in (("outcome", outcome), ("cursor", cursor),
                                      ("limit", None if limit is None else str(limit))) if v is not None]
        return BulkOperation.from_dict(
            await self._json(RequestSpec("GET", f"/v1/extractions/actions/{operation_id}", params=params, repeatable=True))
        )

    async def bulk_outcomes(
        self, operation_id: str, *, outcome: Literal["done", "refused", "not_found"] | None = None
    ) -> AsyncIterator[BulkOutcome]:
        """Every outcome of a bulk operation, page by page."""
        cursor: str | None = None
        while True:
            op = await self.get_bulk_operation(operation_id, outcome=outcome, cursor=cursor, limit=200)
            for item in op.outcomes:
                yield item
            if op.next_cursor is None:
                return
            cursor = op.next_cursor

    # ------------------------------------------------------------ dead letters

    async def dead_letters(self, *, page_size: int | None = None) -> AsyncIterator[DeadLetter]:
        """Every dead letter of the tenant (Kafka intake records that were refused), page by page."""
        cursor: str | None = None
        while True:
            params = [(k, v) for k, v in (("cursor", cursor),
                                          ("limit", None if page_size is None else str(page_size))) if v is not None]
            page = DeadLetterPage.from_dict(
                await self._json(RequestSpec("GET", "/v1/dead-letters", params=params, repeatable=True))
            )
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def replay_dead_letter(self, letter_id: int) -> Replayed:
        """Produces a dead letter's record to its topic again (once: a repeat raises :class:`ConflictError`)."""
        return Replayed.from_dict(await self._json(RequestSpec("POST", f"/v1/dead-letters/{int(letter_id)}/replay")))

    # ------------------------------------------------------------ account

    async def me(self) -> Me:
        """The key's tenant and scopes."""
        return Me.from_dict(await self._json(RequestSpec("GET", "/v1/me", repeatable=True)))

    # ------------------------------------------------------------ export

    def export(
        self,
        group: str,
        *,
        from_: Literal["latest", "earliest"] | None = None,
        status: str | Sequence[str] | None = None,
        transition: str | Sequence[str] | None = None,
        strategy: Literal["block", "drop_oldest", "drop_new"] | None = None,
        reconnect: bool = True,
        idle_timeout: float | None = None,
    ) -> AsyncExportStream:
        """The tenant's job events over the export WebSocket, as consumer group ``group``.

        Use it in a ``with`` block and iterate::

            async with client.export("billing") as events:
                async for frame in events:
                    await handle(frame.event)

        Each event is acknowledged once your code for it returns: when you
        ask for the next one, or leave the ``with`` block normally. An
        exception in your code leaves it unacknowledged, so the group gets it
        again on its next connection: delivery is at least once, and a
        handler should tolerate a repeat. ``from_`` says where a group that
        never acknowledged anything starts (``latest`` by default).

        With ``reconnect`` (the default) a closed connection (a server restart,
        a forced close) is opened again with the client's retry policy, and the
        events that were not acknowledged come again. ``idle_timeout`` raises
        :class:`TimeoutError` when no event came for that many seconds.
        """
        url = self._export_url(group, from_=from_, status=status, transition=transition, strategy=strategy)
        return AsyncExportStream(
            url,
            headers=self._headers,
            retry=self.retry_policy,
            reconnect=reconnect,
            idle_timeout=idle_timeout,
            open_timeout=self._timeout if isinstance(self._timeout, (int, float)) else 30.0,
        )

    # ------------------------------------------------------------ helpers

    @staticmethod
    def job_filter(**kwargs: Any) -> JobFilter:
        """The list's keyword filters (as :meth:`list` takes them) as a bulk action's ``filter``."""
        return filter_object(filter_params(**kwargs))
