"""Bounds the gateway keeps on what it reads: a request body that trickles in is cut at
`clients.body_deadline_s` on every route that reads a body (inference, control, registration,
admin), and an upstream answer the gateway would buffer is cut at
`max_upstream_answer_bytes` (502 `upstream_answer_too_large`)."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

pytestmark = pytest.mark.integration

ADMIN = "adm"


async def trickle(url: str, path: str, size: int = 1000) -> tuple[int, bytes, float]:
    """A request whose body arrives one byte every 0.2 s; (status, body, seconds to answer)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {ADMIN}\r\nContent-Length: {size}\r\n\r\n"
    )
    writer.write(head.encode())
    started = time.monotonic()

    async def send() -> None:
        for _ in range(size):
            writer.write(b" ")
            await asyncio.sleep(0.2)

    sender = asyncio.create_task(send())
    try:
        data = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        sender.cancel()
        writer.close()
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2], time.monotonic() - started


@pytest.mark.parametrize(
    "path",
    [
        "/generate",
        "/v1/chat/completions",
        "/pause_generation",
        "/workers",
        "/admin/pools/mask/endpoints",
    ],
)
async def test_a_trickled_body_times_out_on_every_route(upstreams, gateway, make_config, path):
    up = await upstreams()
    config = make_config([up.url], [up.url], admin_key=ADMIN, clients={"body_deadline_s": 1.0})
    async with gateway(config) as gw:
        status, body, took = await trickle(gw.url, path)
        assert status == 408, body
        assert orjson.loads(body)["error"]["code"] == "request_timeout"
        assert b"body_deadline_s" in body
        assert 0.9 < took < 3.0  # the deadline, not the 30 s gap timeout
    assert not [r for r in up.requests if r.path == path]


async def test_a_buffered_upstream_answer_is_bounded(upstreams, gateway, make_config):
    up = await upstreams()
    config = make_config([up.url], [up.url], max_upstream_answer_bytes=4096)
    async with gateway(config) as gw:
        status, out, _ = await gw.post("/generate", {"text": ["hi"]})
        assert status == 200, out
        status, out, _ = await gw.post("/generate", {"text": ["hi"] * 200})
        assert (status, out["error"]["code"]) == (502, "upstream_answer_too_large")
        # Not an endpoint fault: the circuit stays closed and the next request is served.
        assert all(ep.circuit.available() for ep in gw.state.pools["general"].endpoints)
        assert (await gw.post("/generate", {"text": ["hi"]}))[0] == 200


async def test_a_control_reply_is_bounded_too(workers, gateway, make_config):
    a = await workers(name="a", model_path="p" * 4096)
    config = make_config([a.url], [a.url], max_upstream_answer_bytes=1024)
    async with gateway(config) as gw:
        async with gw.client.get(gw.url + "/model_info") as resp:
            body = await resp.json()
        # The one endpoint's answer was cut: none answered usably.
        assert (resp.status, body["error"]["code"]) == (503, "no_trained_endpoints")
        a.model_path = "fake-rl"
        async with gw.client.get(gw.url + "/model_info") as resp:
            assert (resp.status, (await resp.json())["model_path"]) == (200, "fake-rl")
