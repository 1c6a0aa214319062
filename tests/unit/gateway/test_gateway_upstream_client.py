"""The upstream HTTP/1.1 client against scripted servers on loopback port 0.

Each scripted server answers every request on a connection with the next canned byte
string, optionally split into pieces at awkward places, so framing (Content-Length,
chunked, until close), interim responses, keep-alive reuse and failures are all exercised
exactly. A few tests run the gateway app in-process in front of one scripted server, to see
what the proxy makes of the client's failures (stale re-sends, the metric, the retry policy).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp.test_utils import TestClient, TestServer

from maskgate.gateway import GatewayConfig, create_app
from maskgate.gateway.upstream.client import (
    BodyError,
    ConnectError,
    DisconnectedError,
    ProtocolError,
    UpstreamClient,
)
from maskgate.protocol.settings import load_settings


class Script(asyncio.Protocol):
    """Answers each request (headers + Content-Length body) with the next scripted reply."""

    def __init__(self, server: Scripted) -> None:
        self.server = server
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.server.connections += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self.server.requests.append(head + b"\r\n\r\n" + rest[:length])
            self.buf = rest[length:]
            asyncio.get_running_loop().create_task(self.reply())

    async def reply(self) -> None:
        action = self.server.replies.pop(0)
        if callable(action):
            await action(self.transport)
            return
        for piece in self.server.split(action):
            self.transport.write(piece)  # type: ignore[attr-defined]
            await asyncio.sleep(0.001)


class Scripted:
    def __init__(self, replies: list, split: Callable[[bytes], list[bytes]] | None = None):
        self.replies = list(replies)
        self.split = split or (lambda b: [b])
        self.requests: list[bytes] = []
        self.connections = 0
        self.url = ""


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., asyncio.Future]]:
    servers = []

    async def start(replies: list, split=None) -> Scripted:
        s = Scripted(replies, split)
        srv = await asyncio.get_running_loop().create_server(lambda: Script(s), "127.0.0.1", 0)
        servers.append(srv)
        s.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        return s

    yield start
    for srv in servers:
        srv.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


async def test_content_length_and_keep_alive_reuse(serve):
    s = await serve([ok(b"one", b"X-A: 1\r\n"), ok(b"two")])
    client = UpstreamClient(1.0)
    r = await client.request(s.url, "POST", "/v1/x?q=1", [("X-Id", "7")], b"{}", timeout_s=2)
    assert (r.status, r.header("x-a"), r.content_length, r.streamed) == (200, "1", 3, False)
    assert await r.read() == b"one"
    r.release()
    r = await client.request(s.url, "GET", "/health", [], None, timeout_s=2)
    assert await r.read() == b"two"
    r.release()
    assert s.connections == 1  # the second request reused the connection
    first = s.requests[0]
    assert first.startswith(b"POST /v1/x?q=1 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"X-Id: 7\r\n" in first and b"Content-Length: 2\r\n" in first
    assert first.endswith(b"\r\n\r\n{}")
    assert b"Content-Length" not in s.requests[1]  # a GET without a body
    await client.close()


async def test_chunked_body_split_at_every_byte(serve):
    body = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\nTrailer: x\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream; charset=utf-8\r\n\r\n"
    s = await serve([head + body, ok(b"after")], split=bytewise)
    client = UpstreamClient(1.0)
    r = await client.request(s.url, "GET", "/", [], None, timeout_s=5)
    assert r.streamed and r.content_type == "text/event-stream"
    assert await r.read() == b"hello world!"
    r.release()
    r = await client.request(s.url, "GET", "/", [], None, timeout_s=5)
    assert await r.read() == b"after"
    assert s.connections == 1
    await client.close()


async def test_interim_responses_are_skipped_and_empty_bodies(serve):
    s = await serve(
        [
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n" + ok(b"z"),
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",  # HEAD: no body follows
        ]
    )
    client = UpstreamClient(1.0)
    r = await client.request(s.url, "POST", "/", [], b"x", timeout_s=2)
    assert (r.status, await r.read()) == (200, b"z")
    r.release()
    r = await client.request(s.url, "DELETE", "/", [], None, timeout_s=2)
    assert (r.status, await r.read()) == (204, b"")
    r.release()
    r = await client.request(s.url, "HEAD", "/", [], None, timeout_s=2)
    assert (r.status, await r.read()) == (200, b"")
    r.release()
    # The 204 and the HEAD answer have no body of their own: a body sent anyway would be
    # read as the next answer, so their connections are never reused.
    assert s.connections == 2
    await client.close()


async def test_close_delimited_body_and_connection_close(serve):
    async def until_close(transport):
        transport.write(b"HTTP/1.1 200 OK\r\n\r\npart1,")
        await asyncio.sleep(0.01)
        transport.write(b"part2")
        transport.close()

    s = await serve([until_close, ok(b"bye", b"Connection: close\r\n"), ok(b"new")])
    client = UpstreamClient(1.0)
    r = await client.request(s.url, "GET", "/", [], None, timeout_s=2)
    assert r.streamed and await r.read() == b"part1,part2"
    r.release()
    r = await client.request(s.url, "GET", "/", [], None, timeout_s=2)
    assert await r.read() == b"bye"
    r.release()  # Connection: close: not kept
    r = await client.request(s.url, "GET", "/", [], None, timeout_s=2)
    assert await r.read() == b"new"
    assert s.connections == 3
    await client.close()


async def hang_up(transport):
    transport.close()  # as a server closing an idle connection just as a request came


async def warm(client: UpstreamClient, s: Scripted, n: int = 1) -> None:
    """Leave `n` kept-alive connections idle in the client's pool (n requests in parallel)."""

    async def one() -> None:
        r = await client.request(s.url, "GET", "/warm", [], None, timeout_s=2)
        await r.read()
        r.release()

    await asyncio.gather(*(one() for _ in range(n)))
    assert s.connections == n


async def test_stale_keep_alive_connection_is_sent_again_on_a_new_one(serve):
    s = await serve([ok(b"a"), hang_up, ok(b"b")])
    client = UpstreamClient(1.0)
    await warm(client, s)
    resent: list[str] = []
    r = await client.request(
        s.url, "POST", "/generate", [], b'{"text": "x"}', timeout_s=2, on_resend=resent.append
    )
    assert await r.read() == b"b"
    r.release()
    assert resent == [s.url]
    assert s.connections == 2  # the re-send went on a new connection
    # The upstream read the request on both connections: it may have run it twice.
    assert s.requests[1] == s.requests[2] and s.requests[1].endswith(b'{"text": "x"}')
    await client.close()


async def test_the_resend_never_takes_another_idle_connection(serve):
    s = await serve([ok(b"a"), ok(b"a"), hang_up, ok(b"b")])
    client = UpstreamClient(1.0)
    await warm(client, s, 2)
    resent: list[str] = []
    r = await client.request(s.url, "POST", "/", [], b"x", timeout_s=2, on_resend=resent.append)
    assert await r.read() == b"b"
    r.release()
    # A third connection, though one idle connection was left: it may be as stale as the first.
    assert (s.connections, len(s.requests), resent) == (3, 4, [s.url])
    assert len(client._idle[s.url]) == 2
    await client.close()


async def test_a_request_is_sent_at_most_twice(serve):
    s = await serve([ok(b"a"), hang_up, hang_up, ok(b"never")])
    client = UpstreamClient(1.0)
    await warm(client, s)
    resent: list[str] = []
    with pytest.raises(DisconnectedError):
        await client.request(s.url, "POST", "/", [], b"x", timeout_s=2, on_resend=resent.append)
    assert (len(s.requests), s.connections, resent) == (3, 2, [s.url])
    await client.close()


async def test_a_new_connection_closed_unanswered_is_not_sent_again(serve):
    s = await serve([hang_up, ok(b"never")])
    client = UpstreamClient(1.0)
    resent: list[str] = []
    with pytest.raises(DisconnectedError):
        await client.request(s.url, "POST", "/", [], b"x", timeout_s=2, on_resend=resent.append)
    assert (len(s.requests), s.connections, resent) == (1, 1, [])
    await client.close()


async def partial_head(transport):
    transport.write(b"HTTP/1.1 200 OK\r\nContent-Le")
    await asyncio.sleep(0.01)
    transport.close()


async def head_then_cut(transport):
    transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    await asyncio.sleep(0.01)
    transport.close()


async def status_line_only(transport):
    transport.write(b"H")  # a single byte of an answer is an answer begun
    await asyncio.sleep(0.01)
    transport.close()


@pytest.mark.parametrize("fault", [partial_head, status_line_only])
async def test_a_reused_connection_closed_mid_head_is_not_sent_again(serve, fault):
    s = await serve([ok(b"a"), fault, ok(b"never")])
    client = UpstreamClient(1.0)
    await warm(client, s)
    resent: list[str] = []
    with pytest.raises(ProtocolError):
        await client.request(s.url, "POST", "/", [], b"x", timeout_s=2, on_resend=resent.append)
    assert (len(s.requests), s.connections, resent) == (2, 1, [])
    await client.close()


async def test_a_reused_connection_closed_mid_body_is_not_sent_again(serve):
    s = await serve([ok(b"a"), head_then_cut, ok(b"never")])
    client = UpstreamClient(1.0)
    await warm(client, s)
    resent: list[str] = []
    r = await client.request(s.url, "POST", "/", [], b"x", timeout_s=2, on_resend=resent.append)
    with pytest.raises(BodyError):
        await r.read()
    r.close()
    assert (len(s.requests), s.connections, resent) == (2, 1, [])
    await client.close()


async def test_a_reused_connection_that_times_out_is_not_sent_again(serve):
    async def silent(transport):
        await asyncio.sleep(5)

    s = await serve([ok(b"a"), silent, ok(b"never")])
    client = UpstreamClient(1.0)
    await warm(client, s)
    resent: list[str] = []
    with pytest.raises(TimeoutError):
        await client.request(s.url, "POST", "/", [], b"x", timeout_s=0.05, on_resend=resent.append)
    assert (len(s.requests), s.connections, resent) == (2, 1, [])
    await client.close()


@contextlib.asynccontextmanager
async def proxy_to(url: str) -> AsyncIterator[TestClient]:
    """The gateway app in-process with one general endpoint and no health checks (they
    would take the scripted replies)."""
    pools = {"general": {"endpoints": [url], "health_path": None}, "mask": {"endpoints": []}}
    config = load_settings(GatewayConfig, overrides={"access_log": False, "pools": pools})
    async with TestClient(TestServer(create_app(config))) as client:
        yield client


async def post_generate(gw: TestClient) -> tuple[int, dict]:
    resp = await gw.post("/generate", json={"text": "x"})
    return resp.status, await resp.json()


async def metric_lines(gw: TestClient, prefix: str) -> list[str]:
    text = await (await gw.get("/metrics")).text()
    return [line for line in text.splitlines() if line.startswith(prefix)]


RESENDS = "maskgate_upstream_stale_resends_total{"
JSON = b"Content-Type: application/json\r\n"


async def test_proxy_counts_a_stale_resend_of_generate(serve):
    s = await serve([ok(b'{"n": 1}', JSON), hang_up, ok(b'{"n": 2}', JSON)])
    async with proxy_to(s.url) as gw:
        assert await post_generate(gw) == (200, {"n": 1})
        assert await metric_lines(gw, RESENDS) == []
        assert await post_generate(gw) == (200, {"n": 2})
        assert await metric_lines(gw, RESENDS) == [
            f'maskgate_upstream_stale_resends_total{{pool="general",upstream="{s.url}"}} 1.0'
        ]
        # Not a retry on another endpoint, and not an upstream fault.
        assert await metric_lines(gw, "maskgate_retries_total{") == []
        assert await metric_lines(gw, "maskgate_upstream_errors_total{") == []
    # The second /generate reached the upstream twice, byte for byte (the same rid).
    assert len(s.requests) == 3 and s.requests[1] == s.requests[2]
    assert s.requests[1].startswith(b"POST /generate HTTP/1.1\r\n")
    assert s.connections == 2


async def test_proxy_does_not_resend_on_a_new_connection(serve):
    s = await serve([hang_up, ok(b"{}", JSON)])
    async with proxy_to(s.url) as gw:
        status, body = await post_generate(gw)
        assert (status, body["error"]["code"]) == (502, "upstream_unreachable")
        assert await metric_lines(gw, RESENDS) == []
        # The proxy's own retry policy applies (another endpoint; here there is none).
        assert await metric_lines(gw, "maskgate_upstream_errors_total{") == [
            "maskgate_upstream_errors_total{"
            f'kind="disconnect",pool="general",upstream="{s.url}"}} 1.0'
        ]
    assert len(s.requests) == 1


@pytest.mark.parametrize("fault", [partial_head, head_then_cut])
async def test_proxy_does_not_resend_once_answer_bytes_arrived(serve, fault):
    s = await serve([ok(b"{}", JSON), fault, ok(b"{}", JSON)])
    async with proxy_to(s.url) as gw:
        assert (await post_generate(gw))[0] == 200
        status, body = await post_generate(gw)
        assert (status, body["error"]["code"]) == (502, "upstream_error")
        assert await metric_lines(gw, RESENDS) == []
        assert await metric_lines(gw, "maskgate_retries_total{") == []
    assert len(s.requests) == 2


async def test_failures_are_typed(serve):
    async def cut_mid_body(transport):
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a part")
        await asyncio.sleep(0.01)
        transport.close()

    async def silent(transport):
        await asyncio.sleep(5)

    s = await serve([cut_mid_body, b"garbage\r\n\r\n", silent])
    client = UpstreamClient(1.0)
    r = await client.request(s.url, "GET", "/", [], None, timeout_s=2)
    assert await r.readchunk() == b"only a part"
    with pytest.raises(BodyError):
        await r.readchunk()
    r.close()
    with pytest.raises(ProtocolError):
        await client.request(s.url, "GET", "/", [], None, timeout_s=2)
    with pytest.raises(TimeoutError):
        await client.request(s.url, "GET", "/", [], None, timeout_s=0.05)
    await client.close()

    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(ConnectError):
        await client.request(dead, "GET", "/", [], None, timeout_s=2)


async def test_slow_reader_pauses_the_socket(serve):
    big = b"x" * (4 * 1024 * 1024)
    s = await serve([ok(big)])
    client = UpstreamClient(1.0)
    r = await client.request(s.url, "GET", "/", [], None, timeout_s=5)
    await asyncio.sleep(0.2)  # the reader is not reading: the socket must have been paused
    conn = r._conn
    assert conn._paused and conn._size < len(big)
    got = await r.read()
    assert got == big and not conn._paused
    r.release()
    await client.close()


async def test_sweep_closes_idle_connections_of_removed_endpoints(serve):
    a = await serve([ok(b"a")])
    b = await serve([ok(b"b")])
    client = UpstreamClient(1.0)
    for s in (a, b):
        r = await client.request(s.url, "GET", "/", [], None, timeout_s=2)
        await r.read()
        r.release()
    client.sweep({a.url})
    assert client._take_idle(b.url) is None
    kept = client._take_idle(a.url)
    assert kept is not None and not kept.closed
    await client.close()
