"""HTTP/1.1 on one upstream connection: write a request, parse the response as it arrives.

The status line and headers are parsed once they are complete (1xx interim answers are
skipped); the body is framed by Content-Length, chunked encoding or the connection's end,
and handed to the reader piece by piece. Past `_HIGH_WATER` unread bytes the socket stops
being read until the reader catches up, so a slow client slows the upstream (backpressure).
The connection pool that owns connections is in client.py.

Strict by design (RFC 9112): whatever is not a well-formed response is a MalformedError, the
request fails with a clean 502, and the connection is closed, never reused. That covers
status codes outside 100-599, Content-Length or chunk sizes that are not plain ASCII digits
(hex digits for chunks), any Transfer-Encoding but `chunked`, Content-Length together with
Transfer-Encoding, obs-fold and invalid header names, control characters (a bare CR or LF)
in a field, a head over `_MAX_HEAD` (counted over every read and every interim answer), and
101 (the proxy never asks for an upgrade). A connection is also never reused after bytes
beyond a response's end, after an answer that came before the request was fully written,
and after any answer with no body of its own (204, 304, HEAD): an upstream that sent a body
anyway would have it read as the next request's answer.

(A well-kept parser, llhttp through `httptools`, was the alternative. Measured on an
nginx-like head of 5 fields, httptools parses in about 2 us against about 7 us for this
module's whole round (request future, parse, Response, release): a client on httptools
would still need that round, so the saving is 1-2 us of the ~160 us a proxied mask request
costs, for a compiled dependency and per-header callbacks that can arrive in fragments.
This parser stays: small, with the rules above, fuzzed byte by byte in the tests.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol, cast

from maskgate.gateway.upstream.http1_grammar import (
    CHUNK_LINE,
    STATUS_LINE,
    TRAILER_LINE,
    GrammarError,
    fields,
)

_MAX_HEAD = 64 * 1024  # bytes of status lines + headers of one response (interim ones included)
_MAX_CHUNK_LINE = 1024  # bytes of one chunk-size line (size and extensions)
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
    (The only failure after which client.py sends a request again, and only on a reused
    connection: a close after any response byte is a ProtocolError or a BodyError.)"""


class ProtocolError(UpstreamError):
    """The upstream's bytes are not an HTTP/1.x response this client understands."""


class MalformedError(ProtocolError):
    """The bytes break RFC 9112 (the module docstring lists what is refused); a plain
    ProtocolError is an answer cut off mid-head."""


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
        self._head_bytes = 0  # head (and trailer) bytes of the current response so far
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
                # Bytes past the end of a response (or while idle): whatever they are, they
                # must never be read as the next request's answer. The response already
                # framed stays readable; the connection is dropped.
                self._keep_alive = False
                self.abort()
            else:
                self._body(data)
        except Exception as e:
            if isinstance(e, MalformedError):
                err = e
            elif isinstance(e, GrammarError):
                err = MalformedError(str(e))
            else:
                err = MalformedError(f"unparsable: {e}")
            self._keep_alive = False
            if self._head is not None and not self._head.done():
                self._head.set_exception(err)
            else:
                self._fail(err)
            self.abort()

    # --- requests ---

    def send(self, request: bytes, head_request: bool) -> asyncio.Future[Response]:
        assert self.transport is not None and self._mode == _DONE
        self._mode = _HEAD
        self._head_request = head_request
        self._got_bytes = False
        self._head_bytes = 0
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
        buf = self._buf
        while True:  # loops only past 1xx interim responses
            end = buf.find(b"\r\n\r\n")
            if end < 0 and len(buf) + self._head_bytes > _MAX_HEAD:
                raise MalformedError("response headers are too large")
            if end < 0:
                return
            self._head_bytes += end + 4
            if self._head_bytes > _MAX_HEAD:
                raise MalformedError("response headers are too large")
            line_end = buf.find(b"\r\n")
            m = STATUS_LINE.fullmatch(buf, 0, line_end)
            if m is None:
                raise MalformedError(f"not an HTTP/1.x status line: {bytes(buf[:80])!r}")
            # The field lines, each with its CRLF; strict UTF-8, so that the client gets the
            # very bytes again (aiohttp writes header values as UTF-8).
            block = bytes(buf[line_end + 2 : end + 2]).decode("utf-8")
            version, status = m[1], int(m[2])
            del buf[: end + 4]
            if not 100 <= status <= 599:
                raise MalformedError(f"status code {status} is outside 100-599")
            if status == 101:
                # The proxy drops Upgrade (hop-by-hop), so no switch was ever asked for.
                raise MalformedError("101 Switching Protocols to a request that asked for none")
            if status >= 200:
                break
            # 100 Continue, 103 Early Hints: the real answer follows. Their fields are
            # checked all the same (a malformed interim head is a malformed response).
            fields(block, version)
        headers, length, chunked, connection, content_type = fields(block, version)
        self._keep_alive = version == b"1" and "close" not in connection
        if self.transport is not None and self.transport.get_write_buffer_size():
            # An answer before the request was fully written (an early 413, say): what the
            # upstream makes of the rest of the request is unknown.
            self._keep_alive = False
        if self._head_request or status in (204, 304):
            # No body by definition; an upstream that sent one anyway would have it taken
            # for the next request's answer, so these connections are not reused.
            self._mode, streamed, length, self._keep_alive = _LENGTH, False, 0, False
            self._remaining = 0
        elif chunked:
            self._mode, streamed, self._chunk = _CHUNKED, True, _SIZE
        elif length is not None:
            self._mode, streamed, self._remaining = _LENGTH, False, length
        else:
            self._mode, streamed, self._keep_alive = _UNTIL_CLOSE, True, False
        response = Response(self, status, headers, content_type, length, streamed)
        rest = bytes(buf)
        buf.clear()
        if self._mode == _LENGTH and self._remaining == 0:
            self._end_body()
            if rest:
                self._keep_alive = False  # bytes past the response's end
                self.abort()
        elif rest:
            self._body(rest)
        assert self._head is not None
        if not self._head.done():
            self._head.set_result(response)

    def _body(self, data: bytes) -> None:
        if self._mode == _LENGTH:
            extra = len(data) > self._remaining
            if extra:
                data = data[: self._remaining]
            self._remaining -= len(data)
            self._push(data)
            if self._remaining == 0:
                self._end_body()
            if extra:  # more than its Content-Length: the answer stands, the connection goes
                self._keep_alive = False
                self.abort()
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
                if (i < 0 and len(buf) > _MAX_CHUNK_LINE) or i > _MAX_CHUNK_LINE:
                    raise MalformedError("chunk size line too long")
                if i < 0:
                    return
                m = CHUNK_LINE.fullmatch(buf, 0, i)
                if m is None:
                    raise MalformedError(f"bad chunk size line {bytes(buf[:i])[:20]!r}")
                size = int(m[1], 16)
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
                    raise MalformedError("chunk data not followed by CRLF")
                del buf[:2]
                self._chunk = _SIZE
            else:  # trailer fields (checked, then dropped), ended by an empty line
                i = buf.find(b"\r\n")
                if i < 0 and len(buf) + self._head_bytes > _MAX_HEAD:
                    raise MalformedError("response trailers are too large")
                if i < 0:
                    return
                self._head_bytes += i + 2
                if self._head_bytes > _MAX_HEAD:
                    raise MalformedError("response trailers are too large")
                if i and TRAILER_LINE.fullmatch(buf, 0, i) is None:
                    raise MalformedError(f"malformed trailer line: {bytes(buf[:i])[:80]!r}")
                del buf[: i + 2]
                if i == 0:
                    self._end_body()
                    if buf:  # bytes past the last chunk: the answer stands, the conn goes
                        buf.clear()
                        self._keep_alive = False
                        self.abort()
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
