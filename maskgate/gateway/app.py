"""`create_app(config)`: the one way a gateway is built, by the CLI and by every test.

Long-lived resources (the upstream connection pools, health checks, DNS discovery) live in
`app.cleanup_ctx`, so they start and stop with the app; shared state sits under typed
`web.AppKey`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import orjson
from aiohttp import web

from maskgate.gateway.api import probes
from maskgate.gateway.api.probes import OPENAPI_BODY
from maskgate.gateway.clients.access import CHECKS, networks
from maskgate.gateway.clients.connections import ConnectionGuard
from maskgate.gateway.cluster import leader
from maskgate.gateway.cluster.leader import Cluster, Leader
from maskgate.gateway.cluster.leader_middleware import add_barrier, add_forwarding
from maskgate.gateway.config import POOL_NAMES, GatewayConfig
from maskgate.gateway.observability.metrics import GatewayMetrics
from maskgate.gateway.openapi import openapi_spec
from maskgate.gateway.pools import discovery, health
from maskgate.gateway.pools.pool import Pool
from maskgate.gateway.proxy.bodycheck import BodyChecker
from maskgate.gateway.rl import weight_sync
from maskgate.gateway.rl.control import CONTROL, install_control
from maskgate.gateway.routes import Row, admin_table, leader_paths, main_table, probe_table
from maskgate.gateway.state import STATE, GatewayState, Resolver
from maskgate.gateway.upstream.client import UpstreamClient, UpstreamError
from maskgate.protocol.errors import ApiError, ServerError
from maskgate.protocol.responses import error_response

LOG = logging.getLogger("maskgate")
_FIRST_LOOKUP_S = 5.0  # the first DNS lookup may hold the start this long, no longer
CLUSTER = web.AppKey("maskgate_cluster", Cluster)
LEADER = web.AppKey("maskgate_leader", Leader)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# what aiohttp stores as a route's handler: an `async def`, not any awaitable-returning callable
RouteHandler = Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]
Check = Callable[[web.Request], None]


def _error_answer(request: web.Request, e: Exception) -> web.Response | None:
    """The answer for an exception out of a handler; None: re-raise it (the client is gone,
    or an HTTPException that is not an error)."""
    if isinstance(e, ConnectionResetError):
        return None  # the client is gone (aiohttp's ClientConnectionResetError is both kinds)
    if isinstance(e, ApiError):
        request.app[STATE].metrics.rejections.labels(e.code).inc()
        return error_response(e)
    if isinstance(e, web.HTTPException):
        if e.status < 400:
            return None
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
        return error_response(ApiError(code, e.reason, status=e.status))
    if isinstance(e, UpstreamError):  # an upstream failure nobody mapped more precisely
        request.app[STATE].metrics.rejections.labels("upstream_error").inc()
        return error_response(ServerError("upstream_error", f"upstream failed: {type(e).__name__}"))
    LOG.exception("unhandled error", extra={"path": request.path})
    return error_response(
        ServerError("internal_error", "the gateway failed on this request", status=500)
    )


def with_errors(handler: Handler, check: Check | None = None) -> RouteHandler:
    """`handler` behind its access check (access.py), its exceptions answered by the one
    renderer: a row's one wrapper, so a request pays one coroutine level for both."""

    async def answered(request: web.Request) -> web.StreamResponse:
        try:
            if check is not None:
                check(request)
            return await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            answer = _error_answer(request, e)
            if answer is None:
                raise
            return answer

    return answered


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """For a main app that has middlewares already (several processes, see create_app): the
    forwarding middleware raises errors of its own."""
    return await with_errors(handler)(request)


def add_rows(app: web.Application, rows: tuple[Row, ...]) -> None:
    """Register exactly `rows`, each behind its access group's check, instead of a
    middleware: any middleware makes aiohttp add two coroutine levels to every request (its
    own `_fix_request_current_app` and ours), about 6 % of the gateway's throughput. Every
    path answers the methods it does not take with 405, and a last route answers every
    undeclared path with 404, so aiohttp's router never answers by itself."""
    by_path: dict[str, list[Row]] = {}
    for row in rows:
        by_path.setdefault(row.path, []).append(row)
    for path, group in by_path.items():  # one resource per path: its routes added together
        methods: list[str] = []
        for row in group:
            wrapped = with_errors(row.handler, CHECKS[row.access])
            for method in row.methods:
                app.router.add_route(method, path, wrapped)
                methods.append(method)
        app.router.add_route("*", path, with_errors(_not_allowed(path, tuple(methods))))
    app.router.add_route("*", "/{tail:.*}", with_errors(probes.not_found))


def _not_allowed(path: str, methods: tuple[str, ...]) -> Handler:
    async def refuse(request: web.Request) -> web.StreamResponse:
        raise probes.method_not_allowed(path, methods)

    return refuse


async def _upstream_client(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    state.upstream = UpstreamClient(state.config.timeouts.connect_s)
    yield
    await state.upstream.close()
    if state.checker is not None:
        state.checker.close()


async def _background(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    resolver: Resolver = state.resolver or discovery.resolve_addresses
    dns_pools = [p for p in state.pools.values() if p.cfg.dns is not None]
    for pool in dns_pools:
        try:
            await asyncio.wait_for(discovery.refresh(pool, resolver), _FIRST_LOOKUP_S)
        except TimeoutError:
            LOG.warning("first lookup of %s timed out", pool.cfg.dns, extra={"pool": pool.name})
    tasks = [
        asyncio.create_task(
            health.health_loop(state, weight_sync.poll_version), name="maskgate-health"
        )
    ]
    tasks += [
        asyncio.create_task(discovery.discovery_loop(p, resolver), name=f"maskgate-dns-{p.name}")
        for p in dns_pools
    ]
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def create_app(
    config: GatewayConfig, *, resolver: Resolver | None = None, cluster: Cluster | None = None
) -> web.Application:
    """Build the gateway. `resolver` replaces DNS lookups (tests inject changing records);
    `cluster`: this process's place among the supervisor's (leader.py), None when alone."""
    metrics = GatewayMetrics()
    trained = config.control.trained_pool
    pools = {
        name: Pool(name, getattr(config.pools, name), metrics, trained=name == trained)
        for name in POOL_NAMES
    }
    state = GatewayState(
        config=config,
        policy=config.policy.to_policy(),
        metrics=metrics,
        pools=pools,
        resolver=resolver,
        api_keys=frozenset(config.api_keys),
        mask_allow_keys=(
            frozenset(config.mask_allow_keys) if config.mask_allow_keys is not None else None
        ),
        trusted_proxies=networks(config.trusted_proxies),
        trusted_networks=networks(config.trusted_networks),
        insecure_control=config.insecure_control,
    )
    state.checker = BodyChecker(config.offload, on_offload=metrics.policy_offloads.inc)
    metrics.ready.set_function(lambda: 1.0 if state.ready else 0.0)
    state.connections = ConnectionGuard(
        config.clients, metrics.client_connections, metrics.client_connections_closed
    )
    # The body limit is enforced by the proxy itself (413 body_too_large); aiohttp's own
    # check only has to stop anything larger from being buffered.
    # Request bodies arrive as sent: the proxy decodes Content-Encoding itself, bounded by the
    # body limit (encoding.py); aiohttp's decompression has no such bound.
    app = web.Application(
        client_max_size=config.max_body_bytes, handler_args={"auto_decompress": False}
    )
    app[STATE] = state
    app.cleanup_ctx.append(_upstream_client)
    app.cleanup_ctx.append(_background)
    install_control(app)
    rows = main_table(config)
    app[OPENAPI_BODY] = orjson.dumps(openapi_spec(rows))
    if cluster is not None:
        app[CLUSTER] = cluster
        lead = leader.install(app, app[CONTROL], cluster, leader_paths(rows))
        if lead is not None:
            app[LEADER] = lead
    add_rows(app, rows)
    if app.middlewares:
        # Several processes (leader.py): the barrier or forwarding middleware runs outside
        # the routes' wrappers, and the forwarding one raises errors of its own (503
        # control_leader_unavailable, 413 while reading the body): the error middleware goes
        # outermost. A single process keeps no middleware at all.
        app.middlewares.insert(0, error_middleware)
    _log_control(config)
    return app


def _log_control(config: GatewayConfig) -> None:
    """Say at start who can reach the control plane, loudly when anyone can."""
    if config.insecure_control and config.control_enabled():
        LOG.warning(
            "INSECURE: insecure_control is on: anyone who reaches port %d may update the "
            "workers' weights, pause them and register workers, with no key",
            config.port,
        )
    elif not config.control_enabled() and config.control.enabled is None:
        LOG.warning(
            "the control plane (RL control, registration) is off: the gateway listens on %s "
            "with no admin_key and no trusted_networks beyond loopback; set admin_key or "
            "trusted_networks to serve it",
            config.host,
        )


def create_probe_app(main: web.Application) -> web.Application:
    """The app for `metrics_port`: probes and /metrics over the main app's state."""
    app = web.Application()
    app[STATE] = main[STATE]
    add_rows(app, probe_table())
    return app


def create_admin_app(main: web.Application) -> web.Application:
    """The app for `admin_port` (a loopback-only listener): the admin API and registration
    over the main app's state; the admin rows take the admin key only when one is set."""
    app = web.Application()
    app[STATE] = main[STATE]
    rows = admin_table()
    cluster = main.get(CLUSTER)
    if cluster is not None and cluster.is_leader:
        add_barrier(app, main[CONTROL], leader_paths(rows))
    elif cluster is not None:
        timeout_s = main[STATE].config.control.timeout_s
        add_forwarding(app, cluster.socket("admin.sock"), timeout_s, leader_paths(rows))
    add_rows(app, rows)
    if app.middlewares:
        app.middlewares.insert(0, error_middleware)
    return app
