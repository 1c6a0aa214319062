"""The control leader and its followers in one test process (leader.py): forwarding, the
state copy with its acks, and a follower without a leader."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from fakes.bodies import MASK_GEN

from maskgate.gateway.app import LEADER, create_app
from maskgate.gateway.cluster import leader
from maskgate.gateway.cluster.leader import Cluster, start_leader_sites
from maskgate.gateway.config import GatewayConfig
from maskgate.gateway.rl.control import CONTROL
from maskgate.gateway.state import STATE, GatewayState

pytestmark = pytest.mark.integration

KEY = "admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def directory() -> Any:
    path = tempfile.mkdtemp(prefix="mg-")  # unix socket paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Process:
    def __init__(self, app: web.Application, url: str, client: aiohttp.ClientSession) -> None:
        self.app, self.url, self.client = app, url, client

    @property
    def state(self) -> GatewayState:
        return self.app[STATE]

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = orjson.dumps(body) if body is not None else None
        async with self.client.request(method, self.url + path, data=data, headers=AUTH) as resp:
            raw = await resp.read()
            return resp.status, orjson.loads(raw) if raw else None


@contextlib.asynccontextmanager
async def process(config: GatewayConfig, cluster: Cluster) -> AsyncIterator[Process]:
    app = create_app(config, cluster=cluster)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    sockets = None
    if LEADER in app:
        sockets = await start_leader_sites(app[LEADER], runner, None)
    try:
        async with aiohttp.ClientSession() as client:
            yield Process(app, f"http://127.0.0.1:{port}", client)
    finally:
        await runner.cleanup()
        if sockets is not None:
            await sockets.cleanup()


def config_for(
    make_config: Callable[..., GatewayConfig], urls: list[str], **overrides: Any
) -> GatewayConfig:
    """No trusted network: the admin key is what opens control here."""
    return make_config(
        urls,
        urls,
        admin_key=KEY,
        control={"flush_interval_s": 0.01},
        **{"trusted_networks": [], **overrides},
    )


async def test_follower_forwards_control_and_copies_the_state(
    workers, make_config, until, directory
):
    a, b = await workers(name="a"), await workers(name="b", fail_update=True)
    config = config_for(make_config, [a.url, b.url])
    async with (
        process(config, Cluster(directory, 0, 2)) as lead,
        process(config, Cluster(directory, 1, 2)) as follower,
    ):
        mask = follower.state.pools["mask"]
        assert mask.mirrored and not lead.state.pools["mask"].mirrored
        await until(lambda: not mask.admission.held)  # the first copy arrived
        body = {"model_path": "/ckpt/1", "weight_version": "1"}
        status, out = await follower.call("POST", "/update_weights_from_disk", body)
        assert status == 502, out  # the leader's answer, relayed
        assert {r["url"]: r["stage"] for r in out["endpoints"]} == {a.url: "done", b.url: "update"}
        # The sync returned only after the follower applied it (the barrier).
        by_url = {ep.url: ep for ep in mask.endpoints}
        assert mask.version == "1"
        assert (by_url[a.url].stale, by_url[b.url].stale) == (False, True)
        assert by_url[a.url].weight_version == "1"
        lead_obj = lead.app[LEADER]
        assert lead_obj.acks[1] == lead_obj.generation
        for _ in range(6):
            status, out = await follower.call("POST", "/generate", MASK_GEN)
            assert (status, out["worker"]) == (200, "a")
        # A key the leader refuses is refused for the follower too.
        async with follower.client.post(
            follower.url + "/pause_generation", json={}, headers={"Authorization": "Bearer x"}
        ) as resp:
            assert resp.status == 401
        # Registration through the follower reaches both.
        c = await workers(name="c")
        status, out = await follower.call("POST", f"/add_worker?url={c.url}")
        assert status == 200, out
        for proc in (lead, follower):
            assert c.url in [ep.url for ep in proc.state.pools["mask"].endpoints]
        status, out = await follower.call("POST", "/pause_generation", {})
        assert status == 200, out
        assert mask.admission.held  # held before any endpoint was paused
        status, out = await follower.call("POST", "/continue_generation", {})
        assert status == 200, out
        assert not mask.admission.held
        # A GET that changes state is published before it answers, like a POST.
        status, out = await follower.call("GET", "/release_memory_occupation")
        assert status == 200, out
        assert mask.admission.held
        status, out = await follower.call("GET", "/resume_memory_occupation")
        assert status == 200, out
        assert not mask.admission.held


async def test_follower_without_a_leader(workers, make_config, until, directory, monkeypatch):
    monkeypatch.setattr(leader, "_LOST_S", 0.3)
    a = await workers(name="a")
    config = config_for(make_config, [a.url])
    async with process(config, Cluster(directory, 1, 2)) as follower:
        for method, path in (("POST", "/pause_generation"), ("GET", "/model_info")):
            status, out = await follower.call(method, path, {} if method == "POST" else None)
            assert status == 503, out
            assert out["error"]["code"] == "control_leader_unavailable"
        mask = follower.state.pools["mask"]
        assert mask.admission.held  # no copy yet: nothing routes on the trained pool
        await until(lambda: not mask.admission.held)  # the leader is lost: holds released
        status, out = await follower.call("POST", "/generate", MASK_GEN)
        assert (status, out["worker"]) == (200, "a")
        assert follower.state.metrics.control_leader_lost._value.get() == 1


async def test_a_fresh_leaders_state_is_valid_json(make_config, directory):
    config = config_for(make_config, [])
    async with process(config, Cluster(directory, 0, 2)):
        connector = aiohttp.UnixConnector(path=Cluster(directory, 0, 2).socket("leader.sock"))
        async with aiohttp.ClientSession(connector=connector) as session:
            # A follower that copied another leader: another boot, a later generation.
            params = {"index": "1", "boot": "an-old-boot", "generation": "7"}
            async with session.get("http://leader/state", params=params) as resp:
                assert resp.status == 200
                data = orjson.loads(await resp.read())
    assert data["generation"] >= 1 and data["state"]["holds"] == []
    assert set(data["state"]["pools"]) == {"general", "mask"}


async def test_a_trainers_pause_survives_a_leader_restart(
    workers, make_config, until, directory, monkeypatch
):
    monkeypatch.setattr(leader, "_LOST_S", 0.2)
    a = await workers(name="a")
    config = config_for(make_config, [a.url])
    async with process(config, Cluster(directory, 1, 2)) as follower:
        mask = follower.state.pools["mask"]
        async with process(config, Cluster(directory, 0, 2)) as lead:
            await until(lambda: not mask.admission.held)
            status, out = await lead.call("POST", "/pause_generation", {})
            assert status == 200, out
            assert mask.admission.held and a.paused
        # The leader is gone: the follower keeps holding, since a's generation is paused.
        await until(lambda: follower.state.metrics.control_leader_lost._value.get() == 1)
        assert mask.admission.held
        async with process(config, Cluster(directory, 0, 2)) as lead:
            assert lead.state.pools["mask"].admission.held  # restored from state.json
            assert "paused" in lead.app[CONTROL].holds
            status, out = await follower.call("POST", "/continue_generation", {})
            assert status == 200, out
            assert not a.paused
            assert not mask.admission.held and not lead.state.pools["mask"].admission.held
            status, out = await follower.call("POST", "/generate", MASK_GEN)
            assert (status, out["worker"]) == (200, "a")


@pytest.mark.parametrize(
    ("networks", "status"),
    [(["127.0.0.0/8"], 200), (["10.0.0.0/8"], 401)],
)
async def test_the_leader_judges_the_callers_address_not_the_followers(
    workers, make_config, until, directory, networks, status
):
    """A follower forwards with the address it saw; a client's own `X-Maskgate-Peer` is
    replaced, and the header counts only on the leader's private unix socket."""
    a = await workers(name="a")
    config = config_for(make_config, [a.url], trusted_networks=networks)
    spoof = {"X-Maskgate-Peer": "10.1.2.3"}
    async with (
        process(config, Cluster(directory, 0, 2)) as lead,
        process(config, Cluster(directory, 1, 2)) as follower,
    ):
        await until(lambda: not follower.state.pools["mask"].admission.held)
        for proc in (follower, lead):  # no key: only the caller's address (127.0.0.1) counts
            async with proc.client.post(
                proc.url + "/pause_generation", json={}, headers=spoof
            ) as resp:
                assert resp.status == status, await resp.text()
            assert a.paused == (status == 200)
