"""`sampling_mask_format` through the gateway: packed and lists carry the same masks on every
route (a real worker app on the tiny-random model behind the gateway), malformed packed
answers are 502s, and lists <-> packed conversion when the pool answers the other format."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer
from fakes.upstream import FakeUpstream

from maskgate.worker.config import WorkerConfig
from maskgate.worker.server import create_app as create_worker_app
from maskgate.worker.server.backend import Backend, load_backend
from tests.mask_formats import masks_of, sse_events

pytestmark = pytest.mark.integration

WORKER = WorkerConfig(model="tiny-random", device="cpu", max_model_len=64, max_num_seqs=8)
SP = {"temperature": 1.0, "top_p": 0.9, "top_k": 40, "max_new_tokens": 5, "ignore_eos": True}


@pytest.fixture(scope="module")
def backend() -> Backend:
    return load_backend(WORKER)


@pytest.fixture
async def worker_url(backend: Backend) -> AsyncIterator[str]:
    server = TestServer(create_worker_app(WORKER, backend=backend), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def generate(fmt: Any = None, **extra: Any) -> dict[str, Any]:
    body = {
        "text": "hello",
        "sampling_params": {**SP, "sampling_seed": 11},
        "return_sampling_mask": True,
        **extra,
    }
    if fmt is not None:
        body["sampling_mask_format"] = fmt
    return body


def openai(route: str, fmt: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "max_tokens": 4,
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": 5,
        "n": 2,
        "return_sampling_mask": True,
        "return_meta_info": True,
        "return_token_ids": True,
        "sampling_mask_format": fmt,
    }
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return body


async def test_generate_through_the_gateway(worker_url, gateway, make_config):
    async with gateway(make_config(mask=[worker_url])) as gw:
        s1, lists, _ = await gw.post("/generate", generate())
        s2, packed, _ = await gw.post("/generate", generate("packed"))
        assert (s1, s2) == (200, 200), (lists, packed)
        assert masks_of(packed["meta_info"]) == masks_of(lists["meta_info"])
        assert len(masks_of(packed["meta_info"])) == 5
        texts = {"text": ["hello", "hi"]}
        s3, mixed, _ = await gw.post("/generate", generate(["packed", "lists"], **texts))
        s4, both, _ = await gw.post("/generate", generate("lists", **texts))
        assert (s3, s4) == (200, 200)
        assert "output_token_sampling_mask_ids" in mixed[0]["meta_info"]
        assert "output_token_sampling_mask" in mixed[1]["meta_info"]
        for a, b in zip(mixed, both, strict=True):
            assert masks_of(a["meta_info"]) == masks_of(b["meta_info"])


async def test_generate_stream_through_the_gateway(worker_url, gateway, make_config):
    async def stream(gw: Any, fmt: str) -> list[list[int]]:
        body = generate(fmt, stream=True, incremental_streaming_output=True)
        async with gw.client.post(gw.url + "/generate", json=body) as resp:
            assert resp.status == 200
            raw = await resp.read()
        return [m for ev in sse_events(raw) for m in masks_of(ev["meta_info"])]

    async with gateway(make_config(mask=[worker_url])) as gw:
        packed, lists = await stream(gw, "packed"), await stream(gw, "lists")
    assert packed == lists and len(packed) == 5


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_openai_routes_through_the_gateway(worker_url, gateway, make_config, route):
    async with gateway(make_config(mask=[worker_url])) as gw:
        s1, lists, _ = await gw.post(route, openai(route, "lists"))
        s2, packed, _ = await gw.post(route, openai(route, "packed"))
    assert (s1, s2) == (200, 200), (lists, packed)
    for p, q in zip(packed["choices"], lists["choices"], strict=True):
        assert p["token_ids"] == q["token_ids"]
        assert masks_of(p["meta_info"]) == masks_of(q["meta_info"])


async def test_invalid_format_is_refused_before_the_pool(upstreams, gateway, make_config):
    up = await upstreams()
    async with gateway(make_config(mask=[up.url])) as gw:
        status, body, _ = await gw.post("/generate", generate("csr"))
    assert status == 400
    assert body["error"]["code"] == "sampling_mask_invalid_param"
    assert up.requests == []


def _b64(values: list[int]) -> str:
    return base64.b64encode(b"".join(v.to_bytes(4, "little", signed=True) for v in values)).decode()


@dataclass
class PackedUpstream(FakeUpstream):
    """Answers masks packed whatever was asked, optionally broken in one way."""

    offsets: list[int] = field(default_factory=lambda: [0, 2, 4, 6])
    ids: list[int] = field(default_factory=lambda: [10, 20, 11, 21, 12, 22])

    def _mask_meta(self, body: dict[str, Any], tokens: int = 3) -> tuple[list[int], dict[str, Any]]:
        meta = {
            "output_token_sampling_mask_ids": _b64(self.ids),
            "output_token_sampling_mask_offsets": _b64(self.offsets),
            "output_token_sampling_logprobs": [-0.5] * tokens,
            "output_token_sampling_mask_length": tokens,
        }
        return [10, 11, 12], meta


@pytest.fixture
async def packed_upstream() -> AsyncIterator[PackedUpstream]:
    up = PackedUpstream(name="packed")
    await up.start()
    yield up
    await up.stop()


async def test_packed_answer_to_a_lists_request_is_converted(packed_upstream, gateway, make_config):
    async with gateway(make_config(mask=[packed_upstream.url])) as gw:
        status, body, _ = await gw.post("/generate", generate())
    assert status == 200
    assert body["meta_info"]["output_token_sampling_mask"] == [[10, 20], [11, 21], [12, 22]]
    assert "output_token_sampling_mask_ids" not in body["meta_info"]


@pytest.mark.parametrize(
    ("offsets", "ids", "problem"),
    [
        ([0, 2, 4, 5], [10, 20, 11, 21, 12, 22], "id count"),
        ([0, 4, 2, 6], [10, 20, 11, 21, 12, 22], "non-decreasing"),
        ([1, 2, 4, 6], [10, 20, 11, 21, 12, 22], "start at 0"),
        ([0, 2, 6], [10, 20, 11, 21, 12, 22], "2 tokens"),
        ([0, 2, 4, 6], [10, 20, 11, 21, 12, 5000], "vocabulary"),
        ([0, 2, 2, 6], [10, 20, 11, 21, 12, 22], "empty mask"),
    ],
)
async def test_malformed_packed_answer_is_a_502(
    packed_upstream, gateway, make_config, offsets, ids, problem
):
    packed_upstream.offsets, packed_upstream.ids = offsets, ids
    async with gateway(make_config(mask=[packed_upstream.url])) as gw:
        status, body, _ = await gw.post("/generate", generate("packed"))
        metrics = await gw.metrics()
    assert status == 502, body
    assert body["error"]["code"] == "upstream_invalid_mask"
    assert problem in body["error"]["message"]
    assert 'maskgate_mask_invariant_violations_total{kind="malformed"} 1.0' in metrics


async def test_lists_answer_to_a_packed_request_is_packed(upstreams, gateway, make_config):
    up = await upstreams()  # FakeUpstream answers lists
    async with gateway(make_config(mask=[up.url])) as gw:
        status, body, _ = await gw.post("/generate", generate("packed"))
    assert status == 200
    meta = body["meta_info"]
    assert masks_of(meta) == [[10 + t, 20 + t, 30 + t] for t in range(4)]
    assert orjson.loads(up.requests[-1].body)["sampling_mask_format"] == "packed"
