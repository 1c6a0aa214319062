"""Active health checks (GET the pool's `health_path`) and the mask pool's vocabulary size.

An endpoint's first answer decides its state at once (so a gateway starting next to a dead
endpoint never routes to it); after that it turns unhealthy after `unhealthy_threshold`
failed checks in a row and healthy again after `healthy_threshold` passing ones. Passive
ejection (a refused connection, see proxy/handler.py) marks an endpoint unhealthy directly;
these checks bring it back.

On the trained pool a passing check also polls the endpoint's weight version, through the
`VersionPoll` hook the caller passes (the RL wing's `weight_sync.poll_version`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import orjson

from maskgate.gateway.config import PoolConfig
from maskgate.gateway.pools.pool import Endpoint, Pool
from maskgate.gateway.state import GatewayState
from maskgate.gateway.upstream.client import UpstreamError

LOG = logging.getLogger("maskgate.health")

# Records a healthy trained-pool endpoint's weight version (state, pool, endpoint).
VersionPoll = Callable[[GatewayState, Pool, Endpoint], Awaitable[None]]


def record_check(ep: Endpoint, ok: bool, cfg: PoolConfig) -> bool:
    """Apply one check result; returns True when the endpoint's state changed."""
    if ep.healthy is None:
        ep.healthy = ok
        return True
    if ok:
        ep.health_fails = 0
        if not ep.healthy:
            ep.health_oks += 1
            if ep.health_oks >= cfg.healthy_threshold:
                ep.healthy, ep.health_oks = True, 0
                return True
        return False
    ep.health_oks = 0
    if ep.healthy:
        ep.health_fails += 1
        if ep.health_fails >= cfg.unhealthy_threshold:
            ep.healthy, ep.health_fails = False, 0
            return True
    return False


async def _get(state: GatewayState, ep: Endpoint, path: str) -> tuple[int, bytes]:
    """GET `path` on the endpoint: (status, body), all within `health_timeout_s`."""
    timeout = state.config.timeouts.health_timeout_s
    async with asyncio.timeout(timeout):
        resp = await state.client().request(ep.url, "GET", path, [], None, timeout_s=timeout)
        try:
            body = await resp.read()
        except BaseException:
            resp.close()
            raise
        resp.release()
        return resp.status, body


async def check_endpoint(
    state: GatewayState, pool: Pool, ep: Endpoint, poll_version: VersionPoll
) -> None:
    path = pool.cfg.health_path
    assert path is not None
    try:
        status, _ = await _get(state, ep, path)
        ok = status == 200
    except (UpstreamError, TimeoutError):
        ok = False
    if ep.removed:
        return
    if record_check(ep, ok, pool.cfg):
        LOG.info(
            "endpoint %s",
            "healthy" if ep.healthy else "unhealthy",
            extra={"pool": pool.name, "upstream": ep.url},
        )
    if ok and pool.trained:
        await poll_version(state, pool, ep)
    if ok and pool.name == "mask" and pool.vocab_size is None:
        pool.vocab_size = await fetch_vocab_size(state, ep)


async def fetch_vocab_size(state: GatewayState, ep: Endpoint) -> int | None:
    """`vocab_size` from SGLang's `GET /get_model_info`; None when the server does not say."""
    try:
        status, body = await _get(state, ep, "/get_model_info")
        info = orjson.loads(body) if status == 200 else None
    except (UpstreamError, TimeoutError, orjson.JSONDecodeError):
        return None
    size = info.get("vocab_size") if isinstance(info, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        LOG.info("vocab size %d", size, extra={"upstream": ep.url})
        return size
    return None


async def check_all(state: GatewayState, poll_version: VersionPoll) -> None:
    checks = [
        check_endpoint(state, pool, ep, poll_version)
        for pool in state.pools.values()
        if pool.cfg.health_path is not None
        for ep in pool.endpoints
    ]
    await asyncio.gather(*checks)


async def health_loop(state: GatewayState, poll_version: VersionPoll) -> None:
    while True:
        try:
            await check_all(state, poll_version)
            live = {ep.url for pool in state.pools.values() for ep in pool.endpoints}
            state.client().sweep(live)
        except Exception:  # a bug here must not stop health checking for good
            LOG.exception("health check round failed")
        state.started = True
        await asyncio.sleep(state.config.timeouts.health_interval_s)
