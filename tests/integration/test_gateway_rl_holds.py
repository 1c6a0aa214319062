"""The trained pool's holds and a sync's effect on in-flight requests: an update with no pause
before it leaves them running (SGLang's default), a configured pause mode aborts them; an
update an endpoint accepted and then failed ejects it; every hold has a deadline;
`/continue_generation` lifts any hold; a refused or unreachable pause or release leaves none."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes.bodies import MASK_GEN

pytestmark = pytest.mark.integration

DISK = "/update_weights_from_disk"
SYNC = {"model_path": "/ckpt/1", "weight_version": "1"}


def trained(urls: list[str], make_config, **control: Any):
    return make_config(urls, urls, control={"flush_interval_s": 0.01, **control})


async def test_an_update_without_a_pause_leaves_in_flight_requests_running(
    workers, gateway, make_config, until
):
    a = await workers(name="a", generate_s=0.4)
    async with gateway(trained([a.url], make_config)) as gw:
        running = asyncio.create_task(gw.post("/generate", MASK_GEN))
        await until(lambda: bool(a.bodies("/generate")))
        status, body, _ = await gw.post(DISK, SYNC)
        assert status == 200, body
        assert a.paths() == ["/generate", DISK]  # no pause, no flush, no abort
        status, out, _ = await running
        # It ran to its end, crossing the update (SGLang's default for an update).
        assert (status, out["meta_info"]["finish_reason"]) == (200, {"type": "length"})
        assert out["meta_info"]["weight_version"] == "1"


async def test_a_pause_mode_pauses_flushes_and_aborts_around_the_update(
    workers, gateway, make_config, until
):
    a = await workers(name="a", generate_s=5.0)
    async with gateway(trained([a.url], make_config, pause_mode="abort")) as gw:
        running = asyncio.create_task(gw.post("/generate", MASK_GEN))
        await until(lambda: bool(a.bodies("/generate")))
        status, body, _ = await gw.post(DISK, SYNC)
        assert status == 200, body
        assert a.paths() == [
            "/generate",
            "/pause_generation",
            "/flush_cache",
            DISK,
            "/continue_generation",
        ]
        assert a.bodies("/pause_generation") == [{"mode": "abort"}]
        status, out, _ = await running
        assert (status, out["meta_info"]["finish_reason"]) == (200, {"type": "abort"})


@pytest.mark.parametrize("failure", ["status_500", "timeout"])
async def test_an_update_accepted_then_failed_ejects_the_endpoint(
    workers, gateway, make_config, until, failure
):
    if failure == "status_500":
        b = await workers(name="b", fail_update=True, fail_status=500)
        control: dict[str, Any] = {}
    else:
        b = await workers(name="b", update_delay_s=2.0)
        control = {"timeout_s": 0.3}
    async with gateway(trained([b.url], make_config, **control)) as gw:
        pool = gw.state.pools["mask"]
        await until(lambda: pool.endpoints[0].weight_version == "0")
        status, body, _ = await gw.post(DISK, SYNC)
        assert (status, body["error"]["code"]) == (502, "weight_sync_failed")
        # b may hold the new weights, or half of them: out until it reports version 1.
        assert pool.version == "1"
        assert pool.endpoints[0].stale and pool.endpoints[0].rejoin
        status, out, _ = await gw.post("/generate", MASK_GEN)
        assert (status, out["error"]["code"]) == (503, "mask_pool_unavailable")


async def test_every_hold_expires_at_its_deadline(workers, gateway, make_config, until):
    a = await workers(name="a")
    async with gateway(trained([a.url], make_config, hold_deadline_s=0.3)) as gw:
        pool = gw.state.pools["mask"]
        for hold, resume in (
            ("/pause_generation", "/continue_generation"),
            ("/release_memory_occupation", "/resume_memory_occupation"),
        ):
            assert (await gw.post(hold, {}))[0] == 200
            held = asyncio.create_task(gw.post("/generate", MASK_GEN))
            await until(lambda: pool.admission.depth == 1)
            # Past the deadline the gateway resumes the endpoint itself, then admits.
            status, out, _ = await held
            assert status == 200, out
            assert a.paths()[-2:] == [resume, "/generate"]
            assert not pool.admission.held
        text = await gw.metrics()
        assert 'maskgate_control_hold_expired_total{reason="paused"} 1.0' in text
        assert 'maskgate_control_hold_expired_total{reason="released"} 1.0' in text


async def test_continue_lifts_every_hold(workers, gateway, make_config):
    a = await workers(name="a")
    async with gateway(trained([a.url], make_config)) as gw:
        ctl_pool = gw.state.pools["mask"]
        assert (await gw.post("/release_memory_occupation", {}))[0] == 200
        assert (await gw.post("/pause_generation", {}))[0] == 200
        assert ctl_pool.admission.held
        assert (await gw.post("/continue_generation", {}))[0] == 200
        assert not ctl_pool.admission.held
        # With no endpoint left to reach, a continue still lifts the gateway's hold.
        assert (await gw.post("/pause_generation", {}))[0] == 200
        ctl_pool.endpoints[0].healthy = False
        status, body, _ = await gw.post("/continue_generation", {})
        assert (status, body["error"]["code"]) == (503, "no_trained_endpoints")
        assert not ctl_pool.admission.held


async def test_a_refused_or_unreachable_hold_leaves_no_hold(workers, gateway, make_config):
    a = await workers(name="a", fail_release=True)
    async with gateway(trained([a.url], make_config)) as gw:
        pool = gw.state.pools["mask"]
        status, body, _ = await gw.post("/release_memory_occupation", {})
        assert (status, body["error"]["code"]) == (400, "control_failed")
        assert not pool.admission.held
        a.fail_pause = True
        status, body, _ = await gw.post("/pause_generation", {})
        assert (status, body["error"]["code"]) == (502, "control_failed")
        assert not pool.admission.held
        pool.endpoints[0].healthy = False
        for path in ("/pause_generation", "/release_memory_occupation"):
            status, body, _ = await gw.post(path, {})
            assert (status, body["error"]["code"]) == (503, "no_trained_endpoints")
            assert not pool.admission.held
        pool.endpoints[0].healthy = True
        assert (await gw.post("/generate", MASK_GEN))[0] == 200
