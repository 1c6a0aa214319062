"""The proxy handler: classify, apply the policy, admit, forward with retries, relay.

General requests get the minimum: rule 1 on the three inference routes (their bodies are
parsed once, only to classify), then the original bytes go upstream. Mask requests are
checked (rules 2-10), rewritten with their resolved sampling parameters and sent only to the
mask pool.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import orjson
from aiohttp import web

from maskgate.gateway.auth import authenticate, check_mask_allowed
from maskgate.gateway.logs import log_access
from maskgate.gateway.pool import Endpoint, Pool
from maskgate.gateway.relay import HOP_BY_HOP, RequestCtx, record_status, relay
from maskgate.gateway.state import STATE, GatewayState
from maskgate.gateway.upstream import (
    ConnectError,
    DisconnectedError,
    MalformedError,
    UpstreamError,
)
from maskgate.protocol import policy
from maskgate.protocol.errors import ApiError, ServerError

_DROP_REQUEST = HOP_BY_HOP | {"host", "content-length", "expect"}

# (method, path) -> (route label, policy route). Anything else: ("other", None).
ROUTES: dict[tuple[str, str], tuple[str, policy.Route | None]] = {
    ("POST", "/v1/chat/completions"): ("chat", policy.Route.CHAT),
    ("POST", "/v1/completions"): ("completions", policy.Route.COMPLETIONS),
    ("POST", "/generate"): ("generate", policy.Route.GENERATE),
    ("GET", "/v1/models"): ("models", None),
}
_OTHER: tuple[str, policy.Route | None] = ("other", None)
HOT_PATHS = tuple(sorted({path for _, path in ROUTES}))  # routed by exact path (app.py)
_RETRY_STATUSES = frozenset({502, 503, 504})
_MAX_RID = 128


async def handle(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    state = request.app[STATE]
    rid = request.headers.get("X-Request-Id")
    if not rid or len(rid) > _MAX_RID or not rid.isprintable():
        rid = state.new_request_id()
    path = request.path
    if len(path) > 1 and path[-1] == "/":
        path = path.rstrip("/")  # "/generate/" is still /generate: its policy applies
    route_label, route = ROUTES.get((request.method, path), _OTHER)
    ctx = RequestCtx(rid, route_label, started)
    try:
        resp = await _proxy(request, state, ctx, route)
        ctx.status = resp.status
        return resp
    except ApiError as e:
        ctx.status = e.status
        e.headers["X-Request-Id"] = rid
        raise
    except asyncio.CancelledError:
        ctx.status = ctx.status or 499  # the client went away (nginx's convention)
        raise
    finally:
        elapsed = time.perf_counter() - started
        state.metrics.observe_request(
            route_label, ctx.pool, ctx.status, elapsed, max(0.0, elapsed - ctx.waited)
        )
        log_access(
            rid,
            request.method,
            request.path,
            route_label,
            ctx.pool,
            ctx.upstream,
            ctx.status,
            started,
            ctx.attempts,
        )


async def _proxy(
    request: web.Request,
    state: GatewayState,
    ctx: RequestCtx,
    route: policy.Route | None,
) -> web.StreamResponse:
    key = authenticate(request.headers, state.api_keys)
    raw = await _read_body(request, state)
    pool = state.pools["general"]
    mask = False
    if route is not None:
        body = policy.parse_body(raw, state.config.max_body_bytes)  # rule 1
        if policy.is_mask_request(route, body):
            mask = True
            pool = state.pools["mask"]
            ctx.pool = pool.name
            check_mask_allowed(key, state.mask_allow_keys)  # rule 2
            body = policy.check_mask_request(route, body, state.policy, vocab_size=pool.vocab_size)
            if route is policy.Route.GENERATE:
                _set_rid(body, ctx.rid)
            raw = orjson.dumps(body)
        elif route is policy.Route.GENERATE and "rid" not in body:
            _set_rid(body, ctx.rid)
            raw = orjson.dumps(body)
    ctx.pool = pool.name
    if not pool.has_usable():
        raise _unavailable(pool)
    queued = await pool.admission.acquire()  # rule 10
    ctx.waited += queued
    pool.queue_wait.observe(queued)
    try:
        return await _forward(request, state, ctx, pool, raw, mask)
    finally:
        pool.admission.release()


async def _read_body(request: web.Request, state: GatewayState) -> bytes:
    limit = state.config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(request.content_length, limit)
    content = request.content
    if content.is_eof():  # the whole body came with the head: the usual case
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as e:
            raise _too_large(None, limit) from e
    # Still arriving: each piece within `body_timeout_s` of the last (a stalled client
    # must not hold its connection, nor its admission slot, for ever).
    gap_s = state.config.clients.body_timeout_s
    pieces: list[bytes] = []
    size = 0
    while True:
        try:
            async with asyncio.timeout(gap_s):
                piece = await content.readany()
        except TimeoutError as e:
            if state.connections is not None:
                state.connections.body_timed_out(request)
            raise ApiError(
                "request_timeout",
                f"the request body stalled for {gap_s:g} s (body_timeout_s)",
                status=408,
            ) from e
        if not piece:
            return b"".join(pieces)
        size += len(piece)
        if size > limit:
            raise _too_large(None, limit)
        pieces.append(piece)


def _too_large(size: int | None, limit: int) -> ApiError:
    got = f"{size} bytes" if size is not None else "over the limit"
    return policy.PolicyError(
        "body_too_large", f"request body is {got}; the limit is {limit}", status=413
    )


def _set_rid(body: dict[str, Any], rid: str) -> None:
    """SGLang's `rid`: a string, or one per item of a batch. A client's own rid is kept."""
    if "rid" in body:
        return
    size = policy.batch_size(body)
    body["rid"] = rid if size is None else [f"{rid}-{i}" for i in range(size)]


def _unavailable(pool: Pool) -> ApiError:
    code = "mask_pool_unavailable" if pool.name == "mask" else "no_healthy_upstream"
    return ServerError(
        code,
        f"the {pool.name} pool has no healthy endpoint; retry later",
        status=503,
        headers={"Retry-After": "5"},
    )


def _upstream_headers(
    request: web.Request, state: GatewayState, rid: str, mask: bool
) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    drop_auth = state.config.upstream_api_key is not None or bool(state.api_keys)
    drop = _DROP_REQUEST
    listed = request.headers.get("Connection")
    if listed is not None and listed.lower() not in ("keep-alive", "close"):
        # Headers named in Connection are hop-by-hop too (RFC 9110 7.6.1).
        drop = drop | {t.strip().lower() for t in listed.split(",")}
    for name, value in request.headers.items():
        lname = name.lower()
        if lname in drop or (drop_auth and lname == "authorization"):
            continue
        if lname == "x-request-id" or (mask and lname == "accept-encoding"):
            continue  # set below / the mask check must read the body uncompressed
        headers.append((name, value))
    if state.config.upstream_api_key is not None:
        headers.append(("Authorization", f"Bearer {state.config.upstream_api_key}"))
    headers.append(("X-Request-Id", rid))
    return headers


async def _forward(
    request: web.Request,
    state: GatewayState,
    ctx: RequestCtx,
    pool: Pool,
    raw: bytes,
    mask: bool,
) -> web.StreamResponse:
    cfg = state.config
    headers = _upstream_headers(request, state, ctx.rid, mask)
    client = state.client()
    on_resend = state.metrics.stale_resend_hook(pool.name)
    tried: list[Endpoint] = []
    failure: ApiError | None = None
    for attempt in range(cfg.retries.max_attempts):
        ep = pool.pick(tried)
        if ep is None:
            break
        if attempt:
            state.metrics.retries.labels(pool.name).inc()
            delay = _backoff(attempt, cfg.retries.backoff_base_s, cfg.retries.backoff_max_s)
            ctx.waited += delay
            await asyncio.sleep(delay)
        tried.append(ep)
        ctx.attempts += 1
        ctx.upstream = ep.url
        probe = ep.circuit.acquire()
        ep.outstanding += 1
        t_sent = time.perf_counter()
        try:
            upstream = await client.request(
                ep.url,
                request.method,
                request.raw_path,
                headers,
                raw or None,
                timeout_s=cfg.timeouts.ttfb_s,
                on_resend=on_resend,
            )
        except BaseException as e:
            ep.outstanding -= 1
            ctx.waited += time.perf_counter() - t_sent
            failure = _connect_failure(state, pool, ep, e)
            if failure is None:
                raise
            if failure.code == "upstream_unreachable":
                continue  # retryable
            raise failure from e
        ctx.waited += time.perf_counter() - t_sent
        status = upstream.status
        retry_left = attempt + 1 < cfg.retries.max_attempts
        if status in _RETRY_STATUSES and retry_left and pool.pick(tried) is not None:
            record_status(state, pool, ep, status)
            upstream.release()
            ep.outstanding -= 1
            continue
        try:
            return await relay(request, state, ctx, pool, ep, upstream, mask)
        finally:
            ep.outstanding -= 1
            if probe:
                ep.circuit.release_probe()  # the client left before the probe was judged
    if failure is not None:
        raise failure
    raise _unavailable(pool)


def _backoff(attempt: int, base: float, cap: float) -> float:
    """Capped exponential backoff with equal jitter: in [d/2, d], d = min(cap, base*2^(n-1))."""
    delay = min(cap, base * (2 ** (attempt - 1)))
    return delay * (0.5 + random.random() / 2)


def _connect_failure(
    state: GatewayState, pool: Pool, ep: Endpoint, e: BaseException
) -> ApiError | None:
    """Map an exception raised before the response headers to an error; None: re-raise."""
    errors = state.metrics.upstream_errors
    if isinstance(e, ConnectError):
        errors.labels(pool.name, ep.url, "connect").inc()
        ep.circuit.record_failure()
        # Refused or unreachable: the process is gone, take it out now. A connect timeout
        # only counts towards the circuit: under overload every endpoint times out, and
        # ejecting each at once turned a slow pool into an empty one (soak, 9.5% errors).
        if not e.timed_out:
            _eject(pool, ep)
        return ServerError("upstream_unreachable", f"could not connect to {pool.name} upstream")
    if isinstance(e, DisconnectedError):
        # A new connection closed without an answer (a stale keep-alive connection is
        # already sent again inside the client, counted in maskgate_upstream_stale_resends):
        # a fault, retried on another endpoint.
        errors.labels(pool.name, ep.url, "disconnect").inc()
        ep.circuit.record_failure()
        return ServerError("upstream_unreachable", "the upstream closed the connection")
    if isinstance(e, TimeoutError):
        errors.labels(pool.name, ep.url, "timeout").inc()
        ep.circuit.record_failure()
        return ServerError(
            "upstream_timeout",
            f"the {pool.name} upstream sent no response within {state.config.timeouts.ttfb_s:g} s",
            status=504,
        )
    if isinstance(e, MalformedError):
        # Not a well-formed HTTP/1.1 answer (http1.py says what is refused); the connection
        # is already closed. Not retried: the upstream may have acted on the request.
        errors.labels(pool.name, ep.url, "protocol").inc()
        ep.circuit.record_failure()
        return ServerError(
            "upstream_protocol_error", f"the {pool.name} upstream sent a malformed answer: {e}"
        )
    if isinstance(e, UpstreamError):
        errors.labels(pool.name, ep.url, "protocol").inc()
        ep.circuit.record_failure()
        return ServerError("upstream_error", f"the {pool.name} upstream failed: {type(e).__name__}")
    ep.circuit.record_neutral()
    return None


def _eject(pool: Pool, ep: Endpoint) -> None:
    """Passive ejection: out of rotation until active health checks pass again."""
    if pool.cfg.health_path is None:
        return
    ep.healthy = False
    ep.health_oks = 0
