"""Fake upstreams and an in-process gateway, both on port 0.

A `FakeUpstream` is a small aiohttp server speaking the slice of SGLang's surface the gateway
touches, in SGLang's mask response shape. It records every request it receives and has knobs
for delay, time to first chunk, inter-chunk gap, a status sequence, a failure rate, SSE,
mid-stream drops and health.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

from maskgate.gateway import GatewayConfig, create_app
from maskgate.gateway.state import STATE, GatewayState
from maskgate.protocol.settings import load_settings

# Test modules import shared bodies by name (pytest runs with --import-mode=importlib).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rl_worker import RLWorker  # found through the path above

_PROBES = frozenset({"/health", "/get_model_info", "/model_info", "/get_weight_version"})


@dataclass
class Received:
    method: str
    path: str
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class FakeUpstream:
    """Knobs are plain attributes; change them at any time."""

    name: str = "upstream"
    delay_s: float = 0.0  # before the response headers
    ttfb_s: float = 0.0  # streams: headers -> first chunk
    chunk_gap_s: float = 0.0  # streams: between chunks
    statuses: deque[int] = field(default_factory=deque)  # answered first, one per request
    fail_rate: float = 0.0  # chance of a 500 (seeded, reproducible)
    healthy: bool = True
    chunks: int = 3  # SSE chunks per stream
    drop_after: int | None = None  # streams: cut the connection after this many chunks
    drop_mid_frame: bool = False  # ...after sending half of the next frame
    vocab_size: int | None = 1000
    mask_ids_outside: bool = False  # answer masks whose sampled token is not inside
    received: list[Received] = field(default_factory=list)
    health_checks: int = 0
    cancelled: int = 0  # requests whose connection went away before the answer ended
    url: str = ""
    _rng: random.Random = field(default_factory=lambda: random.Random(1234))
    _runner: web.AppRunner | None = None

    @property
    def requests(self) -> list[Received]:
        """Received requests other than health, model-info and weight-version probes."""
        return [r for r in self.received if r.path not in _PROBES]

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/get_model_info", self._model_info)
        # No weight versions here (the RL worker fake in rl_worker.py has them): the
        # trained pool's version probes get 404 and never consume `statuses`.
        for path in ("/model_info", "/get_weight_version"):
            app.router.add_get(path, self._no_versions)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.url = f"http://{host}:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        self.received.append(Received("GET", "/health", CIMultiDict(request.headers), b""))
        self.health_checks += 1
        return web.Response(status=200 if self.healthy else 503)

    async def _no_versions(self, request: web.Request) -> web.Response:
        self.received.append(Received("GET", request.path, CIMultiDict(request.headers), b""))
        return web.Response(status=404)

    async def _model_info(self, request: web.Request) -> web.Response:
        if self.vocab_size is None:
            return web.Response(status=404)
        return web.json_response({"model_path": "fake", "vocab_size": self.vocab_size})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.received.append(
            Received(request.method, request.path, CIMultiDict(request.headers), raw)
        )
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.statuses:
                status = self.statuses.popleft()
                if status != 200:
                    return web.json_response({"error": f"status {status}"}, status=status)
            if self.fail_rate and self._rng.random() < self.fail_rate:
                return web.json_response({"error": "injected"}, status=500)
            try:
                body = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                body = {}  # the fake answers any body; only the gateway judges them
            if isinstance(body, dict) and body.get("stream"):
                return await self._stream(request, body)
            return web.Response(
                body=orjson.dumps(self._answer(request.path, body)),
                content_type="application/json",
                headers={"X-Upstream": self.name},
            )
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.ttfb_s:
            await asyncio.sleep(self.ttfb_s)
        for i in range(self.chunks):
            if i and self.chunk_gap_s:
                await asyncio.sleep(self.chunk_gap_s)
            chunk = {
                "choices": [{"index": 0, "delta": {"content": f"t{i}"}}],
                "upstream": self.name,
            }
            frame = b"data: " + orjson.dumps(chunk) + b"\n\n"
            if self.drop_after is not None and i == self.drop_after:
                if self.drop_mid_frame:
                    await resp.write(frame[: len(frame) // 2])
                    await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.close()  # an upstream crash mid-stream
                return resp
            await resp.write(frame)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _answer(self, path: str, body: Any) -> Any:
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
        if path == "/generate":
            size = len(body["text"]) if isinstance(body.get("text"), list) else None
            flags = body.get("return_sampling_mask")
            if size is None:
                return self._generate_item(body, 0, bool(flags))
            flags = flags if isinstance(flags, list) else [bool(flags)] * size
            return [self._generate_item(body, i, flags[i]) for i in range(size)]
        if path in ("/v1/chat/completions", "/v1/completions"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            if path == "/v1/chat/completions":
                choice["message"] = {"role": "assistant", "content": "hi"}
            else:
                choice["text"] = "hi"
            if body.get("return_sampling_mask"):
                ids, meta = self._mask_meta(body)
                choice["meta_info"] = meta
                if body.get("return_token_ids"):
                    choice["token_ids"] = ids
            return {
                "id": "cmpl-1",
                "object": "chat.completion",
                "model": "fake",
                "choices": [choice],
            }
        return {"path": path, "upstream": self.name}

    def _generate_item(self, body: dict[str, Any], i: int, mask: bool) -> dict[str, Any]:
        item: dict[str, Any] = {"text": "hi", "meta_info": {"id": f"r{i}", "finish_reason": None}}
        if mask:
            ids, meta = self._mask_meta(body)
            item["output_ids"] = ids
            item["meta_info"].update(meta)
        return item

    def _mask_meta(self, body: dict[str, Any], tokens: int = 4) -> tuple[list[int], dict[str, Any]]:
        """SGLang's fields: per generated token, a mask (ids) and the sampled log-prob."""
        masks = [[10 + t, 20 + t, 30 + t] for t in range(tokens)]
        ids = [m[0] for m in masks]
        if self.mask_ids_outside:
            ids[-1] = 999
        meta = {
            "output_token_sampling_mask": masks,
            "output_token_sampling_logprobs": [-0.5] * tokens,
            "output_token_sampling_mask_length": tokens,
        }
        return ids, meta


@dataclass
class Gateway:
    url: str
    app: web.Application
    client: aiohttp.ClientSession

    @property
    def state(self) -> GatewayState:
        return self.app[STATE]

    async def post(
        self, path: str, body: Any, **kw: Any
    ) -> tuple[int, Any, aiohttp.ClientResponse]:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
        async with self.client.post(self.url + path, data=data, headers=headers, **kw) as resp:
            raw = await resp.read()
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError:
                parsed = raw
            return resp.status, parsed, resp

    async def metrics(self) -> str:
        async with self.client.get(self.url + "/metrics") as resp:
            return await resp.text()


def gateway_config(
    general: list[str] | None = None, mask: list[str] | None = None, **overrides: Any
) -> GatewayConfig:
    """A config for tests, built through the one conversion path. Fast health checks."""
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "access_log": False,
        "timeouts": {"connect_s": 1.0, "health_interval_s": 0.05, "health_timeout_s": 0.5},
        "retries": {"backoff_base_s": 0.001, "backoff_max_s": 0.01},
        "pools": {"general": {"endpoints": general or []}, "mask": {"endpoints": mask or []}},
    }
    from maskgate.protocol.settings import merge

    return load_settings(GatewayConfig, overrides=merge(base, overrides))


async def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def run_gateway(config: GatewayConfig, **kw: Any) -> AsyncIterator[Gateway]:
    app = create_app(config, **kw)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as client:
            gw = Gateway(f"http://127.0.0.1:{port}", app, client)
            await wait_for(lambda: gw.state.ready)
            yield gw
    finally:
        await runner.cleanup()


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[..., Awaitable[FakeUpstream]]]:
    """`await upstreams(**knobs)` starts a fake upstream; all stop after the test."""
    started: list[FakeUpstream] = []

    async def make(**knobs: Any) -> FakeUpstream:
        host = knobs.pop("host", "127.0.0.1")
        port = knobs.pop("port", 0)
        up = FakeUpstream(**knobs)
        await up.start(host, port)
        started.append(up)
        return up

    yield make
    for up in started:
        await up.stop()


@pytest.fixture
async def workers() -> AsyncIterator[Callable[..., Awaitable[RLWorker]]]:
    """`await workers(**knobs)` starts a fake RL engine (rl_worker.py); all stop after the
    test."""
    started: list[RLWorker] = []

    async def make(**knobs: Any) -> RLWorker:
        worker = RLWorker(**knobs)
        await worker.start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        await worker.stop()


@pytest.fixture
def gateway() -> Callable[..., contextlib.AbstractAsyncContextManager[Gateway]]:
    """`async with gateway(config) as gw:` runs the app in-process on port 0."""
    return run_gateway


@pytest.fixture
def make_config() -> Callable[..., GatewayConfig]:
    return gateway_config


@pytest.fixture
def until() -> Callable[..., Awaitable[None]]:
    return wait_for
