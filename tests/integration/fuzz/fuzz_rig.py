"""The fuzz rig: an in-process gateway (`create_app`) in front of two recording fake
upstreams (general and mask), shared by every example of a test."""

from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from fakes.fault_upstream import Knobs, Upstream
from fakes.serve import start_site

from maskgate.gateway.state import GatewayState


@dataclass
class Recorder:
    upstream: Upstream
    runner: web.AppRunner
    url: str

    @property
    def received(self) -> int:
        return self.upstream.counts["requests"]

    def last(self, count: int) -> list[bytes]:
        raws = list(self.upstream.raw)
        return raws[len(raws) - count :] if count else []


@dataclass
class Rig:
    url: str
    state: GatewayState
    client: aiohttp.ClientSession
    general: Recorder
    mask: Recorder
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)

    async def post(self, path: str, raw: bytes) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        async with self.client.post(self.url + path, data=raw, headers=headers) as resp:
            data = await resp.read()
            if resp.content_type == "application/json":
                return resp.status, json.loads(data)
            return resp.status, data


async def start_recorder() -> Recorder:
    up = Upstream(Knobs(chunks=2, keep_bodies=64))
    runner, url = await start_site(up.app())
    return Recorder(up, runner, url)


def report(test: str, outcomes: collections.Counter[str]) -> None:
    """With MASKGATE_FUZZ_REPORT=FILE, append this test's case counts (for bench/)."""
    path = os.environ.get("MASKGATE_FUZZ_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "outcomes": dict(outcomes)}) + "\n")
