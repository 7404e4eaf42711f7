"""The export stream: the tenant's job events over a WebSocket, acknowledged one by one.

The protocol (``docs/src/streams.md``, *Export stream*): the server sends
``{"seq", "partition", "offset", "event"}`` frames; the client answers
``{"ack": N}``, which acknowledges every frame up to ``seq`` N of that
connection. The server commits a group's offsets only up to what was
acknowledged, so a group that reconnects gets again what it had not
acknowledged.

Here each frame is acknowledged once the caller's code for it returned: when
the caller asks for the next frame, or leaves the ``with`` block without an
exception. A frame whose code raised is never acknowledged, and comes again on
the group's next connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as async_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect as sync_connect

from ._errors import APIConnectionError, APIError, ExportClosedError, ExportError, error_from_parts
from ._models import ExportFrame
from ._retry import RetryPolicy, wait_before_retry

__all__ = ["ExportStream", "AsyncExportStream"]

logger = logging.getLogger("docstream")

# Close codes after which opening the stream again cannot help.
_FINAL_CLOSE_CODES = frozenset({1002, 1003, 1007, 1008, 1009, 1010})


def _handshake_error(exc: Exception) -> tuple[APIError | APIConnectionError, bool]:
    """The error for a failed opening, and whether another try may succeed."""
    if isinstance(exc, InvalidStatus):
        response = exc.response
        raw = response.body or b""
        body: Any
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        error = error_from_parts(response.status_code, body, response.headers.get("Retry-After"), None)
        return error, response.status_code in (429, 502, 503, 504)
    return APIConnectionError(f"export stream: could not connect ({exc!r})", cause=exc), True


def _close_code(exc: ConnectionClosed) -> int | None:
    return exc.rcvd.code if exc.rcvd is not None else None


def _decode_frame(raw: str | bytes) -> ExportFrame:
    data = json.loads(raw)
    if isinstance(data, dict) and "error" in data and "seq" not in data:
        detail = data["error"] if isinstance(data["error"], dict) else {}
        raise ExportError(str(detail.get("code", "unknown")), str(detail.get("message", "")))
    return ExportFrame.from_dict(data)


class _Common:
    """State shared by the sync and async streams."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        retry: RetryPolicy,
        reconnect: bool,
        idle_timeout: float | None,
        open_timeout: float,
    ) -> None:
        self.url = url
        self._headers = dict(headers)
        self._retry = retry
        self._reconnect = reconnect
        self._idle_timeout = idle_timeout
        self._open_timeout = open_timeout
        self._pending: int | None = None  # the seq delivered and not acknowledged yet
        self._closed = False
        self.connections = 0
        """How many connections the stream opened (a reconnect adds one)."""

    def _after_close(self, exc: ConnectionClosed) -> None:
        """Bookkeeping when the server closed the connection; raises if it should stay closed."""
        code = _close_code(exc)
        # What was delivered on the lost connection can no longer be acknowledged
        # there; the server sends it again on the next one.
        self._pending = None
        if not self._reconnect or code in _FINAL_CLOSE_CODES:
            raise ExportClosedError(f"export stream closed by the server ({exc})", code) from exc
        logger.info("export stream closed (%s); reconnecting", exc)

    def _give_up(self, error: APIError | APIConnectionError, retryable: bool, attempt: int,
                 started: float) -> float:
        """The wait before the next try to connect, or ``error`` raised."""
        if not retryable:
            raise error
        retry_after = error.retry_after if isinstance(error, APIError) else None
        return wait_before_retry(self._retry, "export stream: connect", (attempt, started), (error, retry_after))


class ExportStream(_Common):
    """An iterator over the export stream's frames (see :meth:`Client.export`)."""

    _ws: SyncConnection | None = None

    def __enter__(self) -> ExportStream:
        self._open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.ack()
        self.close()

    def __iter__(self) -> ExportStream:
        return self

    def __next__(self) -> ExportFrame:
        self.ack()
        while True:
            if self._closed:
                raise StopIteration
            ws = self._open()
            try:
                raw = ws.recv(timeout=self._idle_timeout)
            except ConnectionClosed as exc:
                self._ws = None
                if self._closed:
                    raise StopIteration from None
                self._after_close(exc)
                continue
            frame = _decode_frame(raw)
            self._pending = frame.seq
            return frame

    def ack(self) -> None:
        """Acknowledges every frame delivered so far (done for you as you iterate)."""
        seq, self._pending = self._pending, None
        if seq is None or self._ws is None:
            return
        try:
            self._ws.send(json.dumps({"ack": seq}))
        except ConnectionClosed:
            logger.info("export stream: the connection closed before ack %d; the event comes again", seq)

    def close(self) -> None:
        """Closes the connection; what was not acknowledged goes to the group's next one."""
        self._closed = True
        if self._ws is not None:
            ws, self._ws = self._ws, None
            ws.close()

    def _open(self) -> SyncConnection:
        if self._ws is not None:
            return self._ws
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            try:
                connection = sync_connect(
                    self.url, additional_headers=self._headers, open_timeout=self._open_timeout
                )
                # websockets 17 wants the connection entered as a context
                # manager; close() ends it.
                self._ws = connection.__enter__()
            except (InvalidHandshake, ConnectionClosed, OSError, TimeoutError) as exc:
                error, retryable = _handshake_error(exc)
                time.sleep(self._give_up(error, retryable, attempt, started))
                continue
            self.connections += 1
            logger.debug("export stream open: %s", self.url)
            return self._ws


class AsyncExportStream(_Common):
    """An async iterator over the export stream's frames (see :meth:`AsyncClient.export`)."""

    _ws: AsyncConnection | None = None

    async def __aenter__(self) -> AsyncExportStream:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.ack()
        await self.close()

    def __aiter__(self) -> AsyncExportStream:
        return self

    async def __anext__(self) -> ExportFrame:
        await self.ack()
        while True:
            if self._closed:
                raise StopAsyncIteration
            ws = await self._open()
            try:
                raw = await asyncio.wait_for(ws.recv(), self._idle_timeout)
            except ConnectionClosed as exc:
                self._ws = None
                if self._closed:
                    raise StopAsyncIteration from None
                self._after_close(exc)
                continue
            frame = _decode_frame(raw)
            self._pending = frame.seq
            return frame

    async def ack(self) -> None:
        """Acknowledges every frame delivered so far (done for you as you iterate)."""
        seq, self._pending = self._pending, None
        if seq is None or self._ws is None:
            return
        try:
            await self._ws.send(json.dumps({"ack": seq}))
        except ConnectionClosed:
            logger.info("export stream: the connection closed before ack %d; the event comes again", seq)

    async def close(self) -> None:
        """Closes the connection; what was not acknowledged goes to the group's next one."""
        self._closed = True
        if self._ws is not None:
            ws, self._ws = self._ws, None
            await ws.close()

    async def _open(self) -> AsyncConnection:
        if self._ws is not None:
            return self._ws
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            try:
                self._ws = await async_connect(
                    self.url, additional_headers=self._headers, open_timeout=self._open_timeout
                )
            except (InvalidHandshake, ConnectionClosed, OSError, TimeoutError) as exc:
                error, retryable = _handshake_error(exc)
                await asyncio.sleep(self._give_up(error, retryable, attempt, started))
                continue
            self.connections += 1
            logger.debug("export stream open: %s", self.url)
            return self._ws
