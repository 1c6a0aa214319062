"""Fixtures for the fuzz tests; the rig itself lives in fuzz_rig.py."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
# Test modules import helpers by name (pytest runs with --import-mode=importlib).
sys.path.insert(0, str(HERE))

from fuzz_bodies import CAP, DEFAULT_MAX_TOKENS, MAX_BODY_BYTES, MAX_MASK_IDS  # noqa: E402
from fuzz_rig import Rig, report, start_recorder  # noqa: E402


@pytest.fixture
async def rig(gateway: Any, make_config: Any, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    general, mask = await start_recorder(), await start_recorder()
    config = make_config(
        [general.url],
        [mask.url],
        max_body_bytes=MAX_BODY_BYTES,
        # One round of health checks at start (it brings the mask pool's vocab size), then
        # none: hypothesis generates and shrinks on this event loop and may hold it for a
        # while, which in-process upstreams would "fail" as health checks.
        timeouts={"health_interval_s": 3600.0, "health_timeout_s": 5.0},
        policy={
            "max_mask_tokens": CAP,
            "max_mask_ids_per_request": MAX_MASK_IDS,
            "default_max_tokens": DEFAULT_MAX_TOKENS,
        },
    )
    try:
        async with gateway(config) as gw:
            pool = gw.state.pools["mask"]
            for _ in range(200):  # the vocabulary size comes with the first health check
                if pool.vocab_size is not None:
                    break
                await asyncio.sleep(0.01)
            assert pool.vocab_size == 32000
            r = Rig(gw.url, gw.state, gw.client, general, mask)
            yield r
            report(request.node.name, r.outcomes)
    finally:
        await general.runner.cleanup()
        await mask.runner.cleanup()
