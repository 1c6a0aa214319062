"""Fake upstreams (tests/fakes/upstream.py) and an in-process gateway, both on port 0."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from fakes.serve import start_site
from fakes.upstream import FakeUpstream

from maskgate.gateway import GatewayConfig, create_app
from maskgate.gateway.state import STATE, GatewayState
from maskgate.protocol.settings import load_settings

# Test modules import each other by name (pytest runs with --import-mode=importlib).
sys.path.insert(0, str(Path(__file__).resolve().parent))


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
    runner, url = await start_site(app, handler_cancellation=True, shutdown_timeout=2)
    try:
        async with aiohttp.ClientSession() as client:
            gw = Gateway(url, app, client)
            await wait_for(lambda: gw.state.ready)
            yield gw
    finally:
        await runner.cleanup()


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[..., Awaitable[FakeUpstream]]]:
    """`await upstreams(**knobs)` starts a FakeUpstream (`host`, `port`: where it listens);
    all stop after the test."""
    started: list[FakeUpstream] = []

    async def make(**knobs: Any) -> FakeUpstream:
        host = knobs.pop("host", "127.0.0.1")
        port = knobs.pop("port", 0)
        up = FakeUpstream(**knobs)
        started.append(up)
        await up.start(host, port)
        return up

    yield make
    for up in started:
        await up.stop()


@pytest.fixture
def workers(
    upstreams: Callable[..., Awaitable[FakeUpstream]],
) -> Callable[..., Awaitable[FakeUpstream]]:
    """`await workers(**knobs)` starts a fake RL engine: `upstreams(engine="rl", ...)`."""

    async def make(**knobs: Any) -> FakeUpstream:
        return await upstreams(engine="rl", **{"name": "worker", **knobs})

    return make


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
