"""The control state one gateway process publishes and the others copy (leader.py).

A snapshot is plain JSON: per pool, its weight version and every endpoint (URL, how it was
added, stale, rejoin, last reported version); the trained pool's holds; the weight-update
groups. Endpoints found by DNS are not copied (every process resolves the same names
itself), but their stale flags and versions are.
"""

from __future__ import annotations

import asyncio
from typing import Any

from maskgate.gateway.pools.health import check_endpoint
from maskgate.gateway.pools.pool import Endpoint
from maskgate.gateway.rl.holds import PoolControl
from maskgate.gateway.rl.weight_sync import poll_version, set_version
from maskgate.gateway.state import GatewayState

MIRROR_HOLD = "leader"  # the hold reason a follower uses for the leader's holds


def snapshot(state: GatewayState, ctl: PoolControl) -> dict[str, Any]:
    pools = {
        name: {
            "version": pool.version,
            "endpoints": [
                {
                    "url": ep.url,
                    "source": ep.source,
                    "stale": ep.stale,
                    "rejoin": ep.rejoin,
                    "weight_version": ep.weight_version,
                }
                for ep in pool.endpoints
            ],
        }
        for name, pool in state.pools.items()
    }
    return {"pools": pools, "holds": sorted(ctl.holds), "groups": ctl.groups}


async def apply(
    state: GatewayState, ctl: PoolControl, snap: dict[str, Any], *, holds: bool = True
) -> None:
    """Make this process's pools match `snap`. Endpoints new here get their first health
    check before this returns, so they route as soon as the snapshot counts as applied.
    `holds` False (a leader restoring a dead leader's state): the holds are not copied
    (leader.py takes over the trainer's own)."""
    new: list[tuple[Any, Endpoint]] = []
    for name, data in snap["pools"].items():
        pool = state.pools.get(name)
        if pool is None:
            continue
        pool.version = data["version"]
        listed = set()
        for item in data["endpoints"]:
            url = item["url"]
            listed.add(url)
            ep = next((e for e in pool.endpoints if e.url == url), None)
            if ep is None:
                if item["source"] == "dns":
                    continue  # this process's own DNS lookups add it
                ep = pool.add(url, item["source"], gated=True)
                if ep is None:
                    continue
                new.append((pool, ep))
            ep.stale, ep.rejoin = bool(item["stale"]), bool(item["rejoin"])
            if ep.weight_version != item["weight_version"]:
                set_version(state, pool, ep, item["weight_version"])
        for ep in pool.endpoints:
            if ep.source != "dns" and ep.url not in listed:
                pool.remove(ep.url)
    checked = [
        check_endpoint(state, p, ep, poll_version) for p, ep in new if p.cfg.health_path is not None
    ]
    if checked:
        await asyncio.gather(*checked)
    ctl.groups = {str(k): list(v) for k, v in snap.get("groups", {}).items()}
    if not holds:
        return
    if snap["holds"] and MIRROR_HOLD not in ctl.holds:
        ctl.hold(MIRROR_HOLD)
    elif not snap["holds"] and MIRROR_HOLD in ctl.holds:
        ctl.unhold(MIRROR_HOLD)
