"""`create_app(config)`: the one way a gateway is built, by the CLI and by every test.

Long-lived resources (the upstream connection pools, health checks, DNS discovery) live in
`app.cleanup_ctx`, so they start and stop with the app; shared state sits under typed
`web.AppKey`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from hmac import compare_digest
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from maskgate.gateway import discovery, health, leader, proxy
from maskgate.gateway.admin import add_admin_refusal, add_admin_routes
from maskgate.gateway.auth import authenticate, bearer_token
from maskgate.gateway.bodycheck import BodyChecker
from maskgate.gateway.config import POOL_NAMES, GatewayConfig
from maskgate.gateway.connections import ConnectionGuard
from maskgate.gateway.control import CONTROL, add_control_routes
from maskgate.gateway.forward import add_barrier, add_forwarding
from maskgate.gateway.leader import Cluster, Leader
from maskgate.gateway.metrics import GatewayMetrics
from maskgate.gateway.openapi import openapi_spec
from maskgate.gateway.pool import Pool
from maskgate.gateway.registration import add_load_routes, add_registration_routes
from maskgate.gateway.state import STATE, GatewayState, Resolver
from maskgate.gateway.upstream import UpstreamClient, UpstreamError
from maskgate.protocol.errors import ApiError, ServerError
from maskgate.protocol.responses import error_response

LOG = logging.getLogger("maskgate")
_FIRST_LOOKUP_S = 5.0  # the first DNS lookup may hold the start this long, no longer
CLUSTER = web.AppKey("maskgate_cluster", Cluster)
LEADER = web.AppKey("maskgate_leader", Leader)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# what aiohttp stores as a route's handler: an `async def`, not any awaitable-returning callable
RouteHandler = Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]


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


def with_errors(handler: Handler) -> RouteHandler:
    """`handler` with its exceptions answered by the one renderer."""

    async def answered(request: web.Request) -> web.StreamResponse:
        try:
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
    """For apps whose router can answer by itself (404, 405: the probe and admin apps) and
    for a main app that has middlewares already (several processes, see create_app)."""
    return await with_errors(handler)(request)


def _answer_errors_per_route(app: web.Application) -> None:
    """Every route's handler wrapped in `with_errors`, instead of a middleware: any
    middleware makes aiohttp add two coroutine levels to every request (its own
    `_fix_request_current_app` and ours), about 6 % of the gateway's throughput. The main
    app needs no middleware for router answers: its catch-all route takes every path and
    method, so its router never answers 404 or 405 by itself."""
    for route in app.router.routes():
        route._handler = with_errors(route.handler)  # aiohttp has no setter for it


async def healthz(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.ready:
        return web.Response(body=b'{"status":"ready"}', content_type="application/json")
    status = "draining" if state.draining else "starting"
    return web.Response(
        status=503, body=orjson.dumps({"status": status}), content_type="application/json"
    )


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def keyed_metrics_handler(request: web.Request) -> web.Response:
    """/metrics on the traffic port: it lists upstream URLs, so with `api_keys` set it takes a
    client key (or the admin key) like any other request there."""
    state = request.app[STATE]
    admin_key = state.config.admin_key
    token = bearer_token(request.headers)
    if admin_key is None or token is None or not compare_digest(token, admin_key):
        authenticate(request.headers, state.api_keys)
    return await metrics_handler(request)


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
    tasks = [asyncio.create_task(health.health_loop(state), name="maskgate-health")]
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
        trusted_proxies=tuple(
            ipaddress.ip_network(n, strict=False) for n in config.trusted_proxies
        ),
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
    add_probe_routes(app, with_metrics=config.metrics_port is None, keyed=True)
    if config.admin_key is not None:
        add_admin_routes(app)
    add_admin_refusal(app, enabled=config.admin_key is not None)
    add_control_routes(app)
    if cluster is not None:
        app[CLUSTER] = cluster
        lead = leader.install(app, app[CONTROL], cluster)
        if lead is not None:
            app[LEADER] = lead
    add_registration_routes(app, enabled=config.admin_key is not None)
    add_load_routes(app)
    add_openapi_route(app)
    # The inference routes by exact path first: a plain resource is found by one dict lookup,
    # the catch-all below by a regex match (~4% of the gateway's CPU samples under load).
    for path in proxy.HOT_PATHS:
        app.router.add_route("*", path, proxy.handle)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    _answer_errors_per_route(app)
    if app.middlewares:
        # Several processes (leader.py): the barrier or forwarding middleware runs outside
        # the routes' wrappers, and the forwarding one raises errors of its own (503
        # control_leader_unavailable, 413 while reading the body): the error middleware goes
        # outermost. A single process keeps no middleware at all.
        app.middlewares.insert(0, error_middleware)
    return app


def add_probe_routes(app: web.Application, *, with_metrics: bool, keyed: bool = False) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if with_metrics:
        app.router.add_get("/metrics", keyed_metrics_handler if keyed else metrics_handler)


def add_openapi_route(app: web.Application) -> None:
    """`GET /openapi.json`: the gateway's own API description, serialised once per app."""
    body = orjson.dumps(openapi_spec())

    async def openapi_json(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app.router.add_get("/openapi.json", openapi_json)


def create_probe_app(main: web.Application) -> web.Application:
    """The app for `metrics_port`: probes and /metrics over the main app's state."""
    app = web.Application(middlewares=[error_middleware])
    app[STATE] = main[STATE]
    add_probe_routes(app, with_metrics=True)
    return app


def create_admin_app(main: web.Application) -> web.Application:
    """The app for `admin_port` (a loopback-only listener): the admin API over the main app's
    state; it takes the admin key only when one is set."""
    app = web.Application(middlewares=[error_middleware])
    app[STATE] = main[STATE]
    cluster = main.get(CLUSTER)
    if cluster is not None and cluster.is_leader:
        add_barrier(app, main[CONTROL])
    elif cluster is not None:
        add_forwarding(app, cluster.socket("admin.sock"), main[STATE].config.control.timeout_s)
    add_admin_routes(app)
    add_registration_routes(app, enabled=True)
    add_admin_refusal(app, enabled=True)
    return app
