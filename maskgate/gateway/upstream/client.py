"""The HTTP/1.1 client the gateway talks to upstreams with: keep-alive pools per endpoint.
(The protocol itself, one connection's request and response, is in http1.py.)

Why not aiohttp's ClientSession: measured in one process on the 2-core CI machine, it cost
about 110 us of CPU per proxied request, close to half of the whole gateway's cost, for
generality (cookies, redirects, tracing, proxies, multipart) a reverse proxy never uses.
This client does what the proxy needs and nothing else: write one request, parse the status
line and headers, and hand the body over as it arrives (Content-Length, chunked, or until
close), pausing the socket when the reader falls behind (backpressure).

Errors are typed so the proxy can decide about retries and ejection: `ConnectError` (no
connection), `DisconnectedError` (closed before a response started: nothing was answered),
`ProtocolError` (an answer cut off mid-head; its subclass `MalformedError`: bytes that break
RFC 9112), `BodyError` (the connection broke mid-body), and `TimeoutError` from the deadlines the caller gives. A request on a kept-alive connection that
closes before any response byte (the upstream timed the idle connection out as the request
went) is sent once more on a new connection, and the caller is told (`on_resend`). A head
that outbound.py refuses (`UnsafeRequestError`, a client error) is never sent.
`read_whole` reads an answer whole, up to a limit (`AnswerTooLarge` past it).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from maskgate.gateway.upstream.http1 import (
    BodyError,
    ConnectError,
    Connection,
    DisconnectedError,
    MalformedError,
    ProtocolError,
    Response,
    UpstreamError,
)
from maskgate.gateway.upstream.outbound import UnsafeRequestError, request_head
from maskgate.protocol.errors import ServerError

__all__ = [
    "AnswerTooLarge",
    "BodyError",
    "ConnectError",
    "DisconnectedError",
    "MalformedError",
    "ProtocolError",
    "Response",
    "UnsafeRequestError",
    "UpstreamClient",
    "UpstreamError",
    "read_whole",
]

_MAX_IDLE_PER_ENDPOINT = 512
_IDLE_S = 60.0  # an idle connection older than this is closed instead of reused


def _expire(waiter: asyncio.Future[Response]) -> None:
    """The response headers did not come in time: the request fails with TimeoutError."""
    if not waiter.done():
        waiter.set_exception(TimeoutError("no response headers in time"))


class UpstreamClient:
    """Keep-alive connection pools keyed by endpoint URL (`http://host:port`)."""

    def __init__(self, connect_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[str, list[Connection]] = {}
        self._all: set[Connection] = set()
        self._targets: dict[str, tuple[str, int, ssl.SSLContext | None, str]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def request(
        self,
        endpoint: str,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        *,
        timeout_s: float,
        on_resend: Callable[[str], object] | None = None,
    ) -> Response:
        """Send one request; returns once the response headers are in (within `timeout_s`).

        When a connection reused from the pool closes before any response byte, the request
        is sent once more on a new connection; `on_resend(endpoint)` is called just before.
        """
        host, port, context, host_header = self._target(endpoint)
        # Every upstream request head is written (and checked) by outbound.py.
        data = request_head(method, target, host_header, headers, len(body or b""))
        if body:
            data += body
        is_head = method == "HEAD"
        loop = asyncio.get_running_loop()
        conn = self._take_idle(endpoint)
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect(endpoint, host, port, context)
            waiter = conn.send(data, is_head)
            # A plain timer on the future, not asyncio.timeout(): that was ~6% of the gateway's
            # CPU samples under load (a Timeout object, a reschedule, task lookups per request).
            timer = loop.call_later(timeout_s, _expire, waiter)
            try:
                return await waiter
            except DisconnectedError:
                # Raised only when the connection closed before any response byte (http1.py);
                # response bytes then a close is a ProtocolError or a BodyError, never re-sent.
                conn.abort()
                if not reused:
                    raise  # a new connection closed unanswered: the upstream's fault
            except BaseException:
                conn.abort()
                raise
            finally:
                timer.cancel()
            # A kept-alive connection the upstream closed as the request went out (its idle
            # timeout raced our reuse): once more, on a new connection, never another idle one,
            # so a request is sent at most twice here. The upstream may have read it, so a
            # POST may run twice: `on_resend` lets the caller count it (once connected, so a
            # request that is not sent again is not counted).
            reused = False
            conn = await self._connect(endpoint, host, port, context)
            if on_resend is not None:
                on_resend(endpoint)

    def give_back(self, conn: Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= _MAX_IDLE_PER_ENDPOINT:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def sweep(self, live: set[str]) -> None:
        """Close idle connections that outlived `_IDLE_S` or whose endpoint left its pool."""
        now = time.monotonic()
        for key, idle in list(self._idle.items()):
            for conn in list(idle):
                if key not in live or now - conn.idle_since > _IDLE_S:
                    conn.abort()
            if not idle:
                del self._idle[key]

    async def close(self) -> None:
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()

    def _take_idle(self, key: str) -> Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest to still be open
            if conn.closed:
                continue
            if now - conn.idle_since > _IDLE_S:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(
        self, key: str, host: str, port: int, context: ssl.SSLContext | None
    ) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(self, key), host, port, ssl=context
                )
        except TimeoutError as e:
            raise ConnectError(f"connect to {key} timed out", timed_out=True) from e
        except OSError as e:
            raise ConnectError(f"cannot connect to {key}: {e.strerror or e}") from e
        self._all.add(conn)
        return conn

    def _target(self, endpoint: str) -> tuple[str, int, ssl.SSLContext | None, str]:
        target = self._targets.get(endpoint)
        if target is None:
            parts = urlsplit(endpoint)
            assert parts.hostname is not None, endpoint
            secure = parts.scheme == "https"
            port = parts.port or (443 if secure else 80)
            if secure and self._ssl is None:
                self._ssl = ssl.create_default_context()
            target = self._targets[endpoint] = (
                parts.hostname,
                port,
                self._ssl if secure else None,
                parts.netloc,
            )
        return target


class AnswerTooLarge(ServerError):
    """An upstream answer the gateway would have to buffer past `max_upstream_answer_bytes`."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            "upstream_answer_too_large",
            f"the upstream's answer is larger than the gateway buffers "
            f"(max_upstream_answer_bytes = {limit}); ask for less (fewer log-probs, prompts or "
            "tokens) or stream it",
            status=502,
        )


async def read_whole(upstream: Response, idle_s: float, limit: int) -> bytes:
    """The whole body, each piece within `idle_s` of the last, at most `limit` bytes
    (AnswerTooLarge past it, before reading when the length is announced). It usually came
    with the headers, and then no timer is needed."""
    if upstream.content_length is not None and upstream.content_length > limit:
        raise AnswerTooLarge(limit)
    body = upstream.take_complete_body()
    if body is not None:
        return body
    pieces: list[bytes] = []
    size = 0
    while True:
        async with asyncio.timeout(idle_s):
            piece = await upstream.readchunk()
        if not piece:
            return b"".join(pieces)
        size += len(piece)
        if size > limit:
            raise AnswerTooLarge(limit)
        pieces.append(piece)
