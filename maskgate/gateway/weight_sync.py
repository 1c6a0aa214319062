"""The fleet-wide weight sync of the trained pool, and the endpoint versions it relies on.

A weight update sent to the gateway (`/update_weights_from_disk`, `_distributed`, `_tensor`)
runs on every endpoint of the trained pool:

    hold the pool's admission -> pause every endpoint -> flush (retried while busy)
    -> the update itself -> check the version (set it where the update did not)
    -> mark the ones that failed stale -> continue every endpoint -> admit again

When the trainer has paused the pool itself (`/pause_generation` on the gateway; needed when
one sync is several update calls, such as bucketed broadcasts), only the update and the
version check run: the pause, and the hold, stay the trainer's until `/continue_generation`.

Endpoints that failed, or were out of the pool (unhealthy) during it, are stale: they serve
nothing until they report the pool's version (polled with the health checks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from maskgate.gateway.fanout import Reply, call, fan_out
from maskgate.gateway.pool import Endpoint, Pool
from maskgate.gateway.state import GatewayState
from maskgate.gateway.versions import at_least, normalize

LOG = logging.getLogger("maskgate.control")
_READ_TIMEOUT_S = 5.0  # reading an endpoint's version


@dataclass(eq=False)
class PoolControl:
    """The control-plane state of the trained pool."""

    pool: Pool
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one state change at a time
    holds: set[str] = field(default_factory=set)  # "sync", "paused", "released"
    groups: dict[str, list[str]] = field(default_factory=dict)  # group -> urls by rank
    # Several gateway processes (leader.py): publishes this state to every other process and
    # waits until each has applied it. None in a single-process gateway.
    barrier: Callable[[], Awaitable[None]] | None = None

    @property
    def paused(self) -> bool:
        return "paused" in self.holds

    def hold(self, reason: str) -> None:
        self.holds.add(reason)
        self.pool.admission.hold()

    def unhold(self, reason: str) -> None:
        self.holds.discard(reason)
        if not self.holds:
            self.pool.admission.resume()

    async def shared(self) -> None:
        """Return once every gateway process routes by the state as it is now."""
        if self.barrier is not None:
            await self.barrier()


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
    async with ctl.lock:
        pool.sync_epoch += 1
        members = ctl.groups.get(group) if group is not None else None
        eps = {ep.url: ep for ep in pool.endpoints}
        if members is not None:  # a broadcast needs every rank of the group, healthy or not
            urls = list(members)
        else:
            urls = [ep.url for ep in pool.endpoints if ep.healthy is not False]
        skipped = [ep for ep in pool.endpoints if ep.url not in urls]
        wrap = not ctl.paused
        failed: dict[str, tuple[str, Reply]] = {}
        if wrap:
            ctl.hold("sync")
            await ctl.shared()  # no process sends new requests into a pool being paused
        try:
            targets = urls
            if wrap:
                mode = orjson.dumps({"mode": state.config.control.pause_mode})
                timeout = state.config.control.timeout_s
                for reply in await fan_out(state, urls, "POST", "/pause_generation", mode, timeout):
                    if not reply.ok:
                        failed[reply.url] = ("pause", reply)
                targets = [u for u in urls if u not in failed]
            outcomes = await asyncio.gather(
                *(_update_one(state, u, path, raw, target, wrap) for u in targets)
            )
            done: dict[str, Reply] = {}
            for url, (stage, reply) in zip(targets, outcomes, strict=True):
                if stage is None:
                    done[url] = reply
                else:
                    failed[url] = (stage, reply)
            _apply(state, pool, eps, done, failed, skipped, target)
            # Every process knows the new version and which endpoints are stale before any
            # endpoint generates again.
            await ctl.shared()
            if wrap:
                timeout = state.config.control.timeout_s
                for reply in await fan_out(
                    state, urls, "POST", "/continue_generation", b"{}", timeout
                ):
                    if not reply.ok and reply.url in done:
                        failed[reply.url] = ("continue", done.pop(reply.url))
                        _eject(state, pool, eps.get(reply.url), "continue", target)
        finally:
            if wrap:
                ctl.unhold("sync")
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
        len(urls),
        elapsed,
        "" if wrap else " (pool paused by the trainer)",
        extra=extra,
    )
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


def _eject(
    state: GatewayState, pool: Pool, ep: Endpoint | None, stage: str, target: str | None
) -> None:
    """An endpoint that failed after the versions were applied (its continue)."""
    state.metrics.sync_endpoint_failures.labels(pool.name, stage).inc()
    if ep is not None and not ep.removed:
        ep.stale, ep.rejoin = True, target is not None


def _apply(
    state: GatewayState,
    pool: Pool,
    eps: dict[str, Endpoint],
    done: dict[str, Reply],
    failed: dict[str, tuple[str, Reply]],
    skipped: list[Endpoint],
    target: str | None,
) -> None:
    """Versions and rotation after a sync, before any held request is admitted."""
    if target is not None:
        pool.version = target
    for stage, _ in failed.values():
        state.metrics.sync_endpoint_failures.labels(pool.name, stage).inc()
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
