"""The control state one gateway process copies from the leader (mirror.py), and the
leader's generations and barrier (leader.py), without any network."""

from __future__ import annotations

import asyncio
import os

import orjson

from maskgate.gateway.app import create_app
from maskgate.gateway.cluster import leader, mirror
from maskgate.gateway.cluster.leader import Cluster, Leader
from maskgate.gateway.config import GatewayConfig
from maskgate.gateway.rl.control import CONTROL
from maskgate.gateway.rl.holds import PoolControl
from maskgate.gateway.state import STATE, GatewayState

A, B, C = "http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"


def process() -> tuple[GatewayState, PoolControl]:
    pools = {
        "general": {"endpoints": [A], "health_path": None},
        "mask": {"endpoints": [A, B], "health_path": None},
    }
    app = create_app(GatewayConfig.model_validate({"pools": pools}))
    return app[STATE], app[CONTROL]


async def test_apply_copies_versions_stale_flags_endpoints_and_holds():
    lead, lead_ctl = process()
    follower, follower_ctl = process()
    mask = lead.pools["mask"]
    mask.version = "7"
    a, b = mask.endpoints
    a.weight_version, b.weight_version = "7", "6"
    b.stale, b.rejoin = True, False
    mask.add(C, "admin")
    mask.add("http://10.0.0.9:30000", "dns")
    lead.pools["general"].remove(A)
    lead_ctl.hold("sync")
    lead_ctl.groups["g"] = [A, B]

    snap = orjson.loads(orjson.dumps(mirror.snapshot(lead, lead_ctl)))  # as sent
    await mirror.apply(follower, follower_ctl, snap)

    copy = follower.pools["mask"]
    assert copy.version == "7"
    got = {ep.url: (ep.source, ep.stale, ep.rejoin, ep.weight_version) for ep in copy.endpoints}
    assert got == {
        A: ("static", False, True, "7"),
        B: ("static", True, False, "6"),
        C: ("admin", True, True, None),  # new after a sync: stale until it reports "7"
    }  # and no DNS-found endpoint: every process finds those by its own lookups
    assert follower.pools["general"].endpoints == []
    assert follower_ctl.groups == {"g": [A, B]}
    assert copy.admission.held and follower_ctl.holds == {mirror.MIRROR_HOLD}
    assert [p.usable() for p in copy.endpoints] == [True, False, False]

    lead_ctl.unhold("sync")
    mask.remove(C)
    await mirror.apply(follower, follower_ctl, mirror.snapshot(lead, lead_ctl))
    assert not copy.admission.held and not follower_ctl.holds
    assert [ep.url for ep in copy.endpoints] == [A, B]


async def test_a_restored_snapshot_takes_no_holds():
    lead, lead_ctl = process()
    fresh, fresh_ctl = process()
    lead.pools["mask"].version = "3"
    lead_ctl.hold("paused")
    await mirror.apply(fresh, fresh_ctl, mirror.snapshot(lead, lead_ctl), holds=False)
    assert fresh.pools["mask"].version == "3"
    assert not fresh.pools["mask"].admission.held


async def test_generations_the_state_file_and_the_barrier(tmp_path, monkeypatch):
    monkeypatch.setattr(leader, "_BARRIER_S", 0.05)
    state, ctl = process()
    lead = Leader(state, ctl, Cluster(str(tmp_path), 0, 2))
    first = lead.refresh()
    assert lead.refresh() == first  # nothing changed: same generation
    state.pools["mask"].version = "1"
    assert lead.refresh() == first + 1
    saved = orjson.loads((tmp_path / "state.json").read_bytes())
    assert saved["pools"]["mask"]["version"] == "1"
    assert not os.path.exists(tmp_path / "state.json.tmp")

    lead.acks[1] = lead.generation
    await lead.barrier()  # acknowledged already
    assert state.metrics.control_barrier_timeouts._value.get() == 0
    state.pools["mask"].version = "2"
    await lead.barrier()  # follower 1 never applies generation + 1: bounded wait
    assert state.metrics.control_barrier_timeouts._value.get() == 1

    waiter = asyncio.create_task(lead.barrier())
    await asyncio.sleep(0)
    lead.acks[1] = lead.generation
    lead._acked.set()
    await asyncio.wait_for(waiter, 1.0)
    assert state.metrics.control_barrier_timeouts._value.get() == 1
