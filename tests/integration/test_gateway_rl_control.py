"""The gateway as the RL control plane: fleet-wide weight sync, ejection of stale endpoints,
requests held behind a sync, min_weight_version routing, distributed init, registration."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fakes.bodies import MASK_GEN

pytestmark = pytest.mark.integration

DISK = "/update_weights_from_disk"
CONTROL = {"control": {"flush_interval_s": 0.01}}


async def get(gw, path: str, **kw: Any) -> tuple[int, Any]:
    async with gw.client.get(gw.url + path, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


def trained(config_pool: list[str], make_config, **overrides: Any):
    """A gateway whose trained (mask) pool is `config_pool`; general traffic goes there too."""
    return make_config(config_pool, config_pool, **{**CONTROL, **overrides})


@contextlib.asynccontextmanager
async def one_failing_worker(workers, gateway, make_config, until) -> AsyncIterator[tuple]:
    """A gateway (admin key sent) over workers a and b, where b fails every weight update;
    yields (gateway, mask pool, a, b) once both endpoints report version 0."""
    a, b = await workers(name="a"), await workers(name="b", fail_update=True)
    async with gateway(trained([a.url, b.url], make_config, admin_key="adm")) as gw:
        gw.client.headers["Authorization"] = "Bearer adm"
        pool = gw.state.pools["mask"]
        await until(lambda: all(ep.weight_version == "0" for ep in pool.endpoints))
        yield gw, pool, a, b


async def test_sync_runs_on_every_endpoint(workers, gateway, make_config, until):
    a, b = await workers(name="a"), await workers(name="b")
    async with gateway(trained([a.url, b.url], make_config)) as gw:
        pool = gw.state.pools["mask"]
        await until(lambda: all(ep.weight_version == "0" for ep in pool.endpoints))
        status, body, _ = await gw.post(DISK, {"model_path": "/ckpt/1", "weight_version": "1"})
        assert status == 200, body
        assert body["success"] is True
        assert {r["url"]: r["stage"] for r in body["endpoints"]} == {a.url: "done", b.url: "done"}
        for worker in (a, b):  # no pause around it: SGLang's default for an update
            assert worker.paths() == [DISK]
            assert worker.bodies(DISK) == [{"model_path": "/ckpt/1", "weight_version": "1"}]
            assert worker.version == "1"
        status, versions = await get(gw, "/get_weight_version")
        assert (status, versions["weight_version"], versions["pool_weight_version"]) == (
            200,
            "1",
            "1",
        )
        status, info = await get(gw, "/model_info")
        assert (info["model_path"], info["weight_version"], info["num_ranks"]) == (
            "fake-rl",
            "1",
            2,
        )
        assert info["weight_version_mixed"] is False
        for _ in range(4):
            status, out, _ = await gw.post("/generate", MASK_GEN)
            assert (status, out["meta_info"]["weight_version"]) == (200, "1")
        text = await gw.metrics()
        assert 'maskgate_weight_sync_duration_seconds_count{kind="disk",pool="mask"} 1.0' in text
        assert (
            f'maskgate_endpoint_weight_version{{pool="mask",upstream="{a.url}",version="1"}} 1.0'
            in text
        )
        assert 'version="0"' not in text  # the old version's series is gone


async def test_failed_endpoint_is_ejected_until_it_reports_the_version(
    workers, gateway, make_config, until
):
    async with one_failing_worker(workers, gateway, make_config, until) as (gw, pool, a, b):
        status, body, _ = await gw.post(DISK, {"model_path": "/ckpt/1", "weight_version": "1"})
        assert status == 502
        assert body["error"]["code"] == "weight_sync_failed"
        assert body["success"] is False
        results = {r["url"]: r for r in body["endpoints"]}
        assert (results[a.url]["success"], results[a.url]["stage"]) == (True, "done")
        assert (results[b.url]["success"], results[b.url]["stage"]) == (False, "update")
        assert "Rolling back" in results[b.url]["message"]
        before = len(b.bodies("/generate"))
        for _ in range(8):
            status, out, _ = await gw.post("/generate", MASK_GEN)
            assert (status, out["worker"], out["meta_info"]["weight_version"]) == (200, "a", "1")
        await asyncio.sleep(0.2)  # several health rounds: b still reports "0"
        assert len(b.bodies("/generate")) == before
        status, versions = await get(gw, "/get_weight_version")
        assert versions["weight_version"] == "1"  # what serving endpoints run
        assert {e["url"]: e["serving"] for e in versions["endpoints"]} == {
            a.url: True,
            b.url: False,
        }
        text = await gw.metrics()
        assert 'maskgate_weight_sync_failures_total{kind="disk",pool="mask"} 1.0' in text
        assert (
            'maskgate_weight_sync_endpoint_failures_total{pool="mask",stage="update"} 1.0' in text
        )
        assert f'maskgate_endpoint_weight_stale{{pool="mask",upstream="{b.url}"}} 1.0' in text

        # The trainer retries: the sync reaches the stale endpoint too, and it is back.
        b.fail_update = False
        status, body, _ = await gw.post(DISK, {"model_path": "/ckpt/1", "weight_version": "1"})
        assert status == 200, body
        seen = {(await gw.post("/generate", MASK_GEN))[1]["worker"] for _ in range(16)}
        assert seen == {"a", "b"}

        # A worker that restarts at an older version leaves the rotation by itself...
        b.version = "0"
        await until(lambda: pool.endpoints[1].stale)
        # ...and comes back once it reports the pool's version.
        b.version = "1"
        await until(lambda: not pool.endpoints[1].stale)


async def test_a_sync_every_endpoint_refused_leaves_the_pool_serving(
    workers, gateway, make_config, until
):
    a, b = await workers(name="a", fail_update=True), await workers(name="b", fail_update=True)
    async with gateway(trained([a.url, b.url], make_config)) as gw:
        pool = gw.state.pools["mask"]
        await gw.post("/update_weight_version", {"new_version": "3"})
        await until(lambda: all(ep.weight_version == "3" for ep in pool.endpoints))
        status, body, _ = await gw.post(DISK, {"model_path": "/nope", "weight_version": "4"})
        assert (status, body["error"]["code"]) == (400, "weight_sync_failed")
        assert pool.version == "3"
        assert [(ep.stale, ep.weight_version) for ep in pool.endpoints] == [(False, "3")] * 2
        for _ in range(4):  # the old weights keep serving
            status, out, _ = await gw.post("/generate", MASK_GEN)
            assert (status, out["meta_info"]["weight_version"]) == (200, "3")
        status, versions = await get(gw, "/get_weight_version")
        assert (versions["weight_version"], versions["pool_weight_version"]) == ("3", "3")
        # An integer version (SGLang's field is a string) is refused before anything is sent.
        calls = len(a.calls)
        for path, field in ((DISK, "weight_version"), ("/update_weight_version", "new_version")):
            status, body, _ = await gw.post(path, {"model_path": "/c", field: 5})
            assert (status, body["error"]["code"]) == (400, "invalid_weight_version"), path
        assert len(a.calls) == calls and pool.version == "3"
        # /update_weight_version refused by every endpoint: nothing changes either.
        a.refuse_version = b.refuse_version = True
        status, body, _ = await gw.post("/update_weight_version", {"new_version": "9"})
        assert (status, body["error"]["code"]) == (400, "weight_sync_failed")
        assert pool.version == "3" and not any(ep.stale for ep in pool.endpoints)
        status, body, _ = await gw.post(DISK, {"weight_version": "1"})
        assert (status, body["error"]["code"]) == (400, "missing_field")
        status, body, _ = await gw.post(DISK, b"[1]")
        assert (status, body["error"]["code"]) == (400, "invalid_request")


async def test_requests_during_a_sync_wait_and_get_the_new_version(
    workers, gateway, make_config, until
):
    a, b = await workers(name="a", update_delay_s=0.4), await workers(name="b", update_delay_s=0.4)
    async with gateway(trained([a.url, b.url], make_config)) as gw:
        pool = gw.state.pools["mask"]
        sync = asyncio.create_task(gw.post(DISK, {"model_path": "/ckpt/2", "weight_version": "2"}))
        await until(lambda: bool(a.bodies(DISK) and b.bodies(DISK)))
        requests = [asyncio.create_task(gw.post("/generate", MASK_GEN)) for _ in range(5)]
        await until(lambda: pool.admission.depth == 5)
        assert not any(t.done() for t in requests)
        assert (await sync)[0] == 200
        # None reached a worker while it was updating (the fake reports "0" until it is done).
        for status, out, _ in await asyncio.gather(*requests):
            assert (status, out["meta_info"]["weight_version"]) == (200, "2")
        text = await gw.metrics()
        assert 'maskgate_weight_sync_held_requests_total{pool="mask"} 5.0' in text


async def test_held_requests_obey_the_queue_bounds(workers, gateway, make_config, until):
    a = await workers(name="a", update_delay_s=0.8)
    pools = {"mask": {"endpoints": [a.url], "max_queue": 2, "queue_timeout_s": 0.3}}
    async with gateway(make_config([], [], pools=pools, **CONTROL)) as gw:
        sync = asyncio.create_task(gw.post(DISK, {"model_path": "/c", "weight_version": "3"}))
        await until(lambda: bool(a.bodies(DISK)))
        held = [asyncio.create_task(gw.post("/generate", MASK_GEN)) for _ in range(2)]
        await until(lambda: gw.state.pools["mask"].admission.depth == 2)
        status, body, _ = await gw.post("/generate", MASK_GEN)
        assert (status, body["error"]["code"]) == (429, "pool_overloaded")
        for status, body, _ in await asyncio.gather(*held):
            assert (status, body["error"]["code"]) == (503, "queue_timeout")
        assert (await sync)[0] == 200


async def test_min_weight_version_routing(workers, gateway, make_config, until):
    a, b = await workers(name="a", version="2"), await workers(name="b", version="1")
    async with gateway(trained([a.url, b.url], make_config)) as gw:
        pool = gw.state.pools["mask"]
        await until(lambda: [ep.weight_version for ep in pool.endpoints] == ["2", "1"])
        for _ in range(6):
            status, out, _ = await gw.post("/generate", {**MASK_GEN, "min_weight_version": "2"})
            assert (status, out["worker"]) == (200, "a")
            headers = {"X-Min-Weight-Version": "2"}
            status, out, _ = await gw.post("/generate", MASK_GEN, headers=headers)
            assert (status, out["worker"]) == (200, "a")
        assert all("min_weight_version" not in body for body in a.bodies("/generate"))
        status, out, _ = await gw.post("/generate", {**MASK_GEN, "min_weight_version": 10})
        assert (status, out["error"]["code"]) == (409, "weight_version_unavailable")
        status, out, _ = await gw.post("/generate", {**MASK_GEN, "min_weight_version": ["2"]})
        assert (status, out["error"]["code"]) == (400, "invalid_min_weight_version")
        status, versions = await get(gw, "/get_weight_version")
        assert versions["weight_version"] == "mixed"
        # Versions that are not integers match only themselves.
        a.version = "step-b"
        await until(lambda: pool.endpoints[0].weight_version == "step-b")
        status, out, _ = await gw.post("/generate", {**MASK_GEN, "min_weight_version": "step-a"})
        assert (status, out["error"]["code"]) == (409, "weight_version_unavailable")
        status, out, _ = await gw.post("/generate", {**MASK_GEN, "min_weight_version": "step-b"})
        assert (status, out["worker"]) == (200, "a")


async def test_distributed_init_and_trainer_paused_bucketed_sync(
    workers, gateway, make_config, until
):
    gate = asyncio.Event()
    a, b = await workers(name="a", init_gate=gate), await workers(name="b", init_gate=gate)
    async with gateway(trained([a.url, b.url], make_config)) as gw:
        status, world = await get(gw, "/get_world_size")
        assert (status, world["world_size"]) == (200, 2)
        init = {"master_address": "127.0.0.1", "master_port": 29500, "group_name": "g"}
        status, body, _ = await gw.post(
            "/init_weights_update_group", {**init, "rank_offset": 1, "world_size": 2}
        )
        assert (status, body["error"]["code"]) == (400, "world_size_mismatch")
        task = asyncio.create_task(
            gw.post("/init_weights_update_group", {**init, "rank_offset": 1, "world_size": 3})
        )
        # Both inits are in flight at once, and other traffic is not held meanwhile.
        await until(
            lambda: (
                a.bodies("/init_weights_update_group") and b.bodies("/init_weights_update_group")
            )
        )
        assert (await gw.post("/generate", MASK_GEN))[0] == 200
        gate.set()
        status, body, _ = await task
        assert status == 200, body
        assert a.groups["g"]["rank_offset"] == 1 and b.groups["g"]["rank_offset"] == 2
        assert a.groups["g"]["world_size"] == 3

        # A bucketed sync: the trainer pauses, sends two buckets, continues.
        assert (await gw.post("/pause_generation", {}))[0] == 200
        held = asyncio.create_task(gw.post("/generate", MASK_GEN))
        bucket = {"names": ["w"], "dtypes": ["float32"], "shapes": [[2]], "group_name": "g"}
        for _ in range(2):
            status, body, _ = await gw.post(
                "/update_weights_from_distributed", {**bucket, "weight_version": "5"}
            )
            assert status == 200, body
        assert not held.done()
        assert (await gw.post("/continue_generation", {}))[0] == 200
        status, out, _ = await held
        assert (status, out["meta_info"]["weight_version"]) == (200, "5")
        for worker in (a, b):  # no pause/flush of the gateway's own around the buckets
            assert worker.paths().count("/pause_generation") == 1
            assert "/flush_cache" not in worker.paths()
        status, body, _ = await gw.post("/destroy_weights_update_group", {"group_name": "g"})
        assert status == 200 and not a.groups and not b.groups


async def test_slime_style_registration_and_abort_all(workers, gateway, make_config, until):
    a, b = await workers(name="a"), await workers(name="b")
    # Registration is a control row: a framework on a trusted network (loopback by default)
    # registers and lists workers with no key at all, though keys are configured.
    config = make_config([], [], admin_key="adm", api_keys=["k"], **CONTROL)
    async with gateway(config) as gw:
        ids = []
        for worker in (a, b):
            status, body, resp = await gw.post(
                "/workers", {"url": worker.url, "worker_type": "regular"}
            )
            assert (status, body["status"], body["pool"]) == (202, "accepted", "mask")
            assert resp.headers["Location"] == f"/workers/{body['worker_id']}"
            ids.append(body["worker_id"])
        status, listed = await get(gw, "/workers")
        assert {w["url"]: w["id"] for w in listed["workers"]} == {a.url: ids[0], b.url: ids[1]}
        status, one = await get(gw, f"/workers/{ids[0]}")
        assert (status, one["url"], one["metadata"]["pool"]) == (200, a.url, "mask")
        # The general pool has no endpoints of its own: registered workers serve it too.
        assert one["metadata"]["pools"] == ["mask", "general"]
        gw.client.headers["Authorization"] = "Bearer k"  # the rollouts' client key
        assert (await gw.post("/generate", MASK_GEN))[0] == 200
        assert (await gw.post("/generate", {"text": "x"}))[0] == 200
        del gw.client.headers["Authorization"]
        status, body, _ = await gw.post("/abort_request", {"abort_all": True})
        assert status == 200, body
        assert a.bodies("/abort_request") == b.bodies("/abort_request") == [{"abort_all": True}]
        status, loads = await get(
            gw, "/v1/loads?include=core", headers={"Authorization": "Bearer k"}
        )
        assert (status, loads["total_workers"], loads["successful"]) == (200, 2, 2)
        assert {w["worker"] for w in loads["loads"]} == {a.url, b.url}
        status, body, _ = await gw.post("/workers", {"url": a.url, "worker_type": "prefill"})
        assert (status, body["error"]["code"]) == (400, "unsupported_worker_type")
        async with gw.client.delete(f"{gw.url}/workers/{ids[0]}") as resp:
            assert resp.status == 202
        async with gw.client.delete(f"{gw.url}/workers/{ids[0]}") as resp:
            assert (resp.status, (await resp.json())["error"]["code"]) == (404, "worker_not_found")
        # The older router's paths.
        async with gw.client.post(f"{gw.url}/add_worker", params={"url": a.url}) as resp:
            assert resp.status == 200
        status, listed = await get(gw, "/list_workers")
        assert sorted(listed["urls"]) == sorted([a.url, b.url])
        async with gw.client.post(f"{gw.url}/remove_worker", params={"url": b.url}) as resp:
            assert resp.status == 200
        for pool in ("mask", "general"):
            assert [ep.url for ep in gw.state.pools[pool].endpoints] == [a.url]


async def test_release_holds_the_pool_until_resume(workers, gateway, make_config, until):
    a = await workers(name="a")
    async with gateway(trained([a.url], make_config)) as gw:
        assert (await gw.post("/release_memory_occupation", {"tags": None}))[0] == 200
        held = asyncio.create_task(gw.post("/generate", MASK_GEN))
        await until(lambda: gw.state.pools["mask"].admission.depth == 1)
        assert (await gw.post("/resume_memory_occupation", {}))[0] == 200
        assert (await held)[0] == 200


CONTROL_PATHS = [
    ("POST", DISK),
    ("POST", "/update_weights_from_distributed"),
    ("POST", "/update_weights_from_tensor"),
    ("POST", "/init_weights_update_group"),
    ("POST", "/destroy_weights_update_group"),
    ("POST", "/pause_generation"),
    ("POST", "/continue_generation"),
    ("POST", "/flush_cache"),
    ("GET", "/flush_cache"),
    ("POST", "/abort_request"),
    ("POST", "/update_weight_version"),
    ("POST", "/release_memory_occupation"),
    ("POST", "/resume_memory_occupation"),
    ("POST", "/workers"),
    ("GET", "/workers"),
    ("DELETE", "/workers/00000000-0000-0000-0000-000000000000"),
    ("POST", "/add_worker?url=http://127.0.0.1:1"),
    ("POST", "/remove_worker?url=http://127.0.0.1:1"),
    ("GET", "/list_workers"),
]


async def test_admin_key_on_every_control_path(workers, gateway, make_config):
    """Outside trusted_networks (none here), only the admin key opens the control plane."""
    a = await workers(name="a")
    config = trained([a.url], make_config, admin_key="adm", api_keys=["k"], trusted_networks=[])
    async with gateway(config) as gw:
        for method, path in CONTROL_PATHS:
            for headers in ({}, {"Authorization": "Bearer k"}, {"Authorization": "Bearer x"}):
                async with gw.client.request(
                    method, gw.url + path, json={}, headers=headers
                ) as resp:
                    body = await resp.json()
                    assert (resp.status, body["error"]["code"]) == (401, "invalid_admin_key"), path
        assert a.calls == []  # nothing reached the worker
        # Read-only paths take a client key.
        for path in ("/get_weight_version", "/get_world_size", "/model_info", "/v1/loads"):
            assert (await get(gw, path))[0] == 401
            assert (await get(gw, path, headers={"Authorization": "Bearer k"}))[0] == 200
        # A control path is never proxied, whatever the method: 405 for an undeclared one.
        async with gw.client.get(
            gw.url + "/pause_generation", headers={"Authorization": "Bearer adm"}
        ) as resp:
            assert resp.status == 405
        status, body, _ = await gw.post(
            "/pause_generation", {}, headers={"Authorization": "Bearer adm"}
        )
        assert status == 200 and a.paused


async def test_busy_flush_is_retried_and_a_dead_endpoint_fails_the_sync(
    workers, gateway, make_config, until
):
    a = await workers(name="a", flush_busy=3)
    b = await workers(name="b")
    control = {**CONTROL["control"], "pause_mode": "abort"}
    async with gateway(trained([a.url, b.url], make_config, control=control)) as gw:
        pool = gw.state.pools["mask"]
        await until(lambda: all(ep.weight_version == "0" for ep in pool.endpoints))
        status, body, _ = await gw.post(DISK, {"model_path": "/c", "weight_version": "1"})
        assert status == 200, body
        assert a.paths().count("/flush_cache") == 4  # three busy answers, then done
        # b dies before the next sync (its health checks have not noticed yet).
        pool.endpoints[1].healthy = True
        await b.stop()
        status, body, _ = await gw.post(DISK, {"model_path": "/c", "weight_version": "2"})
        assert (status, body["error"]["code"]) == (502, "weight_sync_failed")
        results = {r["url"]: r for r in body["endpoints"]}
        assert (results[b.url]["stage"], results[b.url]["status"]) == ("pause", None)
        assert results[a.url]["stage"] == "done"
        assert pool.endpoints[1].stale
        for _ in range(4):
            status, out, _ = await gw.post("/generate", MASK_GEN)
            assert (status, out["worker"], out["meta_info"]["weight_version"]) == (200, "a", "2")


async def test_sync_without_a_version_ejects_until_registered_again(
    workers, gateway, make_config, until
):
    async with one_failing_worker(workers, gateway, make_config, until) as (gw, pool, a, b):
        status, body, _ = await gw.post(
            "/update_weights_from_tensor", {"serialized_named_tensors": ["x"]}
        )
        assert (status, body["error"]["code"]) == (502, "weight_sync_failed")
        assert a.bodies("/update_weights_from_tensor") == [{"serialized_named_tensors": ["x"]}]
        assert pool.endpoints[1].stale and not pool.endpoints[1].rejoin
        await asyncio.sleep(0.2)  # b reports "0", the same as before: that proves nothing
        assert pool.endpoints[1].stale
        status, _, _ = await gw.post("/workers", {"url": b.url})
        assert status == 202 and not pool.endpoints[1].stale


async def test_update_weight_version_sets_the_pools_version(workers, gateway, make_config, until):
    a, b = await workers(name="a"), await workers(name="b", refuse_version=True)
    async with gateway(trained([a.url, b.url], make_config)) as gw:
        pool = gw.state.pools["mask"]
        status, body, _ = await gw.post("/update_weight_version", {"new_version": "7"})
        assert (status, body["error"]["code"]) == (502, "weight_sync_failed")
        assert (a.version, pool.version) == ("7", "7")
        assert [ep.stale for ep in pool.endpoints] == [False, True]
        b.refuse_version = False
        status, body, _ = await gw.post("/update_weight_version", {"new_version": "8"})
        assert (status, body["new_version"]) == (200, "8")
        assert [ep.stale for ep in pool.endpoints] == [False, False]
        status, body, _ = await gw.post("/update_weight_version", {"new_version": ["8"]})
        assert (status, body["error"]["code"]) == (400, "invalid_weight_version")


REGISTRATION_PATHS = (
    ("POST", "/workers"),
    ("GET", "/workers"),
    ("DELETE", "/workers/x"),
    ("POST", "/add_worker?url=http://127.0.0.1:9"),
    ("POST", "/remove_worker?url=http://127.0.0.1:9"),
    ("GET", "/list_workers"),
)


@pytest.mark.parametrize(
    ("overrides", "status", "code"),
    [
        ({"trusted_networks": []}, 403, "control_forbidden"),
        ({"trusted_networks": ["10.0.0.0/8"], "admin_key": "adm"}, 401, "invalid_admin_key"),
        ({"host": "0.0.0.0"}, 404, "not_found"),  # no key, no trusted network: off
    ],
)
async def test_registration_outside_trusted_networks_is_refused_and_never_proxied(
    workers, gateway, make_config, overrides, status, code
):
    a = await workers(name="a")
    async with gateway(trained([a.url], make_config, **overrides)) as gw:
        for method, path in REGISTRATION_PATHS:
            async with gw.client.request(method, gw.url + path, json={}) as resp:
                body = await resp.json()
                assert (resp.status, body["error"]["code"]) == (status, code), path
        assert [ep.url for ep in gw.state.pools["mask"].endpoints] == [a.url]
        assert not [p for p, _ in a.calls if "worker" in p]  # nothing reached an upstream


async def test_control_paths_need_an_admin_key_once_client_keys_are_set(
    workers, gateway, make_config
):
    """A client key never opens the control plane: outside trusted_networks, with no admin key
    configured, control is refused whatever key is sent."""
    a = await workers(name="a")
    config = trained([a.url], make_config, api_keys=["k"], trusted_networks=[])
    async with gateway(config) as gw:
        status, body, _ = await gw.post(
            "/pause_generation", {}, headers={"Authorization": "Bearer k"}
        )
        assert (status, body["error"]["code"]) == (403, "control_forbidden")
        assert not a.paused
