"""Client connection bounds on a real listener (serve.py's GuardedRunner, port 0): header,
body and idle timeouts, and the connection cap that sheds the longest-idle connection first.
Timeouts are a fraction of a second so each test takes about one."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import orjson
from aiohttp import web
from fakes.serve import serve_app

from maskgate.gateway import GatewayConfig, create_app
from maskgate.gateway.clients.connections import GuardedRunner
from maskgate.gateway.state import STATE
from maskgate.protocol.settings import load_settings

GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@contextlib.asynccontextmanager
async def gateway(
    upstream: str | None = None, **clients: float
) -> AsyncIterator[tuple[int, web.Application]]:
    defaults = {"header_timeout_s": 0.4, "body_timeout_s": 0.4, "idle_timeout_s": 0.6}
    pools = {"general": {"endpoints": [upstream] if upstream else [], "health_path": None}}
    config = load_settings(
        GatewayConfig,
        overrides={
            "access_log": False,
            "port": 0,
            "clients": defaults | clients,
            "pools": pools,
        },
    )
    app = create_app(config)
    runner = GuardedRunner(app, app[STATE].connections, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], app
    finally:
        await runner.cleanup()


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 answer with a Content-Length: (status, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return status, await asyncio.wait_for(reader.readexactly(length), 3)


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything until the gateway closes the connection, which must happen in time. (A
    client still writing may see a reset instead of the answer: its unread bytes make the
    kernel reset the connection.)"""
    try:
        return await asyncio.wait_for(reader.read(), seconds)
    except ConnectionResetError:
        return b"<reset>"


def closes(app: web.Application, reason: str) -> float:
    metric = app[STATE].metrics.client_connections_closed.labels(reason)
    return metric._value.get()


async def test_slowloris_header_trickle_gets_408_then_closed():
    async with gateway() as (port, app):
        reader, writer = await connect(port)
        t0 = time.monotonic()
        trickle = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100

        async def drip() -> None:
            for byte in trickle:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)

        dripping = asyncio.create_task(drip())
        rest = await closed_within(reader, 3)
        dripping.cancel()
        assert rest == b"<reset>" or rest.startswith(b"HTTP/1.1 408 ")
        assert 0.3 < time.monotonic() - t0 < 1.5
        assert closes(app, "header_timeout") == 1


async def test_silence_after_the_request_line_is_a_header_timeout():
    async with gateway() as (port, app):
        reader, writer = await connect(port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\n")
        rest = await closed_within(reader, 2)
        assert rest.startswith(b"HTTP/1.1 408 ")
        assert closes(app, "header_timeout") == 1


async def test_stalled_body_gets_408_then_closed():
    async with gateway() as (port, app):
        reader, writer = await connect(port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        status, body = await answer(reader)
        assert status == 408
        assert orjson.loads(body)["error"]["code"] == "request_timeout"
        assert await closed_within(reader, 2) == b""
        assert closes(app, "body_timeout") == 1


async def test_idle_keep_alive_connections_are_closed():
    async with gateway() as (port, app):
        reader, writer = await connect(port)
        writer.write(GET)
        assert (await answer(reader))[0] == 200
        t0 = time.monotonic()
        assert await closed_within(reader, 3) == b""  # closed silently between requests
        assert 0.4 < time.monotonic() - t0 < 2
        silent, _ = await connect(port)  # never sends a byte: idle from the start
        assert await closed_within(silent, 3) == b""
        assert closes(app, "idle_timeout") == 2


async def test_the_cap_sheds_the_longest_idle_connection_and_serves_the_new_one():
    async with gateway(max_connections=3, idle_timeout_s=30) as (port, app):
        conns = []
        for _ in range(3):
            conns.append(await connect(port))
            await asyncio.sleep(0.02)
        conns[1][1].write(GET)  # the second one is used, so the first stays the longest idle
        assert (await answer(conns[1][0]))[0] == 200
        reader, writer = await connect(port)
        writer.write(GET)
        assert (await answer(reader))[0] == 200
        assert await closed_within(conns[0][0], 2) == b""  # the oldest idle one went
        conns[2][1].write(GET)  # the others still serve
        assert (await answer(conns[2][0]))[0] == 200
        assert closes(app, "shed_idle") == 1
        conns[2][1].write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        _, metrics = await answer(conns[2][0])
        assert b"maskgate_client_connections 3.0" in metrics  # the 2nd, the 3rd, the new one


async def test_the_cap_refuses_new_connections_when_none_is_idle():
    async with gateway(max_connections=2, header_timeout_s=30) as (port, app):
        busy = []
        for _ in range(2):  # heads in progress: not idle, never shed
            reader, writer = await connect(port)
            writer.write(b"GET /healthz HTTP/1.1\r\n")
            busy.append((reader, writer))
        await asyncio.sleep(0.05)
        reader, _ = await connect(port)
        status, body = await answer(reader)
        assert status == 503 and orjson.loads(body)["error"]["code"] == "too_many_connections"
        assert closes(app, "refused") == 1
        busy[0][1].write(b"Host: x\r\n\r\n")  # the held ones finish their requests
        assert (await answer(busy[0][0]))[0] == 200


@contextlib.asynccontextmanager
async def slow_upstream(delay_s: float) -> AsyncIterator[str]:
    """Answers every request after `delay_s`: a generation longer than every client timeout."""

    async def answer_late(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay_s)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer_late)
    async with serve_app(app) as url:
        yield url


async def test_a_request_in_progress_outlives_every_client_timeout():
    async with slow_upstream(1.5) as url, gateway(url, max_connections=1) as (port, app):
        reader, writer = await connect(port)
        body = b'{"model": "m", "messages": []}'
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await asyncio.sleep(0.1)
        late, _ = await connect(port)  # the cap is reached by a busy connection: refused
        assert (await answer(late))[0] == 503
        status, got = await answer(reader)
        assert (status, orjson.loads(got)) == (200, {"ok": True})
        for reason in ("header_timeout", "body_timeout", "idle_timeout", "shed_idle"):
            assert closes(app, reason) == 0


async def test_pipelined_requests_are_all_answered():
    async with gateway() as (port, app):
        reader, writer = await connect(port)
        writer.write(GET * 3)
        for _ in range(3):
            assert (await answer(reader))[0] == 200
        assert await closed_within(reader, 3) == b""  # then idle, then closed
        assert closes(app, "idle_timeout") == 1


def test_the_cap_is_lowered_to_the_open_file_limit(monkeypatch):
    import resource

    from maskgate.gateway.processes import serve

    limits = {"now": (1024, 1024)}
    monkeypatch.setattr(resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda _, v: limits.update(now=v))
    assert serve._connection_cap(10000) == 768  # 3/4 of 1024: fds left for upstreams
    assert serve._connection_cap(500) == 500
    limits["now"] = (1024, 65536)  # the soft limit is raised to the hard one first
    assert serve._connection_cap(10000) == 10000 and limits["now"] == (65536, 65536)
