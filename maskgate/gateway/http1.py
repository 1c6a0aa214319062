"""HTTP/1.1 on one upstream connection: write a request, parse the response as it arrives.

The status line and headers are parsed once they are complete (1xx interim answers are
skipped); the body is framed by Content-Length, chunked encoding or the connection's end,
and handed to the reader piece by piece. Past `_HIGH_WATER` unread bytes the socket stops
being read until the reader catches up, so a slow client slows the upstream (backpressure).
The connection pool that owns connections is in upstream.py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol, cast

_MAX_HEAD = 64 * 1024  # bytes of status line + headers
_HIGH_WATER = 512 * 1024  # buffered body bytes at which the socket stops being read
_LOW_WATER = 128 * 1024

# Parser modes.
_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _DONE = range(5)
# Chunked sub-states.
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class UpstreamError(Exception):
    """Base of every upstream failure this client reports."""


class ConnectError(UpstreamError):
    """No connection could be made (refused, unreachable, DNS, connect timeout)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        # A timeout says the endpoint is slow to accept (a full listen backlog under load),
        # not that it is gone: the proxy lets the circuit breaker judge it.
        self.timed_out = timed_out


class DisconnectedError(UpstreamError):
    """The connection closed before any response byte: the upstream answered nothing.
    (The only failure after which upstream.py sends a request again, and only on a reused
    connection: a close after any response byte is a ProtocolError or a BodyError.)"""


class ProtocolError(UpstreamError):
    """The upstream's bytes are not an HTTP/1.x response this client understands."""


class BodyError(UpstreamError):
    """The connection broke before the response body was complete."""


class Response:
    """One upstream response. Read the body with `read()` or `readchunk()`, then `release()`
    (connection back to the pool) or `close()` (connection dropped: the upstream sees it)."""

    __slots__ = ("_conn", "content_length", "content_type", "headers", "status", "streamed")

    def __init__(
        self,
        conn: Connection,
        status: int,
        headers: list[tuple[str, str]],
        content_type: str,
        content_length: int | None,
        streamed: bool,
    ) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers  # as received, in order
        self.content_type = content_type  # lower case, parameters dropped
        self.content_length = content_length
        self.streamed = streamed  # chunked or close-delimited: the body arrives over time

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for key, value in self.headers:
            if key.lower() == lname:
                return value
        return None

    async def readchunk(self) -> bytes:
        """The next piece of the body as it arrived; b"" at its end."""
        return await self._conn.next_part()

    def take_complete_body(self) -> bytes | None:
        """The whole body if it has already arrived (usually with the headers), else None."""
        return self._conn.take_complete_body()

    async def read(self) -> bytes:
        conn = self._conn
        whole = conn.take_complete_body()
        if whole is not None:
            return whole
        pieces = []
        while piece := await conn.next_part():
            pieces.append(piece)
        return b"".join(pieces)

    def release(self) -> None:
        self._conn.finish_response()

    def close(self) -> None:
        self._conn.abort()


class ConnectionOwner(Protocol):
    """What a connection tells its pool (upstream.UpstreamClient)."""

    def give_back(self, conn: Connection) -> None: ...

    def forget(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection: writes requests, parses responses."""

    def __init__(self, client: ConnectionOwner, key: str) -> None:
        self.client = client
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.parts: deque[bytes] = deque()
        self._buf = bytearray()
        self._mode = _DONE
        self._head_request = False
        self._keep_alive = False
        self._remaining = 0
        self._chunk = _SIZE
        self._size = 0  # bytes in self.parts
        self._paused = False
        self._exc: BaseException | None = None
        self._eof = False
        self._got_bytes = False
        self._head: asyncio.Future[Response] | None = None
        self._data: asyncio.Future[None] | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, so no isinstance).
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client.forget(self)
        if self._mode == _HEAD and self._head is not None and not self._head.done():
            err = ProtocolError if self._got_bytes else DisconnectedError
            self._head.set_exception(err("the upstream closed the connection"))
        elif self._mode == _UNTIL_CLOSE:
            self._end_body()
        elif self._mode in (_LENGTH, _CHUNKED):
            self._fail(BodyError("the upstream closed the connection mid-body"))

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            if self._mode == _HEAD:
                self._buf += data
                self._parse_head()
            elif self._mode == _DONE:
                raise ProtocolError("the upstream sent bytes outside of a response")
            else:
                self._body(data)
        except ProtocolError as e:
            if self._head is not None and not self._head.done():
                self._head.set_exception(e)
            else:
                self._fail(e)
            self.abort()

    # --- requests ---

    def send(self, request: bytes, head_request: bool) -> asyncio.Future[Response]:
        assert self.transport is not None and self._mode == _DONE
        self._mode = _HEAD
        self._head_request = head_request
        self._got_bytes = False
        self._eof = False
        self._exc = None
        self._buf.clear()
        self._head = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self._head

    def take_complete_body(self) -> bytes | None:
        """The whole body when it has all arrived in at most one piece, else None."""
        if not self._eof or self._exc is not None or self._paused or len(self.parts) > 1:
            return None
        self._size = 0
        return self.parts.popleft() if self.parts else b""

    async def next_part(self) -> bytes:
        while not self.parts:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            self._data = asyncio.get_running_loop().create_future()
            await self._data
        part = self.parts.popleft()
        self._size -= len(part)
        if self._paused and self._size <= _LOW_WATER and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return part

    def finish_response(self) -> None:
        """Back to the pool when the body was read to its end; else drop the connection."""
        if self._eof and not self.parts and self._keep_alive and not self.closed:
            self._mode = _DONE
            self.client.give_back(self)
        else:
            self.abort()

    def abort(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()
        self.client.forget(self)

    # --- parsing ---

    def _parse_head(self) -> None:
        while True:  # loops only past 1xx interim responses
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    raise ProtocolError("response headers are too large")
                return
            # utf-8 with surrogateescape, as aiohttp's server decodes the client's headers.
            lines = bytes(self._buf[:end]).decode("utf-8", "surrogateescape").split("\r\n")
            del self._buf[: end + 4]
            version, _, reason = lines[0].partition(" ")
            code = reason[:3]
            if not version.startswith("HTTP/1.") or not code.isdigit():
                raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
            status = int(code)
            if 100 <= status < 200 and status != 101:
                continue  # interim (100 Continue, 103 Early Hints): the real answer follows
            break
        headers: list[tuple[str, str]] = []
        length: int | None = None
        chunked = False
        connection = ""
        content_type = ""
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"malformed header line: {line[:80]!r}")
            value = value.strip()
            headers.append((name, value))
            lname = name.lower()
            if lname == "content-length":
                if not value.isdigit():
                    raise ProtocolError(f"bad Content-Length: {value[:40]!r}")
                length = int(value)
            elif lname == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif lname == "connection":
                connection = value.lower()
            elif lname == "content-type":
                content_type = value.partition(";")[0].strip().lower()
        self._keep_alive = version == "HTTP/1.1" and "close" not in connection
        if self._head_request or status in (204, 304) or status == 101:
            self._mode, streamed, length = _LENGTH, False, 0
            self._remaining = 0
        elif chunked:
            self._mode, streamed, self._chunk = _CHUNKED, True, _SIZE
        elif length is not None:
            self._mode, streamed, self._remaining = _LENGTH, False, length
        else:
            self._mode, streamed, self._keep_alive = _UNTIL_CLOSE, True, False
        response = Response(self, status, headers, content_type, length, streamed)
        rest = bytes(self._buf)
        self._buf.clear()
        if self._mode == _LENGTH and self._remaining == 0:
            self._end_body()
        elif rest:
            self._body(rest)
        assert self._head is not None
        if not self._head.done():
            self._head.set_result(response)

    def _body(self, data: bytes) -> None:
        if self._mode == _LENGTH:
            if len(data) > self._remaining:
                raise ProtocolError("the upstream sent more than its Content-Length")
            self._remaining -= len(data)
            self._push(data)
            if self._remaining == 0:
                self._end_body()
        elif self._mode == _UNTIL_CLOSE:
            self._push(data)
        else:
            self._buf += data
            self._dechunk()

    def _dechunk(self) -> None:
        buf = self._buf
        while buf:
            if self._chunk == _SIZE:
                i = buf.find(b"\r\n")
                if i < 0:
                    if len(buf) > 1024:
                        raise ProtocolError("chunk size line too long")
                    return
                size_text = bytes(buf[:i]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError as e:
                    raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from e
                del buf[: i + 2]
                self._remaining = size
                self._chunk = _DATA if size else _TRAILER
            elif self._chunk == _DATA:
                take = min(self._remaining, len(buf))
                self._push(bytes(buf[:take]))
                del buf[:take]
                self._remaining -= take
                if self._remaining == 0:
                    self._chunk = _DATA_END
            elif self._chunk == _DATA_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                del buf[:2]
                self._chunk = _SIZE
            else:  # trailers, ended by an empty line
                i = buf.find(b"\r\n")
                if i < 0:
                    return
                del buf[: i + 2]
                if i == 0:
                    self._end_body()
                    if buf:
                        raise ProtocolError("the upstream sent bytes after the last chunk")
                    return

    def _push(self, data: bytes) -> None:
        if not data:
            return
        self.parts.append(data)
        self._size += len(data)
        if self._size >= _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _end_body(self) -> None:
        self._eof = True
        self._mode = _DONE
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._exc = exc
        self._wake()

    def _wake(self) -> None:
        waiter, self._data = self._data, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
