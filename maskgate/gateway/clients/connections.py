"""Bounds on client connections: read timeouts, an idle timeout, and a cap on open ones.

aiohttp's server has one timer of its own (keep-alive, from the last answer or the
connect to the next complete request head) and no bound on how many connections stay open.
That let clients trickle headers at 1 byte/s, stay silent after the request line, or stall
mid-body for minutes, and enough of them exhausted the process's file descriptors. Here:

- `header_timeout_s`: from the first byte of a request head to its end (slowloris). 408,
  then the connection closes.
- `body_timeout_s` and `body_deadline_s`: the longest silence while a request body is read,
  and the longest the whole body may take, on every route that reads one (bodyread.py asks
  `body_timed_out`). 408, then the connection closes.
- `idle_timeout_s`: a kept-alive connection with no request in progress is closed.
- `max_connections` open at once (per process): a new connection past the cap closes the
  idle one that has waited longest; when none is idle, the new one gets 503 and is closed.

Each connection is in one of three states: idle (no byte of a next request yet), head (a
request head is arriving) or busy (a request is being handled, or the rest of an unread
body is drained after its answer). The idle and head sets are ordered by when a connection
entered them, so the sweeper, a task that runs a few times per shortest timeout, looks only
at the oldest entries of each and stops at the first one still in time.
"""

from __future__ import annotations

import asyncio
from time import monotonic as time_now
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import Counter, Gauge

from maskgate.gateway.config import ClientsConfig
from maskgate.protocol.errors import ApiError, ServerError

_IDLE, _HEAD, _BUSY = range(3)
CLOSE_REASONS = ("header_timeout", "body_timeout", "idle_timeout", "shed_idle", "refused")


def _raw_answer(err: ApiError, reason: str) -> bytes:
    """A complete HTTP/1.1 error answer written straight to the socket, for connections
    closed outside any request handler."""
    body = err.to_bytes()
    head = (
        f"HTTP/1.1 {err.status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


_HEADER_TIMEOUT = _raw_answer(
    ApiError("request_timeout", "the request head did not arrive in time", status=408),
    "Request Timeout",
)
_FULL = _raw_answer(
    ServerError("too_many_connections", "the gateway has too many open connections", status=503),
    "Service Unavailable",
)


class ConnectionGuard:
    """The open client connections of one process, and the timers over them."""

    def __init__(self, cfg: ClientsConfig, gauge: Gauge, closed: Counter) -> None:
        self.cfg = cfg
        self.max_connections = cfg.max_connections  # serve.py may lower it to the fd limit
        self.open: set[GuardedHandler] = set()
        self.idle: dict[GuardedHandler, float] = {}  # -> monotonic time it became idle
        self.heads: dict[GuardedHandler, float] = {}  # -> monotonic time its head began
        self._closed = {reason: closed.labels(reason) for reason in CLOSE_REASONS}
        gauge.set_function(lambda: len(self.open))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the sweeper (once: the traffic and the metrics listener share the guard)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sweep())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def opened(self, conn: GuardedHandler) -> None:
        if len(self.open) >= self.max_connections:
            if self.idle:
                oldest = next(iter(self.idle))
                self.close(oldest, "shed_idle")
            else:
                self.close(conn, "refused", _FULL)
                return
        self.open.add(conn)
        self.idle[conn] = time_now()

    def lost(self, conn: GuardedHandler) -> None:
        self.open.discard(conn)
        self.idle.pop(conn, None)
        self.heads.pop(conn, None)

    def close(self, conn: GuardedHandler, reason: str, answer: bytes | None = None) -> None:
        self._closed[reason].inc()
        self.lost(conn)
        if answer is not None and conn.transport is not None:
            conn.transport.write(answer)
        conn.force_close()  # transport.close(): what was written is still flushed

    def body_timed_out(self, request: web.Request) -> None:
        """The proxy stopped waiting for a request body: its connection closes after the
        408 (the rest of the body would otherwise be read as the next request)."""
        self._closed["body_timeout"].inc()
        conn = request.protocol
        if isinstance(conn, GuardedHandler):
            conn.close_after = True

    async def _sweep(self) -> None:
        cfg = self.cfg
        tick = min(cfg.header_timeout_s, cfg.idle_timeout_s, 4.0) / 4
        while True:
            await asyncio.sleep(tick)
            now = time_now()
            for conns, limit, reason in (
                (self.heads, cfg.header_timeout_s, "header_timeout"),
                (self.idle, cfg.idle_timeout_s, "idle_timeout"),
            ):
                expired = []
                for conn, since in conns.items():  # oldest first
                    if now - since < limit:
                        break
                    expired.append(conn)
                for conn in expired:
                    self.close(conn, reason, _HEADER_TIMEOUT if conns is self.heads else None)


class GuardedHandler(RequestHandler):
    """aiohttp's connection handler, telling the guard when its state changes."""

    __slots__ = ("close_after", "guard", "state")

    def __init__(self, manager: GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.guard = manager.guard
        self.state = _IDLE
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.guard.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.guard.lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        guard = self.guard
        if self.state == _IDLE and data:
            if guard.idle.pop(self, None) is None:
                return  # closed by the guard: nothing more is read
            self.state = _HEAD
            guard.heads[self] = time_now()
        super().data_received(data)
        if self.state == _HEAD and self._messages:  # a whole head was parsed
            self.state = _BUSY
            guard.heads.pop(self, None)

    def log_access(
        self, request: web.BaseRequest, response: web.StreamResponse, time: float | None
    ) -> None:
        # aiohttp calls this once per request, right after the answer is written (the end of
        # `finish_response`): a plain call, where overriding that coroutine would add a
        # coroutine level to every request.
        super().log_access(request, response, time)
        if self.close_after:
            self.force_close()
        elif not self._messages and request.content.is_eof() and self.transport is not None:
            # Answered and nothing more to read: idle until the next request's first byte.
            # (An unread body is drained by aiohttp for up to its lingering time first; its
            # own keep-alive timer, see GuardedRunner, covers that connection.)
            self.state = _IDLE
            self.guard.idle[self] = time_now()


class GuardedServer(web.Server):
    """aiohttp's Server, making GuardedHandlers (`guard` is set by GuardedRunner)."""

    guard: ConnectionGuard

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self, loop=self._loop, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """An AppRunner whose connections are bounded by `guard`."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs: Any) -> None:
        # aiohttp's own keep-alive timer stays as a backstop for connections in no state
        # of ours (an unread body drained after its answer); later than ours, so that the
        # guard's closes are the ones counted.
        cfg = guard.cfg
        kwargs.setdefault("keepalive_timeout", cfg.idle_timeout_s + cfg.header_timeout_s + 1)
        super().__init__(app, **kwargs)
        self.guard = guard

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = GuardedServer  # the same object, making GuardedHandlers
        server.guard = self.guard  # type: ignore[attr-defined]
        return server

    async def setup(self) -> None:
        await super().setup()
        self.guard.start()

    async def cleanup(self) -> None:
        await self.guard.stop()
        await super().cleanup()
