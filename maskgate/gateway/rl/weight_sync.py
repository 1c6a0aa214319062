"""The fleet-wide weight sync of the trained pool, and the endpoint versions it relies on.

A weight update sent to the gateway (`/update_weights_from_disk`, `_distributed`, `_tensor`)
runs on every endpoint of the trained pool. By default (`control.pause_mode: none`), as an
SGLang engine does with an update sent to it, in-flight requests are not aborted:

    hold the pool's admission -> the update itself -> check the version (set it where the
    update did not) -> mark the ones that failed stale -> admit again

With a pause mode (`abort`, `retract`, `in_place`) every endpoint is paused and flushed
(retried while busy) before the update, and continued after it.

When the trainer has paused the pool itself (`/pause_generation` on the gateway; needed when
one sync is several update calls, such as bucketed broadcasts), only the update and the
version check run: the pause, and the hold, stay the trainer's until `/continue_generation`.

A sync that changed nothing (every endpoint refused it with a 4xx, or never got it) leaves
the pool as it was: the old version, nothing stale. Otherwise the pool takes the new
version, and endpoints that failed, or were out of the pool (unhealthy) during it, are
stale: they serve nothing until they report the pool's version (polled with the health
checks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from maskgate.gateway.pools.pool import Endpoint, Pool
from maskgate.gateway.pools.versions import at_least, normalize
from maskgate.gateway.rl.fanout import Reply, call, fan_out
from maskgate.gateway.rl.holds import PoolControl
from maskgate.gateway.state import GatewayState

LOG = logging.getLogger("maskgate.control")
_READ_TIMEOUT_S = 5.0  # reading an endpoint's version


async def read_version(state: GatewayState, url: str) -> tuple[bool, str | None]:
    """(answered, version) from `/model_info`, else the older `/get_weight_version`."""
    for path in ("/model_info", "/get_weight_version"):
        reply = await call(state, url, "GET", path, None, _READ_TIMEOUT_S)
        data = reply.json()
        if reply.status == 200 and isinstance(data, dict) and "weight_version" in data:
            return True, normalize(data["weight_version"])
    return False, None


def set_version(state: GatewayState, pool: Pool, ep: Endpoint, version: str | None) -> None:
    ep.weight_version = version
    state.metrics.set_endpoint_version(pool.name, ep.url, version)


async def poll_version(state: GatewayState, pool: Pool, ep: Endpoint) -> None:
    """Health-check hook for the trained pool: record the endpoint's version; a stale one
    serves again once it reports the pool's, and a fresh one reporting an older version (a
    restarted worker) goes stale."""
    if pool.mirrored:
        return  # another gateway process owns this state (leader.py)
    epoch = pool.sync_epoch
    answered, version = await read_version(state, ep.url)
    if not answered or ep.removed or epoch != pool.sync_epoch:
        return  # a sync started meanwhile: it decides this endpoint's state
    set_version(state, pool, ep, version)
    if pool.version is None:
        return
    current = at_least(version, pool.version)
    if ep.stale and ep.rejoin and current:
        ep.stale = False
    elif not ep.stale and not current:
        ep.stale, ep.rejoin = True, True


def _body(raw: bytes) -> dict[str, Any]:
    data = orjson.loads(raw)
    assert isinstance(data, dict), "validated by the handler"
    return data


async def _flush(state: GatewayState, url: str) -> Reply:
    """`/flush_cache` until it answers 2xx (it refuses while requests still run)."""
    cfg = state.config.control
    reply = await call(state, url, "POST", "/flush_cache", None, cfg.timeout_s)
    for _ in range(cfg.flush_attempts - 1):
        if reply.ok or reply.status is None or reply.status >= 500:
            break
        await asyncio.sleep(cfg.flush_interval_s)
        reply = await call(state, url, "POST", "/flush_cache", None, cfg.timeout_s)
    return reply


async def _update_one(
    state: GatewayState, url: str, path: str, raw: bytes, target: str | None, flush: bool
) -> tuple[str | None, Reply]:
    """(failed stage or None, the last reply) for one endpoint: flush, update, version."""
    timeout = state.config.control.timeout_s
    if flush:
        reply = await _flush(state, url)
        if not reply.ok:
            return "flush", reply
    reply = await call(state, url, "POST", path, raw, timeout)
    if not reply.ok or target is None:
        return (None if reply.ok else "update"), reply
    answered, version = await read_version(state, url)
    if answered and version == target:
        return None, reply
    body = orjson.dumps({"new_version": target, "abort_all_requests": False})
    set_reply = await call(state, url, "POST", "/update_weight_version", body, timeout)
    return (None, reply) if set_reply.ok else ("version", set_reply)


async def run_update(
    state: GatewayState, ctl: PoolControl, kind: str, path: str, raw: bytes
) -> list[dict[str, Any]]:
    """One weight update over the pool; the per-endpoint results (see module doc)."""
    pool = ctl.pool
    body = _body(raw)
    target = normalize(body.get("weight_version"))
    group = body.get("group_name", "weight_update_group") if kind == "distributed" else None
    started = time.perf_counter()
    done: dict[str, Reply] = {}
    failed: dict[str, tuple[str, Reply]] = {}
    async with ctl.lock:
        pool.sync_epoch += 1
        members = ctl.groups.get(group) if group is not None else None
        if members is not None:  # a broadcast needs every rank of the group, healthy or not
            urls = list(members)
        else:
            urls = [ep.url for ep in pool.endpoints if ep.healthy is not False]
        skipped = [ep for ep in pool.endpoints if ep.url not in urls]
        wrap = not ctl.paused
        pause = wrap and state.config.control.pause_mode != "none"
        if wrap:
            ctl.hold("sync")
            await ctl.shared()  # no process sends new requests into a pool being updated
        try:
            targets = await _pause(state, urls, failed) if pause else urls
            outcomes = await asyncio.gather(
                *(_update_one(state, u, path, raw, target, pause) for u in targets)
            )
            for url, (stage, reply) in zip(targets, outcomes, strict=True):
                if stage is None:
                    done[url] = reply
                else:
                    failed[url] = (stage, reply)
            changed = _apply(state, pool, done, failed, skipped, target)
            # Every process knows the new version and which endpoints are stale before any
            # endpoint generates again.
            await ctl.shared()
            if pause:
                await _continue(state, pool, urls, done, failed, target if changed else None)
        finally:
            if wrap:
                ctl.unhold("sync")
    _report(state, pool, kind, target, done, failed, len(urls), wrap, started)
    return _results(urls, done, failed, skipped, target)


async def _pause(state: GatewayState, urls: list[str], failed: dict[str, Any]) -> list[str]:
    """Pause every endpoint; the ones that paused (the others are recorded in `failed`)."""
    cfg = state.config.control
    mode = orjson.dumps({"mode": cfg.pause_mode})
    for reply in await fan_out(state, urls, "POST", "/pause_generation", mode, cfg.timeout_s):
        if not reply.ok:
            failed[reply.url] = ("pause", reply)
    return [u for u in urls if u not in failed]


async def _continue(
    state: GatewayState,
    pool: Pool,
    urls: list[str],
    done: dict[str, Reply],
    failed: dict[str, tuple[str, Reply]],
    target: str | None,
) -> None:
    """Continue every endpoint paused for the sync; an updated one whose continue fails is
    ejected (it would stay paused)."""
    timeout = state.config.control.timeout_s
    eps = {ep.url: ep for ep in pool.endpoints}
    for reply in await fan_out(state, urls, "POST", "/continue_generation", b"{}", timeout):
        if not reply.ok and reply.url in done:
            failed[reply.url] = ("continue", done.pop(reply.url))
            state.metrics.sync_endpoint_failures.labels(pool.name, "continue").inc()
            ep = eps.get(reply.url)
            if ep is not None and not ep.removed:
                ep.stale, ep.rejoin = True, target is not None


def _report(
    state: GatewayState,
    pool: Pool,
    kind: str,
    target: str | None,
    done: dict[str, Reply],
    failed: dict[str, tuple[str, Reply]],
    count: int,
    wrap: bool,
    started: float,
) -> None:
    elapsed = time.perf_counter() - started
    state.metrics.sync_duration.labels(pool.name, kind).observe(elapsed)
    extra = {"pool": pool.name}
    if failed:
        state.metrics.sync_failures.labels(pool.name, kind).inc()
        for url, (stage, reply) in failed.items():
            LOG.warning(
                "weight sync failed at %s: %s",
                stage,
                reply.message(),
                extra={**extra, "upstream": url},
            )
    LOG.info(
        "weight sync (%s) to version %s: %d of %d endpoints in %.3f s%s",
        kind,
        target,
        len(done),
        count,
        elapsed,
        "" if wrap else " (pool paused by the trainer)",
        extra=extra,
    )


def _results(
    urls: list[str],
    done: dict[str, Reply],
    failed: dict[str, tuple[str, Reply]],
    skipped: list[Endpoint],
    target: str | None,
) -> list[dict[str, Any]]:
    results = [done[u].result(stage="done", weight_version=target) for u in urls if u in done]
    results += [failed[u][1].result(stage=failed[u][0]) for u in urls if u in failed]
    for res in results:
        if res["stage"] != "done":
            res["success"] = False
    results += [
        {
            "url": ep.url,
            "status": None,
            "success": False,
            "skipped": True,
            "stage": "skipped",
            "message": "unhealthy or outside the update group: out of rotation until it "
            "reports the pool's weight version",
        }
        for ep in skipped
    ]
    return results


def accepted(stage: str, reply: Reply) -> bool:
    """Whether an endpoint that failed a sync at `stage` may have changed its weights: it got
    the update and did not refuse it with a 4xx (SGLang, like our worker, keeps or rolls back
    to the old weights when it answers an update with an error status)."""
    if stage in ("version", "continue"):
        return True  # the update itself succeeded
    if stage != "update":
        return False  # failed before the update was sent (pause, flush)
    if reply.status is None:
        return reply.reached  # no answer: it may have loaded them; no connection: it did not
    return reply.status >= 500


def _apply(
    state: GatewayState,
    pool: Pool,
    done: dict[str, Reply],
    failed: dict[str, tuple[str, Reply]],
    skipped: list[Endpoint],
    target: str | None,
) -> bool:
    """Versions and rotation after a sync, before any held request is admitted. False (and
    nothing changed) when no endpoint may have changed its weights."""
    for stage, _ in failed.values():
        state.metrics.sync_endpoint_failures.labels(pool.name, stage).inc()
    if not done and not any(accepted(stage, reply) for stage, reply in failed.values()):
        return False
    if target is not None:
        pool.version = target
    eps = {ep.url: ep for ep in pool.endpoints}
    for url in done:
        ep = eps.get(url)
        if ep is not None and not ep.removed:
            ep.stale, ep.rejoin = False, True
            if target is not None:
                set_version(state, pool, ep, target)
    stale = [eps[u] for u in failed if u in eps] + skipped
    for ep in stale:
        ep.stale = True
        # Without a version there is nothing an endpoint could report to prove it caught
        # up: only a later sync that succeeds on it (or registering it again) brings it back.
        ep.rejoin = target is not None
    return True
