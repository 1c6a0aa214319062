"""The floor under the gateway: the least an aiohttp process can do per request.

Three modes, all on the gateway's server stack (aiohttp server, uvloop when installed):
  answer  reads the request body and answers a canned completion itself (no upstream):
          the cost of aiohttp's server side alone;
  proxy   forwards the body to the upstream with one aiohttp ClientSession and returns the
          answer: a pass-through proxy with no policy, metrics, logs, pools or retries.
  lean    like `proxy`, but upstream over a minimal keep-alive HTTP/1.1 client written on
          asyncio.Protocol (Content-Length answers only): what a leaner client would buy.
The gateway's cost above `proxy` is its own logic; `proxy` above `answer` is aiohttp's client;
`lean` above `answer` is the least any upstream client costs.

    python -m bench.gateway.floor --mode proxy --port 8081 --upstream http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

CANNED = b'{"id":"chatcmpl-bench","object":"chat.completion","choices":[]}'
_DROP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})
SESSION = web.AppKey("session", aiohttp.ClientSession)


async def answer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=CANNED, content_type="application/json")


async def proxy(request: web.Request) -> web.Response:
    raw = await request.read()
    upstream = request.app["upstream"]
    async with request.app[SESSION].request(
        request.method, upstream + request.raw_path, data=raw, headers=request.headers
    ) as resp:
        body = await resp.read()
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP}
        return web.Response(status=resp.status, body=body, headers=headers)


class _LeanConn(asyncio.Protocol):
    """One keep-alive upstream connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, list[tuple[str, str]], bytes]] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("upstream closed the connection"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        headers = [tuple(h.split(":", 1)) for h in lines[1:]]
        length = next((int(v) for k, v in headers if k.lower() == "content-length"), None)
        if length is None:
            self.waiter.set_exception(ValueError("lean client needs Content-Length answers"))
            return
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        hdrs = [(k, v.strip()) for k, v in headers]
        self.waiter.set_result((int(lines[0].split(" ", 2)[1]), hdrs, body))


class _LeanClient:
    def __init__(self, url: str) -> None:
        host_port = url.split("://", 1)[1].rstrip("/")
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.idle: list[_LeanConn] = []
        self.host_header = host_port.encode()

    async def request(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = self.idle.pop() if self.idle else None
        if conn is None or conn.lost:
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_connection(_LeanConn, self.host, self.port)
        head = [f"{method} {path} HTTP/1.1\r\nHost: ".encode() + self.host_header]
        head += [f"{k}: {v}".encode("latin-1") for k, v in headers]
        head.append(b"Content-Length: %d\r\n\r\n" % len(body))
        conn.waiter = asyncio.get_running_loop().create_future()
        assert conn.transport is not None
        conn.transport.write(b"\r\n".join(head) + body)
        result = await conn.waiter
        conn.waiter = None
        self.idle.append(conn)
        return result


LEAN = web.AppKey("lean", _LeanClient)


async def lean(request: web.Request) -> web.Response:
    raw = await request.read()
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP]
    status, up_headers, body = await request.app[LEAN].request(
        request.method, request.raw_path, headers, raw
    )
    out = {k: v for k, v in up_headers if k.lower() not in _DROP}
    return web.Response(status=status, body=body, headers=out)


def build(mode: str, upstream: str) -> web.Application:
    app = web.Application()
    app["upstream"] = upstream

    async def session(app: web.Application):  # type: ignore[no-untyped-def]
        app[SESSION] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session)
    app[LEAN] = _LeanClient(upstream)
    handler = {"answer": answer, "proxy": proxy, "lean": lean}[mode]
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("answer", "proxy", "lean"), required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    args = p.parse_args()
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    app = build(args.mode, args.upstream)
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(web._run_app(app, host=args.host, port=args.port, print=None, access_log=None))


if __name__ == "__main__":
    main()
