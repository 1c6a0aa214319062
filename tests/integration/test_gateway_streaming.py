"""SSE relay: chunk by chunk, mid-stream upstream failure, client disconnect, timeouts."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

pytestmark = pytest.mark.integration

STREAM = {"model": "m", "prompt": "x", "stream": True}


def events(raw: bytes) -> list[bytes]:
    return [e[len(b"data: ") :] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


async def test_stream_is_relayed_chunk_by_chunk(upstreams, gateway, make_config):
    up = await upstreams(chunks=5, chunk_gap_s=0.15)
    async with gateway(make_config([up.url])) as gw:
        start = time.monotonic()
        arrivals = []
        async with gw.client.post(gw.url + "/v1/completions", json=STREAM) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/event-stream"
            assert resp.headers["X-Request-Id"]
            body = b""
            async for data in resp.content.iter_any():
                arrivals.append(time.monotonic() - start)
                body += data
        text = await gw.metrics()
    got = events(body)
    assert got[-1] == b"[DONE]"
    assert [orjson.loads(e)["choices"][0]["delta"]["content"] for e in got[:-1]] == [
        "t0",
        "t1",
        "t2",
        "t3",
        "t4",
    ]
    # The first chunk reached the client long before the upstream finished (~0.6 s).
    assert arrivals[0] < arrivals[-1] - 0.3
    assert 'maskgate_stream_ttfb_seconds_count{pool="general",route="completions"} 1.0' in text


async def test_generate_may_stream_mask_requests(upstreams, gateway, make_config):
    up = await upstreams(chunks=2)
    async with gateway(make_config([], [up.url])) as gw:
        body = {
            "text": "x",
            "stream": True,
            "return_sampling_mask": True,
            "sampling_params": {"top_k": 4},
        }
        async with gw.client.post(gw.url + "/generate", json=body) as resp:
            assert resp.status == 200
            raw = await resp.read()
    assert events(raw)[-1] == b"[DONE]"
    assert up.requests[0].json()["sampling_params"]["top_p"] == 1.0


async def test_mid_stream_upstream_failure_ends_with_an_error_event(
    upstreams, gateway, make_config
):
    up = await upstreams(chunks=5, drop_after=2)
    async with gateway(make_config([up.url])) as gw:
        async with gw.client.post(gw.url + "/v1/completions", json=STREAM) as resp:
            assert resp.status == 200
            raw = await resp.read()
        text = await gw.metrics()
    got = events(raw)
    assert len(got) == 3  # two chunks, then the error
    error = orjson.loads(got[-1])["error"]
    assert error["code"] == "upstream_stream_error" and error["type"] == "server_error"
    assert 'maskgate_stream_errors_total{pool="general"} 1.0' in text


async def test_error_event_after_a_partial_frame_is_an_event_of_its_own(
    upstreams, gateway, make_config
):
    up = await upstreams(chunks=5, drop_after=1, drop_mid_frame=True)
    async with gateway(make_config([up.url])) as gw:
        resp = await gw.client.post(gw.url + "/v1/completions", json=STREAM)
        raw = await resp.read()
    frames = raw.split(b"\n\n")
    assert frames[-1] == b""  # the stream ends on a frame boundary
    assert frames[0].startswith(b"data: {")  # the whole first frame
    assert not frames[1].startswith(b'data: {"error')  # the cut frame, ended on its own
    error = orjson.loads(frames[2][len(b"data: ") :])["error"]
    assert error["code"] == "upstream_stream_error"


async def test_idle_timeout_between_chunks_ends_the_stream(upstreams, gateway, make_config):
    up = await upstreams(chunks=3, chunk_gap_s=1.0)
    async with gateway(make_config([up.url], timeouts={"idle_s": 0.2})) as gw:
        resp = await gw.client.post(gw.url + "/v1/completions", json=STREAM)
        raw = await resp.read()
    got = events(raw)
    assert len(got) == 2
    assert orjson.loads(got[-1])["error"]["code"] == "upstream_stream_error"


async def test_time_to_first_byte_timeout_is_504(upstreams, gateway, make_config):
    up = await upstreams(delay_s=1.0)
    async with gateway(make_config([up.url], timeouts={"ttfb_s": 0.2})) as gw:
        status, body, _ = await gw.post("/v1/completions", {"prompt": "x"})
    assert (status, body["error"]["code"]) == (504, "upstream_timeout")
    assert len(up.requests) == 1  # a timeout is not retried: the upstream may be working on it


async def test_client_disconnect_cancels_the_upstream_request(
    upstreams, gateway, make_config, until
):
    up = await upstreams(chunks=50, chunk_gap_s=0.1)
    slow = await upstreams(delay_s=5.0)
    async with gateway(make_config([up.url], [slow.url])) as gw:
        # A stream: read one chunk, then hang up.
        async with gw.client.post(gw.url + "/v1/completions", json=STREAM) as resp:
            await resp.content.readany()
            resp.close()
        await until(lambda: up.cancelled == 1)
        # A non-streaming mask request still waiting for its answer.
        task = asyncio.create_task(
            gw.post(
                "/generate",
                {"text": "x", "return_sampling_mask": True, "sampling_params": {"top_k": 2}},
            )
        )
        await until(lambda: len(slow.requests) == 1)
        task.cancel()
        await until(lambda: slow.cancelled == 1)
        # Permits came back.
        await until(lambda: gw.state.pools["mask"].admission.active == 0)
        assert gw.state.pools["general"].admission.active == 0
        assert all(ep.outstanding == 0 for p in gw.state.pools.values() for ep in p.endpoints)
