"""Sending an upstream's answer to the client: whole, or chunk by chunk for streams.

Also the per-request bookkeeping both the proxy and the relay write into, and the rule that
turns an upstream status into a circuit-breaker verdict.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from multidict import CIMultiDict

from maskgate.gateway.pools.pool import Endpoint, Pool
from maskgate.gateway.proxy.maskcheck import finish_mask_response
from maskgate.gateway.proxy.sglang_answers import StreamRewriter, error_from_body
from maskgate.gateway.state import GatewayState
from maskgate.gateway.upstream.client import (
    MalformedError,
    Response,
    UpstreamError,
    read_whole,
)
from maskgate.protocol.errors import ServerError, error_event

# RFC 9110 7.6.1: meaningful for one connection only, never forwarded either way.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# aiohttp sets these itself on the answer to the client.
_DROP_RESPONSE = HOP_BY_HOP | {"content-length", "date", "server"}


class RequestCtx:
    """Per-request bookkeeping for metrics and the access log."""

    __slots__ = (
        "attempts",
        "packed",
        "pool",
        "rid",
        "route_label",
        "started",
        "status",
        "upstream",
        "waited",
    )

    def __init__(self, rid: str, route_label: str, started: float) -> None:
        self.rid = rid
        self.route_label = route_label
        self.started = started  # time.perf_counter() when the request arrived
        self.pool = "none"  # label until the request is routed
        self.upstream: str | None = None
        self.status = 0
        self.waited = 0.0  # seconds spent queued or waiting on upstreams
        self.attempts = 0
        self.packed: tuple[bool, ...] = (False,)  # mask answers: the format each asked for


def response_headers(upstream: Response, rid: str) -> CIMultiDict[str]:
    drop = _DROP_RESPONSE
    listed = [v for n, v in upstream.headers if n.lower() == "connection"]
    if listed:  # headers named in any Connection header are hop-by-hop too (RFC 9110 7.6.1)
        drop = drop | {t.strip().lower() for v in listed for t in v.split(",")}
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.headers:
        if name.lower() not in drop:
            headers.add(name, value)
    headers["X-Request-Id"] = rid
    return headers


def record_status(state: GatewayState, pool: Pool, ep: Endpoint, status: int) -> None:
    if status >= 500 and status != 503:
        state.metrics.upstream_errors.labels(pool.name, ep.url, "status_5xx").inc()
        ep.circuit.record_failure()
    elif status in (429, 503):
        ep.circuit.record_neutral()
    else:
        ep.circuit.record_success()


async def relay(
    request: web.Request,
    state: GatewayState,
    ctx: RequestCtx,
    pool: Pool,
    ep: Endpoint,
    upstream: Response,
    mask: bool,
) -> web.StreamResponse:
    """Send the upstream's answer to the client. Closing `upstream` early (client gone,
    cancellation, failure) drops the connection, which is how the upstream learns to abort."""
    done = False
    try:
        ctx.status = upstream.status
        if upstream.streamed or upstream.content_type == "text/event-stream":
            sglang = mask and pool.cfg.engine == "sglang"
            rewriter = StreamRewriter(pool.name, ctx.packed) if sglang else None
            out = await _relay_stream(request, state, ctx, pool, ep, upstream, rewriter)
            done = True
            return out
        t0 = time.perf_counter()
        try:
            body = await read_whole(
                upstream, state.config.timeouts.idle_s, state.config.max_upstream_answer_bytes
            )
        except (UpstreamError, TimeoutError) as e:
            state.metrics.upstream_errors.labels(pool.name, ep.url, "body").inc()
            ep.circuit.record_failure()
            if isinstance(e, MalformedError):
                raise ServerError(
                    "upstream_protocol_error",
                    f"the {pool.name} upstream sent a malformed answer: {e}",
                ) from e
            raise ServerError(
                "upstream_error", f"the {pool.name} upstream failed mid-answer: {type(e).__name__}"
            ) from e
        ctx.waited += time.perf_counter() - t0
        record_status(state, pool, ep, upstream.status)
        done = True
        if mask and upstream.header("Content-Encoding") is None:
            body = _mask_answer(ctx, pool, state, upstream.status, body)
        return web.Response(
            status=upstream.status, body=body, headers=response_headers(upstream, ctx.rid)
        )
    finally:
        if done:
            upstream.release()
        else:
            upstream.close()


def _mask_answer(
    ctx: RequestCtx, pool: Pool, state: GatewayState, status: int, body: bytes
) -> bytes:
    """A whole mask answer, checked and in the format asked (maskcheck.py); an SGLang pool's
    error body raised as the gateway's error (sglang_answers.py)."""
    if status == 200:
        return finish_mask_response(
            ctx.route_label, body, pool.name, state.metrics, ctx.packed, pool.vocab_size
        )
    if status >= 400 and pool.cfg.engine == "sglang":
        err = error_from_body(body, status, pool.name)
        if err is not None:
            raise err
    return body


async def _relay_stream(
    request: web.Request,
    state: GatewayState,
    ctx: RequestCtx,
    pool: Pool,
    ep: Endpoint,
    upstream: Response,
    rewriter: StreamRewriter | None = None,
) -> web.StreamResponse:
    """Relay chunk by chunk. A write waits while the client's buffer is full, and no read
    happens meanwhile, so a slow client slows the upstream down (backpressure). A `rewriter`
    (an SGLang mask pool's stream) rewrites whole events on the way."""
    out = web.StreamResponse(status=upstream.status, headers=response_headers(upstream, ctx.rid))
    await out.prepare(request)
    timeouts = state.config.timeouts
    first = True
    at_boundary = True  # the client has whole SSE frames only (nothing or "...\n\n" last)
    while True:
        t_wait = time.perf_counter()
        try:
            # The first chunk may take the time to first byte; later ones the idle timeout.
            async with asyncio.timeout(timeouts.ttfb_s if first else timeouts.idle_s):
                data = await upstream.readchunk()
        except (UpstreamError, TimeoutError) as e:
            upstream.close()
            await _end_stream_with_error(state, pool, ep, out, e, at_boundary)
            return out
        now = time.perf_counter()
        ctx.waited += now - t_wait
        if not data:
            if rewriter is not None:
                await out.write(rewriter.flush())
            break
        if rewriter is not None:
            data = rewriter.feed(data)
            if not data:
                continue
        if first:
            state.metrics.stream_ttfb.labels(ctx.route_label, pool.name).observe(now - ctx.started)
            first = False
        await out.write(data)  # ConnectionResetError when the client is gone
        at_boundary = data.endswith((b"\n\n", b"\r\n\r\n"))
        ctx.waited += time.perf_counter() - now  # waiting on the client is not overhead
    record_status(state, pool, ep, upstream.status)
    await out.write_eof()
    return out


async def _end_stream_with_error(
    state: GatewayState,
    pool: Pool,
    ep: Endpoint,
    out: web.StreamResponse,
    e: BaseException,
    at_boundary: bool,
) -> None:
    kind = "timeout" if isinstance(e, TimeoutError) else "stream"
    state.metrics.upstream_errors.labels(pool.name, ep.url, kind).inc()
    state.metrics.stream_errors.labels(pool.name).inc()
    ep.circuit.record_failure()
    err = ServerError(
        "upstream_stream_error",
        f"the {pool.name} upstream failed mid-stream ({type(e).__name__}); "
        "the answer is incomplete",
    )
    # After a partial frame, end it first: the error must arrive as an event of its own.
    await out.write(error_event(err) if at_boundary else b"\n\n" + error_event(err))
    await out.write_eof()
