"""The two middlewares of several gateway processes (leader.py).

- On a follower: a control, registration or admin request goes to the leader's unix socket
  unchanged, and the leader's answer comes back unchanged.
- On the leader: after such a request that may change state (anything but a GET or HEAD
  that only reads), wait until every follower has applied the state it left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NamedTuple

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from maskgate.gateway.clients.access import PEER_HEADER, client_address
from maskgate.gateway.clients.bodyread import read_body
from maskgate.gateway.rl.holds import PoolControl
from maskgate.gateway.state import STATE
from maskgate.protocol.errors import ServerError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CONNECT_S = 5.0
_HOP = frozenset(
    h.lower()
    for h in (
        "Host",
        "Connection",
        "Keep-Alive",
        "Transfer-Encoding",
        "Content-Length",
        "TE",
        "Trailer",
        "Upgrade",
        "Proxy-Authorization",
        "Proxy-Connection",
    )
)
_DROP = _HOP | {PEER_HEADER.lower()}


class LeaderPaths(NamedTuple):
    """The route table's rows forwarded to the control leader (routes.leader_paths)."""

    exact: frozenset[str]
    prefixes: tuple[str, ...]
    changing_gets: tuple[str, ...]  # paths whose GET changes state too


def leader_path(paths: LeaderPaths, path: str) -> bool:
    """Whether the leader answers `path` for every process (the route table's
    `forwarded_to_leader` rows)."""
    return path in paths.exact or path.startswith(paths.prefixes)


def add_forwarding(app: web.Application, socket: str, timeout_s: float, paths: LeaderPaths) -> None:
    """Forward leader paths to the leader app listening on the unix socket `socket`, with
    the caller's address in `PEER_HEADER` (the leader checks access, access.py).

    `timeout_s` is one control call's bound; a weight sync makes several in a row (pause,
    flush, update, version, continue), so the forwarded request may take a few times it."""
    key = web.AppKey("maskgate_leader_session", aiohttp.ClientSession)
    timeout = aiohttp.ClientTimeout(total=6 * timeout_s + 60.0, sock_connect=_CONNECT_S)

    async def session(app: web.Application) -> AsyncIterator[None]:
        app[key] = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket),
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )
        yield
        await app[key].close()

    @web.middleware
    async def forward(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not leader_path(paths, request.path):
            return await handler(request)
        body = await read_body(request)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP]
        peer = client_address(request, request.app[STATE].trusted_proxies)
        headers.append((PEER_HEADER, peer))
        try:
            async with request.app[key].request(
                request.method,
                "http://leader" + request.raw_path,
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
            ) as resp:
                data = await resp.read()
                out = [(k, v) for k, v in resp.headers.items() if k.lower() not in _HOP]
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ServerError(
                "control_leader_unavailable",
                "the gateway process that runs control calls did not answer "
                f"({type(e).__name__}); retry shortly",
                status=503,
                headers={"Retry-After": "2"},
            ) from e
        relayed = CIMultiDict((k, v) for k, v in out if k.lower() not in ("date", "server"))
        return web.Response(status=resp.status, body=data, headers=relayed)

    app.cleanup_ctx.append(session)
    app.middlewares.append(forward)


def add_barrier(app: web.Application, ctl: PoolControl, paths: LeaderPaths) -> None:
    @web.middleware
    async def barrier(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        reading = request.method in ("GET", "HEAD") and path not in paths.changing_gets
        if reading or not leader_path(paths, path):
            return await handler(request)
        try:
            return await handler(request)
        finally:
            await ctl.shared()

    app.middlewares.append(barrier)
