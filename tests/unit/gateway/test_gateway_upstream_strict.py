"""What the upstream client refuses (RFC 9112), one case per class, and what a client of the
gateway then gets: a clean 502 `upstream_protocol_error`, and a connection never reused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from fakes.raw_upstream import RawUpstream

from maskgate.gateway import GatewayConfig, create_app
from maskgate.gateway.upstream.client import ProtocolError, UpstreamClient
from maskgate.gateway.upstream.http1 import _MAX_HEAD
from maskgate.protocol.settings import load_settings

CANARY = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\ncanary"
OK = b"HTTP/1.1 200 OK\r\n"

REFUSED = {
    "status 600": b"HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n",
    "status 099": b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n",
    "status in Arabic-Indic digits": "HTTP/1.1 ٢٠٠ OK\r\n\r\n".encode(),
    "status 2000": b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
    "HTTP/2.0 version": b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    "101 without an upgrade asked": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
    "CL 0x hex": OK + b"Content-Length: 0xb\r\n\r\nhello world",
    "CL underscore": OK + b"Content-Length: 1_0\r\n\r\n0123456789",
    "CL plus": OK + b"Content-Length: +5\r\n\r\nhello",
    "CL inner space": OK + b"Content-Length: 1 0\r\n\r\n0123456789",
    "CL non-ASCII digit": OK + "Content-Length: ٥\r\n\r\nhello".encode(),
    "CL list": OK + b"Content-Length: 5, 5\r\n\r\nhello",
    "CL conflicting": OK + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "CL with TE": OK + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "TE gzip": OK + b"Transfer-Encoding: gzip\r\n\r\nxxxx",
    "TE gzip, chunked": OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "TE twice": OK + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "TE on HTTP/1.0": b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "chunk size 0x": OK + b"Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    "chunk size underscore": OK
    + b"Transfer-Encoding: chunked\r\n\r\n1_0\r\n0123456789abcdef\r\n0\r\n\r\n",
    "chunk size plus": OK + b"Transfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
    "chunk size space": OK + b"Transfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n",
    "chunk size trailing space": OK + b"Transfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
    "chunk size negative": OK + b"Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n",
    "obs-fold": OK + b"Content-Length: 2\r\nX-A: one\r\n two\r\n\r\nok",
    "space before colon": OK + b"Content-Length : 2\r\n\r\nok",
    "invalid name": OK + b"X(A): 1\r\nContent-Length: 2\r\n\r\nok",
    "empty name": OK + b": 1\r\nContent-Length: 2\r\n\r\nok",
    "bare CR in a value": OK + b"X-A: a\rb\r\nContent-Length: 2\r\n\r\nok",
    "bare LF in a value": OK + b"X-A: a\nb\r\nContent-Length: 2\r\n\r\nok",
    "NUL in a value": OK + b"X-A: a\x00b\r\nContent-Length: 2\r\n\r\nok",
    "value not UTF-8": OK + b"X-A: \xff\xfe\r\nContent-Length: 2\r\n\r\nok",
    "bare LF line ends": b"HTTP/1.1 200 OK\nContent-Length: 2\n\r\n\r\nok",
    "malformed trailer": OK
    + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nbad trailer\r\n\r\n",
    "head over the limit": OK + b"X-A: " + b"a" * _MAX_HEAD + b"\r\nContent-Length: 2\r\n\r\nok",
    "interim heads over the limit": (b"HTTP/1.1 103 Hints\r\nLink: " + b"a" * 9000 + b"\r\n\r\n")
    * 8
    + CANARY,
}


class Upstream(RawUpstream):
    """The server's first request gets `first`, written in `pieces` pieces with a pause
    between them; every later request gets CANARY."""

    canary = CANARY

    async def first(self) -> None:
        data, n = self.server["first"], self.server["pieces"]
        step = max(1, -(-len(data) // n))
        for i in range(0, len(data), step):
            self.transport.write(data[i : i + step])
            await asyncio.sleep(0.002)


@pytest.fixture
async def upstream() -> AsyncIterator:
    servers = []

    async def start(first: bytes, pieces: int = 1) -> tuple[str, dict]:
        server = {"first": first, "pieces": pieces, "connections": 0, "on": []}
        srv = await asyncio.get_running_loop().create_server(
            lambda: Upstream(server), "127.0.0.1", 0
        )
        servers.append(srv)
        return f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}", server

    yield start
    for srv in servers:
        srv.close()


@pytest.mark.parametrize("pieces", [1, 7])
@pytest.mark.parametrize("case", list(REFUSED))
async def test_refused_and_the_connection_is_not_reused(upstream, case: str, pieces: int):
    url, server = await upstream(REFUSED[case], pieces)
    client = UpstreamClient(1.0)
    with pytest.raises(ProtocolError):
        r = await client.request(url, "GET", "/", [], None, timeout_s=2)
        await r.read()  # a body-level refusal (chunk sizes, trailers) surfaces here
    second = await client.request(url, "GET", "/", [], None, timeout_s=2)
    assert (second.status, await second.read()) == (200, b"canary")
    assert server["on"][0] != server["on"][1]
    await client.close()


@pytest.mark.parametrize(
    "stray",
    [
        b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nstray",
        b"HTTP/1.1 304 Not Modified\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray",
    ],
)
@pytest.mark.parametrize("pieces", [1, 3])
async def test_stray_bytes_are_never_the_next_answer(upstream, stray: bytes, pieces: int):
    url, server = await upstream(stray, pieces)
    client = UpstreamClient(1.0)
    r = await client.request(url, "GET", "/", [], None, timeout_s=2)
    assert r.status in (200, 204, 304)
    await r.read()
    r.release()
    await asyncio.sleep(0.02)  # the stray pieces arrive
    second = await client.request(url, "GET", "/", [], None, timeout_s=2)
    assert (second.status, await second.read()) == (200, b"canary")
    assert server["on"][0] != server["on"][1]
    await client.close()


async def test_the_gateway_answers_a_clean_502(upstream):
    url, _ = await upstream(OK + b"X-A: a\rb\r\nContent-Length: 2\r\n\r\nok")
    pools = {"general": {"endpoints": [url], "health_path": None}, "mask": {"endpoints": []}}
    config = load_settings(GatewayConfig, overrides={"access_log": False, "pools": pools})
    async with TestClient(TestServer(create_app(config))) as gw:
        resp = await gw.post("/generate", json={"text": "x"})
        assert resp.status == 502
        error = (await resp.json())["error"]
        assert error["code"] == "upstream_protocol_error" and "malformed" in error["message"]
        # The next request is served on a new connection with the canary.
        resp = await gw.post("/generate", json={"text": "x"})
        assert (resp.status, await resp.read()) == (200, b"canary")


class EarlyAnswer(asyncio.Protocol):
    """Answers 413 at once and never reads the request (as a server refusing a large body
    does); later connections get CANARY."""

    def __init__(self, server: dict) -> None:
        self.server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.server["conns"].append(self)
        self.transport = transport
        if len(self.server["conns"]) == 1:
            transport.pause_reading()  # type: ignore[attr-defined]
            transport.write(b"HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data:
            self.transport.write(CANARY)  # type: ignore[attr-defined]


async def test_an_answer_before_the_request_was_written_ends_the_connection():
    server: dict = {"conns": []}
    srv = await asyncio.get_running_loop().create_server(
        lambda: EarlyAnswer(server), "127.0.0.1", 0
    )
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    client = UpstreamClient(1.0)
    r = await client.request(url, "POST", "/", [], b"x" * (16 << 20), timeout_s=2)
    assert (r.status, await r.read()) == (413, b"")
    r.release()  # the upstream never read the rest of the body: not reusable
    second = await client.request(url, "GET", "/", [], None, timeout_s=2)
    assert (second.status, await second.read()) == (200, b"canary")
    assert len(server["conns"]) == 2
    await client.close()
    srv.close()
