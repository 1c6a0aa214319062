"""The proxy handler: classify, apply the policy, admit, forward with retries, relay.

Each proxied row of the route table (routes.py) has its own handler (`proxied`). General
requests get the minimum: rule 1 on the routes that carry sampling parameters (their bodies are
parsed once, only to classify), then the original bytes go upstream, never rewritten (the
request id travels in `X-Request-Id`). Mask requests are checked (rules 2-10), rewritten with
their resolved sampling parameters (and, on `/generate`, one `rid` string when the client
sent none: a bounded addition whatever the batch size) and sent only to the mask pool.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from maskgate.gateway.clients.access import API_KEY
from maskgate.gateway.clients.bodyread import read_body
from maskgate.gateway.observability.logs import log_access
from maskgate.gateway.pools import versions
from maskgate.gateway.pools.pool import Endpoint, Pool
from maskgate.gateway.proxy.bodycheck import BodyJob
from maskgate.gateway.proxy.encoding import codings, decode_body
from maskgate.gateway.proxy.headers import upstream_headers
from maskgate.gateway.proxy.relay import RequestCtx, record_status, relay
from maskgate.gateway.state import STATE, GatewayState
from maskgate.gateway.upstream import outbound
from maskgate.gateway.upstream.client import (
    ConnectError,
    DisconnectedError,
    MalformedError,
    UpstreamError,
)
from maskgate.protocol import policy
from maskgate.protocol.errors import ApiError, ServerError, VersionUnavailable

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_RETRY_STATUSES = frozenset({502, 503, 504})
_MAX_RID = 128


def proxied(label: str, route: policy.Route | None, path: str) -> Handler:
    """The handler of one proxied row of the route table (routes.py): `label` names it in
    metrics and logs, `route` is its mask-policy route (None: no sampling, no policy), and
    `path` is what goes upstream, whatever spelling of it the client's router matched. The
    client's query goes along percent-encoded again (outbound.py), never as sent."""

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        state = request.app[STATE]
        rid = request.headers.get("X-Request-Id")
        if not rid or len(rid) > _MAX_RID or not rid.isprintable():
            rid = state.new_request_id()
        ctx = RequestCtx(rid, label, started)
        try:
            target = path
            if "?" in request.raw_path:
                target = outbound.target(path, request.query.items())
            resp = await _proxy(request, state, ctx, route, target)
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
                label, ctx.pool, ctx.status, elapsed, max(0.0, elapsed - ctx.waited)
            )
            log_access(
                rid,
                request.method,
                request.path,
                label,
                ctx.pool,
                ctx.upstream,
                ctx.status,
                started,
                ctx.attempts,
            )

    return handle


async def _proxy(
    request: web.Request,
    state: GatewayState,
    ctx: RequestCtx,
    route: policy.Route | None,
    target: str,
) -> web.StreamResponse:
    key = request[API_KEY]  # set by the client row's access check (access.py)
    limit = state.config.max_body_bytes
    raw = await read_body(request)
    pool = state.pools["general"]
    mask = False
    decoded = False
    min_version = _min_version(request.headers.get("X-Min-Weight-Version"))
    if route is not None:
        if "Content-Encoding" in request.headers:
            applied = codings(request.headers.getall("Content-Encoding"))
            raw = decode_body(raw, applied, limit) if applied else raw
            decoded = True  # the body goes upstream plain, without the header
        masks = state.pools["mask"]
        job = BodyJob(
            route,
            limit,
            state.policy,
            masks.vocab_size,
            ctx.rid,
            key,
            state.mask_allow_keys,
            masks.cfg.engine,
            masks.cfg.sampling_mask_max_tokens,
        )
        assert state.checker is not None
        checked = await state.checker.check(job, raw)  # rule 1, then rules 2-9 for masks
        if checked.min_version is not None:  # the body's field wins over the header
            min_version = _min_version(checked.min_version)
        if checked.mask:
            mask = True
            ctx.packed = checked.packed
            pool = masks
            ctx.pool = pool.name
            if checked.error is not None:
                raise checked.error
        raw = checked.raw
    ctx.pool = pool.name
    if not pool.has_usable():
        raise _unavailable(pool)
    queued = await pool.admission.acquire()  # rule 10
    ctx.waited += queued
    pool.queue_wait.observe(queued)
    try:
        # Judged once admitted: a request held behind a weight sync sees the new versions.
        if min_version is not None and not pool.has_usable(min_version):
            raise VersionUnavailable(min_version, pool.name)
        headers = upstream_headers(request, state, ctx.rid, mask=mask, decoded=decoded)
        return await _forward(request, state, ctx, pool, raw, mask, target, headers, min_version)
    finally:
        pool.admission.release()


def _min_version(value: object) -> str | None:
    """`min_weight_version` (body field or X-Min-Weight-Version header), as a version string."""
    if value is None:
        return None
    version = versions.normalize(value)
    if version is None:
        raise policy.PolicyError(
            "invalid_min_weight_version",
            "min_weight_version must be a weight version string (or a non-negative integer)",
            param="min_weight_version",
        )
    return version


def _unavailable(pool: Pool) -> ApiError:
    code = "mask_pool_unavailable" if pool.name == "mask" else "no_healthy_upstream"
    return ServerError(
        code,
        f"the {pool.name} pool has no healthy endpoint; retry later",
        status=503,
        headers={"Retry-After": "5"},
    )


async def _forward(
    request: web.Request,
    state: GatewayState,
    ctx: RequestCtx,
    pool: Pool,
    raw: bytes,
    mask: bool,
    target: str,
    headers: list[tuple[str, str]],
    min_version: str | None = None,
) -> web.StreamResponse:
    cfg = state.config
    client = state.client()
    on_resend = state.metrics.stale_resend_hook(pool.name)
    tried: list[Endpoint] = []
    failure: ApiError | None = None
    for attempt in range(cfg.retries.max_attempts):
        ep = pool.pick(tried, min_version)
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
                target,
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
        if status in _RETRY_STATUSES and retry_left and pool.pick(tried, min_version) is not None:
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
